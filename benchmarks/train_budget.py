"""Train configs for a wall-clock budget through `finetune/run.py` and report validation accuracy over time.

    python benchmarks/train_budget.py --config configs/cifar10_scratch_cpu30.yaml --minutes 30 \
        --output benchmarks/results/cpu30 [--key value ...]
    python benchmarks/train_budget.py --minutes 30 --output benchmarks/results/cpu30 \
        --config configs/cifar10_scratch.yaml --config configs/cifar10_scratch_cpu30.yaml
    python benchmarks/train_budget.py --report-only --output benchmarks/results/cpu30 --update-readme README.md

Each config runs in its own `python finetune/run.py` process, one after the other, with `--max_train_minutes M`
(the `TrainingBudgetCallback` stops it once the budget is spent; evaluation, saving and the test then run as after any
run) and `--output_dir OUTPUT/runs/<config name>` (ignored by git: models stay out of the repository). Extra
`--key value` arguments are passed to every run. Afterwards, and with `--report-only`, it reports every run in
OUTPUT/runs (also those of earlier commands, so configs trained one at a time share one plot) and writes:

- `OUTPUT/curve.png`: validation accuracy (y) against wall-clock minutes of training (x), one line per config;
- `OUTPUT/results.md`: a summary table (final and best validation accuracy, test accuracy when there is a test split,
  minutes, epochs, training images/s, the share of training time spent on data, hardware, the exact command) and one
  timeline table (minutes, epoch, accuracy) per config;
- `OUTPUT/summary.json`: the same numbers, machine-readable.

`--update-readme FILE` replaces the text between `<!-- train_budget:NAME:start -->` and `<!-- train_budget:NAME:end
-->` in FILE (NAME is the output folder's name) with `results.md`, so the README's numbers come from these files.
"""

import argparse
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path


logger = logging.getLogger("train_budget")

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], help="A YAML config of finetune/run.py (repeatable).")
    parser.add_argument("--minutes", type=float, help="Wall-clock training budget of each run, in minutes.")
    parser.add_argument("--output", default="benchmarks/results/train_budget", help="Folder for runs and reports.")
    parser.add_argument("--report-only", action="store_true", help="Only (re)write the report from OUTPUT's runs.")
    parser.add_argument("--update-readme", metavar="FILE", help="Replace this report's marked section in FILE.")
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
    """Train one config in its own process; returns the exact command."""
    run_dir = output / "runs" / run_name(config, suffix)
    command = [
        sys.executable,
        "finetune/run.py",
        "--config",
        config,
        "--max_train_minutes",
        str(minutes),
        "--output_dir",
        str(run_dir),
        "--overwrite_output_dir",
        "true",
        *overrides,
    ]
    logger.info(f"Training {config} for {minutes} min: {shlex.join(command)}")
    subprocess.run(command, cwd=ROOT, check=True)
    # Recorded as typed from the repository root, not with this machine's interpreter path.
    typed = shlex.join(["python", *command[1:]])
    (run_dir / "command.txt").write_text(typed + "\n")
    return command


def hardware() -> str:
    import torch

    if torch.cuda.is_available():
        return f"1x {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} threads"


def collect(run_dir: Path) -> dict:
    """The numbers of one finished run, from its `results.json` and `trainer_state.json`."""
    results = json.loads((run_dir / "results.json").read_text())
    history = [h for h in results["history"] if h.get("elapsed_seconds") is not None]
    train = results["train"]
    seconds, data_seconds = train.get("seconds"), train.get("data_seconds")
    command_file = run_dir / "command.txt"
    return {
        "name": run_dir.name,
        "validation_accuracy": results["validation"]["accuracy"],
        "best_history_accuracy": max((h["eval_accuracy"] for h in history), default=None),
        "test_accuracy": (results.get("test") or {}).get("accuracy"),
        "minutes": history[-1]["elapsed_seconds"] / 60 if history else None,
        "epochs": results["epochs"],
        "images_per_second": train.get("images_per_second"),
        "data_share": data_seconds / seconds if seconds and data_seconds is not None else None,
        "num_parameters": results["num_parameters"],
        "hardware": results.get("hardware"),
        "command": command_file.read_text().strip() if command_file.exists() else None,
        "timeline": [
            {"minutes": h["elapsed_seconds"] / 60, "epoch": h["epoch"], "accuracy": h["eval_accuracy"]}
            for h in history
        ],
    }


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def markdown(runs: list[dict], title: str) -> str:
    lines = [
        "| run | validation accuracy | best during training | test accuracy | minutes | epochs | images/s | "
        "data share of step time | parameters | hardware |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['name']} | {_fmt(r['validation_accuracy'], '.2%')} | {_fmt(r['best_history_accuracy'], '.2%')} | "
            f"{_fmt(r['test_accuracy'], '.2%')} | {_fmt(r['minutes'], '.1f')} | {_fmt(r['epochs'], '.1f')} | "
            f"{_fmt(r['images_per_second'], '.0f')} | {_fmt(r['data_share'], '.1%')} | {r['num_parameters']:,} | "
            f"{r['hardware'] or '-'} |"
        )
    lines.append("")
    lines.append(f"![validation accuracy against minutes]({title}/curve.png)")
    for r in runs:
        lines += ["", f"**{r['name']}**" + (f": `{r['command']}`" if r["command"] else ""), ""]
        lines += ["| minutes | epoch | validation accuracy |", "|---|---|---|"]
        lines += [f"| {t['minutes']:.1f} | {t['epoch']:.1f} | {t['accuracy']:.2%} |" for t in r["timeline"]]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        ax.plot(
            [t["minutes"] for t in r["timeline"]],
            [100 * t["accuracy"] for t in r["timeline"]],
            marker=".",
            label=r["name"],
        )
    ax.set_xlabel("wall-clock minutes of training (evaluations included)")
    ax.set_ylabel("validation accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(output: Path, names: list[str] | None = None) -> str:
    """Write curve.png, results.md and summary.json for the runs in `output`; returns the Markdown."""
    if names is None:
        names = sorted(p.parent.name for p in output.glob("runs/*/results.json"))
    if not names:
        raise FileNotFoundError(f"No finished runs (*/results.json) in {output}.")
    runs = [collect(output / "runs" / name) for name in names]
    hw = hardware()
    for r in runs:
        r["hardware"] = r["hardware"] or hw
    plot(runs, output / "curve.png")
    text = markdown(runs, os.path.relpath(output, ROOT))
    (output / "results.md").write_text(text)
    (output / "summary.json").write_text(json.dumps(runs, indent=2))
    return text


def update_readme(readme: Path, name: str, text: str) -> None:
    start, end = f"<!-- train_budget:{name}:start -->", f"<!-- train_budget:{name}:end -->"
    content = readme.read_text()
    if start not in content or end not in content:
        raise ValueError(f"{readme} has no {start} ... {end} markers; add them where the report should go.")
    before, rest = content.split(start, 1)
    _, after = rest.split(end, 1)
    readme.write_text(f"{before}{start}\n{text}{end}{after}")


def main(argv: list[str] | None = None) -> str:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(name)s - %(message)s")
    args, overrides = parse_args(argv)
    output = Path(args.output)
    output = output if output.is_absolute() else ROOT / output
    output.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for config in args.config:
            train(config, args.minutes, output, overrides, args.suffix)
    # Every run in OUTPUT, so runs trained by separate commands end up on one plot and in one table.
    text = report(output)
    if args.update_readme:
        update_readme(Path(args.update_readme), output.name, text)
    print(text)
    return text


if __name__ == "__main__":
    main()
