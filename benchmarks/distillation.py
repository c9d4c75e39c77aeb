"""Knowledge distillation on the quickstart: its fine-tuned "pretrained" ViT teaching its ScratchViT, against the same
ScratchViT trained alone on the same data, split, epochs and seed.

Needs the quickstart's teacher (`python -m finetune.tools.quickstart` writes outputs/quickstart/pretrained). Trains the
student alone (`configs/quickstart_distilled.yaml` without its teacher) and taught (with it), each skipped when its
results.json exists, then writes the comparison report of teacher, student alone and student taught (validation
accuracy, images/s of the training loop) and `distillation.json` into `--output`. Further `--key value` arguments
go to the taught run only (e.g. `--distillation_temperature 4`).

    python -m finetune.tools.quickstart
    python benchmarks/distillation.py --output benchmarks/results/distillation
"""

import argparse
import json
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "configs" / "quickstart_distilled.yaml"


def train(output_dir: Path, argv: list[str]) -> None:
    from finetune import run

    if (output_dir / "results.json").exists():
        print(f"{output_dir} is trained already; kept.", flush=True)
        return
    run.main(["--config", str(CONFIG), "--output_dir", str(output_dir), "--overwrite_output_dir", "true", *argv])


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
    args, extra = parser.parse_known_args(argv)
    if not (args.teacher / "results.json").exists():
        parser.error(f"no trained teacher at {args.teacher}: run `python -m finetune.tools.quickstart` first.")
    from finetune.tools.compare import write_comparison

    alone, taught = args.runs / "scratch_alone", args.runs / "scratch_taught"
    train(alone, ["--teacher_model_name_or_path", "null", "--report_to", "none"])
    train(taught, ["--teacher_model_name_or_path", str(args.teacher), "--report_to", "none", *extra])
    runs = {"teacher": args.teacher, "alone": alone, "taught": taught}
    report = write_comparison(list(runs.values()), args.output)
    summary = {name: figures(path) for name, path in runs.items()}
    (args.output / "distillation.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, row in summary.items():
        print(
            f"{name:8s} {row['architecture']:28s} validation accuracy {row['validation_accuracy']:.2%}, "
            f"{row['train_images_per_second'] or 0:.0f} training images/s",
            flush=True,
        )
    print(report)
    return summary


if __name__ == "__main__":
    main()
