"""Epoch time of this project's data pipeline against the transformers example's, for the same model and images.

- **example**: the style of transformers' `examples/pytorch/image-classification/run_image_classification.py`: a
  `datasets.Dataset` with `set_transform` running torchvision transforms (RandomResizedCrop, RandomHorizontalFlip,
  ToTensor, Normalize) on one PIL image at a time, a `DataLoader` with `--num_workers` workers and a stacking collate.
- **ours**: `load_image_data` (every image decoded once to uint8, then read from the decoded cache), a `DataLoader`
  over `ImageSplit` that serves whole batches with `__getitems__`, and `BatchTransform` on the device.

For each pipeline: pure data throughput (no model), then training steps (forward, backward, fused AdamW as the
Trainer's default) in two passes: `--steps` steps timed as a whole with nothing waiting for the device between them
(the training images/s, and the extrapolated time of a 50,000-image CIFAR-10 epoch), then `--steps` steps each split
by synchronisations into the data path (next batch, transform) and the model (the data share). With `--compile MODE`
the model runs through the Trainer's `TrainingCompiler` (`auto`: CUDA graphs where kernel launches set the pace,
kept only if faster than eager after warm-up; `default`: inductor; `reduce-overhead`: inductor with CUDA graphs;
`cudagraphs`: CUDA graphs of the eager kernels), warmed up (and, for `auto`, decided) before timing. Prints a
Markdown table; `--output` writes JSON.

    python benchmarks/data_pipeline.py                      # ScratchViT at 32 px (default config)
    python benchmarks/data_pipeline.py --model vit-b16-tiny-224 --batch_size 32 --steps 10
"""

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader
from torchvision import transforms
from transformers.utils import logging as transformers_logging


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from finetune.arguments import DataArguments  # noqa: E402
from finetune.augment import BatchTransform  # noqa: E402
from finetune.data import collate_batch, load_image_data  # noqa: E402
from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import check_folder, make_folder  # noqa: E402


EPOCH_IMAGES = 50_000
MODELS = ("scratch", "scratch-gpu", "vit-b16-tiny-224", "vit-b16-224")
COMPILE_MODES = ("auto", "default", "reduce-overhead", "cudagraphs")


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument(
        "--num_images", "--num-images", type=int, default=10_000, help="Use the first M images of --data."
    )
    parser.add_argument("--batch_size", "--batch-size", type=int, default=128)
    parser.add_argument(
        "--num_workers", "--num-workers", type=int, default=2, help="DataLoader workers of the example pipeline."
    )
    parser.add_argument(
        "--our_num_workers",
        "--our-num-workers",
        type=int,
        default=0,
        help="DataLoader workers of ours (batches are one tensor index).",
    )
    parser.add_argument("--steps", type=int, default=40, help="Training steps per pipeline (after 3 warm-up steps).")
    parser.add_argument(
        "--data_batches", "--data-batches", type=int, default=40, help="Batches for the data-only throughput."
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", choices=MODELS, default="scratch")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice, one per core)."
    )
    parser.add_argument(
        "--decoded_cache_dir",
        "--decoded-cache-dir",
        default=None,
        help="Default: a fresh temporary folder (first run).",
    )
    parser.add_argument("--bf16", action="store_true", help="Train under bf16 autocast (both pipelines).")
    parser.add_argument(
        "--compile", nargs="?", const="default", choices=COMPILE_MODES, default=None, help="torch.compile the model."
    )
    parser.add_argument("--compile_backend", default=None, help="Another dynamo backend for --compile (tests).")
    parser.add_argument(
        "--pipelines", nargs="+", choices=["example", "ours"], default=["example", "ours"], help="Which to run."
    )
    parser.add_argument("--output", default=None, help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    output = args.output and check_folder(args.output, is_file=True)
    if not os.path.isfile(args.data):  # datasets' own error named the path, not the fix
        raise FileNotFoundError(f"--data {args.data} is not a file. Fix: a parquet file of images (CIFAR-10's copy).")
    if output:  # made now: found in the way only after the measurement, it lost the results
        make_folder(output.parent)
    return args


# The encoder of configs/cifar10_scratch_gpu.yaml.
SCRATCH_GPU = {
    "patch_embedding_type": "conv_stem", "hidden_size": 384, "num_hidden_layers": 8, "num_attention_heads": 6,
    "intermediate_size": 1536, "pooling": "mean", "qk_norm": True,
}  # fmt: skip


def build_model(name: str, num_labels: int):
    """The model and its input size, mean and std."""
    if name in ("scratch", "scratch-gpu"):
        from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification

        config = ScratchViTConfig(num_labels=num_labels, **(SCRATCH_GPU if name == "scratch-gpu" else {}))
        return ScratchViTForImageClassification(config), config.image_size, [0.5] * 3, [0.5] * 3
    from transformers import ViTConfig, ViTForImageClassification

    # `vit-b16-224`: google/vit-base-patch16-224-in21k's architecture (ViTConfig's defaults) with random weights, which
    # take the same time as the pretrained ones; `vit-b16-tiny-224`: its depth and resolution at ViT-Tiny's width.
    width = {} if name == "vit-b16-224" else {"hidden_size": 192, "num_attention_heads": 3, "intermediate_size": 768}
    config = ViTConfig(image_size=224, patch_size=16, num_labels=num_labels, **width)
    return ViTForImageClassification(config), config.image_size, [0.5] * 3, [0.5] * 3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def example_pipeline(args, image_size: int, mean, std):
    """A `next_batch()` over the example script's pipeline, yielding normalized float batches on the device."""
    dataset = datasets.load_dataset("parquet", data_files={"train": args.data}, split="train")
    dataset = dataset.select(range(min(args.num_images, len(dataset))))
    image_column = "img" if "img" in dataset.column_names else "image"
    train_transforms = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean=mean, std=std),
        ]
    )

    def preprocess(batch):
        batch["pixel_values"] = [train_transforms(image.convert("RGB")) for image in batch[image_column]]
        return batch

    dataset.set_transform(preprocess)

    def collate(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        return {"pixel_values": pixel_values, "labels": torch.tensor([example["label"] for example in examples])}

    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        collate_fn=collate,
        pin_memory=args.device.type == "cuda",
        persistent_workers=args.num_workers > 0,
        drop_last=True,
    )
    next_batch = _cycle(loader, lambda batch: batch["pixel_values"].to(args.device, non_blocking=True), args.device)
    return next_batch, len(dataset)


