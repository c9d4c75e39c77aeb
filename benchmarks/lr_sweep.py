"""Where a small ScratchViT diverges: a learning-rate sweep, float32 against bf16 autocast, with and without qk_norm.

    python benchmarks/lr_sweep.py --dataset_name ../shared/data/cifar10-jpeg/train.parquet \
        --output benchmarks/results/lr_sweep                     # 20 runs of 400 steps; about 70 min on 2 cores
    python benchmarks/lr_sweep.py --learning_rates 3e-3 1e-1 --variants bf16 bf16_qk_norm --max_steps 200 ...

The method of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities"):
instabilities of large models show in small ones once the learning rate is raised, so a sweep of small models over
learning rates shows which change removes them. Every run trains the same model (`BASE`: a convolutional stem, hidden
96, 4 layers of 3 heads of 32 channels, mean pooling: the GPU recipe's encoder at a quarter of its width and half its
depth) for the same `--max_steps` steps (warmup, then cosine decay), through `benchmarks/sweep.py` and the real
pipeline, with SDPA attention (the kernel a GPU runs). A run that goes non-finite is stopped by the pipeline's guard
and reported with its first non-finite step. For every run that finished, the largest attention logit
|q.k|/sqrt(d) over the layers is measured on 512 validation images: its growth is the instability qk_norm removes
(Dehghani et al. 2023).

bf16 autocast is slow on a CPU without native bf16 (AVX512-BF16/AMX): run the sweep on one with it, or on a GPU. Writes
OUT/lr_sweep.md and OUT/lr_sweep.json (one row per learning rate, a column per variant), OUT/lr_sweep.png (validation
accuracy and largest attention logit against the learning rate) and the sweep's own files (OUT/sweep.*, OUT/runs/).
"""

import argparse
import json
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import sweep  # noqa: E402
import torch  # noqa: E402

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import check_folder, make_folder  # noqa: E402
from finetune.tools.report import MISSING, format_number, format_percent, markdown_table  # noqa: E402


# The model and schedule every run shares (on top of configs/cifar10_scratch.yaml), and the variants compared.
BASE = [
    "--patch_embedding_type", "conv_stem", "--hidden_size", "96", "--num_hidden_layers", "4",
    "--num_attention_heads", "3", "--intermediate_size", "384", "--pooling", "mean",
    "--attn_implementation", "sdpa", "--per_device_train_batch_size", "128", "--per_device_eval_batch_size", "500",
    "--lr_scheduler_type", "cosine", "--weight_decay", "0.05", "--adam_beta2", "0.99", "--max_grad_norm", "1.0",
    "--label_smoothing_factor", "0.1", "--eval_strategy", "steps", "--save_strategy", "steps",
    "--load_best_model_at_end", "false", "--logging_steps", "25", "--report_to", "none", "--torch_compile", "false",
]  # fmt: skip
VARIANTS = {
    "float32": ["--bf16", "false"],
    "bf16": ["--bf16", "true"],
    "float32_qk_norm": ["--bf16", "false", "--qk_norm", "true"],
    "bf16_qk_norm": ["--bf16", "true", "--qk_norm", "true"],
}
LEARNING_RATES = ("1e-3", "3e-3", "1e-2", "3e-2", "1e-1")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset_name", default=sweep.from_here("../shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument("--output", default=sweep.from_here("benchmarks/results/lr_sweep"))
    parser.add_argument("--validation_size", type=int, default=5000, help="Training images held out (seeded 42).")
    parser.add_argument("--decoded_cache_dir", default=None, help="As finetune.run's (default: under HF_HOME).")
    parser.add_argument("--learning_rates", nargs="+", default=list(LEARNING_RATES))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--max_steps", type=int, default=400)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--logit_images", type=int, default=512, help="Validation images the logits are measured on.")
    parser.add_argument("--report_only", action="store_true", help="Only rewrite the report from OUTPUT's runs.")
    return parser.parse_known_args(argv)


def run_name(variant: str, learning_rate: str) -> str:
    return f"{variant}_lr{learning_rate}"


@torch.no_grad()
def largest_attention_logit(run_dir: Path, data, num_images: int) -> float | None:
    """max |q.k| / sqrt(d) over the layers, heads and token pairs of `num_images` validation images of `data` (an
    `ImageData`), in float32; `None` where the run saved no model."""
    from finetune.arguments import ModelArguments
    from finetune.augment import BatchTransform
    from finetune.models import load_trained_model

    if not (run_dir / "model.safetensors").is_file():
        return None
    model_args = ModelArguments(model_name_or_path=str(run_dir), model_type="scratch", attn_implementation="sdpa")
    model, _, prep = load_trained_model(model_args, data)
    transform = BatchTransform.for_model(prep, data.num_channels)
    batch = data.validation.__getitems__(list(range(min(num_images, len(data.validation)))))
    largest, captured = 0.0, {}
    hooks = []
    for attention in (m for m in model.modules() if type(m).__name__ == "ScratchViTAttention"):
        hooks.append(attention.q_norm.register_forward_hook(lambda m, i, out, a=attention: captured.update(q=out)))

        def logits(module, inputs, k, a=attention):
            nonlocal largest
            scores = captured["q"].float() @ k.float().transpose(-2, -1) * a.scale  # (B, nh, T, T)
            largest = max(largest, scores.abs().max().item())

        hooks.append(attention.k_norm.register_forward_hook(logits))
    model(pixel_values=transform(batch["pixel_values"], train=False))
    for hook in hooks:
        hook.remove()
    return largest


