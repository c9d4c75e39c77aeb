"""Trainer callbacks: the run's one clock, a wall-clock budget with a schedule that ends at it, and an exponential
moving average (EMA) of the weights. `ImageClassificationTrainer` builds them from its arguments.

- `RunClock` is the only timer of a run. It stamps each entry of `state.log_history` with `elapsed_seconds` since
  training began (so accuracy can be plotted against wall-clock minutes), adds up the training loop's own time
  (`train_seconds`, without the evaluations and checkpoints, between epochs or inside them) and its optimizer steps,
  and estimates the time the Trainer spends on the data path (`data_seconds`) from the steps it times (every step on
  a CPU; on a GPU, where timing a step means waiting for the device, each epoch's first step and one in
  `data_timing_interval` of the others). Evaluation
  entries also get the training figures so far (`train_seconds`, `data_seconds`, `train_steps`,
  `train_images_per_second`), so a run that stops early still has them. `results.json`'s timings all come from it.
- `TrainingBudgetCallback` stops training once `max_train_minutes` of wall-clock time (training, evaluation and
  saving alike, since that is what the budget buys) is spent on the clock; the Trainer then still loads the best
  model and `run.py` evaluates, tests and saves it as after any run. With `fit_schedule=True` it also stretches or
  shrinks the learning-rate schedule so that it reaches its end exactly at the budget: after `calibration_fraction`
  of the budget it measures the seconds per step (evaluations included) and sets the schedule's `num_training_steps`
  to the steps that fit (at most the Trainer's own `max_steps`, so `num_train_epochs` is an upper bound); it
  re-plans at every epoch end, so a machine that slows down or speeds up is followed. Give `warmup_steps` as a number
  of steps then: a ratio would be taken of the upper bound.
- `EMACallback` keeps `ModelEMA` up to date after every optimizer step; `ImageClassificationTrainer` evaluates and
  saves the EMA weights (see `finetune/trainer.py`).
"""

import functools
import time
from collections.abc import Callable

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.utils import logging


logger = logging.get_logger(__name__)


