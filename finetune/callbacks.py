"""Trainer callbacks that `ImageClassificationTrainer` builds from its arguments: the run's one clock (`RunClock`), a
wall-clock budget with a schedule that ends at it, an exponential moving average (EMA) of the weights evaluated and
saved in place of the weights, a stop on SIGTERM/SIGINT that saves a checkpoint first, and quieter progress bars."""

import datetime
import enum
import functools
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable

import torch
from accelerate.utils import reduce
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import EarlyStoppingCallback, ProgressCallback, TrainerCallback, TrainerState, set_seed
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import SaveStrategy, has_length
from transformers.utils import logging

from finetune.errors import Interrupted, signal_name
from finetune.results import history_from_log_history


logger = logging.get_logger(__name__)
EMA_STATE_NAME = "ema_state.safetensors"  # in each checkpoint: the training weights and the average (`EMACallback`)


def total_batch_size(args) -> int:
    """Images per optimizer step, over every process (`train_batch_size`: a process's, all its GPUs' where the Trainer
    splits a batch over several with DataParallel)."""
    return args.train_batch_size * args.gradient_accumulation_steps * args.world_size


def restore_state(callback: ExportableState, state) -> None:
    """Take up a callback's attributes saved in a resumed run's checkpoint (`TrainerState.stateful_callbacks`). Not
    the Trainer's `restore_callback_states_from_checkpoint`, which replaces the callback behind the trainer's back. A
    checkpoint saved without it gets its entry, which the Trainer's next save updates (and fails without)."""
    saved = state.stateful_callbacks.setdefault(type(callback).__name__, callback.state())
    for name, value in saved.get("attributes", {}).items():
        setattr(callback, name, value)


# The options whose values a checkpoint's optimizer and scheduler states hold, and a resume would take from there.
OPTIMIZER_OPTIONS = ("learning_rate", "weight_decay", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps")
OPTIMIZER_OPTIONS += ("optim", "optim_args", "adam_beta1", "adam_beta2", "adam_epsilon")
# The options whose consequences a checkpoint holds otherwise: the validation split and the order of the images (the
# seeds), the best model kept so far (by which metric), the weights' average, what taught them (the teacher's options).
DISTILLATION_OPTIONS = ("teacher_model_name_or_path", "distillation_type", "distillation_alpha")
DISTILLATION_OPTIONS += ("distillation_temperature",)
RUN_OPTIONS = ("seed", "data_seed", "metric_for_best_model", "greater_is_better", "ema_decay", *DISTILLATION_OPTIONS)
HELD_BY = {
    **dict.fromkeys((*OPTIMIZER_OPTIONS, "layer_decay"), "optimizer and schedule states"),
    **dict.fromkeys(("seed", "data_seed"), "validation split (another one holds images it trained on)"),
    **dict.fromkeys(("metric_for_best_model", "greater_is_better"), "best model so far"),
    "ema_decay": "weights' average",
    "finetune_method": "weights (the adapters, the head or all of them)",
    **dict.fromkeys((*DISTILLATION_OPTIONS, "teacher_weights"), "weights, taught so far by another teacher or mix,"),
    # Data moved since: a link at its old path takes it up again.
    "dataset": "weights, trained so far on other images (or on these at their old path), and evaluations so far",
    # `decode_size`, `random_resized_crop` (its margin) or the processor set it: the earlier evaluations scored others.
    "stored_image_size": "evaluations so far (of images stored at that size: `decode_size`, `random_resized_crop`)",
}


def number(value):
    """A value as an error line shows it: 3.0 as 3, 3e-05 as 3e-05."""
    return f"{value:g}" if isinstance(value, float) else value


def option(args, name: str):
    """`args.name` as the checkpoint's JSON gives it back (an enum as its value, a tuple as a list)."""
    value = getattr(args, name, None)
    try:
        return json.loads(json.dumps(value.value if isinstance(value, enum.Enum) else value))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"`{name}` {value!r} cannot be saved with the checkpoints ({error}). Fix: give it as JSON data (strings, "
            "numbers, lists, maps with string keys), e.g. a date as a quoted string."
        ) from error


class ResumeRefused(ValueError):
    """A checkpoint this run cannot resume; every process refuses it alike (said once: `errors.said_elsewhere`)."""

    every_process = True


def effective(options: dict, name: str):
    """An option's value as the run uses it: an unset `data_seed` is `seed` (`--data_seed 42` for a run of seed 42
    keeps its split and order), a teacher's local folder is its full path (`./outputs/t` is `outputs/t`), and hard
    distillation has no temperature."""
    value = options.get(name)
    if name == "data_seed" and value is None:
        return options.get("seed")
    if name == "teacher_model_name_or_path" and value is not None and os.path.exists(os.path.expanduser(value)):
        return os.path.realpath(os.path.expanduser(value))
    if name == "distillation_temperature" and options.get("distillation_type") == "hard":
        return None  # unused: a checkpoint saved with one before it was refused resumes without it
    return value


def saved_attributes(stateful_callbacks: dict, callback: str = "ResumeCheck") -> dict:
    """What `callback` saved in a checkpoint's trainer_state.json (`stateful_callbacks`), {} where it saved nothing."""
    return stateful_callbacks.get(callback, {}).get("attributes", {})


def saved_options(state: TrainerState) -> dict:
    """The options a checkpoint's run trained with, as `ResumeCheck` saved them ({} before they were recorded)."""
    return saved_attributes(state.stateful_callbacks).get("options") or {}


