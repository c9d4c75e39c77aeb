"""Reporting: number formatting, Markdown tables, the runs' summary table and the plots, for the comparison report
(`finetune/tools/compare.py`), the model card (`finetune/tools/model_card.py`) and the benchmarks.

Plots use matplotlib's object-oriented `Figure` on the Agg canvas: no display needed, no global backend switched.
numpy and matplotlib are imported by the functions that use them, so the commands importing this module start at once.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.results import HistoryRow, Results


if TYPE_CHECKING:
    import numpy as np


logger = logging.getLogger(__name__)
MISSING = "—"


def is_hub_id(name: str | None) -> bool:
    """Whether `name` is a valid Hub repo id (`namespace/name` or `name`) and not an existing local path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return bool(name) and not os.path.exists(name)


def display_dataset(name: str | None) -> str:
    """A dataset name fit for a public report: a local path by its last component only (also of split files)."""
    if not name:
        return MISSING
    if is_hub_id(name) or name.startswith("sklearn:"):
        return name
    splits = re.findall(r"(train|validation|test): (.+?)(?=, (?:validation|test): |$)", name)
    if splits and name.startswith("train: "):
        return ", ".join(f"{split}: {Path(path).name}" for split, path in splits)
    return Path(name).name


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
    if not is_number(seconds):
        return MISSING
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def format_percent(value: float | None) -> str:
    """`0.93414` -> `93.41%`."""
    return f"{100 * value:.2f}%" if is_number(value) else MISSING


