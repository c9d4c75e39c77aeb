"""The run folder: which checkpoint to resume from (only a whole one), the guard that never trains over an earlier
run's work by accident, and the lock that keeps a second run out of a folder in use."""

import atexit
import contextlib
import json
import os
import re
import shutil
import socket
import time
from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path

import psutil
import torch
from safetensors import safe_open
from transformers import TrainerCallback, TrainerState, TrainingArguments
from transformers.hf_argparser import string_to_bool
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_pt_utils import safe_globals
from transformers.utils import logging

from finetune.callbacks import EMA_STATE_NAME, KEPT_FROM_THE_START, check_options_kept, option, saved_attributes
from finetune.errors import one_line
from finetune.locations import ADAPTER_CONFIG_NAME
from finetune.results import RESULTS_NAME


logger = logging.get_logger(__name__)

LATEST = ("true", "last", "latest")
LOCK_NAME = ".run.lock"
FINISHED = "finished"  # `resolve_checkpoint` of a model that a resumed `model_type: both` run had finished


def numbered_checkpoints(run_dir: Path) -> list[Path]:
    """The `checkpoint-N` folders of `run_dir`, newest first."""
    numbered = [p for p in run_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-", 1)[1].isdigit()]
    return sorted(numbered, key=lambda p: int(p.name.split("-", 1)[1]), reverse=True)


def resolve_checkpoint(
    run_dir: Path, training_args: TrainingArguments, one_of_two: bool = False, kept: dict | None = None
) -> str | None:
    """The checkpoint to resume from, and a guard that never trains over an earlier run's work by accident; `kept`:
    options of other groups than `training_args` that a resume must keep (`layer_decay`)."""
    remove_partial_checkpoints(run_dir, training_args)
    resume = training_args.resume_from_checkpoint
    text = "" if resume is None else str(resume).lower()
    if text and not os.path.exists(str(resume)):  # `yes`, `1`, ... as switches read them, where no folder has the name
        with contextlib.suppress(ArgumentTypeError):
            text = str(string_to_bool(text)).lower()
    if one_of_two and text not in (*LATEST, "auto", "false", "none", ""):
        raise ValueError(
            f"`resume_from_checkpoint` {resume} names one checkpoint, and `model_type: both` trains two models, "
            "each with its own. Fix: `--resume_from_checkpoint true` (each model goes on from its newest whole "
            "checkpoint; a finished one is kept), or resume each model as its own run (`--model_type` one of them, "
            "`--output_dir` its folder, e.g. OUTPUT/scratch)."
        )
    if one_of_two and text in (*LATEST, "auto"):
        # A `both` run resumed: a model that finished is kept (resumed, it would train on past an early stop and
        # rewrite its results); a model stopped in training resumes, one not reached yet starts.
        if (run_dir / RESULTS_NAME).exists() and whole_json(run_dir / RESULTS_NAME):
            return FINISHED  # (a damaged one is written again: its training had ended, the resume trains no step)
        text = "auto"
    # `auto`: preemptible machines restart the same command; resume where there is a checkpoint, else start.
    numbered = numbered_checkpoints(run_dir)
    if text == "auto" and numbered and not (run_dir / RESULTS_NAME).exists() and all(map(cut_short, numbered)):
        # Stopped again during the first save (a preemption's SIGTERM, then its kill): nothing to resume.
        if training_args.process_index == 0:
            logger.warning(
                f"{', '.join(c.name for c in numbered)} in {run_dir}: {CUT_SHORT}, and no checkpoint is whole: "
                "starting anew (`resume_from_checkpoint: auto`); they are left in place."
            )
        return None
    if text in LATEST or (text == "auto" and numbered):
        return prepare_resume(newest_whole_checkpoint(run_dir, training_args), run_dir, training_args, kept)
    earlier = earlier_run(run_dir)
    if text not in ("false", "none", "", "auto"):
        saved = ("trainer_state.json", "config.json", "model.safetensors", "optimizer.pt")
        if not any(os.path.isfile(os.path.join(resume, name)) for name in saved):  # also a missing folder
            inside = numbered_checkpoints(Path(resume)) if os.path.isdir(resume) else []
            names = ", ".join(p.name for p in inside[:3])
            raise FileNotFoundError(
                f"`resume_from_checkpoint` {resume!r} is not a checkpoint folder"
                + (f"; it holds {names}: pass one of them (the newest is {inside[0].name})." if inside else ".")
            )
        problem = checkpoint_problem(Path(resume), training_args)
        if problem:
            raise ValueError(
                f"`resume_from_checkpoint` {resume!r} cannot be resumed: {problem}. {fix_for(problem, resume)}"
            )
        if earlier and Path(resume).resolve().parent != run_dir.resolve() and not training_args.overwrite_output_dir:
            # Another run's checkpoint going on here would overwrite this folder's checkpoints and results.
            raise FileExistsError(
                f"{run_dir} already holds an earlier run ({', '.join(earlier[:3])}), and the checkpoint {resume} is "
                "not one of its own. Nothing was changed. Fix: a new `--output_dir` to go on from that checkpoint "
                "there, or `--overwrite_output_dir true` to replace the earlier run."
            )
        return prepare_resume(resume, run_dir, training_args, kept)
    if earlier and not training_args.overwrite_output_dir:
        # With no checkpoint left (deleted after the run), there is nothing to continue from.
        resume = "`--resume_from_checkpoint true` to continue it, " if earlier != [RESULTS_NAME] else ""
        raise FileExistsError(
            f"{run_dir} already holds an earlier run ({', '.join(earlier[:3])}). Nothing was changed. Fix: "
            f"{resume}a new `--output_dir`, or `--overwrite_output_dir true` to replace it."
        )
    return None  # an earlier run asked to be replaced is removed once the new one can train: `remove_earlier_run`


def earlier_run(run_dir: Path) -> list[str]:
    """The names of an earlier run's `checkpoint-N` folders and results in `run_dir`."""
    earlier = [p.name for p in reversed(numbered_checkpoints(run_dir))]
    return earlier + ([RESULTS_NAME] if (run_dir / RESULTS_NAME).exists() else [])


# What else a run, or a tool on it, writes into its folder that the next run may not write again, and that would then
# be served as its model: the other kind's weights (LoRA or full, shards), merged/, ONNX, the card, evaluations.
EARLIER_OUTPUTS = (
    ADAPTER_CONFIG_NAME, "adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin",
    "model.safetensors.index.json", "model-*-of-*.safetensors", "pytorch_model.bin.index.json", "merged", "onnx",
    "onnx-checkpoint-*", "predictions_*.csv", "eval_results.json", "test_results.json", "README.md",
)  # fmt: skip


def earlier_outputs(run_dir: Path) -> list[Path]:
    """The files and folders of `EARLIER_OUTPUTS` in `run_dir`: an ONNX export only with its model.onnx, the model card
    only as it was written (`edited_card`: one edited by hand is kept)."""
    from finetune.tools.model_card import edited_card

    kept = {run_dir / "README.md"} if edited_card(run_dir) else set()
    kept |= {p for p in [run_dir / "onnx", *run_dir.glob("onnx-checkpoint-*")] if not (p / "model.onnx").is_file()}
    return sorted({path for pattern in EARLIER_OUTPUTS for path in run_dir.glob(pattern)} - kept)


def remove_earlier_run(run_dir: Path, training_args: TrainingArguments) -> None:
    """`overwrite_output_dir`: remove the earlier run's checkpoints (else mixed with the new ones in rotation), its
    results, and its outputs the new run may not replace. Called just before training, once the data and the model
    are ready: a mistake found on the way then leaves the earlier run whole."""
    earlier = earlier_run(run_dir)
    if earlier and training_args.overwrite_output_dir and training_args.process_index == 0:
        paths = [run_dir / name for name in earlier] + earlier_outputs(run_dir)
        names = ", ".join(p.name + "/" * p.is_dir() for p in paths)
        logger.warning(f"--overwrite_output_dir: removing the earlier run's {names} in {run_dir}")
        for path in paths:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if (run_dir / "README.md").is_file():
            logger.warning(f"{run_dir / 'README.md'}, edited by hand, is kept: it describes the earlier run.")


class RemoveEarlierRun(TrainerCallback):
    """`remove_earlier_run` at the start of training, once `ResumeCheck` accepted the resumed checkpoint (a resume
    refused there had deleted the earlier run first)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def on_train_begin(self, args, state, control, **kwargs):
        remove_earlier_run(self.run_dir, args)


def newest_whole_checkpoint(run_dir: Path, training_args: TrainingArguments) -> str:
    """The newest `checkpoint-N` of `run_dir` that can be resumed exactly. A damaged one (cut short, a file deleted)
    is skipped, with a warning, for the one before; it is left in place."""
    numbered = numbered_checkpoints(run_dir)
    if not numbered:
        raise FileNotFoundError(
            f"`resume_from_checkpoint: {training_args.resume_from_checkpoint}` but {run_dir} holds no complete "
            "checkpoint-* folder. Train without it first, or pass the path of a checkpoint folder."
        )
    problems = []
    for checkpoint in numbered:
        problem = checkpoint_problem(checkpoint, training_args)
        if not problem:
            logger.info(f"Resuming from {checkpoint}")
            return str(checkpoint)
        problems.append(problem)
        if training_args.process_index == 0:
            logger.warning(f"Skipping {checkpoint}: {problem}; it cannot be resumed exactly, and is left in place.")
    fix = fix_for(problems[0], numbered[0])
    if problems[0] == CUT_SHORT:  # every checkpoint was tried: no earlier one to pass
        fix = "Fix: start anew: `--resume_from_checkpoint auto` does where no checkpoint is whole."
        if (run_dir / RESULTS_NAME).exists():  # `auto` starts anew only a run that did not finish
            fix = (
                f"Its finished model and {RESULTS_NAME} are kept. Fix: train anew with `--overwrite_output_dir true` "
                "(or a new `--output_dir`)."
            )
    raise ValueError(
        f"{run_dir} holds no whole checkpoint to resume from (the newest, {numbered[0].name}: {problems[0]}). {fix}"
    )


def prepare_resume(checkpoint: str, run_dir: Path, training_args: TrainingArguments, kept: dict | None = None) -> str:
    """`checkpoint`, with its recorded best checkpoint found by name next to it when the run folder was moved, and
    the options it must be resumed with checked before the data loads (`ResumeCheck` checks the rest)."""
    path = Path(checkpoint) / TRAINER_STATE_NAME
    state = TrainerState.load_from_json(str(path))
    check_options_kept(state, {name: option(training_args, name) for name in KEPT_FROM_THE_START} | (kept or {}))
    # The Trainer records the best checkpoint as a path from where the run started; resumed from elsewhere (or after
    # the folder was moved) it would drop it with a warning and end with the last weights instead of the best.
    recorded, folder = state.best_model_checkpoint, Path(checkpoint).parent
    if recorded is None or training_args.process_index != 0:
        return checkpoint  # the other processes read it after the main one has loaded the data: rewritten by then
    if folder.resolve() == run_dir.resolve():
        folder = run_dir  # spelled as the Trainer spells the checkpoints it rotates (it keeps the best one)
    elif os.path.isdir(recorded):
        return checkpoint
    state.best_model_checkpoint = str(folder / Path(recorded).name)
    if state.best_model_checkpoint != recorded and os.path.isdir(state.best_model_checkpoint):
        state.save_to_json(str(path.with_name(path.name + ".tmp")))
        os.replace(path.with_name(path.name + ".tmp"), path)  # a kill mid-write leaves the old file whole
    return checkpoint


MODEL_ONLY = "it holds the model only (saved with `save_only_model`)"
CUT_SHORT = (
    f"it was cut short: {TRAINER_STATE_NAME}, which a save writes last, is missing or incomplete (a stop or failure "
    "mid-save)"
)
OTHER_EMA = "it was saved by a run"
BEST_DAMAGED = "its best checkpoint"


def fix_for(problem: str, checkpoint: str | os.PathLike) -> str:
    """The fix for a checkpoint that cannot be resumed."""
    if problem.startswith(MODEL_ONLY):
        # The Trainer would resume such a checkpoint with a new optimizer and the schedule back at its start.
        return (
            "Resuming needs the optimizer and schedule states. Fix: start a new run from its weights "
            f"(`--model_type pretrained --model_name_or_path {checkpoint}` and a new `--output_dir`), and save "
            "without `save_only_model` to be able to resume."
        )
    if problem == CUT_SHORT:
        return (
            "Fix: pass the path of an earlier checkpoint-* folder, or start anew: `--resume_from_checkpoint auto` "
            "does where no checkpoint is whole."
        )
    if problem.startswith(BEST_DAMAGED):  # every later checkpoint ends with the same best one
        return (
            "Fix: restore its file from a copy, resume with `--load_best_model_at_end false` (and without "
            "`early_stopping_patience`: the run then ends with its last model), or train anew with "
            "`--overwrite_output_dir true`."
        )
    if problem.startswith(OTHER_EMA):
        return "Fix: resume with the `ema_decay` of the run that saved it, or start a new run (a new `--output_dir`)."
    return (
        "Fix: pass the path of another checkpoint-* folder, restore the file from a copy, or train anew with "
        "`--overwrite_output_dir true`."
    )


def checkpoint_problem(checkpoint: Path, training_args: TrainingArguments) -> str | None:
    """What keeps `checkpoint` from being resumed exactly, naming the file (`optimizer.pt is missing`), or None when
    every file the Trainer loads on resume is present and readable (cheaply: safetensors headers only, and
    `torch.load` memory-maps, where a cut-short zip fails on its missing central directory)."""
    files = os.listdir(checkpoint)
    if cut_short(checkpoint):
        return CUT_SHORT
    has_states = any(f in ("optimizer.pt", "scheduler.pt") or f.startswith("rng_state") for f in files)
    if not (training_args.deepspeed or has_states):
        return MODEL_ONLY
    required: list[tuple[str, Callable[[Path], object]]] = []  # trainer_state.json: read by `cut_short` above
    if not (training_args.deepspeed or training_args.fsdp):
        # DeepSpeed and FSDP save weights and optimizer in formats of their own (folders, shards) and load them.
        required += weight_files(checkpoint, files) + [("optimizer.pt", read_torch)]
    if not training_args.deepspeed:
        required += [("scheduler.pt", read_torch)]
    if training_args.fp16 and not training_args.use_cpu and not training_args.deepspeed:
        required += [("scaler.pt", read_torch)]  # accelerate's loss scaler exists for fp16 on accelerators only
    state = json.loads((checkpoint / TRAINER_STATE_NAME).read_text())  # whole: `cut_short` read it
    processes = saved_attributes(state.get("stateful_callbacks", {})).get("processes")
    required += [(name, read_torch) for name in rng_state_files(files, processes)]
    ema = getattr(training_args, "ema_decay", None) is not None
    if ema != (EMA_STATE_NAME in files):
        try:
            saved = torch.load(checkpoint / "training_args.bin", weights_only=False)  # the saving run's arguments
        except Exception:
            saved = None  # unreadable: the files below tell
        if saved is not None and (getattr(saved, "ema_decay", None) is not None) != ema:
            return f"{OTHER_EMA} {'without' if ema else 'with'} `ema_decay`"  # it trained other weights than saved
    if ema:
        required += [(EMA_STATE_NAME, read_weights)]  # the training weights and the average
    return unreadable(checkpoint, required) or best_checkpoint_problem(checkpoint, training_args)


def unreadable(checkpoint: Path, required: list[tuple[str, Callable[[Path], object]]]) -> str | None:
    """The first of the `required` files of `checkpoint` that is missing or cannot be read, said as a problem."""
    for name, read in required:
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            read(path)
        except Exception as error:
            return f"{name} is unreadable ({one_line(error).split('. ')[0]})"  # torch adds advice on loading
    return None


def best_checkpoint_problem(checkpoint: Path, training_args: TrainingArguments) -> str | None:
    """Where the run ends with its best model: a damaged best checkpoint other than `checkpoint` (found by name next
    to it, as `prepare_resume` finds it), which failed only after the resumed run had trained to its end."""
    if not training_args.load_best_model_at_end or training_args.deepspeed or training_args.fsdp:
        return None
    recorded = json.loads((checkpoint / TRAINER_STATE_NAME).read_text()).get("best_model_checkpoint")
    best = checkpoint.parent / Path(recorded).name if recorded else None
    if best is None or best.name == checkpoint.name or not best.is_dir():
        return None
    problem = unreadable(best, weight_files(best, os.listdir(best)))
    return f"{BEST_DAMAGED}, {best.name}, which the run ends with, is damaged: {problem}" if problem else None


def whole_json(path: Path) -> bool:
    """Whether `path` holds a JSON map (not one cut short, or emptied)."""
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def cut_short(checkpoint: Path) -> bool:
    """Whether a save of `checkpoint` stopped before its last file, trainer_state.json, was whole (reads that file
    alone: `resume_from_checkpoint: auto` asks it of every checkpoint)."""
    try:
        return not isinstance(json.loads((checkpoint / TRAINER_STATE_NAME).read_text()).get("global_step"), int)
    except (OSError, ValueError, AttributeError):  # missing, or cut short while written (JSONDecodeError: ValueError)
        return True


def weight_files(checkpoint: Path, files: list[str]) -> list[tuple[str, Callable[[Path], object]]]:
    """The weight files the resume loads, with how to read each."""
    if ADAPTER_CONFIG_NAME in files:
        return [("adapter_model.bin" if "adapter_model.bin" in files else "adapter_model.safetensors", read_weights)]
    if "model.safetensors.index.json" in files:
        try:
            shards = read_index(checkpoint / "model.safetensors.index.json")
        except (ValueError, KeyError, TypeError):
            shards = []  # the index itself is damaged: reported when read below
        return [("model.safetensors.index.json", read_index)] + [(name, read_weights) for name in shards]
    if "model.safetensors" not in files and "pytorch_model.bin" in files:
        return [("pytorch_model.bin", read_weights)]
    return [("model.safetensors", read_weights)]


def rng_state_files(files: list[str], processes: int | None) -> list[str]:
    """The RNG states of a checkpoint that `processes` processes saved (`ResumeCheck` records them; before it did,
    as many as its files): `rng_state.pth` of one, `rng_state_{i}.pth` of each of several. A resume with another number
    of processes goes on from those of its processes that were saved, and says so (`ResumeCheck`)."""
    if processes is None:
        numbered = [int(m[1]) for f in files if (m := re.fullmatch(r"rng_state_(\d+)\.pth", f))]
        processes = max(numbered) + 1 if numbered and "rng_state.pth" not in files else 1  # a missing one is named
    return ["rng_state.pth"] if processes == 1 else [f"rng_state_{i}.pth" for i in range(processes)]


def read_index(path: Path) -> list[str]:
    """The shards a `model.safetensors.index.json` names."""
    return sorted(set(json.loads(path.read_text())["weight_map"].values()))


def read_weights(path: Path) -> None:
    if path.suffix == ".safetensors":
        with safe_open(path, framework="pt") as f:
            f.keys()
    else:
        read_torch(path)


def read_torch(path: Path) -> None:
    with safe_globals():  # the numpy types of the RNG states, as the Trainer allows them when it loads
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def remove_partial_checkpoints(run_dir: Path, training_args: TrainingArguments) -> None:
    """Delete the incomplete `tmp-checkpoint-*` folders that earlier versions' interrupted saves left."""
    partial = sorted(run_dir.glob("tmp-checkpoint-*")) if run_dir.is_dir() else []
    if partial and training_args.process_index == 0:
        logger.warning(
            f"Removing {len(partial)} incomplete checkpoint(s) left by an interrupted or failed save in {run_dir}: "
            f"{', '.join(p.name for p in partial)}. The complete checkpoint-* folders are kept."
        )
        for path in partial:
            shutil.rmtree(path, ignore_errors=True)


class RunLock:
    """`output_dir/.run.lock`, holding `{pid, host, started}` of the one run that uses the folder: created atomically
    (`O_CREAT | O_EXCL`, also on NFS v3+), not `fcntl.flock`, which is per host. A lock whose process is gone from this
    host is stale and taken over; one of another host cannot be checked, so it is reported with the fix."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / LOCK_NAME
        self.held = self.made_folder = False

    def acquire(self) -> "RunLock":
        """Hold the lock, or raise `RuntimeError` naming the run that holds it."""
        self.made_folder = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        for attempt in range(3):  # again after a stale lock is taken over, or while one is being written or removed
            if self.create(me):
                self.refuse_nested(me)
                return self
            holder = read_lock(self.path)
            if holder and self.is_stale(holder, me):
                self.take_over(holder)
            elif holder or (holder == {} and attempt == 2):
                raise RuntimeError(in_use(self.path.parent, self.path, holder))
            elif holder == {}:
                time.sleep(0.2)
        raise RuntimeError(f"Could not lock {self.path.parent}: other runs keep taking it. Start this run again.")

    def refuse_nested(self, me: dict) -> None:
        """Release and refuse while a live run holds a folder above this one or right below it (a `both` run's
        `pretrained/`): writing here could destroy that run's work."""
        folder = self.path.parent.resolve()
        for path in [*(p / LOCK_NAME for p in folder.parents), *folder.glob(f"*/{LOCK_NAME}")]:
            holder = read_lock(path)
            if holder and not self.is_stale(holder, me):
                self.release()
                raise RuntimeError(in_use(self.path.parent, path, holder))

    def create(self, me: dict) -> bool:
        try:
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as f:
            json.dump(me, f)
        self.held = True
        HELD.append(self)
        atexit.register(self.release)  # at the latest; SIGKILL skips it, hence the takeover of stale locks
        return True

    @staticmethod
    def is_stale(holder: dict, me: dict) -> bool:
        if holder.get("host") != me["host"] or not isinstance(holder.get("pid"), int):
            return False
        # This process's own lock is stale too: an earlier pipeline here (a notebook, a test) that ended in an error,
        # or a killed container's run restarted with the same process id.
        return holder["pid"] == me["pid"] or not psutil.pid_exists(holder["pid"])

    def take_over(self, holder: dict) -> None:
        """Remove a stale lock: renamed away first, and put back if another run took it over first."""
        aside = self.path.with_name(f"{LOCK_NAME}.{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if read_lock(aside) != holder:
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        elif holder["pid"] != os.getpid():
            logger.info(f"Taking over {self.path}: its run (process {holder['pid']}) is no longer alive.")
        aside.unlink()

    def release(self) -> None:
        """Remove the lock if this process holds it, and the folder if the lock made it and it stayed empty. A folder
        that turned read-only keeps its lock (taken over later as stale), and the error that ended the run is shown."""
        atexit.unregister(self.release)
        if self in HELD:
            HELD.remove(self)
        held, self.held = self.held, False
        if held and (read_lock(self.path) or {}).get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)
                if self.made_folder and not any(self.path.parent.iterdir()):
                    self.path.parent.rmdir()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


HELD: list[RunLock] = []  # the locks this process holds


def release_output_dirs() -> None:
    """Release the output folders this process holds: `run.main` calls it when a run ends, also after an error."""
    for lock in list(HELD):
        lock.release()


def holder_text(holder: dict) -> str:
    """The run a lock names, as the refusals and the tools say it."""
    return f"process {holder['pid']} on {holder['host']}, started {holder['started']}"


def in_use(folder: Path, lock: Path, holder: dict) -> str:
    """The refusal of a run in `folder`, whose `lock` (of that folder, or of one above or below it) `holder` holds."""
    other = holder_text(holder) if holder else ""
    where = "" if lock.parent == folder else f", which holds {lock.parent}"
    return (
        f"{folder} is in use by another run ({other or 'an unreadable lock'}{where}). Fix: wait for it to end, or use "
        f"another `--output_dir`; if that run is gone, delete {lock}."
    )


def read_lock(path: Path) -> dict | None:
    """A lock's holder; `{}` when unreadable (being written, or damaged: never taken over); None when it is gone."""
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) and {"pid", "host", "started"} <= holder.keys() else {}


def lock_output_dir(output_dir: str | os.PathLike, training_args: TrainingArguments) -> RunLock:
    """Lock `output_dir` for this run (`run.main` releases it); refuse, on every process, if another run holds it.
    Only global rank 0 locks: nodes may share the folder."""
    lock, refusal = RunLock(output_dir), [None]
    if training_args.process_index == 0:
        try:
            lock.acquire()
        except RuntimeError as error:
            refusal[0] = str(error)
    if training_args.world_size > 1:
        # Each process ends with the refusal's line, not with "connection closed by peer" once rank 0 has left.
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(refusal)
    if refusal[0]:
        raise RuntimeError(refusal[0])
    return lock
