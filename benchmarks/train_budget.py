"""Train configs for a wall-clock budget through `finetune/run.py` and report validation accuracy over time.

    python benchmarks/train_budget.py --config configs/cifar10_scratch_cpu30.yaml --minutes 30 \
        --output benchmarks/results/cpu30 [--key value ...]
    python benchmarks/train_budget.py --minutes 30 --output benchmarks/results/cpu30 \
        --config configs/cifar10_scratch.yaml --config configs/cifar10_scratch_cpu30.yaml
    python benchmarks/train_budget.py --report_only --output benchmarks/results/cpu30

Each config runs in its own `python -m finetune.run` process, one after the other, with `--max_train_minutes M`
(the `TrainingBudgetCallback` stops it once the budget is spent; evaluation, saving and the test then run as after any
run) and `--output_dir OUTPUT/runs/<config name>` (ignored by git: models stay out of the repository). Extra
`--key value` arguments are passed to every run. Afterwards, and with `--report_only`, it reports every run in
OUTPUT/runs (also those of earlier commands, so configs trained one at a time share one plot) and writes:

- `OUTPUT/curve.png`: validation accuracy (y) against wall-clock minutes of training (x), one line per config;
- `OUTPUT/results.md`: a summary table (final and best validation accuracy, test accuracy when there is a test split,
  minutes, epochs, training images/s, the share of training time spent on data, hardware, the exact command) and one
  timeline table (minutes, epoch, accuracy) per config;
- `OUTPUT/summary.json`: the same numbers, machine-readable.

benchmarks/README.md links these files rather than copying their numbers.
"""

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a clone without `pip install -e .`
sys.path.insert(0, str(ROOT / "benchmarks"))

from sweep import from_here  # noqa: E402

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.hardware import short_name  # noqa: E402
from finetune.locations import make_folder  # noqa: E402
from finetune.results import Results  # noqa: E402
from finetune.tools.report import (  # noqa: E402
    MISSING,
    format_count,
    format_number,
    format_percent,
    markdown_table,
)


logger = logging.getLogger("train_budget")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], help="A YAML config of finetune/run.py (repeatable).")
    parser.add_argument("--minutes", type=float, help="Wall-clock training budget of each run, in minutes.")
    parser.add_argument(
        "--output",
        default=from_here("benchmarks/results/train_budget"),
        help="Folder for runs and reports.",
    )
    parser.add_argument(
        "--report_only", "--report-only", action="store_true", help="Only (re)write the report from OUTPUT's runs."
    )
    parser.add_argument(
        "--suffix",
        default="",
        help="Append `_SUFFIX` to each run's name (its folder in OUTPUT/runs), e.g. `--suffix seed1 --seed 1` to rerun"
        " a config with another seed next to the first run instead of over it.",
    )
    args, overrides = parser.parse_known_args(argv)
    if not args.report_only:
        if not args.config:
            parser.error("give at least one --config (or --report-only)")
        if args.minutes is None or args.minutes <= 0:
            parser.error("--minutes must be > 0")
    return args, overrides


def run_name(config: str, suffix: str = "") -> str:
    return Path(config).stem + (f"_{suffix}" if suffix else "")


def train(config: str, minutes: float, output: Path, overrides: list[str], suffix: str = "") -> list[str]:
    """Train one config in its own process; returns the exact command, or raises naming the run that failed."""
    run_dir = output / "runs" / run_name(config, suffix)
    # Started in the current folder, so that the user's relative paths (`--dataset_name data/x.parquet`) hold.
    command = [
        sys.executable,
        from_here("benchmarks/timed_run.py"),
        "--config",
        config,
        "--max_train_minutes",
        str(minutes),
        "--output_dir",
        os.path.relpath(run_dir),
        "--overwrite_output_dir",
        "true",
        *overrides,
    ]
    logger.info(f"Training {config} for {minutes} min: {shlex.join(command)}")
    if status := subprocess.run(command).returncode:
        raise RuntimeError(
            f"The run of {config} ended with exit status {status} (its output is above); the runs that finished are "
            f"kept in {output / 'runs'}."
        )
    # Recorded as typed in the folder the benchmark ran in: no interpreter path, no absolute paths of this machine.
    typed = shlex.join(["python", *command[1:]])
    (run_dir / "command.txt").write_text(typed + "\n")
    return command


