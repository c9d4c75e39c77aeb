"""No optimizer step on a non-finite loss or gradient, and a loud stop when training has diverged.

`NonFiniteGuard` watches every optimizer step of a run (`ImageClassificationTrainer` drives it from its training step
and its callbacks):

- A step is *bad* when a micro-batch's loss or any gradient is NaN or infinite. In a multi-process run the flag is
  max-reduced over the processes, so every process takes the same decision at the same step.
- A bad step is not applied: a fused optimizer (the default on every device) receives the flag as `found_inf` and
  skips the update on the device, as it does under fp16 loss scaling; another optimizer reads the flag first. The
  buffers that the forward pass updated (BatchNorm running statistics and counts) are restored too. The learning-rate
  schedule still advances, as it does over fp16's skipped steps.
- The flags are copied to host memory without waiting for the device and read back exactly `lag` steps later on an
  accelerator (at once on a CPU), so the guard adds no host-device synchronisation to a step and every process reads
  the same step's flags at the same point. Each bad step is logged with its number and learning rate; after
  `max_consecutive` bad steps in a row, `TrainingDiverged` is raised: the model cannot recover, since skipped steps
  leave its weights as they were.
- `skip_step()` makes the guard skip the current step without counting it as non-finite (after a failed compiled
  step, whose gradients may be partly accumulated twice).

Under fp16 with a loss scaler, gradients that overflow are the scaler's business (it skips the step and lowers the
scale); the guard then counts a step as bad only when its loss itself is non-finite or the scale has fallen below 1.
"""

import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import logging


logger = logging.get_logger(__name__)

# How many bad steps in a row end a run, unless `max_nonfinite_steps` says otherwise. A corrupt batch or a single
# overflow makes one or two; a diverged model makes every step bad, since skipped steps leave its weights unchanged.
DEFAULT_MAX_CONSECUTIVE = 5
# Steps a flag stays in flight on an accelerator before it is read (the device then still has the next step queued,
# so the host keeps working ahead of it).
DEFAULT_LAG = 2
# Bad steps logged one by one; beyond that, every 100th.
LOGGED_STEPS = 20


class TrainingDiverged(RuntimeError):
    """Training stopped after `max_consecutive` optimizer steps in a row with a non-finite loss or gradient."""


@dataclass
class BadStep:
    """What the guard knows of one flagged optimizer step, once its flags reached the host."""

    step: int
    learning_rate: float | None
    loss: bool  # the loss of a micro-batch was non-finite (else only gradients were)
    consecutive: int


