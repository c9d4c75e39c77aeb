"""Fine-tuning methods side by side: full, linear probe, LoRA, and full with layer-wise learning-rate decay.

Two measurements, each method in a process of its own so its peak resident memory is its own:

- `quickstart`: the quickstart's "pretrained" ViT (pretrained on digits 0-4 by `python -m finetune.quickstart`'s first
  two stages, made here when missing) fine-tuned on all ten digits with `configs/quickstart.yaml`'s settings and each
  method. Reports validation accuracy, trained parameters, the training loop's time per optimizer step
  (`results.json`: `train.seconds / train.steps`) and the process's peak resident memory.
- `vit_b16`: ViT-B/16 dimensions at 224 px with a 10-class head (random weights: only the shapes matter). Reports
  trained parameters, the AdamW state and gradient memory they need in fp32 (2 + 1 floats per trained parameter),
  and, with `--steps`, the time of a training step (forward, loss, backward, AdamW) on random images and the process's
  peak resident memory.

    python benchmarks/finetune_methods.py quickstart --num_train_epochs 10 --output benchmarks/results/finetune_methods
    python benchmarks/finetune_methods.py vit_b16 --steps 3 --batch_size 8 --output benchmarks/results/finetune_methods
"""

import argparse
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

METHODS = {
    "full": [],
    "linear_probe": ["--finetune_method", "linear_probe"],
    "lora": ["--finetune_method", "lora"],
    "full + layer_decay 0.75": ["--layer_decay", "0.75"],
}
QUICKSTART_OUTPUT = Path("outputs/finetune_methods")


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports kibibytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, method: str, argv: list[str]) -> dict:
    """Run one method in this (child) process and return its figures."""
    if kind == "quickstart":
        from finetune import run

        results = run.main(argv)["pretrained"]
        steps = results.train.steps or 0
        return {
            "method": method,
            "validation_accuracy": results.validation.accuracy,
            "macro_f1": results.validation.macro_f1,
            "parameters": results.num_parameters,
            "trained_parameters": results.num_trainable_parameters,
            "step_seconds": results.train.seconds / steps if steps else None,
            "peak_rss_mib": peak_rss_mib(),
        }
    return vit_b16_child(method, argv)


def vit_b16_child(method: str, argv: list[str]) -> dict:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    from finetune.arguments import ModelArguments
    from finetune.models import apply_finetune_method, count_parameters
    from finetune.trainer import parameter_groups

    options = dict(zip(argv[::2], argv[1::2]))
    steps, batch_size = int(options.get("--steps", 0)), int(options.get("--batch_size", 8))
    model_args = ModelArguments(
        finetune_method=options.get("--finetune_method", "full"),
        layer_decay=float(options["--layer_decay"]) if "--layer_decay" in options else None,
    )
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(image_size=224, patch_size=16, num_labels=10))  # ViT-B/16 dims
    model = apply_finetune_method(model, model_args)
    trained = count_parameters(model, trainable=True)
    figures = {
        "method": method,
        "parameters": count_parameters(model),
        "trained_parameters": trained,
        "adamw_state_mib": 2 * 4 * trained / 2**20,  # exp_avg and exp_avg_sq, fp32
        "gradient_mib": 4 * trained / 2**20,
    }
    if steps:
        groups = parameter_groups(model, 1e-4, 0.05, model_args.layer_decay)
        optimizer = torch.optim.AdamW(groups)
        pixels = torch.randn(batch_size, 3, 224, 224)
        labels = torch.randint(0, 10, (batch_size,))
        times = []
        model.train()
        for _ in range(steps + 1):  # the first step (allocation, warm-up) is not timed
            start = time.perf_counter()
            loss = model(pixel_values=pixels, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        figures.update(
            step_seconds=sorted(times[1:])[len(times[1:]) // 2],
            batch_size=batch_size,
            threads=torch.get_num_threads(),
            peak_rss_mib=peak_rss_mib(),
        )
    return figures


def ensure_quickstart_source() -> Path:
    """The quickstart's pretrained source model (its stages 1 and 2), made when missing."""
    from finetune import quickstart, run

    root = Path("outputs/quickstart")
    if not (root / "source_init" / "config.json").exists():
        quickstart.make_source_init(root / "source_init")
    if not (root / "source_model" / "results.json").exists():
        run.main(["--config", str(quickstart.CONFIGS / "quickstart_source.yaml"), "--overwrite_output_dir", "true"])
    return root / "source_model"


def method_argv(kind: str, method: str, extra: list[str]) -> list[str]:
    if kind == "quickstart":
        slug = method.split(" ")[0] if method != "full + layer_decay 0.75" else "layer_decay"
        return [
            "--config", str(ROOT / "configs" / "quickstart.yaml"), "--model_type", "pretrained",
            "--output_dir", str(QUICKSTART_OUTPUT / slug), "--overwrite_output_dir", "true", "--report_to", "none",
            *METHODS[method], *extra,
        ]  # fmt: skip
    return [*METHODS[method], *extra]


def table(rows: list[dict], kind: str) -> str:
    def number(value, digits=1):
        return "—" if value is None else f"{value:,.{digits}f}"

    if kind == "quickstart":
        header = "| method | validation accuracy | macro F1 | trained parameters | s/step | peak RSS (MiB) |"
        lines = [header, "|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(
                f"| {r['method']} | {100 * r['validation_accuracy']:.2f}% | {number(r['macro_f1'], 4)} | "
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["quickstart", "vit_b16"])
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--steps", type=int, default=0, help="vit_b16: timed training steps per method (0: none).")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=8, help="vit_b16: images per step.")
    parser.add_argument(
        "--num_train_epochs", "--num-train-epochs", type=float, help="quickstart: epochs per method (config: 30)."
    )
    parser.add_argument("--output", help="Folder for <kind>.json and <kind>.md.")
    args = parser.parse_args(argv)
    if args.kind == "quickstart":
        ensure_quickstart_source()
    if args.kind == "quickstart":
        extra = ["--num_train_epochs", str(args.num_train_epochs)] if args.num_train_epochs else []
    else:
        extra = ["--steps", str(args.steps), "--batch_size", str(args.batch_size)]
    rows = []
    for method in args.methods:
        out = Path(f".finetune_methods_{os.getpid()}.json")
        command = [
            sys.executable,
            __file__,
            "--child",
            args.kind,
            method,
            str(out),
            *method_argv(args.kind, method, extra),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL if args.kind == "quickstart" else None)
        rows.append(json.loads(out.read_text()))
        out.unlink()
    text = table(rows, args.kind)
    print(text)
    if args.output:
        folder = Path(args.output)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{args.kind}.json").write_text(json.dumps(rows, indent=2) + "\n")
        (folder / f"{args.kind}.md").write_text(text + "\n")
    return rows


if __name__ == "__main__":
    main()