class RunClock(TrainerCallback):
    """The run's clock: time since training began, the training loop's own time, its steps and its data time.

    Args:
        time_fn: a function returning seconds (`time.perf_counter`); tests pass a fake one.
        data_timing_interval: time the data path of one optimizer step in this many (1: every step).
    """

    def __init__(self, time_fn: Callable[[], float] = time.perf_counter, data_timing_interval: int = 1):
        self.time_fn = time_fn
        self.data_timing_interval = data_timing_interval
        self.train_start = None
        self.train_seconds = 0.0
        self.steps = 0
        # The data path of each epoch's first step (loader start-up included) is timed and counted as it is; the other
        # steps' from those sampled, scaled up to all of them.
        self.data_seconds_first = 0.0
        self.data_steps_first = 0
        self.data_seconds_timed = 0.0
        self.data_steps_timed = 0
        self._epoch_start = None
        self._epoch_first_step = False
        self._paused = 0.0  # evaluations and checkpoints inside the running epoch
        self._mark = None  # the end of the last step, or of the last evaluation or checkpoint after it
        self._timing_first = False

    def elapsed(self) -> float:
        """Seconds since training began (0 before it does)."""
        return 0.0 if self.train_start is None else self.time_fn() - self.train_start

    def times_data_of_step(self, step: int) -> bool:
        """Whether the data path of optimizer step `step` (0-based) is to be timed: the first of each epoch and one in
        `data_timing_interval` of the others."""
        self._timing_first, self._epoch_first_step = self._epoch_first_step, False
        return self._timing_first or step % self.data_timing_interval == 0

    def add_data_time(self, seconds: float, new_step: bool) -> None:
        """Add a timed piece of the data path of the step `times_data_of_step` chose (`new_step`: its first piece)."""
        if self._timing_first:
            self.data_seconds_first += seconds
            self.data_steps_first += int(new_step)
        else:
            self.data_seconds_timed += seconds
            self.data_steps_timed += int(new_step)

    @property
    def data_seconds(self) -> float:
        """Seconds spent on the data path: each epoch's first step as measured, the others measured on every step
        (on a CPU) or scaled up from the steps sampled."""
        if not self.data_steps_timed:
            return self.data_seconds_first
        others = max(self.steps - self.data_steps_first, self.data_steps_timed)
        return self.data_seconds_first + self.data_seconds_timed * others / self.data_steps_timed

    def _running(self) -> float:
        """Training seconds of the running epoch up to its last step, without its evaluations and checkpoints."""
        if self._epoch_start is None:
            return 0.0
        return (self._mark if self._mark is not None else self.time_fn()) - self._epoch_start - self._paused

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_start = self.time_fn()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_start = self.time_fn()
        self._epoch_first_step, self._paused, self._mark = True, 0.0, None

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
        self._mark = self.time_fn()

    def on_evaluate(self, args, state, control, **kwargs):
        self._pause()

    def on_save(self, args, state, control, **kwargs):
        self._pause()

    def _pause(self) -> None:
        # An evaluation or checkpoint inside an epoch (`eval_strategy: steps`) is not training time.
        if self._epoch_start is not None and self._mark is not None:
            now = self.time_fn()
            self._paused += now - self._mark
            self._mark = now

    def on_epoch_end(self, args, state, control, **kwargs):
        # Called before the end-of-epoch evaluation and checkpoint, so those are not counted.
        if self._epoch_start is not None:
            self._mark = self.time_fn()
            self.train_seconds += self._running()
            self._epoch_start = None

    def on_train_end(self, args, state, control, **kwargs):
        # A budget or `max_steps` can end training inside an epoch, with no `on_epoch_end` after it.
        self.on_epoch_end(args, state, control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.train_start is not None and state.log_history:
            entry = state.log_history[-1]
            entry["elapsed_seconds"] = round(self.elapsed(), 3)
            if "eval_accuracy" in entry:
                # Logged before `on_evaluate`: the running epoch counts up to its last step.
                seconds = self.train_seconds + self._running()
                batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
                entry["train_seconds"] = round(seconds, 3)
                entry["data_seconds"] = round(self.data_seconds, 3)
                entry["train_steps"] = self.steps
                entry["train_images_per_second"] = round(self.steps * batch / seconds, 1) if seconds > 0 else None


class TrainingBudgetCallback(TrainerCallback):
    """Stop training when `max_minutes` of wall-clock time have passed since training began.

    Args:
        max_minutes: the budget, in minutes of wall-clock time from `on_train_begin`.
        clock: the run's `RunClock`, registered with the Trainer before this callback.
        fit_schedule: re-plan the learning-rate schedule's length so that it ends at the budget.
        calibration_fraction: share of the budget after which the seconds per step are first measured.
    """

    def __init__(
        self, max_minutes: float, clock: RunClock, fit_schedule: bool = False, calibration_fraction: float = 0.02
    ):
        if max_minutes <= 0:
            raise ValueError(f"`max_minutes` must be > 0, got {max_minutes}.")
        self.budget_seconds = 60.0 * max_minutes
        self.clock = clock
        self.fit_schedule = fit_schedule
        self.calibration_fraction = calibration_fraction
        self.planned_steps = None
        self.stopped_at = None
        self.reference = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.reference = None

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        elapsed = self.clock.elapsed()
        if self.reference is None:
            # The first step carries one-off costs (allocation, kernel selection): measure the rate after it.
            self.reference = (elapsed, state.global_step)
        calibrated = elapsed >= self.calibration_fraction * self.budget_seconds
        if self.fit_schedule and self.planned_steps is None and calibrated:
            self._plan(state, lr_scheduler, elapsed)
        schedule_done = self.planned_steps is not None and state.global_step >= self.planned_steps
        if elapsed >= self.budget_seconds or schedule_done:
            self._stop(args, state, control, elapsed)

    def on_epoch_end(self, args, state, control, lr_scheduler=None, **kwargs):
        if self.fit_schedule and self.planned_steps is not None:
            self._plan(state, lr_scheduler, self.clock.elapsed())

    def on_evaluate(self, args, state, control, **kwargs):
        # An evaluation can be what spends the budget; stop before the next step starts.
        elapsed = self.clock.elapsed()
        if elapsed >= self.budget_seconds:
            self._stop(args, state, control, elapsed)

    def _stop(self, args, state, control, elapsed: float) -> None:
        if not control.should_training_stop:
            logger.info(
                f"Training budget of {self.budget_seconds / 60:.2f} min spent ({elapsed / 60:.2f} min, step "
                f"{state.global_step}, epoch {state.epoch:.2f}): stopping."
            )
        self.stopped_at = state.global_step
        control.should_training_stop = True
        # Evaluate and save at the stopping point, so the final model is a candidate for the best one. With the
        # `epoch` strategies the Trainer does so anyway at the end of the interrupted epoch.
        if args.eval_strategy == "steps":
            control.should_evaluate = True
        if args.save_strategy == "steps":
            control.should_save = True

    def _plan(self, state, lr_scheduler, elapsed: float) -> None:
        reference_seconds, reference_step = self.reference
        steps_done = state.global_step - reference_step
        if steps_done <= 0 or lr_scheduler is None:
            return
        seconds_per_step = (elapsed - reference_seconds) / steps_done
        total = state.global_step + int((self.budget_seconds - elapsed) / seconds_per_step)
        # Never past the Trainer's own end (`num_train_epochs` / `max_steps`): on a faster machine the schedule then
        # ends there, before the budget, instead of being cut off mid-decay.
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
    """Set `num_training_steps` of a transformers `LambdaLR` schedule (cosine, linear, ...) in place.

    transformers builds those schedules as `functools.partial(lr_lambda, num_warmup_steps=...,
    num_training_steps=...)`; replacing the keyword changes where the decay ends while keeping the warmup. Returns
    False for schedules without a length (constant).
    """
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
    """Exponential moving average of a model's floating-point parameters and buffers.

    After each `update(model)`, `ema = decay_t * ema + (1 - decay_t) * weights`, with `decay_t = decay` or, with
    `warmup=True`, `min(decay, (1 + t) / (10 + t))` at update `t` (as timm does), so early, random weights fade fast.
    The average is kept in float32 on the model's device.
    """

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"`decay` must be in (0, 1), got {decay}.")
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0
        self.shadow = {name: t.detach().float().clone() for name, t in _averaged_tensors(model)}

    def current_decay(self) -> float:
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = self.current_decay()
        names, tensors = zip(*_averaged_tensors(model))
        shadow = [self.shadow[name] for name in names]
        torch._foreach_lerp_(shadow, [t.float() for t in tensors], 1.0 - decay)
        self.num_updates += 1

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        """Exchange the model's weights with the average (call twice to swap back)."""
        for name, tensor in _averaged_tensors(model):
            current = tensor.detach().float().clone()
            tensor.copy_(self.shadow[name])
            self.shadow[name] = current

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        for name, tensor in _averaged_tensors(model):
            tensor.copy_(self.shadow[name])


def _averaged_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [(name, t) for name, t in named if t.is_floating_point()]


class EMACallback(TrainerCallback):
    """Updates `ema` from the model after every optimizer step (every `every` steps)."""

    def __init__(self, ema: ModelEMA, every: int = 1):
        self.ema = ema
        self.every = every

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None and state.global_step % self.every == 0:
            self.ema.update(model)
