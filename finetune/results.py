"""The `results.json` of a run: written by `finetune/run.py`, read back with `Results.load` by the comparison report,
the model card and the benchmarks. Each figure is stored once:

- `train.seconds`: this process's training loop (steps and the data path), without the evaluations and checkpoints
  between epochs (`finetune.callbacks.RunClock`); `images_per_second` is measured against it, and so is
  `data_seconds` (fetching and transforming batches), which only `benchmarks/timed_run.py` records.
- `wall_seconds`: this model alone from start to `results.json`, evaluations and checkpoints included, in the session
  that wrote it (a resumed run's earlier sessions are not counted; `train.seconds` and `history` cover them).
- `history`: one row per evaluation, stamped with `elapsed_seconds` since training began.
- `hardware`: where it ran (`finetune.hardware.describe`)."""

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.locations import write_whole


RESULTS_NAME = "results.json"
SCHEMA_VERSION = 3


@dataclass
class EvalMetrics:
    """The Trainer's metrics of one split, without the split's prefix."""

    accuracy: float | None = None
    loss: float | None = None
    runtime_seconds: float | None = None
    images_per_second: float | None = None
    top5_accuracy: float | None = None  # only with more than 5 classes
    macro_f1: float | None = None
    # Multi-label data: mean average precision, and micro F1 (and macro F1) at the per-label thresholds chosen on
    # validation (so optimistic there); evaluations between epochs have none yet and count a label above 0.5.
    map: float | None = None
    micro_f1: float | None = None

    @classmethod
    def from_trainer(cls, metrics: dict[str, float] | None, prefix: str) -> "EvalMetrics | None":
        """`{"eval_accuracy": ..., "eval_runtime": ...}` -> `EvalMetrics(accuracy=..., runtime_seconds=...)`."""
        if metrics is None:
            return None
        start, renamed = f"{prefix}_", {"runtime": "runtime_seconds", "samples_per_second": "images_per_second"}
        values = {renamed.get(k[len(start) :], k[len(start) :]): v for k, v in metrics.items() if k.startswith(start)}
        return _dataclass_from(cls, values)


@dataclass
class TrainMetrics:
    """The whole run's training (a resumed run's before and after); `data_seconds` only from benchmarks/timed_run."""

    loss: float | None = None
    seconds: float | None = None
    data_seconds: float | None = None
    steps: int | None = None
    images_per_second: float | None = None
    nonfinite_steps: int | None = None  # optimizer steps skipped for a non-finite loss or gradient
    stopped_by: str | None = None  # "early_stopping" or "time_budget" when one ended training before its epochs


@dataclass
class HistoryRow:
    """One evaluation during training."""

    epoch: float | None = None
    step: int | None = None
    train_loss: float | None = None
    train_loss_epoch: float | None = None  # where `train_loss` was logged (None in files of earlier versions)
    eval_loss: float | None = None
    eval_accuracy: float | None = None
    eval_map: float | None = None  # multi-label runs
    elapsed_seconds: float | None = None


@dataclass
class Results:
    """Everything a finished run reports; `results.json` is `dataclasses.asdict` of it."""

    run_name: str
    model_type: str
    architecture: str | None = None
    model_name_or_path: str | None = None
    # Whether `model_name_or_path` was a local folder (None in earlier files): the model card links Hub ids only.
    model_is_local: bool | None = None
    teacher_is_local: bool | None = None  # the same of a distilled run's teacher (`teacher_model_name_or_path`)
    dataset: str | None = None
    dataset_fingerprint: str | None = None  # `ImageData.fingerprint`: an evaluation knows the same data by it
    dataset_location: str | None = None  # a local dataset's folder or file (`dataset_location`), hashed: no path shown
    label_names: list[str] = field(default_factory=list)
    image_size: int | None = None
    # (H, W) the training images were stored at, not square only where all had that size: predict then resizes whole
    # images as evaluation did, not the centre square of a photo (finetune/data/decode.py).
    stored_image_size: list[int] | None = None
    # A LoRA run's: its base model with the new head (as many as merged) plus the trained ones, as peft holds them (the
    # base's head beside its trained copy); the model card tells the two apart by this sum.
    num_parameters: int | None = None
    num_trainable_parameters: int | None = None  # those the fine-tuning method trains (LoRA: adapters and head)
    num_samples: dict[str, int | None] = field(default_factory=dict)
    # Per evaluated split, its images with the pixels of a training image (a photo saved twice): its figures read high.
    training_image_copies: dict[str, int] = field(default_factory=dict)
    epochs: float | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    train: TrainMetrics = field(default_factory=TrainMetrics)
    validation: EvalMetrics | None = None
    test: EvalMetrics | None = None
    per_class_accuracy: dict[str, float] = field(default_factory=dict)
    # On `confusion_split`, as `per_class_accuracy` (the recall); None where undefined. Empty before schema version 3.
    per_class_precision: dict[str, float | None] = field(default_factory=dict)
    per_class_recall: dict[str, float | None] = field(default_factory=dict)
    per_class_f1: dict[str, float | None] = field(default_factory=dict)
    confusion_matrix: list[list[int]] = field(default_factory=list)
    confusion_split: str | None = None
    # Multi-label runs have no accuracy nor confusion matrix: per label, the threshold chosen on validation (predict
    # uses it), and on `confusion_split` the precision, recall and F1 at it (above), support and average precision.
    multi_label: bool = False
    per_class_threshold: dict[str, float] = field(default_factory=dict)
    per_class_support: dict[str, int] = field(default_factory=dict)
    per_class_average_precision: dict[str, float | None] = field(default_factory=dict)
    history: list[HistoryRow] = field(default_factory=list)
    wall_seconds: float | None = None
    license: str | None = None
    schema_version: int = SCHEMA_VERSION

    def save(self, output_dir: str | os.PathLike) -> Path:
        # Never a cut file: results.json marks a finished model.
        return write_whole(Path(output_dir) / RESULTS_NAME, json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Results":
        """The inverse of `dataclasses.asdict`; unknown keys are ignored, missing ones keep their default."""
        nested = {
            "train": _dataclass_from(TrainMetrics, data.get("train")) or TrainMetrics(),
            "validation": _dataclass_from(EvalMetrics, data.get("validation")),
            "test": _dataclass_from(EvalMetrics, data.get("test")),
            "history": [_dataclass_from(HistoryRow, row) for row in data.get("history") or []],
        }
        return _dataclass_from(cls, {"run_name": "", "model_type": "", **data, **nested})

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "Results":
        """Read `run_dir/results.json`. Without a history in it, the history comes from `trainer_state.json`."""
        run_dir = Path(run_dir)
        path = run_dir / RESULTS_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: {run_dir} is not the output of a finished run.")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} is not valid JSON ({error}): cut short or edited. Fix: for a training run, rerun its command "
                "with `--resume_from_checkpoint true`, which writes it again from the run's last checkpoint; else "
                "rerun the command that wrote it."
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds a {type(data).__name__}, not a results map. Rerun the training.")
        results = cls.from_dict(data)
        if not results.history:
            state_path = run_dir / "trainer_state.json"
            if state_path.is_file():
                results.history = history_from_log_history(json.loads(state_path.read_text()).get("log_history", []))
        results.run_name = results.run_name or run_dir.name
        return results


def dataset_location(source: str) -> str | None:
    """A hash of the real path of a local dataset (None for a Hub id); a hash, as results.json goes to the Hub."""
    path = os.path.expanduser(source)
    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:24] if os.path.exists(path) else None