def check_options_kept(state: TrainerState, now: dict) -> None:
    """Refuse to resume the checkpoint of `state` where an option of `now` (as `option` reads it) differs from the
    one it was trained with (one it did not record is kept)."""
    saved = saved_options(state)
    given_otherwise = [name for name in now if saved.get(name, now[name]) != now[name]]
    names = [name for name in given_otherwise if effective(saved, name) != effective(now, name)]
    if state.global_step == 0 or not names:
        return
    changed = [f"{name} {number(saved[name])} (now {number(now[name])})" for name in names]
    # What the checkpoint holds of each option changed; the data options make the validation split.
    held = dict.fromkeys(HELD_BY.get(name, HELD_BY["seed"]) for name in names)
    # From its weights on another validation split: one that holds images they trained on (refused).
    other_split = {"seed", "data_seed", "validation_size", "held_out_images", "validation_images", "dataset"}
    weights = "" if other_split & set(names) else (
        ", or start a new run from its weights (`--model_type pretrained --model_name_or_path` its checkpoint "
        "folder, a new `--output_dir`)"
    )  # fmt: skip
    if "validation_images" in names and set(names) <= {"validation_images", "held_out_images"}:
        held_out = "held out from its training images: some it trained on" if saved.get("held_out_images") else ""
        raise ResumeRefused(
            f"The resumed checkpoint (step {state.global_step}) was validated on other images: the dataset's "
            f"files changed since (added or removed), and this run's validation split holds others"
            f"{f' ({held_out})' if held_out else ''}. Fix: resume on the dataset's files as they were, or start a "
            "new run (a new `--output_dir`)."
        )
    raise ResumeRefused(
        f"The resumed checkpoint (step {state.global_step}) was trained with {', '.join(changed)}: its "
        f"{', '.join(held)} would go on with the old values while the results recorded the new. Fix: resume "
        f"with the options it was trained with{weights}."
    )


# The training recipe: changed on resume (MixUp off for the last epochs is a recipe of its own), the run goes on with
# the new values, said, as results.json records them for the whole run. The augmentation options come with
# `ResumeCheck`'s `data_options` (as "augmentation").
RECIPE_OPTIONS = ("mixup_alpha", "cutmix_alpha", "label_smoothing_factor", "max_grad_norm", "class_weighting")
RECIPE_OPTIONS += ("flip_tta",)

# The options `check_options_kept` compares before the data loads: the rest follow the data (multi-label data keeps
# the best mAP) or are the data's.
KEPT_FROM_THE_START = (*OPTIMIZER_OPTIONS, "seed", "data_seed", "ema_decay", *DISTILLATION_OPTIONS)


