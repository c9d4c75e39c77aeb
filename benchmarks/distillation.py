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

from finetune.errors import ArgumentParser, UsageError, error_line, run_command  # noqa: E402
from finetune.locations import make_folder  # noqa: E402


CONFIG = ROOT / "configs" / "quickstart_distilled.yaml"
TEACHER_SPLIT_SEED = "42"  # configs/quickstart.yaml's seed, which drew the split the teacher was trained on


def run_argv(output_dir: Path, argv: list[str]) -> list[str]:
    """The command line of the student run in `output_dir` with `argv` on top of the config."""
    return ["--config", str(CONFIG), "--output_dir", str(output_dir), "--overwrite_output_dir", "true", *argv]


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
        run.main(run_argv(output_dir, argv))
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
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", type=Path, default=Path("outputs/quickstart/pretrained"))
    parser.add_argument("--runs", type=Path, default=Path("outputs/distillation"), help="where the students train")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "distillation")
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=[TEACHER_SPLIT_SEED], help="training seeds of each pair"
    )
    args, extra = parser.parse_known_args(argv)
    if not (args.teacher / "results.json").exists():
        parser.error(f"no trained teacher at {args.teacher}: run `python -m finetune.tools.quickstart` first.")
    students = {}  # (seed, "alone" or "taught"): (folder, argv), in the order they train
    for seed in args.seeds:
        suffix = "" if seed == args.seeds[0] else f"_seed{seed}"
        common = ["--seed", str(seed), "--data_seed", TEACHER_SPLIT_SEED, "--report_to", "none"]
        alone_argv = [*common, "--teacher_model_name_or_path", "null"]
        taught_argv = [*common, "--teacher_model_name_or_path", str(args.teacher), *extra]
        students[seed, "alone"] = args.runs / f"scratch_alone{suffix}", alone_argv
        students[seed, "taught"] = args.runs / f"scratch_taught{suffix}", taught_argv
    from finetune.arguments import parse_args

    for folder, student_argv in students.values():  # read as its run will: a malformed option failed after training
        parse_args(run_argv(folder, student_argv))
    from finetune.tools.compare import check_report_folder, write_comparison

    check_report_folder(args.output)  # found in the way only after training, it lost the report
    make_folder(args.output)

    for (seed, kind), (folder, student_argv) in students.items():
        name = "student alone" if kind == "alone" else "taught student"
        train(f"{name} of seed {seed}", folder, student_argv)
    accuracies = {}
    for (seed, kind), (folder, _) in students.items():
        accuracies.setdefault(seed, {})[kind] = figures(folder)["validation_accuracy"]
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
