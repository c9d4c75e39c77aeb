"""Compare finished runs: a Markdown report with a summary table and per-class accuracies, learning curves of every
run on shared axes, and a normalized confusion matrix per run.

    python -m finetune.compare OUTPUT/pretrained OUTPUT/scratch --output OUTPUT/comparison

A run directory is what `finetune/run.py` writes: `results.json` (and `trainer_state.json`, read when the results
carry no history). A directory without `results.json` whose subfolders are runs (the `model_type: both` layout)
stands for those runs. Plots use matplotlib's object-oriented API on the Agg canvas, so no display is needed and no
global backend is switched.
"""

import argparse
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from transformers.utils import logging


logger = logging.get_logger(__name__)

REPORT_NAME = "report.md"
SUMMARY_NAME = "comparison.json"
LEARNING_CURVES_NAME = "learning_curves.png"
HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
MISSING = "—"


# ---------------------------------------------------------------------------------------------------------------------
# Reading runs


def find_run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Resolve the given paths to run directories (folders holding `results.json`).

    A folder without `results.json` stands for its immediate subfolders that have one, as `model_type: both` writes
    `OUTPUT/pretrained` and `OUTPUT/scratch`. Raises `FileNotFoundError` naming a path that holds no run.
    """
    run_dirs = []
    for path in map(Path, paths):
        if (path / "results.json").is_file():
            run_dirs.append(path)
            continue
        children = sorted(p for p in path.iterdir() if (p / "results.json").is_file()) if path.is_dir() else []
        if not children:
            raise FileNotFoundError(
                f"{path} is not a run directory: it has no results.json, nor subfolders with one. Pass the output "
                "directory of a finished `finetune/run.py` run (for `model_type: both`, OUTPUT/pretrained and "
                "OUTPUT/scratch, or OUTPUT itself)."
            )
        run_dirs.extend(children)
    return run_dirs


def history_from_log_history(log_history: Sequence[dict]) -> list[dict]:
    """One row per evaluation of a Trainer `log_history`: epoch, step, the last training loss logged before it,
    validation loss and accuracy (the `history` rows of `results.json`)."""
    rows, last_train_loss = [], None
    for entry in log_history:
        if "loss" in entry:
            last_train_loss = entry["loss"]
        if "eval_accuracy" in entry or "eval_loss" in entry:
            rows.append(
                {
                    "epoch": entry.get("epoch"),
                    "step": entry.get("step"),
                    "train_loss": last_train_loss,
                    "eval_loss": entry.get("eval_loss"),
                    "eval_accuracy": entry.get("eval_accuracy"),
                }
            )
    return rows


def load_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read a run's `results.json`; fill `history` from `trainer_state.json` when it is missing or empty.

    The returned dict also holds `run_dir` (a `Path`).
    """
    run_dir = Path(run_dir)
    results_path = run_dir / "results.json"
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} does not exist: {run_dir} is not the output of a finished run.")
    with open(results_path) as f:
        results = json.load(f)
    if not results.get("history"):
        state_path = run_dir / "trainer_state.json"
        if state_path.is_file():
            with open(state_path) as f:
                results["history"] = history_from_log_history(json.load(f).get("log_history", []))
        else:
            results["history"] = []
    results.setdefault("run_name", run_dir.name)
    results["run_dir"] = run_dir
    return results


def _unique_names(runs: Sequence[dict]) -> list[str]:
    """Run names for tables and file names; a name shared by several runs gets its directory appended."""
    names = [str(run.get("run_name") or run["run_dir"].name) for run in runs]
    return [
        f"{name} ({run['run_dir'].parent.name}/{run['run_dir'].name})" if names.count(name) > 1 else name
        for name, run in zip(names, runs)
    ]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"


# ---------------------------------------------------------------------------------------------------------------------
# Formatting


def is_hub_id(name: str | None) -> bool:
    """Whether `name` looks like a Hub repo id (`namespace/name` or `name`) and is not an existing local path."""
    return bool(name) and HUB_ID_PATTERN.match(name) is not None and not os.path.exists(name)


def display_dataset(name: str | None) -> str:
    """A dataset name fit for a public report: a Hub id as it is, a local path by its last component only."""
    if not name:
        return MISSING
    return name if is_hub_id(name) or ":" in name else Path(name).name