class ResumeCheck(TrainerCallback, ExportableState):
    """Refuses a resumed checkpoint trained with other `OPTIMIZER_OPTIONS`, `RUN_OPTIONS` or `data_options` (the
    options of the images' split, from `finetune.run`), or at another count of optimizer steps an epoch, whatever set
    it (the Trainer reads the saved step through this run's: step 20 at 16 an epoch, resumed at 8, was epoch 2.5), or
    of images an optimizer step. A resume in another mixed precision or number of processes, or of an unfinished run
    with another length, is said with the fix; one without the time budget its schedule was fitted to
    (`TrainingBudgetCallback`) is refused."""

    def __init__(self, data_options: dict | None = None):
        self.steps_per_epoch = self.options = self.precision = self.max_steps = self.recipe = self.batch = None
        self.processes = None
        self.ended = False
        self.data_options = data_options or {}

    def state(self) -> dict:
        attributes = {"steps_per_epoch": self.steps_per_epoch, "options": self.options, "precision": self.precision}
        attributes.update(max_steps=self.max_steps, recipe=self.recipe, batch=self.batch, processes=self.processes)
        return {"args": {}, "attributes": attributes}

    def on_epoch_begin(self, args, state, control, **kwargs):
        # A resumed run whose training had ended: the epoch takes no batch (`ImageClassificationTrainer.
        # get_batch_samples`), and ends without evaluating or saving again the step its checkpoint holds.
        self.ended = control.should_training_stop

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.ended:
            control.should_evaluate = control.should_save = False

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.steps_per_epoch, self.options, self.precision, resumed = None, None, None, state.global_step > 0
        self.max_steps = self.recipe = self.batch = self.processes = None
        restore_state(self, state)
        planned, self.max_steps = self.max_steps, state.max_steps
        fitted = saved_attributes(state.stateful_callbacks, "TrainingBudgetCallback").get("planned_steps")
        trained_in, self.precision = self.precision, str(args.mixed_precision)  # bf16, fp16 or no
        if trained_in == "fp16" and args.device.type == "cpu":  # recorded before fp16 on a CPU was refused: float32
            trained_in = "no"
        if resumed and trained_in not in (None, self.precision) and state.is_world_process_zero:
            # Not refused: `bf16: auto` measures the machine again, and a resume may run on another one.
            flags = {"bf16": "--bf16 true", "fp16": "--fp16 true"}.get(trained_in, "--bf16 false --fp16 false")
            logger.warning(
                f"The resumed checkpoint (step {state.global_step}) trained in mixed precision {trained_in} and this "
                f"run goes on in {self.precision}: it will not end with an uninterrupted run's weights. Fix: resume "
                f"with `{flags}` to go on as it trained."
            )
        self.options = {name: option(args, name) for name in OPTIMIZER_OPTIONS + RUN_OPTIONS}
        data_options = json.loads(json.dumps(self.data_options))
        augmentation = data_options.pop("augmentation", {})
        # Whether this run's held-out split differs from the one a run saved before it was drawn from every class
        # (one class per image, `include_labels` other than all classes in their order): said by `finetune.run`.
        split_redrawn = data_options.pop("split_redrawn", False)
        self.options.update(data_options)
        check_options_kept(state, self.options)  # against the saved ones, which `state` holds
        if resumed and split_redrawn and "held_out_images" not in saved_options(state):  # saved before it was
            raise ResumeRefused(
                f"The resumed checkpoint (step {state.global_step}) held out its validation split from the "
                "`include_labels` classes alone; this version draws it from every class's images, which would "
                "validate on images it trained on. Fix: start a new run (a new `--output_dir`)."
            )
        saved, self.recipe = self.recipe or {}, {name: option(args, name) for name in RECIPE_OPTIONS} | augmentation
        self.recipe["flip_tta"] = bool(self.recipe["flip_tta"])  # unset is off
        changed = [f"{name} {number(saved[name])} (now {number(value)})" for name, value in self.recipe.items()
                   if name in saved and saved[name] != value]  # fmt: skip
        if resumed and changed and state.is_world_process_zero:
            logger.warning(
                f"The resumed checkpoint (step {state.global_step}) trained with {', '.join(changed)}: the run goes "
                "on with the new values, and its results.json records them for the whole run."
            )
        if has_length(train_dataloader):  # else no epochs to count
            now = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)  # as the Trainer counts them
            # A checkpoint that did not save them: `epoch` counts the running epoch's batches, so the ratio lies
            # between batches / accumulation and its ceiling (not after a resume with `ignore_data_skip`).
            then = self.steps_per_epoch or (state.epoch and math.ceil(state.global_step / state.epoch - 1e-6))
            self.steps_per_epoch = now
            if resumed and then != now:
                raise ResumeRefused(
                    f"The resumed checkpoint (step {state.global_step}) was trained at {then} optimizer steps an "
                    f"epoch, and this run has {now}: its steps would not count this run's epochs (another batch size, "
                    "number of processes, gradient accumulation or number of training images). Fix: resume with the "
                    "options it was trained with, or start a new run (a new `--output_dir`)."
                )
        # Images an optimizer step: the same steps an epoch at another batch size (31 for 32) trained other steps and
        # skipped other images to go on in the epoch.
        trained_at, self.batch = self.batch, total_batch_size(args)
        if args.auto_find_batch_size:  # the size it settles on is the Trainer's own, not the arguments'
            self.batch = None
        if resumed and trained_at not in (None, self.batch) and self.batch is not None:
            raise ResumeRefused(
                f"The resumed checkpoint (step {state.global_step}) was trained at {trained_at} images an optimizer "
                f"step (`per_device_train_batch_size` x GPUs a process x `gradient_accumulation_steps` x processes), "
                f"and this run takes {self.batch}: it would go on with other steps, and skip other images of the "
                "running epoch. Fix: resume with the batch size it was trained with, or start a new run (a new "
                "`--output_dir`)."
            )
        trained_by, self.processes = self.processes, args.world_size
        if resumed and trained_by not in (None, self.processes) and state.is_world_process_zero:
            # Not refused, as each step takes the same images (checked above); the Trainer restores the generators of
            # the processes the checkpoint saved, as `rng_state_files` checks them.
            logger.warning(
                f"The resumed checkpoint (step {state.global_step}) was trained by {trained_by} process(es) and this "
                f"run has {self.processes}: their random generators (augmentation, dropout) do not carry over, so it "
                f"will not end with an uninterrupted run's weights. Fix: resume with {trained_by} process(es) to go "
                "on as it trained."
            )
        if resumed and fitted is not None and getattr(args, "max_train_minutes", None) is None:
            raise ResumeRefused(
                f"The resumed checkpoint's learning-rate schedule was fitted to its time budget (`budget_schedule`, "
                f"ending at step {fitted}): without `max_train_minutes` it would jump back to the full schedule. Fix: "
                "resume with the `max_train_minutes` and `budget_schedule: true` it was trained with, or start a new "
                "run from its weights (`--model_type pretrained --model_name_or_path` its checkpoint folder)."
            )
        if resumed and 0 < state.max_steps < state.global_step:  # this run's `max_steps`, or its epochs' steps
            limit, fix = f"`max_steps` {args.max_steps}", "a `max_steps` above it (or -1 for the epochs)"
            if args.max_steps <= 0:
                limit = f"`num_train_epochs` {number(args.num_train_epochs)} ({state.max_steps} steps)"
                fix = "the `num_train_epochs` it was trained with"
            raise ResumeRefused(
                f"The resumed checkpoint is at step {state.global_step}, past {limit}: the run would train nothing "
                f"and record a limit it did not keep. Fix: {fix}, or resume from an earlier checkpoint "
                "(`--resume_from_checkpoint` its folder)."
            )
        if resumed and state.global_step == state.max_steps:  # the Trainer would take one more step before it checks
            logger.info(f"The resumed checkpoint is at the run's last step ({state.global_step}): no step is trained.")
            control.should_training_stop = True
        schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
        any_length = ("inverse_sqrt", "reduce_lr_on_plateau")  # schedules whose rate the length does not set
        constant = schedule.startswith("constant") or schedule in any_length
        if resumed and planned not in (None, state.max_steps) and state.global_step < planned and fitted is None:
            if state.is_world_process_zero and not constant:  # an unfinished run given another length: said
                logger.warning(
                    f"The resumed checkpoint (step {state.global_step}) was trained on a learning-rate schedule of "
                    f"{planned} steps, and this run has {state.max_steps} (another `num_train_epochs` or `max_steps`):"
                    " the schedule is stretched to the new length from here, so the rate changes at once, and the run "
                    "follows neither schedule. Fix: resume with the length it was started with, then train on."
                )
        elif resumed and planned == state.global_step < state.max_steps and fitted is None and not constant:
            if state.is_world_process_zero:  # a finished run trained on: its rate had decayed to the schedule's end
                logger.info(
                    f"Training on from the finished run's last step ({planned}) to step {state.max_steps}: its "
                    f"learning-rate schedule is drawn out to {state.max_steps} steps, so the rate rises at once from "
                    "the end of its decay to that schedule's rate at this step, and decays again."
                )