def collect(run_dir: Path) -> dict:
    """The numbers of one finished run, from its `results.json` (`finetune/results.py`)."""
    results = Results.load(run_dir)
    history = [h for h in results.history if h.elapsed_seconds is not None]
    train = results.train
    command_file = run_dir / "command.txt"
    return {
        "name": run_dir.name,
        "validation_accuracy": results.validation.accuracy if results.validation else None,
        "best_history_accuracy": max((h.eval_accuracy for h in history if h.eval_accuracy is not None), default=None),
        "test_accuracy": results.test.accuracy if results.test else None,
        "minutes": history[-1].elapsed_seconds / 60 if history else None,
        "epochs": results.epochs,
        "images_per_second": train.images_per_second,
        "data_share": train.data_seconds / train.seconds if train.seconds and train.data_seconds is not None else None,
        "num_parameters": results.num_parameters,
        "hardware": short_name(results.hardware),
        "mixed_precision": results.hyperparameters.get("mixed_precision"),
        "command": command_file.read_text().strip() if command_file.exists() else None,
        "timeline": [
            {"minutes": h.elapsed_seconds / 60, "epoch": h.epoch, "accuracy": h.eval_accuracy} for h in history
        ],
    }


def markdown(runs: list[dict]) -> str:
    headers = [
        "run",
        "validation accuracy",
        "best during training",
        "test accuracy",
        "minutes",
        "epochs",
        "images/s",
        "data share of step time",
        "parameters",
        "precision",
        "hardware",
    ]
    rows = [
        [
            r["name"],
            format_percent(r["validation_accuracy"]),
            format_percent(r["best_history_accuracy"]),
            format_percent(r["test_accuracy"]),
            format_number(r["minutes"], 1),
            format_number(r["epochs"], 1),
            format_number(r["images_per_second"], 0),
            format_percent(r["data_share"]),
            format_count(r["num_parameters"]),
            {"no": "float32"}.get(r["mixed_precision"], r["mixed_precision"]) or MISSING,
            r["hardware"] or MISSING,
        ]
        for r in runs
    ]
    parts = [markdown_table(headers, rows), "![validation accuracy against minutes](curve.png)"]
    for r in runs:
        parts.append(f"**{r['name']}**" + (f": `{r['command']}`" if r["command"] else ""))
        parts.append(
            markdown_table(
                ["minutes", "epoch", "validation accuracy"],
                [
                    [format_number(t["minutes"], 1), format_number(t["epoch"], 1), format_percent(t["accuracy"])]
                    for t in r["timeline"]
                ],
            )
        )
    return "\n\n".join(parts) + "\n"


def plot_accuracy_over_time(runs: list[dict], path: Path) -> None:
    """Validation accuracy against wall-clock minutes, one line per run (`collect`'s timeline)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for run in runs:
        points = [(t["minutes"], 100 * t["accuracy"]) for t in run["timeline"] if t["accuracy"] is not None]
        if points:
            ax.plot(*zip(*points), marker=".", label=run["name"])
    ax.set(xlabel="Wall-clock minutes of training (evaluations included)", ylabel="Validation accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)


def report(output: Path, names: list[str] | None = None) -> str:
    """Write curve.png, results.md and summary.json for the runs in `output`; returns the Markdown."""
    if names is None:
        names = sorted(p.parent.name for p in output.glob("runs/*/results.json"))
    if not names:
        raise FileNotFoundError(
            f"No finished runs (runs/*/results.json) in {output}. Fix: train some first: `python "
            f"benchmarks/train_budget.py --config CONFIG --minutes M --output {output}`."
        )
    runs = [collect(output / "runs" / name) for name in names]
    plot_accuracy_over_time(runs, output / "curve.png")
    text = markdown(runs)
    (output / "results.md").write_text(text)
    (output / "summary.json").write_text(json.dumps(runs, indent=2))
    return text


def main(argv: list[str] | None = None) -> str:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(message)s")
    args, overrides = parse_args(argv)
    output = Path(args.output)
    if not args.report_only:
        make_folder(output)
        try:
            for config in args.config:
                train(config, args.minutes, output, overrides, args.suffix)
        except RuntimeError:
            if any(output.glob("runs/*/results.json")):
                print(report(output))  # the runs that finished, before the one that failed is named
            raise
    # Every run in OUTPUT, so runs trained by separate commands end up on one plot and in one table.
    text = report(output)
    print(text)
    return text


if __name__ == "__main__":
    sys.exit(run_command(main))