def format_number(value: float | None, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if is_number(value) else MISSING


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


SUMMARY_COLUMNS = tuple(
    "Run|Architecture|Parameters|Initialisation|Dataset|Epochs|Training time|Images/s|Validation accuracy|"
    "Test accuracy|Top-5 accuracy|Macro F1".split("|")
)
# A multi-label run's figures in place of the accuracies (`summary_row`'s keys, the columns' names).
ACCURACY_SCORES = ("validation_accuracy", "test_accuracy", "top5_accuracy")
MULTI_LABEL_SCORES = {"validation_map": "Validation mAP", "test_map": "Test mAP", "micro_f1": "Micro F1"}
# What the "Training time" and "Images/s" columns measure (`results.json`'s `train.seconds`).
SUMMARY_NOTE = (
    "Training time is the training loop (optimizer steps with their data path), without the evaluations and "
    "checkpoints between epochs; images/s counts training images (all epochs) per second of it. Top-5 accuracy "
    "(only with more than 5 classes) and macro F1 are on the test split, or on the validation split of a run "
    "without one."
)


def summary_row(results: Results, name: str, run_dir: str) -> dict[str, Any]:
    """The raw values of one run's line in the summary table (and `comparison.json`)."""
    final = results.test if results.test is not None else results.validation  # the split of the headline metrics
    row = {
        "run": name,
        "run_dir": run_dir,
        "architecture": results.architecture,
        "num_parameters": results.num_parameters,
        "num_trainable_parameters": results.num_trainable_parameters,
        "model_type": results.model_type,
        "model_name_or_path": results.model_name_or_path,
        "teacher": (results.hyperparameters or {}).get("teacher_model_name_or_path"),
        "dataset": display_dataset(results.dataset),
        "epochs": results.epochs,
        "train_seconds": results.train.seconds,
        "train_images_per_second": results.train.images_per_second,
        "validation_accuracy": results.validation.accuracy if results.validation else None,
        "test_accuracy": results.test.accuracy if results.test else None,
        "top5_accuracy": final.top5_accuracy if final else None,
        "macro_f1": final.macro_f1 if final else None,
    }
    if results.multi_label:
        test_map = results.test.map if results.test else None
        row.update(multi_label=True, validation_map=results.validation.map, test_map=test_map, micro_f1=final.micro_f1)
    return row


def teacher_name(path: str) -> str:
    """The model that taught a run: its Hub id, or a local folder by its last two parts (`runs/teacher`)."""
    return path if is_hub_id(path) else "/".join(Path(path).parts[-2:])


def copies_note(results: Results) -> str | None:
    """What the run's results.json says of evaluated images that have a training image's pixels, if any."""
    copies = results.training_image_copies
    total = results.num_samples
    counts = [f"{n:,} of its {format_number(total.get(split), 0)} {split} images" for split, n in copies.items()]
    if not counts:
        return None
    verb = "has" if list(copies.values()) == [1] else "have"
    return (
        f"{' and '.join(counts)} {verb} the pixels of training images (a photo saved twice): its "
        f"{' and '.join(copies)} figures read high."
    )


def summary_table(rows: Sequence[dict]) -> str:
    """The Markdown table of `summary_row` dicts (a multi-label run's mAP and micro F1 in the accuracies' columns)."""
    cells = []
    for row in rows:
        if row.get("model_type") == "pretrained":
            base = row.get("model_name_or_path")
            init = f"pretrained (`{base if is_hub_id(base) else Path(str(base)).name}`)" if base else "pretrained"
        else:
            init = row.get("model_type") or MISSING
        if row.get("teacher"):  # a distilled run
            init += f", taught by `{teacher_name(row['teacher'])}`"
        total, trained = row.get("num_parameters"), row.get("num_trainable_parameters")
        cells.append(
            [
                row["run"],
                f"`{row['architecture']}`" if row.get("architecture") else MISSING,
                format_count(total) + (f" ({format_count(trained)} trained)" if trained not in (None, total) else ""),
                init,
                f"`{row['dataset']}`",
                format_number(row.get("epochs"), 1),
                format_duration(row.get("train_seconds")),
                format_number(row.get("train_images_per_second"), 1),
                *(
                    format_percent(row.get(key))
                    for key in (MULTI_LABEL_SCORES if row.get("multi_label") else ACCURACY_SCORES)
                ),
                format_number(row.get("macro_f1"), 4),
            ]
        )
    kinds = {bool(row.get("multi_label")) for row in rows}
    headers = list(SUMMARY_COLUMNS)
    if True in kinds:
        ours = zip(headers[8:11], MULTI_LABEL_SCORES.values())
        headers[8:11] = [f"{theirs} / {mine}" if False in kinds else mine for theirs, mine in ours]
    return markdown_table(headers, cells)


def history_table(history: Sequence[HistoryRow], max_rows: int | None = None) -> str:
    """The per-evaluation history as a Markdown table, thinned to at most `max_rows` rows."""
    if max_rows and history:
        history = history[:: math.ceil(len(history) / max_rows)]
    multi_label = any(h.eval_map is not None for h in history)
    score, name = ("eval_map", "mAP") if multi_label else ("eval_accuracy", "accuracy")
    return markdown_table(
        ["Epoch", "Step", "Minutes", "Training loss", "Validation loss", f"Validation {name}"],
        [
            [
                format_number(h.epoch, 2),
                h.step if h.step is not None else MISSING,
                format_number(h.elapsed_seconds / 60 if is_number(h.elapsed_seconds) else None, 1),
                format_number(h.train_loss, 4),
                format_number(h.eval_loss, 4),
                format_percent(getattr(h, score)),
            ]
            for h in history
        ],
    )


def write_predictions_csv(
    path: str | os.PathLike,
    logits: np.ndarray,
    labels: np.ndarray,
    label_names: Sequence[str],
    top_k: int = 5,
    thresholds: Sequence[float] = (),
    positions: Sequence[int] | None = None,
    files: Sequence[str | None] | None = None,
) -> Path:
    """Per-image predictions of a split as CSV: `index` (the image's position in its source split, as the corrupt-image
    warnings number it), `file`, the label, the prediction and the `top_k` classes (multi-label data: the labels
    `predicted` at their `thresholds` and each label's probability)."""
    import numpy as np
    import torch

    logits = torch.as_tensor(np.asarray(logits), dtype=torch.float64)  # (N, K)
    probabilities = (logits.sigmoid() if labels.ndim == 2 else logits.softmax(dim=-1)).numpy()
    index = range(len(labels)) if positions is None else positions
    names = [[int(i), file or ""] for i, file in zip(index, files)] if files else [[int(i)] for i in index]
    head = ["index", "file"] if files else ["index"]
    path = Path(path)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        if labels.ndim == 2:
            writer.writerow([*head, "labels", "predicted", *(f"{name}_probability" for name in label_names)])
            for name, truth, p in zip(names, labels, probabilities):
                shown = [";".join(n for n, on in zip(label_names, row) if on) for row in (truth, p >= thresholds)]
                writer.writerow([*name, *shown, *(f"{q:.6f}" for q in p)])
            return path
        k = min(top_k, probabilities.shape[-1])
        ranked = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]  # (N, K) -> (N, k)
        ranks = [f"top{i}{end}" for i in range(1, k + 1) for end in ("", "_probability")]
        writer.writerow([*head, "label", "predicted", *ranks])
        for name, label, order, p in zip(names, labels, ranked, probabilities):
            row = [*name, label_names[int(label)], label_names[int(order[0])]]
            for j in order:
                row += [label_names[int(j)], f"{p[j]:.6f}"]
            writer.writerow(row)
    return path


# Fonts of other scripts than matplotlib's DejaVu Sans has (CJK, Arabic, Devanagari, Thai, ...), for class names,
# where installed: matplotlib takes each character from the first font of `font.family` that has it.
FALLBACK_FONTS = (
    "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans", "Noto Sans Arabic", "Noto Sans Devanagari", "Noto Sans Thai",
    "WenQuanYi Zen Hei", "Droid Sans Fallback", "Arial Unicode MS", "Microsoft YaHei", "Yu Gothic", "Malgun Gothic",
    "PingFang SC", "Hiragino Sans", "Apple SD Gothic Neo",
)  # fmt: skip