class NonFiniteGuard:
    """Skips optimizer steps with a non-finite loss or gradient and raises `TrainingDiverged` after too many in a row.

    Args:
        model: the model being trained (its buffers are restored after a bad step).
        max_consecutive: bad steps in a row that end training.
        step_info: returns `(step, learning_rate)` of the optimizer step about to be taken, for the log.
        on_bad_step: called with each `BadStep` as it is read back (the Trainer adds it to its log history).
        on_diverged: called with the last `BadStep` before `TrainingDiverged` is raised; returns more of the message
            (what was kept, what to try).
        lag: steps a flag stays in flight on an accelerator before it is read.
        world_size: processes of the run; above 1 the flags are max-reduced over them.
        scaler: the fp16 `GradScaler` where there is one.

    Per optimizer step: `begin_step(step)` before each micro-batch's forward pass, `observe_loss(loss)` after it (it
    returns the loss to add to the logged running loss), `before_optimizer_step(optimizer)` once the gradients are
    complete, the optimizer's `step` (which `install` routes through the guard), then `after_optimizer_step()`. Called
    alone, the optimizer's `step` does the two around itself. `finish()` reads every flag still in flight.
    """

    def __init__(
        self,
        model: nn.Module,
        max_consecutive: int = DEFAULT_MAX_CONSECUTIVE,
        step_info: Callable[[], tuple[int, float | None]] = lambda: (0, None),
        on_bad_step: Callable[[BadStep], None] = lambda bad: None,
        on_diverged: Callable[[BadStep], str] = lambda bad: "",
        lag: int = DEFAULT_LAG,
        world_size: int = 1,
        scaler=None,
    ):
        if max_consecutive < 1:
            raise ValueError(f"`max_nonfinite_steps` must be an integer >= 1, got {max_consecutive}.")
        self.model = model
        self.max_consecutive = max_consecutive
        self.step_info = step_info
        self.on_bad_step = on_bad_step
        self.on_diverged = on_diverged
        self.lag = lag
        self.world_size = world_size
        self.scaler = scaler
        self.bad_steps = 0  # flagged steps read back so far
        self._open_step = None  # the optimizer step whose micro-batches are running
        self._loss_bad = None  # (,) bool on the device: a micro-batch loss of the open step was non-finite
        self._force_skip = False
        self._saved_buffers = None
        self._flags = None  # the open step's (bad, loss bad, skip) on the device, once its gradients are checked
        self._consecutive = None  # (,) int32 on the device
        self._pending: deque = deque()

    # ---- Per micro-batch.

    def begin_step(self, step: int | None = None) -> None:
        """Before a micro-batch's forward pass. The first one of optimizer step `step` starts it afresh (whatever an
        earlier step left, e.g. one whose optimizer call a loss scaler skipped) and keeps the buffers it may update."""
        if self._open_step is not None and step == self._open_step:
            return
        self._open_step = step
        self._loss_bad, self._force_skip, self._flags = None, False, None
        self._saved_buffers = [b.detach().clone() for b in self.model.buffers()]

    def observe_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Record whether a micro-batch's loss is finite; returns it with a non-finite value replaced by 0 so that
        the logged running loss stays readable (the step is reported on its own)."""
        finite = torch.isfinite(loss.detach())
        self._loss_bad = ~finite if self._loss_bad is None else self._loss_bad | ~finite
        return torch.where(finite, loss.detach(), torch.zeros_like(loss.detach()))

    def skip_step(self) -> None:
        """Skip the open optimizer step without counting it as non-finite."""
        self._force_skip = True

    # ---- Per optimizer step.

    def install(self, optimizer: torch.optim.Optimizer) -> None:
        """Route `optimizer.step` through the guard (before an LR scheduler or `AcceleratedOptimizer` wraps it)."""
        original = optimizer.step

        def step(optimizer_self, *args, **kwargs):
            return self._guarded_step(optimizer_self, original, *args, **kwargs)

        optimizer.step = types.MethodType(step, optimizer)

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Check the open step's loss and gradients (on the device; max-reduced over the processes)."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        device = grads[0].device if grads else self._loss_bad.device if self._loss_bad is not None else "cpu"
        grads_bad = torch.zeros((), dtype=torch.bool, device=device)
        if grads:
            norms = torch._foreach_norm(grads)  # one norm per tensor, NaN or inf wherever a gradient is
            grads_bad = ~torch.isfinite(torch.stack([n.float() for n in norms]).sum())
        loss_bad = self._loss_bad.to(device) if self._loss_bad is not None else torch.zeros_like(grads_bad)
        if self.scaler is not None and self.scaler.is_enabled():
            # Overflowing gradients are skipped by the scaler, which then lowers its scale: count them only once
            # the scale is below 1, where they overflow without any scaling.
            grads_bad = grads_bad & (self.scaler._get_scale_async().to(device) < 1.0)
        skip = torch.full((), self._force_skip, dtype=torch.bool, device=device)
        flags = torch.stack([loss_bad | grads_bad, loss_bad, skip]).to(torch.int32)
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        self._flags = flags.bool()

    def _guarded_step(self, optimizer, original_step, *args, **kwargs):
        alone = self._flags is None  # called outside the Trainer's hooks
        if alone:
            self.before_optimizer_step(optimizer)
        skip = self._flags[0] | self._flags[2]
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # A fused optimizer skips on the device; the scaler's own `found_inf` (fp16) is kept: either skips.
            scaler_found_inf = getattr(optimizer, "found_inf", None)
            found_inf = skip.float() if scaler_found_inf is None else torch.maximum(scaler_found_inf, skip.float())
            optimizer.found_inf = found_inf
            try:
                result = original_step(*args, **kwargs)
            finally:
                if scaler_found_inf is None:
                    del optimizer.found_inf
                else:
                    optimizer.found_inf = scaler_found_inf
        elif bool(skip):  # a host-device sync, for optimizers that cannot skip on the device (free on a CPU)
            result = None
        else:
            result = original_step(*args, **kwargs)
        if alone:
            self.after_optimizer_step()
        return result

    def after_optimizer_step(self) -> None:
        """Restore the buffers of a skipped step, queue its flags for the host and read those that are due."""
        if self._flags is None:
            return
        bad, loss_bad, skip = self._flags
        saved, self._saved_buffers = self._saved_buffers, None
        if saved:
            with torch.no_grad():
                for buffer, before in zip(self.model.buffers(), saved):
                    buffer.copy_(torch.where(bad | skip, before, buffer))
        if self._consecutive is None:
            self._consecutive = torch.zeros((), dtype=torch.int32, device=bad.device)
        self._consecutive.add_(1).mul_(bad)  # reset to 0 by a good step
        flags = torch.stack([bad.to(torch.int32), loss_bad.to(torch.int32), self._consecutive])
        # On CUDA the copy goes to pinned memory without waiting, and an event says when it has arrived; elsewhere it
        # is made at once (on a CPU there is nothing to wait for).
        deferred = flags.device.type == "cuda"
        host = torch.empty(3, dtype=torch.int32, pin_memory=deferred)
        host.copy_(flags, non_blocking=deferred)
        event = None
        if deferred:
            event = torch.cuda.Event()
            event.record()
        step, learning_rate = self.step_info()
        self._pending.append((step, learning_rate, host, event))
        self._open_step, self._flags = None, None
        self.poll()

    def poll(self, wait_all: bool = False) -> None:
        """Read the flags that are due: at once on a CPU; on an accelerator those more than `lag` steps old (the same
        steps in every process, whatever each one's timing). Raises `TrainingDiverged` once `max_consecutive` bad
        steps in a row are read."""
        while self._pending:
            step, learning_rate, host, event = self._pending[0]
            if event is not None:
                if not wait_all and len(self._pending) <= self.lag:
                    return
                event.synchronize()
            self._pending.popleft()
            bad, loss_bad, consecutive = (int(v) for v in host.numpy())
            if bad:
                self._report(BadStep(step, learning_rate, bool(loss_bad), consecutive))

    def finish(self) -> None:
        """Read every flag still in flight (at an epoch's end and training's), raising if the last steps diverged."""
        self.poll(wait_all=True)

    def _report(self, bad: BadStep) -> None:
        self.bad_steps += 1
        self.on_bad_step(bad)
        what = "loss" if bad.loss else "gradients"
        rate = f"{bad.learning_rate:.3g}" if bad.learning_rate is not None else "?"
        if bad.consecutive >= self.max_consecutive:
            first = bad.step - bad.consecutive + 1
            message = (
                f"Training diverged: {bad.consecutive} optimizer steps in a row ({first}-{bad.step}) had a non-finite "
                f"loss or gradient, at learning rate {rate}; none of them was applied."
            )
            detail = self.on_diverged(bad)
            raise TrainingDiverged(f"{message} {detail}".strip())
        if self.bad_steps <= LOGGED_STEPS or self.bad_steps % 100 == 0:
            logger.warning(
                f"Step {bad.step}: non-finite {what} (learning rate {rate}); the update was skipped. "
                f"{bad.consecutive} such step(s) in a row, {self.bad_steps} in all; training stops at "
                f"{self.max_consecutive} in a row (`max_nonfinite_steps`)."
            )
