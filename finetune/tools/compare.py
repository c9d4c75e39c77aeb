"""Compare finished runs: a Markdown report with a summary table and per-class accuracies, learning curves of every
run on shared axes, and a normalized confusion matrix per run (tables and plots from `finetune/tools/report.py`).

    python -m finetune.tools.compare OUTPUT/pretrained OUTPUT/scratch --output OUTPUT/comparison
    vit-finetune compare OUTPUT --output OUTPUT/comparison

A run directory holds the `results.json` that `finetune/run.py` writes; a directory without one whose subfolders are
runs (the `model_type: both` layout) stands for those runs.
"""

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from os.path import expanduser
from pathlib import Path

from finetune.errors import ArgumentParser, run_command
from finetune.locations import check_folder, edited_file, free_name, is_onnx_export, make_folder, marked, write_whole
from finetune.results import RESULTS_NAME, Results, check_outside_training_data, find_run_dirs
from finetune.tools.report import (
    SUMMARY_NOTE,
    copies_note,
    display_dataset,
    format_percent,
    markdown_table,
    plot_confusion_matrix,
    plot_learning_curves,
    summary_row,
    summary_table,
)


logger = logging.getLogger(__name__)

REPORT_NAME = "report.md"
SUMMARY_NAME = "comparison.json"
LEARNING_CURVES_NAME = "learning_curves.png"


def per_class_table(runs: Sequence[Results], names: Sequence[str]) -> str:
    """Markdown table of per-class accuracy (the recall) per run, then the runs' precision and F1 where they hold
    them, and a multi-label run's threshold and average precision."""
    classes = list(dict.fromkeys(label for run in runs for label in [*run.label_names, *run.per_class_accuracy]))
    headers = ["Class"] + [f"{name} ({run.confusion_split or '?'})" for run, name in zip(runs, names)]
    columns = [run.per_class_recall if run.multi_label else run.per_class_accuracy for run in runs]
    for run, name in zip(runs, names):
        if run.per_class_precision:
            headers += [f"{name} precision", f"{name} F1"]
            columns += [run.per_class_precision, run.per_class_f1]
        if run.multi_label:
            headers += [f"{name} threshold", f"{name} AP"]
            columns += [run.per_class_threshold, run.per_class_average_precision]
    rows = [[label] + [format_percent(column.get(label)) for column in columns] for label in classes]
    return markdown_table(headers, rows)


def data_differences(runs: Sequence[Results]) -> list[str]:
    """What differs between the data the runs were scored on, as their results.json records it."""

    def held_out(run: Results) -> list | None:
        recorded = run.hyperparameters
        if "validation_size" in recorded:  # the images held out of the whole train split where recorded
            size = recorded.get("held_out_images", recorded["validation_size"])
            return [size, recorded.get("data_seed", recorded.get("seed"))]

    def subset(run: Results) -> list | None:
        recorded = run.hyperparameters
        if "max_eval_samples" in recorded:  # seeded subsets of the evaluated splits
            return [recorded["max_eval_samples"], recorded.get("data_seed", recorded.get("seed"))]

    aspects = {
        "dataset": lambda run: display_dataset(run.dataset),
        "classes": lambda run: sorted(run.label_names),  # the per-class tables match them by name
        "number of validation images": lambda run: run.num_samples.get("validation"),
        "number of test images": lambda run: run.num_samples.get("test"),
        "held-out validation split (its seed or size)": held_out,
        "evaluated subsets (`max_eval_samples` or its seed)": subset,
    }
    values = {what: {json.dumps(key(run)) for run in runs if key(run) is not None} for what, key in aspects.items()}
    return [what for what, seen in values.items() if len(seen) > 1]


# What a run's folder (or a checkpoint, export or model folder) holds: no place for a report.
RUN_FOLDER_FILES = (RESULTS_NAME, "config.json", "trainer_state.json", ".run.lock", "checkpoint-*")


STOPPED_BY = {"early_stopping": "early stopping", "time_budget": "its time budget (`max_train_minutes`)"}


def training_notes(run: Results) -> str | None:
    """What the run's figures stand on beyond its table row: optimizer steps skipped for a non-finite loss or
    gradients, and a stop before its epochs."""
    notes = []
    if run.train.nonfinite_steps:
        notes.append(f"{run.train.nonfinite_steps:,} optimizer step(s) skipped for a non-finite loss or gradients")
    if run.train.stopped_by:
        notes.append(f"ended by {STOPPED_BY.get(run.train.stopped_by, run.train.stopped_by)} before its epochs")
    return "; ".join(notes) or None