def our_pipeline(args, image_size: int, mean, std, timings: dict):
    cache_dir = args.decoded_cache_dir
    if cache_dir is None:  # a fresh one, removed at exit (the images decoded: 148 MB for CIFAR-10)
        cache_dir = tempfile.mkdtemp(prefix="decoded-")
        atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
    # 2% held out (1,000 of CIFAR-10's 50,000): the split is not used here, only its training part.
    data_args = DataArguments(dataset_name=args.data, validation_size=0.02, decoded_cache_dir=cache_dir)
    for run in ("first_load_s", "cached_load_s"):
        start = time.perf_counter()
        data = load_image_data(data_args, seed=0, target_size=image_size)
        timings[run] = time.perf_counter() - start
    train = data.train.select(range(min(args.num_images, len(data.train))))
    transform = BatchTransform(image_size, mean, std, data.num_channels, 3).to(args.device)
    loader = DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.our_num_workers,
        collate_fn=collate_batch,
        pin_memory=args.device.type == "cuda",
        drop_last=True,
    )

    def to_model_input(batch):
        return transform(batch["pixel_values"].to(args.device, non_blocking=True), train=True)

    return _cycle(loader, to_model_input, args.device), len(train)


def _cycle(loader, to_model_input, device):
    """`next_batch()` -> (pixel_values, labels) on the device, over the loader endlessly."""
    iterator = iter(loader)

    def next_batch():
        nonlocal iterator
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = iter(loader)
            batch = next(iterator)
        return to_model_input(batch), batch["labels"].to(device, non_blocking=True)

    return next_batch


def data_throughput(next_batch, num_batches: int, device) -> float:
    next_batch()  # starts the workers
    sync(device)
    images, start = 0, time.perf_counter()
    for _ in range(num_batches):
        pixel_values, _ = next_batch()
        images += len(pixel_values)
    sync(device)
    return images / (time.perf_counter() - start)


def compile_choice(mode: str | None, backend: str | None = None):
    """The Trainer's `CompileChoice` for a `--compile` mode (`None`: eager); `backend` replaces the mode's."""
    from finetune.hardware import AUTO_CUDA_COMPILE, CompileChoice

    if mode is None:
        return CompileChoice(False, reason="eager")
    if mode == "auto":
        choice = CompileChoice(True, verify=True, reason="auto", **AUTO_CUDA_COMPILE)
    elif mode == "cudagraphs":
        choice = CompileChoice(True, backend="cudagraphs", reason="CUDA graphs of the eager kernels")
    else:
        choice = CompileChoice(True, backend="inductor", mode=None if mode == "default" else mode, reason=mode)
    if backend:
        choice.backend, choice.mode = backend, None
    return choice