def check_outside_training_data(output: str | os.PathLike, runs: Sequence[Results | None], what: str) -> None:
    """Never write `what` (a command's files) into the folder of images one of `runs` was trained on: its next run
    would read them as images (or their folder as a class), as `finetune.run` refuses such an `output_dir`."""
    folder = Path(output).expanduser().resolve()
    inside = {dataset_location(str(p)) for p in (folder, *folder.parents)} - {None}  # the folder and those around it
    for trained in runs:
        if trained is not None and trained.dataset_location in inside:
            raise ValueError(
                f"--output {output} is inside {trained.dataset}, the images the model was trained on, where its "
                f"next run would read {what} as training data. Nothing was written. Fix: an --output outside it."
            )


def results_of_model(model_dir: str | os.PathLike) -> Results | None:
    """The results of the run that wrote the model in `model_dir`: its own results.json, or that of the run folder
    around it (a checkpoint-*, merged/, onnx/); None for a model that no run of this project wrote."""
    folder = Path(model_dir).expanduser()
    run_dir = next((p for p in (folder, folder.resolve().parent) if (p / RESULTS_NAME).is_file()), None)
    return Results.load(run_dir) if run_dir is not None else None


def _dataclass_from(cls, data: dict[str, Any] | None):
    """`cls` from the keys of `data` that name its fields."""
    return None if data is None else cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def history_from_log_history(log_history: Sequence[dict]) -> list[HistoryRow]:
    """One row per evaluation of a Trainer `log_history`, with the training loss logged since the previous one (None
    when none was: a plot then draws only logged points) and the epoch it was logged at."""
    rows, train_loss, train_loss_epoch = [], None, None
    for entry in log_history:
        if "loss" in entry:
            train_loss, train_loss_epoch = entry["loss"], entry.get("epoch")
        if "eval_accuracy" in entry or "eval_loss" in entry:
            row = {**entry, "train_loss": train_loss, "train_loss_epoch": train_loss_epoch}
            rows.append(_dataclass_from(HistoryRow, row))
            train_loss = train_loss_epoch = None
    return rows


def find_run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The run directories (with `results.json`) of `paths`, each once: a folder without one stands for its subfolders
    that have one (`model_type: both`)."""
    run_dirs = []
    for path in map(Path, paths):
        if (path / RESULTS_NAME).is_file():
            run_dirs.append(path)
            continue
        children = sorted(p for p in path.iterdir() if (p / RESULTS_NAME).is_file()) if path.is_dir() else []
        if not children:
            raise FileNotFoundError(
                f"{path} is not a run directory: it has no {RESULTS_NAME}, nor subfolders with one. Pass the output "
                "directory of a finished training run (for `model_type: both`, OUTPUT/pretrained and OUTPUT/scratch, "
                "or OUTPUT itself)."
            )
        run_dirs.extend(children)
    unique = {run_dir.resolve(): run_dir for run_dir in reversed(run_dirs)}  # the first path given names each
    return [run_dir for run_dir in run_dirs if unique[run_dir.resolve()] is run_dir]