def unfinished(folder: Path) -> str | None:
    """How the run in `folder` stands where its results.json is missing (still training, diverged, stopped) or not
    yet the whole run's (a finished run resumed, training on), or None: a finished run, or no run."""
    finished = (folder / RESULTS_NAME).is_file()
    locks = [folder / ".run.lock"] + ([] if finished else [folder.parent / ".run.lock"])  # a `both` run's is above
    if any(lock.exists() for lock in locks):  # the lock's module imports torch: only where there is one
        from finetune.tools.model_card import still_training

        training = still_training(folder, above=not finished)
        if training:
            return f"still training ({training})"
    if finished or re.fullmatch(r"checkpoint-\d+", folder.name):  # a checkpoint is no run: `find_run_dirs` says so
        return None
    state, log = folder / "trainer_state.json", []
    with contextlib.suppress(OSError, ValueError, AttributeError):
        log = json.loads(state.read_text()).get("log_history") or []
    if log and "nonfinite_step" in log[-1]:  # `finetune.nonfinite` logs the bad steps that stopped it
        return f"diverged at step {log[-1]['nonfinite_step']} (non-finite losses or gradients)"
    steps = [int(p.name[11:]) for p in folder.glob("checkpoint-*") if p.name[11:].isdigit() and p.is_dir()]
    if steps:
        return f"stopped at checkpoint-{max(steps)} (interrupted, or ended by an error)"
    return "stopped before writing its results" if state.is_file() else None


def check_finished(paths: Sequence[str | os.PathLike]) -> None:
    """Refuse a run given, or one of a folder of runs given (`model_type: both`), that has not finished: compared
    as it was (or left out of its folder's runs, exit 0), its figures passed for a finished run's."""
    for path in map(Path, paths):
        folders = [path] if (path / RESULTS_NAME).is_file() or not path.is_dir() else [path, *sorted(path.iterdir())]
        for folder in filter(Path.is_dir, folders):
            state = unfinished(folder)
            if state:
                others = f", or compare the finished runs of {path} by name" if folder != path else ""
                how = "its command with the change its error line named" if "diverged" in state else "its command"
                raise ValueError(
                    f"{folder} is a run that has not finished: {state}. Nothing was written. Fix: compare it once "
                    f"it has finished (a stopped run goes on with {how} and `--resume_from_checkpoint true`){others}."
                )


def check_report_folder(output_dir: str | os.PathLike, option: str = "--output") -> None:
    """Refuse a run's folder, where the report would lie among the run's files (where neither the model card nor
    push looks for it, and a new run there leaves it describing the earlier one), and a folder where it would replace
    a file of the user's: a report.md not written here, or edited since (`finetune.locations.marked`). One of an
    earlier version, without the mark, is moved aside when written."""
    check_folder(output_dir, option)
    held = next((p.name for pattern in RUN_FOLDER_FILES for p in sorted(Path(output_dir).glob(pattern))), None)
    if held:
        comparison = Path(output_dir) / "comparison"
        inside = f", e.g. {option} {comparison}, where its card and push find it" if held == RESULTS_NAME else ""
        raise FileExistsError(
            f"{option} {output_dir} is a run's or a model's folder (it holds {held}): the report would lie among its "
            f"files. Nothing was written. Fix: a folder of its own{inside}."
        )
    edited = edited_file(Path(output_dir) / REPORT_NAME)
    if edited and not _unmarked_report(edited):
        raise FileExistsError(
            f"{edited} was edited after the report was written (or not written here), and is kept. Fix: another "
            f"{option}, or move it away first: mv {edited} {free_name(edited, 'edited')}"
        )


def _unmarked_report(path: Path) -> bool:
    """A report.md of this tool before reports were marked: kept beside the new one, in case it was edited."""
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    return text.startswith("# Comparison of ") and "\n## Runs\n" in text and "<!-- Written by" not in text


