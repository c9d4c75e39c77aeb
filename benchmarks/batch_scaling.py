"""How the learning rate should follow the batch size when fine-tuning: a learning-rate sweep at 16x the batch.

    python benchmarks/batch_scaling.py --dataset_name ../shared/data/cifar10-jpeg/train.parquet \
        --output benchmarks/results/batch_scaling                     # about 30 minutes on 2 CPU cores

The fine-tuning case of `finetune_methods.py cifar10` (a small ViT "pretrained" offline on five CIFAR-10 classes,
fine-tuned in full on the other five for 3 epochs, AdamW with warmup and cosine decay), at batch 32 with a learning
rate of 5e-4, then at batch 512 (16x) over learning rates from 5e-4 (unscaled) to 8e-3 (scaled linearly), with 2e-3
(scaled by the square root, Malladi et al. 2022) between. Every run sees the same images for the same epochs, so the
512 runs take 16x fewer steps. Writes OUT/sweep.md and OUT/sweep.json (`benchmarks/sweep.py`): validation accuracy
per run. `configs/cifar10_vit_b16_large_batch.yaml` applies the rule this checks.
"""

import argparse
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import finetune_methods  # noqa: E402
import sweep  # noqa: E402

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402


BASE_BATCH, BASE_RATE, FACTOR = 32, 5e-4, 16
RATES = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)


def variants(base_batch: int, base_rate: float, factor: int, rates) -> list[sweep.Variant]:
    """The small-batch run and the large-batch runs, named by batch and learning rate."""
    runs = [(base_batch, base_rate)] + [(base_batch * factor, rate) for rate in rates]
    return [
        sweep.Variant(
            f"batch{batch}_lr{rate:g}", ["--per_device_train_batch_size", str(batch), "--learning_rate", f"{rate:g}"]
        )
        for batch, rate in runs
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset_name", default=sweep.from_here("../shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument("--output", default=sweep.from_here("benchmarks/results/batch_scaling"))
    parser.add_argument("--work_dir", default=str(finetune_methods.CIFAR10_OUTPUT), help="Where the source is made.")
    parser.add_argument("--base_batch", type=int, default=BASE_BATCH)
    parser.add_argument("--base_rate", type=float, default=BASE_RATE)
    parser.add_argument("--factor", type=int, default=FACTOR)
    parser.add_argument("--rates", type=float, nargs="+", default=list(RATES))
    parser.add_argument("--num_train_epochs", type=float, default=3)
    parser.add_argument("--source_epochs", type=float, default=12)
    args, shared = parser.parse_known_args(argv)
    output = make_folder(args.output)
    work = Path(args.work_dir)
    finetune_methods.ensure_cifar10_source(args.dataset_name, args.source_epochs, work, shared)
    # The `full` method's run, its learning rate, batch and output folder left to the variants.
    base = finetune_methods.method_argv("cifar10", "full", ["--dataset_name", args.dataset_name], work)
    base = [a for a in base[: base.index("--learning_rate")]] + base[base.index("--learning_rate") + 2 :]
    base = base[: base.index("--output_dir")] + base[base.index("--output_dir") + 2 :]
    base += ["--num_train_epochs", str(args.num_train_epochs), "--warmup_steps", "0.05", *shared]
    runs = variants(args.base_batch, args.base_rate, args.factor, args.rates)
    rows = sweep.run_variants(None, runs, output, base)
    title = (
        f"Batch {args.base_batch} against {args.base_batch * args.factor} ({args.factor}x), full fine-tuning, "
        f"{args.num_train_epochs:g} epochs"
    )
    print(sweep.write_report(output, rows, title))
    sweep.check_finished(rows, output)
    return rows


if __name__ == "__main__":
    sys.exit(run_command(main))