def table(rows: dict[str, dict[str, dict]], variants: list[str], learning_rates: list[str]) -> str:
    """One row per learning rate, one cell per variant: validation accuracy, last training loss and the largest
    attention logit, or where the run diverged."""

    def cell(row: dict | None) -> str:
        if row is None:
            return MISSING
        if row["status"] == "diverged":
            return f"**diverged** at step {row['first_nonfinite_step']}"
        if row["status"] != "finished":
            return f"failed: {row['error']}"
        logit = format_number(row.get("largest_attention_logit"), 0)
        skipped = f", {row['nonfinite_steps']} steps skipped" if row["nonfinite_steps"] else ""
        return (
            f"{format_percent(row['validation_accuracy'])} (loss {format_number(row['last_train_loss'], 2)}, "
            f"logit {logit}{skipped})"
        )

    return markdown_table(
        ["learning rate", *variants], [[lr, *(cell(rows[v].get(lr)) for v in variants)] for lr in learning_rates]
    )


def plot(rows: dict[str, dict[str, dict]], variants: list[str], learning_rates: list[str], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    accuracy_ax, logit_ax = fig.subplots(1, 2)
    rates = [float(lr) for lr in learning_rates]
    for variant in variants:
        runs = [rows[variant].get(lr) or {} for lr in learning_rates]
        accuracy = [r.get("validation_accuracy") if r.get("status") == "finished" else 0.1 for r in runs]
        logits = [r.get("largest_attention_logit") for r in runs]
        style = "--" if variant.startswith("float32") else "-"
        accuracy_ax.plot(rates, [100 * (a or 0.1) for a in accuracy], style, marker="o", label=variant)
        logit_ax.plot(rates, [v if v else float("nan") for v in logits], style, marker="o", label=variant)
    accuracy_ax.set(xscale="log", xlabel="peak learning rate", ylabel="validation accuracy (%); diverged = 10")
    logit_ax.set(xscale="log", yscale="log", xlabel="peak learning rate", ylabel="largest attention logit")
    accuracy_ax.legend()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    args, shared = parse_args(argv)
    # Checked now, made once the data has loaded: a report of nothing, or data that cannot be read, makes nothing.
    output = Path(args.output) if args.report_only else check_folder(args.output)
    schedule = ["--max_steps", str(args.max_steps), "--warmup_steps", str(args.warmup_steps)]
    schedule += ["--eval_steps", str(args.max_steps), "--save_steps", str(args.max_steps)]
    data_settings = ["--dataset_name", args.dataset_name, "--validation_size", str(args.validation_size)]
    if args.decoded_cache_dir:
        data_settings += ["--decoded_cache_dir", args.decoded_cache_dir]
    common = [*data_settings, *BASE, *schedule, *shared]
    variants = [
        sweep.Variant(run_name(v, lr), [*VARIANTS[v], "--learning_rate", lr])
        for v in args.variants
        for lr in args.learning_rates
    ]
    if args.report_only:
        found = [sweep.collect(output / "runs" / v.name) for v in variants if (output / "runs" / v.name).is_dir()]
        if not found:
            raise FileNotFoundError(
                f"No runs of these variants and learning rates in {output / 'runs'}. Fix: run them first: `python "
                f"benchmarks/lr_sweep.py --output {output}` with the same --variants and --learning_rates."
            )
    from finetune.arguments import DataArguments
    from finetune.data import load_image_data

    # The validation split of the runs (seed 42, as configs/cifar10_scratch.yaml), loaded before them: a dataset that
    # cannot be read stops the sweep at once instead of failing every run.
    cache = {"decoded_cache_dir": args.decoded_cache_dir} if args.decoded_cache_dir else {}
    data_args = DataArguments(dataset_name=args.dataset_name, validation_size=args.validation_size, **cache)
    data = load_image_data(data_args, seed=42, target_size=32)
    if not args.report_only:
        config = sweep.from_here("configs/cifar10_scratch.yaml")
        found = sweep.run_variants(config, variants, make_folder(output), common, parallel=args.parallel)
    sweep.write_report(output, found, "Learning-rate sweep: the runs")
    rows: dict[str, dict[str, dict]] = {v: {} for v in args.variants}
    for row in found:
        variant, _, lr = row["name"].rpartition("_lr")
        run_dir = output / "runs" / row["name"]
        row["largest_attention_logit"] = largest_attention_logit(run_dir, data, args.logit_images)
        rows[variant][lr] = row
    text = "\n\n".join(
        [
            f"# Learning-rate sweep: {args.max_steps} steps, warmup {args.warmup_steps}, cosine decay",
            f"Validation accuracy on {args.validation_size:,} held-out training images (last training loss, largest "
            f"attention logit |q.k|/sqrt(d) on {args.logit_images} validation images).",
            table(rows, args.variants, args.learning_rates),
            "![validation accuracy and largest attention logit against the learning rate](lr_sweep.png)",
        ]
    )
    (output / "lr_sweep.md").write_text(text + "\n")
    (output / "lr_sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, args.variants, args.learning_rates, output / "lr_sweep.png")
    print(text)
    if not args.report_only:
        sweep.check_finished(found, output)
    return rows


if __name__ == "__main__":
    sys.exit(run_command(main))