def write_comparison(run_dirs: Sequence[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write `report.md`, `learning_curves.png`, a `confusion_matrix_<run>.png` per run that has a confusion matrix,
    and `comparison.json` (for the model card) into `output_dir`; returns the report's path. Its paths are relative:
    the folder can be moved. A report.md of the user's is never replaced (`check_report_folder`)."""
    check_finished(run_dirs)
    run_dirs = find_run_dirs(run_dirs)
    runs = [Results.load(d) for d in run_dirs]
    unscored = [str(d) for d, run in zip(run_dirs, runs) if run.validation is None]
    if unscored:  # an export of a checkpoint keeps its run's settings, not the figures of the run's kept model
        raise ValueError(
            f"{', '.join(unscored)}: no figures to compare (the export of a checkpoint). Score the checkpoint, then "
            "compare that folder: `python -m finetune.run --do_train false --model_name_or_path RUN/checkpoint-N "
            "--output_dir NEW` with the run's data options."
        )
    exports = [str(d) for d in run_dirs if is_onnx_export(d)]
    if exports:  # the export of a run's kept model: its figures, compared with them as another run's
        raise ValueError(
            f"{', '.join(exports)}: an ONNX export, whose results.json is its run's. Fix: compare the run folder it "
            "was exported from."
        )
    check_outside_training_data(output_dir, runs, "the report's plots")
    check_report_folder(output_dir)
    output_dir = make_folder(output_dir)
    names = [run.run_name or run_dir.name for run, run_dir in zip(runs, run_dirs)]
    # Names for tables and file names: a name shared by several runs gets its directory appended.
    names = [f"{n} ({d.parent.name}/{d.name})" if names.count(n) > 1 else n for n, d in zip(names, run_dirs)]
    rows = [summary_row(run, name, run_dir.name) for run, name, run_dir in zip(runs, names, run_dirs)]

    plot_learning_curves(runs, names, output_dir / LEARNING_CURVES_NAME)
    confusion_files = {}
    for run, name, run_dir in zip(runs, names, run_dirs):
        if run.confusion_matrix:
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"  # a file name from the run's name
            # Names that differ only in other characters (`猫`, `狗`: both `run`) would share, and overwrite, a plot;
            # compared without case, as macOS and Windows compare file names.
            taken, n = {file.lower() for file in confusion_files.values()}, 1
            file_name = f"confusion_matrix_{slug}.png"
            while file_name.lower() in taken:
                n += 1
                file_name = f"confusion_matrix_{slug}_{n}.png"
            confusion_files[name] = file_name
            title = f"{name}\n{run.confusion_split or 'evaluation'} split, normalized per true class"
            plot_confusion_matrix(run.confusion_matrix, run.label_names, title, output_dir / file_name)
        elif not run.multi_label:  # a multi-label run has none
            logger.warning(f"{run_dir} has no confusion matrix in results.json; no confusion plot for it.")

    title = "Comparison of " + (" and ".join(names) if len(names) <= 2 else f"{len(names)} runs")
    differences = data_differences(runs)
    sections = [
        f"# {title}",
        "## Summary",
        summary_table(rows),
        SUMMARY_NOTE,
        "## Learning curves",
        f"![Learning curves: loss and validation accuracy per epoch]({LEARNING_CURVES_NAME})",
        "## Per-class accuracy",
        "On the split named in each run's accuracy column (the test split when the run had one). A class's accuracy "
        "is its recall: the fraction of its images predicted as it; precision is the fraction of the images "
        "predicted as the class that belong to it.",
        per_class_table(runs, names),
    ]
    if confusion_files:
        sections.append("## Confusion matrices")
        sections.append("Rows are true classes, columns predictions; each row is divided by the class's count.")
        for name, file_name in confusion_files.items():
            sections += [f"### {name}", f"![Confusion matrix of {name}]({file_name})"]
    optimistic = [name for run, name in zip(runs, names) if run.multi_label and run.test is None]
    if optimistic:  # after the summary table and its note
        sections.insert(4, f"**{', '.join(optimistic)}**: multi-label, without a test split: its F1, precision and "
                        "recall are at the per-label thresholds chosen on the same validation images, so optimistic; "
                        "its mAP does not depend on thresholds.")  # fmt: skip
    copies = [f"**{name}**: {copies_note(run)}" for run, name in zip(runs, names) if run.training_image_copies]
    if copies:  # after the summary table and its note
        sections.insert(4, "\n\n".join(copies))  # a paragraph each: a line break alone joins them
    notes = [f"**{name}**: {training_notes(run)}." for run, name in zip(runs, names) if training_notes(run)]
    if notes:  # after the summary table and its note
        sections.insert(4, "\n\n".join(notes))
    sizes = {name: run.image_size for run, name in zip(runs, names) if run.image_size}
    if len(set(sizes.values())) > 1:  # the same images, seen at each model's own input size
        listed = ", ".join(f"{name} at {size} px" for name, size in sizes.items())
        sections.insert(4, f"**Other input sizes**: {listed}; each model saw the images resized to its own size.")
    if differences:  # after the summary table and its note
        sections.insert(4, f"**Not scored on the same images**: the runs differ in their {', '.join(differences)}, so "
                        "their figures do not compare directly.")  # fmt: skip
    sections.append("## Runs")
    sections.append("\n".join(f"- {name}: `{os.path.relpath(d, output_dir)}`" for d, name in zip(run_dirs, names)))
    report_path = output_dir / REPORT_NAME
    if _unmarked_report(report_path):
        kept = report_path.rename(free_name(report_path, "earlier"))
        logger.warning(f"Kept the report of an earlier version, which may have been edited, as {kept}.")
    write_whole(report_path, marked("\n\n".join(sections) + "\n", "finetune.tools.compare"))
    summary = {"runs": rows, "data_differences": differences}
    for key in ("per_class_accuracy", "per_class_precision", "per_class_f1"):
        summary[key] = {name: getattr(run, key) for run, name in zip(runs, names)}
    write_whole(output_dir / SUMMARY_NAME, json.dumps(summary, indent=2))
    return report_path


def main(argv: list[str] | None = None) -> Path:
    parser = ArgumentParser(
        prog="python -m finetune.tools.compare",
        description="Compare finished runs: report.md with a summary and a per-class table, learning curves, "
        "and a confusion matrix per run.",
    )
    run_help = "Output directory of a run (with results.json), or a `model_type: both` output holding several."
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", type=expanduser, help=run_help)
    parser.add_argument(
        "--output", required=True, metavar="REPORT_DIR", type=expanduser, help="Where to write the report and plots."
    )
    args = parser.parse_args(argv)
    try:
        report = write_comparison(args.run_dirs, args.output)
    except FileNotFoundError as error:
        parser.error(str(error))
    print(report)
    return report


if __name__ == "__main__":
    sys.exit(run_command(main))
