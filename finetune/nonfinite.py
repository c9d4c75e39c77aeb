"""No optimizer step on a non-finite loss or gradient, and a loud stop when training has diverged.

`NonFiniteGuard` watches every optimizer step of a run (`ImageClassificationTrainer` installs it on its optimizer):

- A step is *bad* when a micro-batch's loss or any gradient is NaN or infinite. In a multi-process run the flag is
  max-reduced over the processes, so every process takes the same decision at the same step.
- A bad step is not applied: a fused optimizer (the default on every device) receives the flag as `found_inf` and
  skips the update on the device, as it does under fp16 loss scaling; another optimizer reads the flag first. The
  buffers that the forward pass updated (BatchNorm running statistics and counts) are restored too.
- The flags are copied to host memory without waiting for the device and read back at most `lag` steps later, so the
  guard adds no host-device synchronisation to a step (on a CPU there is nothing to wait for). Each bad step is
  logged with its number and learning rate; after `max_consecutive` bad steps in a row, `TrainingDiverged` is raised:
  the model cannot recover, since skipped steps leave its weights as they were.

Under fp16 with a loss scaler, gradients that overflow are the scaler's business (it skips the step and lowers the
scale); the guard then counts a step as bad only when its loss itself is non-finite or the scale has fallen below 1.
"""

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
# Steps a flag may stay in flight on an accelerator before the guard waits for it (the device is then still busy with
# the next step, so the host keeps queueing work ahead of it).
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
        lag: steps a flag may stay in flight on an accelerator before the guard waits for it.
        world_size: processes of the run; above 1 the flag is max-reduced over them.
        scaler: the fp16 `GradScaler` where there is one.

    Use: `install(optimizer)` once; `begin_step()` before each micro-batch's forward pass; `observe_loss(loss)` after
    it (returns the loss to add to the logged running loss); the optimizer's `step` then checks, skips or applies.
    `finish()` reads every flag still in flight (at the end of training).
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
        self.first_bad: BadStep | None = None
        self._loss_bad = None  # (,) bool on the device: a micro-batch loss of the open step was non-finite
        self._consecutive = None  # (,) int32 on the device
        self._saved_buffers = None
        self._pending: deque = deque()

    # ---- Per micro-batch.

    def begin_step(self) -> None:
        """Before a micro-batch's forward pass: on the first of an optimizer step, keep the buffers it may update."""
        if self._saved_buffers is not None:
            return
        self._saved_buffers = [b.detach().clone() for b in self.model.buffers()]

    def observe_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Record whether a micro-batch's loss is finite; returns it with a non-finite value replaced by 0 so that
        the logged running loss stays readable (the step is reported on its own)."""
        finite = torch.isfinite(loss.detach())
        self._loss_bad = ~finite if self._loss_bad is None else self._loss_bad | ~finite
        return torch.where(finite, loss.detach(), torch.zeros_like(loss.detach()))

    # ---- Per optimizer step.

    def install(self, optimizer: torch.optim.Optimizer) -> None:
        """Route `optimizer.step` through the guard (before an LR scheduler or `AcceleratedOptimizer` wraps it)."""
        original = optimizer.step

        def step(*args, **kwargs):
            return self._guarded_step(optimizer, original, *args, **kwargs)

        optimizer.step = step

    def _guarded_step(self, optimizer, original_step, *args, **kwargs):
        bad = self._flag(optimizer)
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        if fused:
            # The scaler's own `found_inf` (fp16) is kept: the step is skipped if either flag is set.
            scaler_found_inf = getattr(optimizer, "found_inf", None)
            found_inf = bad.float() if scaler_found_inf is None else torch.maximum(scaler_found_inf, bad.float())
            optimizer.found_inf = found_inf
            try:
                result = original_step(*args, **kwargs)
            finally:
                if scaler_found_inf is None:
                    del optimizer.found_inf
                else:
                    optimizer.found_inf = scaler_found_inf
        elif bool(bad):  # a host-device sync, for optimizers that cannot skip on the device (free on a CPU)
            result = None
        else:
            result = original_step(*args, **kwargs)
        self._restore_buffers(bad)
        self._record(bad)
        self.poll()
        return result

    def _flag(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """(,) bool on the device: this step's loss or gradients are non-finite (in any process)."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        device = grads[0].device if grads else self._loss_bad.device
        grads_bad = torch.zeros((), dtype=torch.bool, device=device)
        if grads:
            norms = torch._foreach_norm(grads)  # one norm per tensor, NaN or inf wherever a gradient is
            grads_bad = ~torch.isfinite(torch.stack([n.float() for n in norms]).sum())
        loss_bad = self._loss_bad.to(device) if self._loss_bad is not None else torch.zeros_like(grads_bad)
        self._loss_bad = None
        if self.scaler is not None and self.scaler.is_enabled():
            # Overflowing gradients are skipped by the scaler, which then lowers its scale: count them only once
            # the scale is below 1, where they overflow without any scaling.
            grads_bad = grads_bad & (self.scaler.get_scale_async().to(device) < 1.0)
        flags = torch.stack([loss_bad | grads_bad, loss_bad]).to(torch.int32)
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        self._step_loss_bad = flags[1].bool()
        return flags[0].bool()

    def _restore_buffers(self, bad: torch.Tensor) -> None:
        saved, self._saved_buffers = self._saved_buffers, None
        if not saved:
            return
        with torch.no_grad():
            for buffer, before in zip(self.model.buffers(), saved):
                buffer.copy_(torch.where(bad, before, buffer))

    def _record(self, bad: torch.Tensor) -> None:
        """Queue this step's flags for the host: the copy is issued now, read when it has arrived."""
        if self._consecutive is None:
            self._consecutive = torch.zeros((), dtype=torch.int32, device=bad.device)
        self._consecutive.add_(1).mul_(bad)  # reset to 0 by a good step
        flags = torch.stack([bad.to(torch.int32), self._step_loss_bad.to(torch.int32), self._consecutive])
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

    def poll(self, wait_all: bool = False) -> None:
        """Read the flags that have reached the host; wait for the oldest ones when more than `lag` are in flight.
        Raises `TrainingDiverged` once `max_consecutive` bad steps in a row are read."""
        while self._pending:
            step, learning_rate, host, event = self._pending[0]
            if event is not None and not event.query():
                if not wait_all and len(self._pending) <= self.lag:
                    return
                event.synchronize()
            self._pending.popleft()
            bad, loss_bad, consecutive = (int(v) for v in host.numpy())
            if bad:
                self._report(BadStep(step, learning_rate, bool(loss_bad), consecutive))

    def finish(self) -> None:
        """Read every flag still in flight (end of training), raising if the last steps diverged."""
        self.poll(wait_all=True)

    def _report(self, bad: BadStep) -> None:
        self.bad_steps += 1
        self.first_bad = self.first_bad or bad
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