class ProcessRandomness(TrainerCallback):
    """With several processes, each draws its own augmentations (crops, flips, erasing, MixUp/CutMix), dropout and
    drop-path masks: seeded alike, every process augmented its batch exactly as the others did theirs. Seeded with
    `seed` plus the process index once the model (and its EMA) is built alike in each; a resumed run then restores
    each process's saved generators, as the Trainer does. One process keeps its generator as it is."""

    def on_train_begin(self, args, state, control, **kwargs):
        if args.world_size > 1:
            set_seed(args.seed + args.process_index)


class ResumedEarlyStopping(EarlyStoppingCallback):
    """transformers' early stopping, whose count of evaluations without improvement goes on after a resume (from 0,
    it trained past the uninterrupted run's stop); a run resumed from its stop's checkpoint trains no step."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        restore_state(self, state)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            logger.info(f"The resumed run had stopped early (step {state.global_step}): no step is trained.")
            control.should_training_stop = True


class RunClock(TrainerCallback, ExportableState):
    """The run's clock: stamps each log entry with `elapsed_seconds` since training began, and adds up the training
    loop's own time (evaluations and checkpoints left out), its optimizer steps and the sum of their losses, saved
    with every checkpoint so that `results.json` covers a resumed run whole. Images per second count the epochs
    trained times `num_images` (the training split's, over every process); without it, steps times the batch size."""

    def __init__(self, time_fn: Callable[[], float] = time.perf_counter, num_images: int | None = None):
        self.time_fn, self.num_images = time_fn, num_images
        self.epoch = 0.0  # the Trainer's epoch count at the last step: whole epochs and the running one's share
        self.train_start, self.train_seconds, self.steps = None, 0.0, 0
        self.loss_sum = 0.0  # a tensor on the device while training (no host read per step)
        self.elapsed_seconds = None  # a resumed run's seconds since training began, when its checkpoint was saved
        self._epoch_start = None
        self._paused = 0.0  # evaluations and checkpoints inside the running epoch
        self._mark = None  # the end of the last step, or of the last evaluation or checkpoint after it
        self.logged = None  # `[loss_sum, steps]` at the last training log
        self._carried = None  # a resumed run's steps since that log: `(loss sum, steps, steps at the resume)`

    def state(self) -> dict:
        attributes = {"train_seconds": self.training_seconds(), "steps": self.steps, "loss_sum": float(self.loss_sum)}
        attributes["elapsed_seconds"] = self.elapsed()  # evaluations and checkpoints included: what a budget counts
        attributes["logged"] = self.logged
        return {"args": {}, "attributes": attributes}

    def logged_loss(self, loss: float) -> float:
        """The Trainer's training loss of a log (the mean since its last log) over the steps a resume split off too:
        the Trainer counts from the resume, and the checkpoint's steps since the log before it were logged nowhere.
        Like the Trainer's, the sums are means over the processes."""
        carried, self._carried = self._carried, None
        if carried is not None:
            carried_loss, carried_steps, resumed_at = carried
            loss = (loss * (self.steps - resumed_at) + carried_loss) / (self.steps - resumed_at + carried_steps)
        # The sum as the checkpoints save it (`ClockBeforeSave`: the mean of every process's), from the logged means.
        logged_sum, logged_steps = self.logged or (float(self.loss_sum), self.steps)  # saved before `logged` was
        self.logged = [logged_sum + loss * (self.steps - logged_steps), self.steps]
        return loss

    def add_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss, as the Trainer adds it to its logged loss (already divided by the accumulation)."""
        self.loss_sum = self.loss_sum + loss.detach()

    def elapsed(self) -> float:
        return 0.0 if self.train_start is None else self.time_fn() - self.train_start

    def training_seconds(self) -> float:
        """The training loop's seconds up to the last step (a resumed run's included), without evaluations and
        checkpoints."""
        if self._epoch_start is None:
            return self.train_seconds
        end = self._mark if self._mark is not None else self.time_fn()
        return self.train_seconds + end - self._epoch_start - self._paused

    def on_train_begin(self, args, state, control, **kwargs):
        restore_state(self, state)  # a resumed run's totals
        self.epoch = state.epoch or 0.0
        if state.global_step == 0:
            self.logged = [0.0, 0]
        elif self.logged is not None and self.steps > self.logged[1]:  # else saved before `logged` was
            self._carried = (float(self.loss_sum) - self.logged[0], self.steps - self.logged[1], self.steps)
        # Checkpoints saved before `elapsed_seconds` was: the training seconds, without evaluations and checkpoints.
        self.train_start = self.time_fn() - (self.elapsed_seconds or self.train_seconds)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_start, self._paused, self._mark = self.time_fn(), 0.0, None

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
        self.epoch = state.epoch
        self._mark = self.time_fn()

    def on_evaluate(self, args, state, control, **kwargs):
        # An evaluation or checkpoint inside an epoch (`eval_strategy: steps`) is not training time.
        if self._epoch_start is not None and self._mark is not None:
            now = self.time_fn()
            self._paused += now - self._mark
            self._mark = now

    on_save = on_evaluate

    def on_epoch_end(self, args, state, control, **kwargs):
        # Called before the end-of-epoch evaluation and checkpoint, so those are not counted; an epoch that took no
        # step (a resumed run whose training had ended) adds nothing.
        if self._epoch_start is not None and self._mark is not None:
            self._mark = self.time_fn()
            self.train_seconds = self.training_seconds()
        self._epoch_start = None

    on_train_end = on_epoch_end  # a budget or `max_steps` can end training inside an epoch, with no `on_epoch_end`

    def figures(self, args) -> dict:
        """The whole run's training figures (a resumed run's included), named as transformers names its session's."""
        seconds, images = self.training_seconds(), self.images(args)
        # The mean of every process's sums (all ask for the figures at the same point: the end of training).
        loss = reduce(torch.as_tensor(self.loss_sum, dtype=torch.float32, device=args.device), reduction="mean")
        return {
            "train_loss": float(loss) / self.steps if self.steps else None,
            "train_runtime": seconds,
            "train_samples_per_second": images / seconds if seconds > 0 else None,
            "train_steps_per_second": self.steps / seconds if seconds > 0 else None,
        }

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "train_runtime" in logs:
            # The Trainer's closing line counts this session and the steps it planned, not those run.
            figures = self.figures(args)
            logs.update(figures)
            state.log_history[-1].update(figures)
        if self.train_start is not None and state.log_history:
            entry = state.log_history[-1]
            entry["elapsed_seconds"] = round(self.elapsed(), 3)
            if "eval_accuracy" in entry or "eval_map" in entry:
                # Logged before `on_evaluate`: the running epoch counts up to its last step.
                seconds = self.training_seconds()
                entry["train_seconds"] = round(seconds, 3)
                entry["train_steps"] = self.steps
                entry["train_images_per_second"] = round(self.images(args) / seconds, 1) if seconds > 0 else None

    def images(self, args) -> float:
        """The training images of the whole run so far, every process's."""
        if not self.num_images:
            return self.steps * total_batch_size(args)
        batch = args.train_batch_size * args.world_size
        per_epoch = self.num_images - self.num_images % batch if args.dataloader_drop_last else self.num_images
        return self.epoch * per_epoch


