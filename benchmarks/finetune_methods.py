"""Fine-tuning methods side by side: full, linear probe, LoRA, and full with layer-wise learning-rate decay.

Three measurements, each method in a process of its own so its peak resident memory is its own (with quickstart and
cifar10, further `--key value` arguments go to every training run):

- `quickstart`: the quickstart's "pretrained" ViT (pretrained on digits 0-4 by
  `python -m finetune.tools.quickstart`'s first
  two stages, made here when missing) fine-tuned on all ten digits with `configs/quickstart.yaml`'s settings and each
  method. Reports validation accuracy, trained parameters, the training loop's time per optimizer step
  (`results.json`: `train.seconds / train.steps`) and the process's peak resident memory.
- `cifar10`: the same on CIFAR-10 with a "pretrained" source made offline: a transformers ViT at 32 px (patch 4,
  hidden 64, 6 layers, 4 heads, MLP 256; 0.3M parameters) trained from random weights on the five classes airplane,
  automobile, bird, cat and deer (made here when missing, 12 epochs), then fine-tuned with each method on the other
  five (dog, frog, horse, ship, truck), each with its own learning rate (`CIFAR10_LEARNING_RATES`), next to the same
  ViT trained from random weights for as long. 2,500 images of each five-class set are held out for validation.
- `vit_b16`: ViT-B/16 dimensions at 224 px with a 10-class head (random weights: only the shapes matter). Reports
  trained parameters, the AdamW state and gradient memory they need in fp32 (2 + 1 floats per trained parameter),
  and, with `--steps`, the time of a training step (forward, loss, backward, AdamW) on random images and the process's
  peak resident memory.

    python benchmarks/finetune_methods.py quickstart --num_train_epochs 10 --output benchmarks/results/finetune_methods
    python benchmarks/finetune_methods.py cifar10 --dataset_name ../shared/data/cifar10-jpeg/train.parquet \
        --output benchmarks/results/finetune_methods
    python benchmarks/finetune_methods.py vit_b16 --steps 3 --batch_size 8 --output benchmarks/results/finetune_methods
"""

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402
from finetune.tools import quickstart  # noqa: E402


METHODS = {  # each method's `ModelArguments` settings
    "full": {},
    "linear_probe": {"finetune_method": "linear_probe"},
    "lora": {"finetune_method": "lora"},
    "full + layer_decay 0.75": {"layer_decay": 0.75},
}
QUICKSTART_OUTPUT = Path("outputs/finetune_methods")
CIFAR10_OUTPUT = Path("outputs/finetune_methods/cifar10")
CIFAR10_SOURCE_CLASSES = ["airplane", "automobile", "bird", "cat", "deer"]
CIFAR10_TARGET_CLASSES = ["dog", "frog", "horse", "ship", "truck"]
# The control: the same ViT from random weights (the source's starting point), trained in full like `full`.
RANDOM_INIT = "full from random weights"
# Peak learning rates for AdamW with a cosine decay, per method, as fine-tuning recipes set them: a frozen backbone
# takes a larger step on the head alone (the ViT paper's linear probes), LoRA's low-rank updates a larger one than
# full fine-tuning (peft's image-classification guide), layer decay the full rate at the top layer (timm, BEiT).
CIFAR10_LEARNING_RATES = {
    "full": 1e-3,
    "linear_probe": 1e-2,
    "lora": 5e-3,
    "full + layer_decay 0.75": 1e-3,
    RANDOM_INIT: 1e-3,
}
CIFAR10_SETTINGS = [
    "--validation_size", "2500", "--per_device_train_batch_size", "128", "--per_device_eval_batch_size", "256",
    "--weight_decay", "0.05", "--lr_scheduler_type", "cosine", "--label_smoothing_factor", "0.1",
    "--random_crop_padding", "4", "--horizontal_flip", "true", "--logging_steps", "50", "--seed", "42",
    "--report_to", "none", "--overwrite_output_dir", "true",
]  # fmt: skip


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports kibibytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, method: str, argv: list[str]) -> dict:
    """Run one method in this (child) process and return its figures."""
    if kind in ("quickstart", "cifar10"):
        from finetune import run

        results = run.main(argv)["pretrained"]
        steps = results.train.steps or 0
        return {
            "method": method,
            "learning_rate": results.hyperparameters.get("learning_rate"),
            "epochs": results.epochs,
            "validation_accuracy": results.validation.accuracy,
            "macro_f1": results.validation.macro_f1,
            "parameters": results.num_parameters,
            "trained_parameters": results.num_trainable_parameters,
            "step_seconds": results.train.seconds / steps if steps else None,
            "peak_rss_mib": peak_rss_mib(),
        }
    return vit_b16_child(method, argv)