def format_count(n: int | None) -> str:
    """`85806346` -> `85.81M`, `12345` -> `12.3K`."""
    if n is None:
        return MISSING
    for size, suffix in ((1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:.2f}{suffix}"
    return f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


def format_duration(seconds: float | None) -> str:
    """`754.5` -> `12m 34s`, `4000` -> `1h 06m 40s`, `42.3` -> `42.3s`."""
    if not _is_number(seconds):
        return MISSING
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def format_percent(value: float | None) -> str:
    """`0.93414` -> `93.41%`."""
    return f"{100 * value:.2f}%" if _is_number(value) else MISSING


def format_number(value: float | None, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if _is_number(value) else MISSING


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _get(mapping: dict | None, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


def summary_row(run: dict, name: str) -> dict[str, Any]:
    """The raw values of one run's line in the summary table (also stored in `comparison.json`)."""
    images_per_second = run.get("train_images_per_second")
    if images_per_second is None:
        images_per_second = _get(run.get("train"), "images_per_second")
    runtime = _get(run.get("train"), "runtime_seconds")
    return {
        "run": name,
        "run_dir": run["run_dir"].name,
        "architecture": run.get("architecture"),
        "num_parameters": run.get("num_parameters"),
        "model_type": run.get("model_type"),
        "model_name_or_path": run.get("model_name_or_path"),
        "dataset": display_dataset(run.get("dataset")),
        "epochs": run.get("epochs"),
        "train_runtime_seconds": runtime if runtime is not None else run.get("wall_time_seconds"),
        "train_images_per_second": images_per_second,
        "validation_accuracy": _get(run.get("validation"), "accuracy"),
        "test_accuracy": _get(run.get("test"), "accuracy"),
    }


SUMMARY_COLUMNS = (
    "Run",
    "Architecture",
    "Parameters",
    "Initialisation",
    "Dataset",
    "Epochs",
    "Training time",
    "Images/s",
    "Validation accuracy",
    "Test accuracy",
)


def summary_table(rows: Sequence[dict]) -> str:
    """The Markdown summary table of `summary_row` dicts, one line per run."""
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "|".join("---" for _ in SUMMARY_COLUMNS) + "|"]
    for row in rows:
        if row.get("model_type") == "pretrained":
            base = row.get("model_name_or_path")
            init = f"pretrained (`{base if is_hub_id(base) else Path(str(base)).name}`)" if base else "pretrained"
        else:
            init = row.get("model_type") or MISSING
        cells = [
            row["run"],
            f"`{row['architecture']}`" if row.get("architecture") else MISSING,
            format_count(row.get("num_parameters")),
            init,
            f"`{row['dataset']}`",
            format_number(row.get("epochs"), 1),
            format_duration(row.get("train_runtime_seconds")),
            format_number(row.get("train_images_per_second"), 1),
            format_percent(row.get("validation_accuracy")),
            format_percent(row.get("test_accuracy")),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def per_class_table(runs: Sequence[dict], names: Sequence[str]) -> str:
    """Markdown table of per-class accuracy: one row per class (in label order), one column per run."""
    classes: list[str] = []
    for run in runs:
        for label in list(run.get("label_names") or []) + list((run.get("per_class_accuracy") or {}).keys()):
            if label not in classes:
                classes.append(label)
    headers = ["Class"] + [f"{name} ({run.get('confusion_split') or '?'})" for run, name in zip(runs, names)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for label in classes:
        cells = [str(label)] + [format_percent((run.get("per_class_accuracy") or {}).get(label)) for run in runs]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Plots


def plot_learning_curves(runs: Sequence[dict], names: Sequence[str], path: str | os.PathLike) -> Path:
    """One PNG with two panels on shared epoch axes: train (solid) and validation (dashed) loss of every run, and
    validation accuracy of every run. Each run keeps one color in both panels."""
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2, sharex=True)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for run, name, color in zip(runs, names, colors):
        history = run.get("history") or []
        for key, style, marker, what in (("train_loss", "-", "o", "train"), ("eval_loss", "--", "s", "validation")):
            points = [(h["epoch"], h[key]) for h in history if _is_number(h.get(key)) and _is_number(h.get("epoch"))]
            if points:
                x, y = zip(*points)
                ax_loss.plot(x, y, linestyle=style, marker=marker, markersize=4, color=color, label=f"{name} {what}")
        points = [
            (h["epoch"], 100 * h["eval_accuracy"])
            for h in history
            if _is_number(h.get("eval_accuracy")) and _is_number(h.get("epoch"))
        ]
        if points:
            x, y = zip(*points)
            ax_acc.plot(x, y, marker="o", markersize=4, color=color, label=name)
    ax_loss.set(title="Loss", xlabel="Epoch", ylabel="Cross-entropy loss")
    ax_acc.set(title="Validation accuracy", xlabel="Epoch", ylabel="Accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no history logged", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Learning curves")
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def normalize_confusion(matrix: Sequence[Sequence[int]]) -> np.ndarray:
    """Divide each row (a true class) by its count; a class with no samples keeps a row of zeros."""
    matrix = np.asarray(matrix, dtype=np.float64)
    totals = matrix.sum(axis=1, keepdims=True)
    return np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)


def plot_confusion_matrix(
    matrix: Sequence[Sequence[int]], label_names: Sequence[str], title: str, path: str | os.PathLike
) -> Path:
    """A confusion matrix PNG normalized per true class (rows), with label names on both axes; the cell values are
    written in when there are at most 20 classes ("–" in the row of a class with no samples)."""
    normalized = normalize_confusion(matrix)
    n = normalized.shape[0]
    labels = list(label_names) if len(label_names) == n else [str(i) for i in range(n)]
    longest = max((len(str(label)) for label in labels), default=1)
    # Room for the rotated tick labels grows with the longest name, the cells with the number of classes.
    side = max(4.0, 0.5 * n + 1.5) + 0.07 * longest
    fig = Figure(figsize=(side + 1.2, side), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(normalized, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="Fraction of the true class")
    ax.set_xticks(range(n), labels, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(n), labels)
    ax.set(xlabel="Predicted label", ylabel="True label", title=title)
    if n <= 20:
        empty_rows = np.asarray(matrix).reshape(n, n).sum(axis=1) == 0
        for i in range(n):
            for j in range(n):
                value = normalized[i, j]
                ax.text(
                    j,
                    i,
                    "–" if empty_rows[i] else f"{value:.2f}",  # a class absent from the split has no fractions
                    ha="center",
                    va="center",
                    fontsize=8 if n > 10 else 9,
                    color="white" if value > 0.5 else "black",
                )
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Report


def write_comparison(run_dirs: Sequence[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write the comparison of the given runs into `output_dir` and return the path of its `report.md`.

    Writes `report.md` (summary table, per-class accuracy table, the plots), `learning_curves.png`, one
    `confusion_matrix_<run>.png` per run that has a confusion matrix, and `comparison.json` (the summary rows, for the
    model card). Paths in the report are relative to `output_dir`, so the folder can be moved or uploaded as is.
    """
    runs = [load_run(d) for d in find_run_dirs(run_dirs)]
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    names = _unique_names(runs)
    rows = [summary_row(run, name) for run, name in zip(runs, names)]

    plot_learning_curves(runs, names, output_dir / LEARNING_CURVES_NAME)
    confusion_files = {}
    for run, name in zip(runs, names):
        if run.get("confusion_matrix"):
            split = run.get("confusion_split") or "evaluation"
            file_name = f"confusion_matrix_{_slug(name)}.png"
            plot_confusion_matrix(
                run["confusion_matrix"],
                run.get("label_names") or [],
                f"{name}\n{split} split, normalized per true class",
                output_dir / file_name,
            )
            confusion_files[name] = file_name
        else:
            logger.warning(f"{run['run_dir']} has no confusion matrix in results.json; no confusion plot for it.")

    title = "Comparison of " + (" and ".join(names) if len(names) <= 2 else f"{len(names)} runs")
    sections = [
        f"# {title}",
        "## Summary",
        summary_table(rows),
        "Training time is the Trainer's training loop; images/s counts training images (all epochs) per second of it.",
        "## Learning curves",
        f"![Learning curves: loss and validation accuracy per epoch]({LEARNING_CURVES_NAME})",
        "## Per-class accuracy",
        "On the split named in each column header (the test split when the run had one).",
        per_class_table(runs, names),
    ]
    if confusion_files:
        sections.append("## Confusion matrices")
        sections.append("Rows are true classes, columns predictions; each row is divided by the class's count.")
        for name, file_name in confusion_files.items():
            sections += [f"### {name}", f"![Confusion matrix of {name}]({file_name})"]
    sections.append("## Runs")
    sections.append(
        "\n".join(f"- {name}: `{os.path.relpath(run['run_dir'], output_dir)}`" for run, name in zip(runs, names))
    )
    report_path = output_dir / REPORT_NAME
    report_path.write_text("\n\n".join(sections) + "\n")
    summary = {
        "runs": rows,
        "per_class_accuracy": {name: run.get("per_class_accuracy") or {} for run, name in zip(runs, names)},
    }
    (output_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=2))
    return report_path


def main(argv: list[str] | None = None) -> Path:
    """Command-line entry: `python -m finetune.compare RUN_DIR [RUN_DIR ...] --output REPORT_DIR`."""
    parser = argparse.ArgumentParser(
        prog="python -m finetune.compare",
        description="Compare finished runs: report.md with a summary and a per-class table, learning curves, "
        "and a confusion matrix per run.",
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="Output directory of a run (with results.json), or a `model_type: both` output holding several.",
    )
    parser.add_argument("--output", required=True, metavar="REPORT_DIR", help="Where to write the report and plots.")
    args = parser.parse_args(argv)
    try:
        report = write_comparison(args.run_dirs, args.output)
    except FileNotFoundError as error:
        parser.error(str(error))
    print(report)
    return report


if __name__ == "__main__":
    main()