class ClockBeforeSave(TrainerCallback):
    """Before each checkpoint, every process's `RunClock.loss_sum` replaced by their mean, which process 0 saves and
    every resumed process takes up. Registered after the callbacks that ask for a checkpoint."""

    def __init__(self, clock: RunClock):
        self.clock, self.shared_at = clock, None

    def on_step_end(self, args, state, control, **kwargs):
        self.share(args, state, control.should_save)

    on_epoch_end = on_step_end

    def on_evaluate(self, args, state, control, **kwargs):
        # `save_strategy: best` saves after an evaluation that found a new best, as the Trainer decides after this.
        self.share(args, state, control.should_save or args.save_strategy == SaveStrategy.BEST)

    def share(self, args, state, saving: bool) -> None:
        if saving and args.world_size > 1 and self.shared_at != state.global_step:  # the same in every process
            self.clock.loss_sum = reduce(torch.as_tensor(self.clock.loss_sum, device=args.device), reduction="mean")
            self.shared_at = state.global_step


class TrainingBudgetCallback(TrainerCallback, ExportableState):
    """Stop training when `max_minutes` of wall-clock time have passed since training began (by `clock`, registered
    before this callback); with `fit_schedule`, re-plan the learning-rate schedule to end at the budget, from the
    seconds per step measured after `calibration_fraction` of it and again after each further tenth. The plan and the
    stop are saved with each checkpoint, and a resumed run keeps them."""

    def __init__(
        self,
        max_minutes: float,
        clock: RunClock,
        fit_schedule: bool = False,
        calibration_fraction: float = 0.02,
        guard=None,
        settle_steps: int = 1,
    ):
        self.budget_seconds = 60.0 * max_minutes
        # The rate is measured after the steps with one-off costs: the first, and under `torch_compile: auto` the
        # first compiled one (`TrainingCompiler.first_compiled_step`).
        self.settle_steps = settle_steps
        self.clock, self.fit_schedule = clock, fit_schedule
        # With several processes, the `NonFiniteGuard` agrees on the step at which the budget is spent (else the others
        # wait) and on the (step, seconds) the schedule is planned from, so that every process plans alike.
        self.guard = guard
        self.planned_steps = self.reference = None
        self.next_plan = calibration_fraction  # the budget's fraction at which the schedule is planned next
        self.stopped_at = self.stopped_budget = None  # the step and budget (seconds) of the stop

    def state(self) -> dict:
        names = ("planned_steps", "next_plan", "stopped_at", "stopped_budget", "reference")
        return {"args": {}, "attributes": {name: getattr(self, name) for name in names}}

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        restore_state(self, state)
        if self.planned_steps is not None and lr_scheduler is not None:
            # The saved scheduler state holds its step, not its length: the resumed one ends where the Trainer's would.
            set_schedule_length(lr_scheduler, self.planned_steps)
        if self.stopped_at is not None and self.budget_seconds > (self.stopped_budget or self.budget_seconds):
            if self.planned_steps is not None:  # resumed with or without `budget_schedule`: it ended at that step
                raise ResumeRefused(
                    f"The resumed run's learning-rate schedule was fitted to its time budget and ended with it (step "
                    f"{self.stopped_at}): a larger `max_train_minutes` cannot extend it. Fix: resume with the budget "
                    "it was trained with, or start a new run from its weights (`--model_type pretrained "
                    "--model_name_or_path` its checkpoint folder, a new `--output_dir`)."
                )
            logger.info(f"The resumed run's time budget had ended its training (step {self.stopped_at}); the larger "
                        f"one of {self.budget_seconds / 60:g} min trains on.")  # fmt: skip
            self.stopped_at = None
        if self.stopped_at is not None:
            logger.info(f"The resumed run's time budget had ended its training (step {self.stopped_at}): no step is "
                        "trained.")  # fmt: skip
            control.should_training_stop = True

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        elapsed = self.clock.elapsed()
        if self.guard is not None:
            self.guard.elapsed_ms = round(elapsed * 1000)
        step, seconds = self._planning_point(state, elapsed)
        if self.reference is None and step >= max(1, self.settle_steps):
            self.reference = (seconds, step)
        # Planned again after each tenth (and epoch): a first estimate from a few slow steps would end it far too soon.
        planning = self.fit_schedule and self.reference is not None
        if planning and seconds >= self.next_plan * self.budget_seconds and seconds < self.budget_seconds:
            self._plan(state, lr_scheduler, step, seconds)
            if self.planned_steps is not None:
                self.next_plan = seconds / self.budget_seconds + 0.1
        schedule_done = self.planned_steps is not None and state.global_step >= self.planned_steps
        if self._spent(elapsed >= self.budget_seconds or schedule_done):
            self._stop(args, state, control, elapsed)

    def _spent(self, spent_here: bool) -> bool:
        """Whether to stop now: by this process's clock, or as every process agreed through the guard."""
        if self.guard is None:
            return spent_here
        self.guard.budget_requested = self.guard.budget_requested or int(spent_here)
        return bool(self.guard.budget_agreed)

    def _planning_point(self, state, elapsed: float) -> tuple[int, float]:
        return (state.global_step, elapsed) if self.guard is None else self.guard.elapsed_agreed

    def on_epoch_end(self, args, state, control, lr_scheduler=None, **kwargs):
        if self.fit_schedule and self.planned_steps is not None and self.stopped_at is None:
            self._plan(state, lr_scheduler, *self._planning_point(state, self.clock.elapsed()))

    def expected_steps(self, state) -> int | None:
        """The steps training will take: the planned schedule's, or those that fit in the budget at the rate so far."""
        if self.planned_steps is not None:
            return self.planned_steps
        elapsed = self.clock.elapsed()
        if self.reference is None or elapsed <= 0:
            return None
        return min(
            state.max_steps or 2**62, max(state.global_step, int(state.global_step * self.budget_seconds / elapsed))
        )

    def on_evaluate(self, args, state, control, **kwargs):
        # An evaluation can spend the budget: stop before the next step, without evaluating the same step again.
        elapsed = self.clock.elapsed()
        if self._spent(elapsed >= self.budget_seconds):
            self._stop(args, state, control, elapsed, evaluate=False)

    def _stop(self, args, state, control, elapsed: float, evaluate: bool = True) -> None:
        if not control.should_training_stop:
            where, budget = f"step {state.global_step}, epoch {state.epoch:.2f}", f"{self.budget_seconds / 60:.2f} min"
            logger.info(
                f"Training budget of {budget} spent ({elapsed / 60:.2f} min, {where}): stopping."
                if elapsed >= self.budget_seconds
                else f"Budget schedule: the learning-rate schedule ended ({where}) after {elapsed / 60:.2f} min of "
                f"the {budget} budget: stopping."
            )
        self.stopped_at, self.stopped_budget = state.global_step, self.budget_seconds
        control.should_training_stop = True
        # Evaluate and save at the stop, so the final model is a candidate for the best one (the `epoch` strategies
        # do so at the interrupted epoch's end).
        if args.eval_strategy == "steps" and evaluate:
            control.should_evaluate = True
        if args.save_strategy == "steps":
            control.should_save = True

    def _plan(self, state, lr_scheduler, step: int, elapsed: float) -> None:
        reference_seconds, reference_step = self.reference
        steps_done = step - reference_step
        if steps_done <= 0 or lr_scheduler is None:
            return
        seconds_per_step = (elapsed - reference_seconds) / steps_done
        total = step + int((self.budget_seconds - elapsed) / seconds_per_step)
        # Never past the Trainer's own end: a faster machine then ends the schedule before the budget, not mid-decay.
        total = max(min(total, state.max_steps or total), state.global_step + 1)
        if set_schedule_length(lr_scheduler, total):
            if self.planned_steps is None:
                logger.info(
                    f"Budget schedule: {seconds_per_step * 1000:.1f} ms per step so far; the learning-rate schedule "
                    f"now ends at step {total} (was {state.max_steps})."
                )
            self.planned_steps = total
        elif self.planned_steps is None:
            logger.warning("Budget schedule: the learning-rate schedule has no `num_training_steps`; left as is.")
            self.fit_schedule = False