def vit_b16_child(method: str, argv: list[str]) -> dict:
    options = dict(zip(argv[::2], argv[1::2]))
    return method_figures(method, int(options.get("--steps", 0)), int(options.get("--batch_size", 8)))


def method_figures(
    method: str, steps: int = 0, batch_size: int = 8, device: str = "cpu", bf16: bool = False, config=None
) -> dict:
    """Trained parameters, AdamW state and gradient memory of `method` on a ViT classifier (`config`; default
    ViT-B/16 at 224 px with 10 classes, random weights), and with `steps`, the median time of a training step
    (forward, loss, backward, AdamW) on random images, with the peak memory: the process's resident memory on a CPU,
    allocated GPU memory on CUDA. The GPU suite calls it in its own process, once per method."""
    import contextlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import ViTConfig, ViTForImageClassification

    from finetune.arguments import ModelArguments
    from finetune.models import apply_finetune_method, count_parameters, parameter_groups

    model_args = ModelArguments(**METHODS[method])
    config = config or ViTConfig(image_size=224, patch_size=16, num_labels=10)  # ViT-B/16 dimensions
    torch.manual_seed(0)
    model = apply_finetune_method(ViTForImageClassification(config), model_args).to(device)
    trained = count_parameters(model, trainable=True)
    figures = {
        "method": method,
        "parameters": count_parameters(model),
        "trained_parameters": trained,
        "adamw_state_mib": 2 * 4 * trained / 2**20,  # exp_avg and exp_avg_sq, fp32
        "gradient_mib": 4 * trained / 2**20,
    }
    if not steps:
        return figures
    cuda = torch.device(device).type == "cuda"
    groups = parameter_groups(model, 1e-4, 0.05, model_args.layer_decay)
    optimizer = torch.optim.AdamW(groups, fused=cuda)
    size = config.image_size
    pixels = torch.randn(batch_size, config.num_channels, size, size, device=device)
    labels = torch.randint(0, config.num_labels, (batch_size,), device=device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    model.train()
    for step in range(steps + 1):  # the first step (allocation, warm-up) is not timed; its FLOPs are counted
        start = time.perf_counter()
        with FlopCounterMode(display=False) if step == 0 else contextlib.nullcontext() as counter:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(pixel_values=pixels, labels=labels).loss
            loss.backward()
        if step == 0:
            figures["training_flops_per_image"] = counter.get_total_flops() / batch_size
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    figures.update(
        step_seconds=sorted(times[1:])[len(times[1:]) // 2],
        batch_size=batch_size,
        threads=torch.get_num_threads(),
    )
    if cuda:
        figures["peak_gpu_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        figures["peak_rss_mib"] = peak_rss_mib()
    return figures


def ensure_quickstart_source() -> Path:
    """The quickstart's pretrained source model (its stages 1 and 2), made when missing."""
    from finetune import run

    root = Path("outputs/quickstart")
    quickstart.ensure_source_init(root / "source_init")
    if not (root / "source_model" / "results.json").exists():
        run.main(["--config", str(quickstart.CONFIGS / "quickstart_source.yaml"), "--overwrite_output_dir", "true"])
    return root / "source_model"


def make_cifar10_source_init(path: Path) -> None:
    """A randomly initialised transformers ViT for CIFAR-10's 32 px images (5 classes) with its image processor."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(
        image_size=32, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
        intermediate_size=256, num_labels=5,
    )  # fmt: skip
    ViTForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.4914, 0.4822, 0.4465], image_std=[0.2470, 0.2435, 0.2616]
    ).save_pretrained(path)


def ensure_cifar10_source(
    dataset_name: str, epochs: float, root: Path = CIFAR10_OUTPUT, extra: list[str] = ()
) -> Path:
    """The CIFAR-10 source model: `make_cifar10_source_init`'s ViT trained on `CIFAR10_SOURCE_CLASSES`, made when
    missing (in a process of its own, like the methods), under `root`."""
    quickstart.ensure_source_init(root / "source_init", make_cifar10_source_init)
    if not (root / "source_model" / "results.json").exists():
        argv = [
            "--model_type", "pretrained", "--model_name_or_path", str(root / "source_init"),
            "--dataset_name", dataset_name, "--include_labels", *CIFAR10_SOURCE_CLASSES, *CIFAR10_SETTINGS,
            "--learning_rate", "2e-3", "--warmup_steps", "300", "--num_train_epochs", str(epochs),
            "--output_dir", str(root / "source_model"), *extra,
        ]  # fmt: skip
        if status := subprocess.run([sys.executable, str(ROOT / "finetune" / "run.py"), *argv]).returncode:
            raise RuntimeError(
                f"Training the source model in {root} ended with exit status {status} (its output is above)."
            )
    return root / "source_model"


def slug(method: str) -> str:
    return {"full + layer_decay 0.75": "layer_decay", RANDOM_INIT: "random_init"}.get(method, method)


def method_flags(method: str) -> list[str]:
    """A method's settings as command-line flags of `finetune.run` (none for full fine-tuning and the control)."""
    return [flag for key, value in METHODS.get(method, {}).items() for flag in (f"--{key}", str(value))]


def method_argv(kind: str, method: str, extra: list[str], root: Path = CIFAR10_OUTPUT) -> list[str]:
    if kind == "cifar10":
        source = root / ("source_init" if method == RANDOM_INIT else "source_model")
        return [
            "--model_type", "pretrained", "--model_name_or_path", str(source),
            "--include_labels", *CIFAR10_TARGET_CLASSES, *CIFAR10_SETTINGS,
            "--learning_rate", str(CIFAR10_LEARNING_RATES[method]), "--warmup_steps", "100",
            "--output_dir", str(root / slug(method)), *method_flags(method), *extra,
        ]  # fmt: skip
    if kind == "quickstart":
        return [
            "--config", str(ROOT / "configs" / "quickstart.yaml"), "--model_type", "pretrained",
            "--output_dir", str(QUICKSTART_OUTPUT / slug(method)), "--overwrite_output_dir", "true",
            "--report_to", "none",
            *method_flags(method), *extra,
        ]  # fmt: skip
    return [*method_flags(method), *extra]


def table(rows: list[dict], kind: str) -> str:
    def number(value, digits=1):
        return "—" if value is None else f"{value:,.{digits}f}"

    if kind in ("quickstart", "cifar10"):
        header = (
            "| method | learning rate | epochs | validation accuracy | macro F1 | trained parameters | s/step "
            "| peak RSS (MiB) |"
        )
        lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            rate = r.get("learning_rate")
            lines.append(
                f"| {r['method']} | {'—' if rate is None else f'{rate:g}'} | {number(r.get('epochs'), 1)} | "
                f"{100 * r['validation_accuracy']:.2f}% | {number(r['macro_f1'], 4)} | "
                f"{r['trained_parameters']:,} of {r['parameters']:,} | {number(r['step_seconds'], 4)} | "
                f"{number(r['peak_rss_mib'], 0)} |"
            )
        return "\n".join(lines)
    header = "| method | trained parameters | AdamW state (MiB) | gradients (MiB) | s/step | peak RSS (MiB) |"
    lines = [header, "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['trained_parameters']:,} of {r['parameters']:,} | {number(r['adamw_state_mib'])} | "
            f"{number(r['gradient_mib'])} | {number(r.get('step_seconds'), 2)} | {number(r.get('peak_rss_mib'), 0)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        _, kind, method, out, *rest = argv
        Path(out).write_text(json.dumps(child(kind, method, rest)))
        return []
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["quickstart", "cifar10", "vit_b16"])
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=[*METHODS, RANDOM_INIT],
        help=f"Default: all; `{RANDOM_INIT}` is the cifar10 control.",
    )
    parser.add_argument("--steps", type=int, default=0, help="vit_b16: timed training steps per method (0: none).")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=8, help="vit_b16: images per step.")
    parser.add_argument(
        "--num_train_epochs",
        "--num-train-epochs",
        type=float,
        help="quickstart, cifar10: epochs per method (quickstart: the config's 30; cifar10: 3).",
    )
    parser.add_argument(
        "--source_epochs", "--source-epochs", type=float, default=12, help="cifar10: epochs of the source model."
    )
    parser.add_argument(
        "--dataset_name",
        "--dataset-name",
        default="uoft-cs/cifar10",
        help="cifar10: the Hub dataset, or a local copy such as ../shared/data/cifar10-jpeg/train.parquet.",
    )
    parser.add_argument(
        "--work_dir", "--work-dir", default=str(CIFAR10_OUTPUT), help="cifar10: where the models are trained."
    )
    parser.add_argument("--output", help="Folder for <kind>.json and <kind>.md.")
    args, passthrough = parser.parse_known_args(argv)  # quickstart, cifar10: more `--key value` for every run
    if passthrough and args.kind == "vit_b16":
        parser.error(f"unrecognized arguments: {' '.join(passthrough)}")
    if args.output:  # made now: found in the way only after the runs, it lost their figures
        make_folder(args.output)
    methods = args.methods or [*METHODS, *([RANDOM_INIT] if args.kind == "cifar10" else [])]
    if RANDOM_INIT in methods and args.kind != "cifar10":
        parser.error(f"`{RANDOM_INIT}` is a method of the cifar10 measurement only.")
    if args.kind == "quickstart":
        ensure_quickstart_source()
        extra = ["--num_train_epochs", str(args.num_train_epochs)] if args.num_train_epochs else []
        extra += passthrough
    elif args.kind == "cifar10":
        ensure_cifar10_source(args.dataset_name, args.source_epochs, Path(args.work_dir), passthrough)
        extra = ["--dataset_name", args.dataset_name, "--num_train_epochs", str(args.num_train_epochs or 3)]
        extra += passthrough
    else:
        extra = ["--steps", str(args.steps), "--batch_size", str(args.batch_size)]
    rows = []
    try:
        for method in methods:
            out = Path(f".finetune_methods_{os.getpid()}.json")
            command = [
                sys.executable,
                __file__,
                "--child",
                args.kind,
                method,
                str(out),
                *method_argv(args.kind, method, extra, Path(args.work_dir)),
            ]
            quiet = subprocess.DEVNULL if args.kind != "vit_b16" else None
            if status := subprocess.run(command, stdout=quiet).returncode:
                raise RuntimeError(f"The {method} run ended with exit status {status} (its output is above).")
            rows.append(json.loads(out.read_text()))
            out.unlink()
    finally:  # the methods that finished are reported also when a later one failed
        if rows:
            text = table(rows, args.kind)
            print(text)
            if args.output:
                (Path(args.output) / f"{args.kind}.json").write_text(json.dumps(rows, indent=2) + "\n")
                (Path(args.output) / f"{args.kind}.md").write_text(text + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(run_command(main))
