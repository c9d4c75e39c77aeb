"""Checkpoints of a run folder: which one to resume from, which are incomplete, and the guard that never trains over
an earlier run's work by accident. The Trainer writes each checkpoint atomically (`finetune/trainer.py`)."""

import os
import shutil
from pathlib import Path

from transformers import TrainingArguments
from transformers.utils import logging

from finetune.models import WEIGHT_FILES


logger = logging.get_logger(__name__)

# Earlier versions wrote each checkpoint under this prefix and renamed it once complete; their leftovers are removed.
PARTIAL_CHECKPOINT_PREFIX = "tmp-"


def resolve_checkpoint(run_dir: Path, training_args: TrainingArguments) -> str | None:
    """The checkpoint to resume from, and a guard that never trains over an earlier run's work by accident."""
    remove_partial_checkpoints(run_dir, training_args)
    resume = training_args.resume_from_checkpoint
    if resume is not None and str(resume).lower() in ("true", "last", "latest"):
        last = last_complete_checkpoint(run_dir)
        if last is None:
            raise FileNotFoundError(
                f"`resume_from_checkpoint: {resume}` but {run_dir} holds no complete checkpoint-* folder. Train "
                "without it first, or pass the path of a checkpoint folder."
            )
        logger.info(f"Resuming from {last}")
        return last
    if resume is not None and str(resume).lower() not in ("false", "none", ""):
        if not os.path.isdir(resume):
            raise FileNotFoundError(f"`resume_from_checkpoint` {resume!r} is not a checkpoint folder.")
        missing = missing_checkpoint_files(Path(resume))
        if missing:
            raise FileNotFoundError(
                f"`resume_from_checkpoint` {resume!r} is incomplete (no {' or '.join(missing)}). Pass a complete "
                "checkpoint-* folder, or `true` for the run's last complete one."
            )
        return resume
    earlier = sorted(p.name for p in run_dir.glob("checkpoint-*")) + [
        p.name for p in (run_dir / "results.json",) if p.exists()
    ]
    if earlier and not training_args.overwrite_output_dir:
        raise FileExistsError(
            f"{run_dir} already holds an earlier run ({', '.join(earlier[:3])}). Nothing was changed. Fix: "
            "`--resume_from_checkpoint true` to continue it, a new `--output_dir`, or `--overwrite_output_dir true` "
            "to replace it."
        )
    if earlier and training_args.process_index == 0:
        # Asked to replace the run: its old checkpoints would otherwise mix with the new ones in rotation.
        logger.warning(f"--overwrite_output_dir: removing the earlier run's {', '.join(earlier)} in {run_dir}")
        for name in earlier:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return None


def missing_checkpoint_files(checkpoint: Path) -> list[str]:
    """What a checkpoint folder lacks to resume from: its weights and `trainer_state.json` (empty when complete)."""
    has_weights = any((checkpoint / name).is_file() for name in WEIGHT_FILES)
    missing = [] if has_weights else ["model.safetensors"]
    return missing + [name for name in ("trainer_state.json",) if not (checkpoint / name).is_file()]


def last_complete_checkpoint(run_dir: Path) -> str | None:
    """The newest `checkpoint-N` of `run_dir` that can be resumed from. Checkpoints are saved atomically, but a folder
    written by an older version, or damaged since, may lack files: it is skipped with a warning (and left in place)
    instead of being resumed into a crash."""
    numbered = [p for p in run_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-", 1)[1].isdigit()]
    for checkpoint in sorted(numbered, key=lambda p: int(p.name.split("-", 1)[1]), reverse=True):
        missing = missing_checkpoint_files(checkpoint)
        if not missing:
            return str(checkpoint)
        logger.warning(
            f"Skipping the incomplete checkpoint {checkpoint} (no {', '.join(missing)}); it is left in place."
        )
    return None


def remove_partial_checkpoints(run_dir: Path, training_args: TrainingArguments) -> None:
    """Delete the `tmp-checkpoint-*` folders of saves that failed or were interrupted: they are incomplete by
    construction (a checkpoint is renamed to `checkpoint-N` only once fully written) and nothing can resume from
    them."""
    partial = sorted(run_dir.glob(PARTIAL_CHECKPOINT_PREFIX + "checkpoint-*")) if run_dir.is_dir() else []
    if partial and training_args.process_index == 0:
        logger.warning(
            f"Removing {len(partial)} incomplete checkpoint(s) left by an interrupted or failed save in {run_dir}: "
            f"{', '.join(p.name for p in partial)}. The complete checkpoint-* folders are kept."
        )
        for path in partial:
            shutil.rmtree(path, ignore_errors=True)