def set_schedule_length(lr_scheduler, num_training_steps: int) -> bool:
    """Set `num_training_steps` of a transformers schedule, built as `functools.partial(lr_lambda, ...,
    num_training_steps=...)`, in place; False for one without a length."""
    lambdas = getattr(lr_scheduler, "lr_lambdas", None)
    if not lambdas or not all(
        isinstance(f, functools.partial) and "num_training_steps" in f.keywords for f in lambdas
    ):
        return False
    lr_scheduler.lr_lambdas = [
        functools.partial(f.func, *f.args, **{**f.keywords, "num_training_steps": num_training_steps}) for f in lambdas
    ]
    return True


class ModelEMA:
    """Exponential moving average of a model's floating-point parameters and buffers, in float32 on its device:
    `ema = decay_t * ema + (1 - decay_t) * weights`, `decay_t = decay` or, with `warmup`, `min(decay, (1 + t) / (10 +
    t))` at update `t` (as timm does), so early, random weights fade fast. Not `torch.optim.swa_utils.AveragedModel`
    (the same average: tests/test_callbacks.py): it reads its update count from the device at every update (a sync
    per step on a GPU), averages integer buffers too, and is slower on the CPU (`benchmarks/ema_update.py`)."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        self.decay, self.warmup, self.num_updates = decay, warmup, 0
        self.shadow = {name: t.detach().float().clone() for name, t in _averaged_tensors(model)}

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        names, tensors = zip(*_averaged_tensors(model))
        torch._foreach_lerp_([self.shadow[n] for n in names], [t.float() for t in tensors], 1.0 - self.current_decay())
        self.num_updates += 1

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        """Exchange the model's weights with the average (call twice to swap back)."""
        for name, tensor in _averaged_tensors(model):
            current = tensor.detach().float().clone()
            tensor.copy_(self.shadow[name])
            self.shadow[name] = current