def train_steps(
    next_batch,
    model,
    steps: int,
    device,
    bf16: bool = False,
    compile_mode: str | None = None,
    compile_backend: str | None = None,
) -> dict:
    """Training throughput with nothing waiting for the device between steps, then the data share of a step."""
    from finetune.compile import TrainingCompiler

    fused = device.type in ("cuda", "cpu")  # the Trainer's default optimizer, adamw_torch_fused
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    model.train()
    compiler = TrainingCompiler(compile_choice(compile_mode, compile_backend), device)

    def forward_backward(pixel_values, labels) -> None:
        forward = compiler.module_for(model, len(labels))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(pixel_values=pixel_values, labels=labels).loss
        loss.backward()

    def step(split: bool = False, batch=None) -> tuple[int, float, float]:
        start = time.perf_counter()
        pixel_values, labels = batch or next_batch()
        if split:
            sync(device)
        fetched = time.perf_counter()
        compiler.run(lambda: forward_backward(pixel_values, labels))  # eager again after a compiler error
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if split:
            sync(device)
        return len(labels), fetched - start, time.perf_counter() - fetched

    # Warm-up: worker start-up, allocator, compilation and CUDA-graph recording, and `auto`'s timed comparison.
    warmup = 3 + (25 if compiler.choice.verify else 0)
    for index in range(warmup):
        batch = next_batch()  # before the step begins, as the Trainer fetches it: `auto` times the step alone
        compiler.on_step_begin()
        if index == 0:
            compile_start = time.perf_counter()
        step(batch=batch)
        if index == 0:
            sync(device)
            first_step_s = time.perf_counter() - compile_start
        compiler.on_step_end()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    sync(device)
    start = time.perf_counter()
    images = sum(step()[0] for _ in range(steps))
    sync(device)
    total = time.perf_counter() - start

    data_time = model_time = 0.0
    for _ in range(steps):
        _, data_s, model_s = step(split=True)
        data_time, model_time = data_time + data_s, model_time + model_s
    return {
        "train_images_per_s": images / total,
        "epoch_s": EPOCH_IMAGES * total / images,
        "data_share": data_time / (data_time + model_time),
        "data_ms_per_step": 1000 * data_time / steps,
        "model_ms_per_step": 1000 * model_time / steps,
        "step_ms": 1000 * total / steps,
        # `auto` times eager steps before it compiles: its first compiled step is the compiler's.
        "first_step_s": compiler.compile_seconds if compiler.compile_seconds is not None else first_step_s,
        "compile": compile_mode or "no",
        "compile_outcome": compiler.summary(),
        "peak_gpu_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()
    load_before = os.getloadavg()
    results = {
        "model": args.model,
        "device": str(args.device),
        "batch_size": args.batch_size,
        "bf16": args.bf16,
        "compile": args.compile,
        "num_images": args.num_images,
        "steps": args.steps,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }

    timings = {}
    _, image_size, mean, std = build_model(args.model, num_labels=10)
    pipelines = {
        "example": (lambda: example_pipeline(args, image_size, mean, std), args.num_workers),
        "ours": (lambda: our_pipeline(args, image_size, mean, std, timings), args.our_num_workers),
    }
    for name in args.pipelines:
        build_pipeline, workers = pipelines[name]
        # One pipeline at a time, so the example's workers never compete with ours for the CPU.
        next_batch, num_images = build_pipeline()
        torch.manual_seed(0)
        model = build_model(args.model, num_labels=10)[0].to(args.device)
        row = {
            "num_workers": workers,
            "data_images_per_s": data_throughput(next_batch, args.data_batches, args.device),
        }
        row.update(
            train_steps(next_batch, model, args.steps, args.device, args.bf16, args.compile, args.compile_backend)
        )
        results[name] = row
        results["num_images"] = min(results["num_images"], num_images)
        del next_batch, model
    results.update(timings)
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(markdown(results))
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2))
    return results


def markdown(results: dict) -> str:
    lines = [
        f"Model `{results['model']}` on {results['device']} ({results['torch_threads']} torch threads, "
        f"{results['cpu_count']} CPUs), batch {results['batch_size']}, first {results['num_images']:,} images, "
        f"{results['steps']} timed training steps. Load average before/after: "
        f"{' '.join(f'{x:.2f}' for x in results['load_average']['before'])} / "
        f"{' '.join(f'{x:.2f}' for x in results['load_average']['after'])}.",
        "",
        "| pipeline | workers | data only (img/s) | training (img/s) | epoch of 50k (s) | data share of step | "
        "data ms/step | model ms/step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in [n for n in ("example", "ours") if n in results]:
        r = results[name]
        lines.append(
            f"| {name} | {r['num_workers']} | {r['data_images_per_s']:,.0f} | {r['train_images_per_s']:,.0f} | "
            f"{r['epoch_s']:,.1f} | {100 * r['data_share']:.0f}% | {r['data_ms_per_step']:.1f} | "
            f"{r['model_ms_per_step']:.1f} |"
        )
    if "first_load_s" in results:
        lines += [
            "",
            f"Ours, one-off: decoding the whole file and caching it took {results['first_load_s']:.1f}s; "
            f"loading it again from the decoded cache {results['cached_load_s']:.2f}s.",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_command(main))