@contextlib.contextmanager
def _plot_fonts():
    """The installed `FALLBACK_FONTS` after matplotlib's own; characters that no font has show as boxes and are said
    in one line, not by matplotlib's two-line warning per character."""
    import matplotlib
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    family = [*matplotlib.rcParams["font.family"], *(name for name in FALLBACK_FONTS if name in installed)]
    missing, show = [], warnings.showwarning

    def collect(message, category, filename, lineno, file=None, line=None):  # other warnings shown as they were
        glyph = re.fullmatch(r"Glyph (\d+) .* missing from font\(s\).*", str(message), re.DOTALL)
        if glyph is None:
            show(message, category, filename, lineno, file, line)
        elif chr(int(glyph[1])) not in missing:
            missing.append(chr(int(glyph[1])))

    with matplotlib.rc_context({"font.family": family}), warnings.catch_warnings():
        warnings.filterwarnings("always", r"Glyph \d+ .* missing from font")
        warnings.showwarning = collect
        yield
    if missing:
        logger.warning(
            f"No installed font has {''.join(missing[:10])}{'...' if len(missing) > 10 else ''} (in a class or run "
            "name): the plots show boxes for them. Install a font of their script (e.g. Noto Sans CJK) to see them."
        )


@_plot_fonts()
def plot_learning_curves(runs: Sequence[Results], names: Sequence[str], path: str | os.PathLike) -> Path:
    """Two panels on shared epoch axes: train and validation loss, and validation accuracy."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2, sharex=True)
    for i, (run, name) in enumerate(zip(runs, names)):
        color = f"C{i % 10}"
        # A taught run's training loss mixes in the loss on the teacher's logits (`trainer.distillation_loss`).
        train = "train (with distillation)" if run.hyperparameters.get("teacher_model_name_or_path") else "train"
        for key, style, marker, what in (("train_loss", "-", "o", train), ("eval_loss", "--", "s", "validation")):
            x, y = _series(run.history, key)
            if x:
                ax_loss.plot(x, y, linestyle=style, marker=marker, markersize=4, color=color, label=f"{name} {what}")
        x, y = _series(run.history, "eval_map" if run.multi_label else "eval_accuracy", scale=100)
        if x:
            ax_acc.plot(x, y, marker="o", markersize=4, color=color, label=name)
    kinds = {run.multi_label for run in runs}
    score = "mAP" if kinds == {True} else "accuracy / mAP" if True in kinds else "accuracy"
    loss = "Binary cross-entropy" if kinds == {True} else "Cross-entropy / BCE" if True in kinds else "Cross-entropy"
    ax_loss.set(title="Loss", xlabel="Epoch", ylabel=f"{loss} loss")
    ax_acc.set(title=f"Validation {score}", xlabel="Epoch", ylabel=f"{score.replace('accuracy', 'Accuracy')} (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no history logged", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Learning curves")
    fig.savefig(path, dpi=110)
    return Path(path)


def _series(history: Sequence[HistoryRow], key: str, scale: float = 1.0):
    """`(epochs, values)` where both are numbers; a training loss at the epoch it was logged at (older files: the
    evaluation's)."""
    at = [h.train_loss_epoch if key == "train_loss" and h.train_loss_epoch is not None else h.epoch for h in history]
    points = [(x, scale * getattr(h, key)) for x, h in zip(at, history) if is_number(x) and is_number(getattr(h, key))]
    return tuple(zip(*points)) if points else ((), ())


def normalize_confusion(matrix: Sequence[Sequence[int]]) -> np.ndarray:
    """Each row divided by its count; a class with no samples keeps a row of zeros."""
    import numpy as np

    matrix = np.asarray(matrix, dtype=np.float64)
    totals = matrix.sum(axis=1, keepdims=True)
    return np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)


@_plot_fonts()
def plot_confusion_matrix(
    matrix: Sequence[Sequence[int]], label_names: Sequence[str], title: str, path: str | os.PathLike
) -> Path:
    """A confusion matrix normalized per true class (rows), the values written in up to 20 classes."""
    import numpy as np
    from matplotlib.figure import Figure

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
        empty_rows = normalized.sum(axis=1) == 0  # a row with samples sums to 1
        for (i, j), value in np.ndenumerate(normalized):
            text = "–" if empty_rows[i] else f"{value:.2f}"  # a class absent from the split has no fractions
            color = "white" if value > 0.5 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=8 if n > 10 else 9, color=color)
    fig.savefig(path, dpi=110)
    return Path(path)