def _averaged_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [(name, t) for name, t in named if t.is_floating_point()]


class EMACallback(TrainerCallback):
    """Updates `ema` after every optimizer step and swaps the average into the model when the Trainer is about to
    evaluate or save (registered last, after the callbacks that decide so); `restorer`, registered first, swaps it
    back before the next step. Training ends with the model holding the average."""

    def __init__(self, ema: ModelEMA, model: nn.Module):
        self.ema, self.model, self.swapped = ema, model, False
        self.resume_from: str | None = None  # set by the trainer before training
        self.restorer = EMARestorer(self)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.resume_from is None:
            return
        saved = load_file(os.path.join(self.resume_from, EMA_STATE_NAME))
        with torch.no_grad():
            for name, tensor in _averaged_tensors(self.model):
                tensor.copy_(saved[f"training.{name}"])
                self.ema.shadow[name] = saved[f"average.{name}"].to(tensor.device)
        self.ema.num_updates = int(saved["num_updates"])

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.ema.update(self.model)

    def swap_back(self) -> None:
        if self.swapped:
            self.ema.swap(self.model)
            self.swapped = False

    def on_step_end(self, args, state, control, **kwargs):
        if (control.should_evaluate or control.should_save) and not self.swapped:
            self.ema.swap(self.model)
            self.swapped = True

    on_epoch_end = on_step_end

    def save_state(self, args, folder: str) -> None:
        """Write `ema_state.safetensors`, from which a resume goes on exactly, into the checkpoint `folder`."""
        if not args.should_save:
            return
        current = dict(_averaged_tensors(self.model))
        training, average = (self.ema.shadow, current) if self.swapped else (current, self.ema.shadow)
        tensors = {f"training.{n}": t.detach().float().contiguous().cpu() for n, t in training.items()}
        tensors.update({f"average.{n}": t.detach().float().contiguous().cpu() for n, t in average.items()})
        tensors["num_updates"] = torch.tensor(self.ema.num_updates)
        save_file(tensors, os.path.join(folder, EMA_STATE_NAME))

    def on_train_end(self, args, state, control, **kwargs):
        # The best checkpoint reloaded at the end holds averaged weights already; else keep the final average.
        if not self.swapped and not (args.load_best_model_at_end and state.best_model_checkpoint):
            self.ema.swap(self.model)
        self.swapped = False


class EMARestorer(TrainerCallback):
    """`EMACallback.restorer`, registered first: the non-finite guard keeps the training weights' buffers."""

    def __init__(self, ema_callback: EMACallback):
        self.ema_callback = ema_callback

    def on_step_begin(self, args, state, control, **kwargs):
        self.ema_callback.swap_back()

    on_epoch_begin = on_step_begin


