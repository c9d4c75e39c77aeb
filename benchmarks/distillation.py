"""Knowledge distillation on the quickstart: its fine-tuned "pretrained" ViT teaching its ScratchViT, against the same
ScratchViT trained alone on the same data, split, epochs and seed.

Needs the quickstart's teacher (`python -m finetune.tools.quickstart` writes outputs/quickstart/pretrained). Trains the
student alone (`configs/quickstart_distilled.yaml` without its teacher) and taught (with it), each skipped when its
folder holds a finished run of the same options, then writes the comparison report of teacher, student alone and
student taught (validation accuracy, images/s of the training loop) and `distillation.json` into `--output`. Further
`--key value` arguments go to the taught runs only (e.g. `--distillation_temperature 4`). `--seeds` repeats the pair
with other training seeds on the teacher's split (`data_seed` 42: another split would validate on images the teacher
trained on); the report shows the first seed's runs, `distillation.json` every seed's accuracies.

    python -m finetune.tools.quickstart
    python benchmarks/distillation.py --seeds 42 1 2 --output benchmarks/results/distillation
"""

import argparse
import json
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from finetune.errors import UsageError, error_line, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402


CONFIG = ROOT / "configs" / "quickstart_distilled.yaml"
TEACHER_SPLIT_SEED = "42"  # configs/quickstart.yaml's seed, which drew the split the teacher was trained on


def train(name: str, output_dir: Path, argv: list[str]) -> None:
    """Train unless `output_dir` holds a finished run of the same arguments (`benchmark_argv.json` records them): a
    rerun with other options (`--distillation_temperature 4`) trains anew, where the earlier run was reported. A run
    that fails ends the benchmark with its error, named as the run `name`."""
    from finetune import run

    recorded = output_dir / "benchmark_argv.json"
    if (output_dir / "results.json").exists() and recorded.exists() and json.loads(recorded.read_text()) == argv:
        print(f"{output_dir} is trained already with these options; kept.", flush=True)
        return
    try:
        run.main(["--config", str(CONFIG), "--output_dir", str(output_dir), "--overwrite_output_dir", "true", *argv])
    except Exception as error:  # its line says what went wrong, not in which of the runs
        kind = UsageError if isinstance(error, UsageError) else RuntimeError  # a malformed option keeps status 2
        raise kind(f"The {name} ({output_dir}) failed: {error_line(error)}") from error
    recorded.write_text(json.dumps(argv))


def figures(run_dir: Path) -> dict:
    from finetune.results import Results

    results = Results.load(run_dir)
    return {
        "run_dir": str(run_dir),
        "architecture": results.architecture,
        "parameters": results.num_parameters,
        "epochs": results.epochs,
        "teacher": results.hyperparameters.get("teacher_model_name_or_path"),
        "distillation": {k: v for k, v in results.hyperparameters.items() if k.startswith("distillation_")},
        "validation_accuracy": results.validation.accuracy,
        "train_seconds": results.train.seconds,
        "train_images_per_second": results.train.images_per_second,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", type=Path, default=Path("outputs/quickstart/pretrained"))
    parser.add_argument("--runs", type=Path, default=Path("outputs/distillation"), help="where the students train")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "distillation")
    parser.add_argument("--seeds", nargs="+", default=[TEACHER_SPLIT_SEED], help="training seeds of each pair")
    args, extra = parser.parse_known_args(argv)
    if not (args.teacher / "results.json").exists():
        parser.error(f"no trained teacher at {args.teacher}: run `python -m finetune.tools.quickstart` first.")
    make_folder(args.output)  # made now: found in the way only after training, it lost the report
    from finetune.tools.compare import write_comparison

    accuracies = {}
    for seed in args.seeds:
        suffix = "" if seed == args.seeds[0] else f"_seed{seed}"
        alone, taught = args.runs / f"scratch_alone{suffix}", args.runs / f"scratch_taught{suffix}"
        common = ["--seed", seed, "--data_seed", TEACHER_SPLIT_SEED, "--report_to", "none"]
        train(f"student alone of seed {seed}", alone, [*common, "--teacher_model_name_or_path", "null"])
        taught_argv = [*common, "--teacher_model_name_or_path", str(args.teacher), *extra]
        train(f"taught student of seed {seed}", taught, taught_argv)
        accuracies[seed] = {
            name: figures(path)["validation_accuracy"] for name, path in (("alone", alone), ("taught", taught))
        }
    runs = {"teacher": args.teacher, "alone": args.runs / "scratch_alone", "taught": args.runs / "scratch_taught"}
    report = write_comparison(list(runs.values()), args.output)
    summary = {name: figures(path) for name, path in runs.items()}
    summary["validation_accuracy_per_seed"] = accuracies
    (args.output / "distillation.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, row in summary.items():
        if name not in runs:
            continue
        print(
            f"{name:8s} {row['architecture']:28s} validation accuracy {row['validation_accuracy']:.2%}, "
            f"{row['train_images_per_second'] or 0:.0f} training images/s",
            flush=True,
        )
    for seed, row in accuracies.items():
        print(f"seed {seed}: alone {row['alone']:.2%}, taught {row['taught']:.2%}", flush=True)
    print(report)
    return summary


if __name__ == "__main__":
    sys.exit(run_command(main))
