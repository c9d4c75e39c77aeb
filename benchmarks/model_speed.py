"""Training-step throughput of ScratchViT against transformers' ViT with identical dimensions.

Both models train on the same random batch in one process with the same thread count. After a warm-up, each repeat
times the two models back to back (ours first in even repeats, theirs first in odd ones), so a change in machine load
hits both alike; the reported ratio is the median over repeats of these paired ratios, with their range, which is
steadier than a ratio of two medians when the load drifts. A step is forward, cross-entropy loss, backward and an
AdamW update.

    python benchmarks/model_speed.py --preset all
    python benchmarks/model_speed.py --preset cifar --bf16 --compile --output speed.json

On a CPU that other processes share, pass `--threads 1`: with more threads than free cores, OpenMP threads wait on
descheduled siblings and the wall-clock numbers swing several-fold from one repeat to the next.
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from transformers import ViTConfig, ViTForImageClassification

from finetune.compile import synchronize
from finetune.errors import ArgumentParser, run_command
from finetune.locations import check_folder, make_folder
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification


logger = logging.getLogger("model_speed")

NUM_LABELS = 10

PRESETS = {
    # The default ScratchViT: the CIFAR-10 model of the teaching notebooks.
    "cifar": {
        "image_size": 32,
        "patch_size": 4,
        "hidden_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 192,
        "batch_size": 256,
    },
    # The model of the 30-minute CPU recipe (configs/cifar10_scratch_cpu30.yaml).
    "cpu30": {
        "image_size": 32,
        "patch_size": 4,
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "batch_size": 128,
    },
    # ViT-Tiny's widths and depth on 32 px images.
    "tiny": {
        "image_size": 32,
        "patch_size": 4,
        "hidden_size": 192,
        "num_hidden_layers": 12,
        "num_attention_heads": 3,
        "intermediate_size": 768,
        "batch_size": 128,
    },
    # GPU sizes, not part of `all`: the encoder of the scratch GPU recipe (configs/cifar10_scratch_gpu.yaml, with ViT's
    # patch projection in both models) and ViT-B/16 at 224 px (google/vit-base-patch16-224-in21k's architecture).
    "gpu": {
        "image_size": 32,
        "patch_size": 4,
        "hidden_size": 384,
        "num_hidden_layers": 8,
        "num_attention_heads": 6,
        "intermediate_size": 1536,
        "batch_size": 512,
    },
    "vit-b16": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "batch_size": 64,
    },
}
CPU_PRESETS = ("cifar", "cpu30", "tiny")
# Steps per timed repeat and repeats on CPU: a repeat takes one to two seconds per model on two idle cores, so
# `--preset all` takes about four minutes (more when other processes share the cores). Odd repeat counts give each
# model the first slot of a pair about as often as the other.
DEFAULT_STEPS = {"cifar": 3, "cpu30": 3, "tiny": 1, "gpu": 2, "vit-b16": 1}
DEFAULT_REPEATS = {"cifar": 11, "cpu30": 11, "tiny": 5, "gpu": 5, "vit-b16": 5}


@dataclass
class Result:
    """Median throughput of both models for one preset, mode and attention implementation."""

    preset: str
    mode: str
    attention: str
    batch_size: int
    ours_images_per_s: float
    transformers_images_per_s: float
    ratio: float  # median over repeats of ours/theirs, each pair timed back to back
    ratio_min: float
    ratio_max: float
    cpu_time_ratio: float
    ours_all: list[float]
    transformers_all: list[float]
    ours_cpu_all: list[float]
    transformers_cpu_all: list[float]
    ours_params: int
    transformers_params: int


def build_models(preset: dict, attentions: list[str]) -> dict[tuple[str, str], torch.nn.Module]:
    """Both models per attention implementation, keyed `(model, attention)`, with the preset's dimensions."""
    dims = {key: value for key, value in preset.items() if key != "batch_size"}
    shared = {"qkv_bias": True, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "num_labels": NUM_LABELS}
    models = {}
    for attention in attentions:
        # A config per model: the attention implementation is stored on the config and read at every forward.
        torch.manual_seed(0)
        ours = ScratchViTForImageClassification._from_config(
            ScratchViTConfig(**dims, **shared), attn_implementation=attention
        )
        theirs = ViTForImageClassification._from_config(
            ViTConfig(**dims, **shared, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
            attn_implementation=attention,
        )
        for name, model in (("ours", ours), ("transformers", theirs)):
            if model.config._attn_implementation != attention:
                raise RuntimeError(f"{name} did not take attn_implementation={attention!r}.")
            models[name, attention] = model
    # Same architecture, so the same parameter count; a mismatch means the configs drifted apart.
    counts = {sum(p.numel() for p in model.parameters()) for model in models.values()}
    if len(counts) != 1:
        raise RuntimeError(f"The models have different parameter counts: {sorted(counts)}.")
    return models


def make_step(model: torch.nn.Module, device: torch.device, compile_model: bool, bf16: bool) -> Callable:
    """One optimisation step as a closure; `torch.compile` wraps the model's forward, as Trainer does."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model) if compile_model else model
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(pixels: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = forward(pixel_values=pixels).logits
        loss = loss_fn(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def time_steps(
    step: Callable, pixels: torch.Tensor, labels: torch.Tensor, steps: int, device: torch.device
) -> tuple[float, float]:
    """Images per second of wall-clock time and per second of this process's CPU time over `steps` steps.

    On a CPU shared with other processes, wall-clock time also counts the time slices they take; CPU time does not,
    so its ratio is the steadier comparison there (with one thread, where no thread waits on another).
    """
    synchronize(device)
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(pixels, labels)
    synchronize(device)
    images = steps * pixels.shape[0]
    return images / (time.perf_counter() - start), images / (time.process_time() - start_cpu)


def benchmark(
    preset_name: str,
    attentions: list[str],
    device: torch.device,
    compile_model: bool,
    bf16: bool,
    repeats: int,
    steps: int,
    warmup: int,
    batch_size: int | None = None,
) -> list[Result]:
    """Time every model on one batch, rotating the order each repeat; one `Result` per attention implementation."""
    preset = {**PRESETS[preset_name], **({"batch_size": batch_size} if batch_size else {})}
    models = build_models(preset, attentions)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(preset["batch_size"], 3, preset["image_size"], preset["image_size"], generator=generator)
    labels = torch.randint(0, NUM_LABELS, (preset["batch_size"],), generator=generator)
    pixels, labels = pixels.to(device), labels.to(device)

    step_fns = {key: make_step(model, device, compile_model, bf16) for key, model in models.items()}
    for (name, attention), step in step_fns.items():
        started = time.perf_counter()
        for _ in range(warmup):  # compilation, allocator and oneDNN primitive caches
            step(pixels, labels)
        synchronize(device)
        logger.info("%s %s/%s: warm-up %.1f s", preset_name, name, attention, time.perf_counter() - started)

    # Time ours and theirs back to back (alternating which goes first) and rotate the attention implementations, so
    # a change in machine load hits every model alike.
    keys = list(step_fns)
    throughput = {key: [] for key in keys}
    cpu_throughput = {key: [] for key in keys}
    for repeat in range(repeats):
        shift = repeat % len(attentions)
        for attention in attentions[shift:] + attentions[:shift]:
            pair = [("ours", attention), ("transformers", attention)]
            for key in pair if repeat % 2 == 0 else pair[::-1]:
                wall, cpu = time_steps(step_fns[key], pixels, labels, steps, device)
                throughput[key].append(wall)
                cpu_throughput[key].append(cpu)
        logger.info(
            "%s repeat %d/%d: %s",
            preset_name,
            repeat + 1,
            repeats,
            ", ".join(f"{name}/{attention} {throughput[name, attention][-1]:.0f} img/s" for name, attention in keys),
        )

    mode = ("compile" if compile_model else "eager") + (" bf16" if bf16 else " fp32") + f" {device.type}"
    results = []
    for attention in attentions:
        ours, theirs = throughput["ours", attention], throughput["transformers", attention]
        ours_cpu, theirs_cpu = cpu_throughput["ours", attention], cpu_throughput["transformers", attention]
        ratios = [a / b for a, b in zip(ours, theirs)]
        results.append(
            Result(
                preset=preset_name,
                mode=mode,
                attention=attention,
                batch_size=preset["batch_size"],
                ours_images_per_s=statistics.median(ours),
                transformers_images_per_s=statistics.median(theirs),
                ratio=statistics.median(ratios),
                ratio_min=min(ratios),
                ratio_max=max(ratios),
                cpu_time_ratio=statistics.median(a / b for a, b in zip(ours_cpu, theirs_cpu)),
                ours_all=ours,
                transformers_all=theirs,
                ours_cpu_all=ours_cpu,
                transformers_cpu_all=theirs_cpu,
                ours_params=sum(p.numel() for p in models["ours", attention].parameters()),
                transformers_params=sum(p.numel() for p in models["transformers", attention].parameters()),
            )
        )
    return results


def markdown_table(results: list[Result]) -> str:
    """The results as a Markdown table, one row per preset, mode and attention implementation."""
    lines = [
        "| preset | mode | attention | ours img/s | transformers img/s | ratio ours/transformers | range over "
        "repeats | ratio, CPU time |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.preset} | {r.mode} | {r.attention} | {r.ours_images_per_s:.0f} | "
            f"{r.transformers_images_per_s:.0f} | {r.ratio:.2f} | {r.ratio_min:.2f}-{r.ratio_max:.2f} | "
            f"{r.cpu_time_ratio:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset", choices=[*PRESETS, "all"], nargs="+", default=["all"], help=f"`all`: {', '.join(CPU_PRESETS)}"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--bf16", action="store_true", help="run the forward pass under bfloat16 autocast")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per model (default: per preset)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per repeat (default: per preset)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per model (default: 1, 3 compiled)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument(
        "--batch_size", "--batch-size", type=int, default=None, help="override the preset's batch size"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--attention",
        nargs="+",
        choices=["sdpa", "eager"],
        default=["sdpa", "eager"],
        help="attn_implementation(s) to run both models with (one table row each)",
    )
    parser.add_argument("--output", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    if args.output:  # made now: found in the way only after the measurement, it lost the results
        make_folder(check_folder(args.output, is_file=True).parent)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch_size must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    presets = list(CPU_PRESETS) if "all" in args.preset else list(dict.fromkeys(args.preset))
    warmup = args.warmup if args.warmup is not None else (3 if args.compile else 1)
    # Other processes on the same cores skew wall-clock numbers; the load average tells how much to trust them.
    load_before = os.getloadavg()
    logger.info(
        "torch %s, %d threads, device %s, load average %.2f %.2f %.2f",
        torch.__version__,
        torch.get_num_threads(),
        device,
        *load_before,
    )

    results = []
    for preset in presets:
        steps = args.steps or (DEFAULT_STEPS[preset] * (10 if device.type == "cuda" else 1))
        repeats = args.repeats or DEFAULT_REPEATS[preset]
        results += benchmark(
            preset, args.attention, device, args.compile, args.bf16, repeats, steps, warmup, args.batch_size
        )
    load_after = os.getloadavg()
    logger.info("load average %.2f %.2f %.2f", *load_after)
    print(markdown_table(results))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(
                {
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "device": str(device),
                    "compile": args.compile,
                    "bf16": args.bf16,
                    "load_average_before": load_before,
                    "load_average_after": load_after,
                    "results": [asdict(r) for r in results],
                },
                f,
                indent=2,
            )
    return results


if __name__ == "__main__":
    sys.exit(run_command(main))