class InterruptCallback(TrainerCallback):
    """The first SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C) asks `guard` to stop: once every process has
    agreed (through the guard's flags), the Trainer saves a checkpoint after the running optimizer step, and
    `Interrupted` ends training right after that save (before the Trainer's end, which could reload or rotate
    checkpoints); after the last step, at the end of training where a checkpoint holds that step (else the run goes on
    to its results rather than lose its training, and stops after them: `deferred`). A second signal ends the process
    at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, guard):
        self.guard = guard
        self.signal: int | None = None  # the first one's, in the process that received it
        self.saved_step = None  # the step of the last checkpoint saved (or resumed)
        self.deferred: int | None = None  # a signal after the last step that no checkpoint holds, in every process
        self._previous = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.saved_step = state.global_step
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:  # the second one: Python's default (SIGINT: KeyboardInterrupt; SIGTERM: the end)
            self.restore_handlers()
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.signal = signum
        self.guard.stop_requested = int(signum)
        logger.warning(
            f"{signal.Signals(signum).name}: saving a checkpoint after this optimizer step (and the evaluation due "
            "then, if any), then stopping (after the last step: at the end of training); send it again to stop at "
            "once without saving."
        )

    def restore_handlers(self) -> None:
        """Put back the handlers training replaced (also after an error: `ImageClassificationTrainer.train`)."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def agreed(self, args) -> int:
        """The signal every process agreed to stop on (through the guard's flags, a step or two later), or 0; one
        process needs no agreement: its own, so that a signal during an evaluation stops at the save after it rather
        than a step later (on a GPU, `LAG` steps later)."""
        return self.guard.stop_agreed or (self.signal or 0 if args.world_size == 1 else 0)

    def on_step_end(self, args, state, control, **kwargs):
        # An evaluation due at this step still runs before the save; at an epoch's last step, the save waits for the
        # epoch's end and its evaluation: a resumed run never comes back to an epoch that is over.
        if self.agreed(args):
            self.stop(args, control, save=control.should_save or not float(state.epoch).is_integer())

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.agreed(args):  # on a GPU the agreement arrives two steps late, possibly at an epoch's end
            self.stop(args, control, save=True)

    @staticmethod
    def stop(args, control, save: bool) -> None:
        control.should_training_stop, control.should_save = True, save
        if args.save_strategy == SaveStrategy.BEST:
            # Which saves only a new best: the stop's checkpoint is saved whatever its score (else the run said it had
            # stopped after its last step, and the resume went back to the best one).
            args.save_strategy = SaveStrategy.STEPS

    def on_save(self, args, state, control, **kwargs):
        self.saved_step = state.global_step
        signum = self.agreed(args)  # the same in every process, signalled or not
        if not signum:
            return
        self.restore_handlers()
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        raise Interrupted(
            f"stopped by {signal_name(signum)} at step {state.global_step}; saved {checkpoint}. {resume_with(args)}.",
            signum,
        )

    def on_train_end(self, args, state, control, **kwargs):
        self.restore_handlers()
        # A signal after the last optimizer step, which no step passed on to the other processes: all stop here,
        # before the final evaluation and the results, which the resumed run then writes.
        signum = int(reduce(torch.tensor(self.signal or 0, device=args.device), reduction="max"))
        if signum and self.saved_step != state.global_step:
            # No checkpoint holds the last step (`save_strategy: no`, or `best` where it was not): stopping loses it.
            self.deferred = signum
            logger.warning(
                f"{signal_name(signum)} after the last optimizer step ({state.global_step}), which no checkpoint "
                f"holds (`save_strategy: {args.save_strategy.value}`): the run goes on to its evaluation and results "
                "rather than lose its training; send it again to stop at once."
            )
        elif signum:
            raise Interrupted(
                f"stopped by {signal_name(signum)} after the last optimizer step ({state.global_step}); the "
                f"checkpoints in {args.output_dir} are kept. {resume_with(args)} for the final evaluation and "
                "results.",
                signum,
            )


def resume_with(args) -> str:
    """How to resume a stopped run: its own command where it resumes by itself (`resume_from_checkpoint: auto`, as
    the quickstart's)."""
    if str(args.resume_from_checkpoint).lower() == "auto":
        return "Resume with the same command"
    return "Resume with the same command and `--resume_from_checkpoint true`"


class QuietProgress(ProgressCallback):
    """transformers' progress bars, with one line per evaluation instead of a dict per log, and under a time budget a
    training bar whose total (its ETA) is the steps that fit in the budget."""

    def __init__(self, budget: TrainingBudgetCallback | None = None):
        super().__init__()
        self.budget = budget

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None and self.budget is not None and state.global_step >= 2:
            total = self.budget.expected_steps(state)
            if total and total != self.training_bar.total:
                self.training_bar.total = total
                self.training_bar.refresh()
        super().on_step_end(args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = evaluation_line(state, logs)
        if state.is_world_process_zero and self.training_bar is not None and line:
            self.training_bar.write(line)


class ProgressLines(TrainerCallback):
    """Without progress bars (`disable_tqdm`; by default where stderr is not a terminal, such as a log file, which
    tqdm's redrawn bars fill with carriage returns and cursor moves), one logged line per training log (step, loss,
    learning rate, speed, training time left) and per evaluation (the line of `QuietProgress`)."""

    def __init__(self, clock: RunClock, budget: TrainingBudgetCallback | None = None):
        self.clock, self.budget = clock, budget

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = evaluation_line(state, logs)
        if line is None and "loss" in (logs or {}):
            line = self.training_line(state, logs)
        if state.is_world_process_zero and line:
            logger.info(line)

    def training_line(self, state, logs: dict) -> str:
        total = (self.budget and self.budget.expected_steps(state)) or state.max_steps
        line = f"step {state.global_step:,}/{total:,} (epoch {state.epoch:.2f}): training loss {logs['loss']:.4f}"
        if "learning_rate" in logs:
            line += f", learning rate {logs['learning_rate']:.3g}"
        seconds = self.clock.training_seconds()
        if seconds > 0 and self.clock.steps:
            rate = self.clock.steps / seconds  # a resumed run's steps and seconds included
            left = datetime.timedelta(seconds=round((total - state.global_step) / rate))
            line += f"; {rate:.3g} steps/s, {left} of training left"
        return line


def evaluation_line(state, logs: dict | None) -> str | None:
    """An evaluation's logs as one line (None for other logs): validation score and loss, and the training loss logged
    since the previous evaluation (a loss logged before that one is not repeated)."""
    score = next((name for name in ("accuracy", "map") if f"eval_{name}" in (logs or {})), None)
    if score is None:
        return None
    train_loss = history_from_log_history(state.log_history)[-1].train_loss  # the Trainer logged this evaluation
    name = "mAP" if score == "map" else score
    line = f"epoch {state.epoch:.2f}: validation {name} {logs[f'eval_{score}']:.2%}, loss {logs['eval_loss']:.4f}"
    return line + (f" (training loss {train_loss:.4f})" if train_loss is not None else "")
