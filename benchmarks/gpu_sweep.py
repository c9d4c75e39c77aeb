"""Tune the scratch GPU recipe in one command: variants of `configs/cifar10_scratch_gpu.yaml` trained side by side on
one GPU for a few minutes each, through `benchmarks/sweep.py`.

    python benchmarks/gpu_sweep.py --data .gpu_data/cifar10/train.parquet --output benchmarks/results/gpu/sweep
    python benchmarks/gpu_sweep.py --variants as_shipped no_qk_norm --minutes 10 --data ... --output ...
    python benchmarks/gpu_sweep.py --variant "warmup_2k=--warmup_steps 2000" --data ... --output ...   # and others
    python benchmarks/gpu_sweep.py --tiny --data small.parquet --output OUT      # a CPU-sized run (the tests)

Every variant runs at once by default (one H100 held six scratch-recipe runs side by side); they then share the GPU,
so compare images/s within one sweep only. Writes OUT/sweep.md and OUT/sweep.json: per variant, whether it finished
or diverged, the first non-finite step, validation accuracy at each minute, best and final accuracy, images/s and the
data share of step time (the data path of one step in 25 is timed on a GPU). Runs go to OUT/runs (not committed).
A run that failed (one that diverged is a finding) ends the sweep, once the report is written, with one line naming it.
"""

import argparse
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import sweep  # noqa: E402

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402


CONFIG = ROOT / "configs" / "cifar10_scratch_gpu.yaml"
# What each variant changes in the recipe; `as_shipped` is the recipe itself.
VARIANTS = {
    "as_shipped": [],
    "no_qk_norm": ["--qk_norm", "false"],
    "float32": ["--bf16", "false"],
    "lr_1e-3": ["--learning_rate", "1e-3"],
    "lr_4e-3": ["--learning_rate", "4e-3"],
    "no_mixup_cutmix": ["--mixup_alpha", "0", "--cutmix_alpha", "0"],
}
# A CPU-sized run of the same code paths, for the test suite.
TINY = [
    "--max_train_samples", "128", "--max_eval_samples", "64", "--validation_size", "64", "--hidden_size", "32",
    "--num_hidden_layers", "1", "--num_attention_heads", "2", "--intermediate_size", "64",
    "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--torch_compile", "false",
    "--decoded_cache_dir", "none", "--report_to", "none", "--warmup_steps", "1", "--num_train_epochs", "2",
]  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/gpu/sweep"))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--variant", action="append", default=[], help="Another variant: `NAME=--key value ...`.")
    parser.add_argument("--minutes", type=float, default=6.0, help="Wall-clock training budget of each variant.")
    parser.add_argument("--parallel", type=int, default=None, help="Variants at once (default: all).")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized models and data (what the tests run).")
    args, shared = parser.parse_known_args(argv)
    if args.parallel is not None and args.parallel < 1:  # 0 meant all at once; below, ThreadPoolExecutor's error
        parser.error("--parallel must be >= 1 (leave it out to run every variant at once)")
    variants = [sweep.Variant(name, VARIANTS[name]) for name in args.variants]
    variants += [sweep.Variant.parse(text) for text in args.variant]
    common = ["--dataset_name", args.data, *(TINY if args.tiny else []), *shared]
    output = make_folder(args.output)
    parallel = len(variants) if args.parallel is None else args.parallel
    rows = sweep.run_variants(sweep.from_here(CONFIG), variants, output, common, args.minutes, parallel)
    title = f"Scratch GPU recipe: {len(variants)} variants side by side, {args.minutes:g} minutes each"
    print(sweep.write_report(output, rows, title))
    sweep.check_finished(rows, output)
    return rows


if __name__ == "__main__":
    sys.exit(run_command(main))
