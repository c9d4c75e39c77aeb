"""No optimizer step on a non-finite loss or gradient, and a loud stop when training has diverged.

`NonFiniteGuard` flags a non-finite loss (`observe_loss`) and gradient (`on_pre_optimizer_step`) on the device,
max-reduced over the processes with the requests every process must act on at the same step (a signal's stop, a spent
time budget) and the seconds the budget's schedule is planned from; skips the update (fused optimizers take the flag
as `found_inf`, others have their gradients cleared, under fp16 the scaler skips it already) and restores the buffers
(BatchNorm statistics) of a skipped step; and reads the flags `LAG` steps later on CUDA, so the host never waits for
the device under a fused optimizer (the default `adamw_torch_fused`); another reads its step's flag to clear the
gradients (a wait per step on a GPU). A run whose steps are all bad cannot recover: `max_consecutive` in a row raise
`TrainingDiverged`."""

from collections import deque

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.utils import logging

from finetune.callbacks import restore_state


logger = logging.get_logger(__name__)

# A corrupt batch or one overflow makes one or two bad steps; a diverged model makes every step bad.
DEFAULT_MAX_CONSECUTIVE = 5
# Steps a flag stays in flight on CUDA before it is read: the device still has the next step queued meanwhile.
LAG = 2
LOGGED_STEPS = 20  # bad steps logged one by one; beyond that, every 100th


class TrainingDiverged(RuntimeError):
    """Training stopped after `max_consecutive` optimizer steps in a row with a non-finite loss or gradient."""

    every_process = True  # raised by every process at the same step (the flags are reduced): said once

    def __init__(self, message: str, step: int, learning_rate: float | None):
        super().__init__(message)
        self.step, self.learning_rate = step, learning_rate


class NonFiniteGuard(TrainerCallback, ExportableState):
    """Skips optimizer steps with a non-finite loss or gradient; raises `TrainingDiverged` after `max_consecutive`
    in a row. `scaler` is the fp16 `GradScaler`, if any. The count of bad steps is saved with each checkpoint."""

    def __init__(self, model, max_consecutive=DEFAULT_MAX_CONSECUTIVE, world_size=1, scaler=None):
        self.model, self.max_consecutive, self.world_size = model, max_consecutive, world_size
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.bad_steps = 0  # bad steps read back so far
        # Requests every process must act on at the same step, reduced with the flags: a signal to stop (its number)
        # and a spent time budget (1); 0 is none.
        self.stop_requested = self.stop_agreed = 0
        self.budget_requested = self.budget_agreed = 0
        # The budget's clock at the last step's end, in ms (0: none yet); agreed as the slowest process's (step, s).
        self.elapsed_ms, self.elapsed_agreed = 0, (0, 0.0)
        self._loss_bad = self._saved = self._flags = None
        self._skip = False
        self._consecutive = None  # (,) int64 on the device
        self._pending = deque()

    def state(self) -> dict:
        # Flags still in flight (CUDA) are of steps the checkpoint holds: counted here, not by the resumed run.
        pending = 0
        for *_, host, event in self._pending:
            if event is not None:
                event.synchronize()
            pending += int(host[0])
        return {"args": {}, "attributes": {"bad_steps": self.bad_steps + pending}}

    def on_train_begin(self, args, state, control, **kwargs):
        restore_state(self, state)

    def skip_step(self) -> None:
        """Skip the running optimizer step without counting it as non-finite (a compiled step that failed)."""
        self._skip = True

    def observe_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Flag a non-finite micro-batch loss; returns it replaced by 0 for the logged mean (the step is reported)."""
        finite = torch.isfinite(loss.detach())
        self._loss_bad = ~finite if self._loss_bad is None else self._loss_bad | ~finite
        return torch.where(finite, loss.detach(), torch.zeros_like(loss.detach()))

    def on_step_begin(self, args, state, control, **kwargs):
        self._loss_bad, self._skip, self._flags = None, False, None
        self._saved = [b.detach().clone() for b in self.model.buffers()]

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch optimizer
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        device = grads[0].device if grads else args.device
        grads_bad = torch.zeros((), dtype=torch.bool, device=device)
        if grads:  # the norm is NaN or inf wherever a gradient is
            grads_bad = ~torch.isfinite(torch.nn.utils.get_total_norm(grads))
        if self.scaler is not None:
            # Overflows are the scaler's (it skips and lowers its scale); count them only once no scale is left.
            grads_bad = grads_bad & (self.scaler.get_scale() < 1.0)
        loss_bad = self._loss_bad.to(device) if self._loss_bad is not None else torch.zeros_like(grads_bad)
        # `torch.full` on the device: a copy from the host would wait for it. int64: ms overflow int32 in 24 days.
        scalars = (int(self._skip), self.stop_requested, self.budget_requested, self.elapsed_ms)
        skip, stop, budget, elapsed = (torch.full((), value, dtype=torch.int64, device=device) for value in scalars)
        flags = torch.stack([(loss_bad | grads_bad).long(), loss_bad.long(), skip, stop, budget, elapsed])
        if self.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        self._flags = flags
        skip = (flags[0] | flags[2]).bool()
        if self.scaler is not None:  # the scaler skips non-finite steps itself; a skipped step's, without them:
            if self._skip or (self.world_size > 1 and bool(skip)):  # (one process's is every process's)
                try:  # where not done already (clipping unscales), as the scaler's step would: it applies no gradient
                    self.scaler.unscale_(optimizer)
                except RuntimeError as error:
                    if "already been called" not in str(error):
                        raise
                optimizer.zero_grad(set_to_none=True)
            return
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            optimizer.found_inf = skip.float()  # fused optimizers skip on the device
        elif bool(skip):
            optimizer.zero_grad(set_to_none=True)

    def on_optimizer_step(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if self._flags is None:
            return
        optimizer = getattr(optimizer, "optimizer", optimizer)
        if hasattr(optimizer, "found_inf"):
            del optimizer.found_inf
        bad, loss_bad, skip, stop, budget, elapsed = self._flags
        bad, loss_bad, skip = bad.bool(), loss_bad.bool(), skip.bool()
        with torch.no_grad():
            for buffer, before in zip(self.model.buffers(), self._saved or []):
                buffer.copy_(torch.where(bad | skip, before, buffer))
        if self._consecutive is None:
            self._consecutive = torch.zeros((), dtype=torch.int64, device=bad.device)
        self._consecutive.add_(1).mul_(bad)  # back to 0 after a good step
        flags = torch.stack([bad.long(), loss_bad.long(), self._consecutive, stop, budget, elapsed])
        deferred = flags.device.type == "cuda"
        host = torch.empty(6, dtype=torch.int64, pin_memory=deferred)
        host.copy_(flags, non_blocking=deferred)
        event = torch.cuda.Event() if deferred else None
        if event is not None:
            event.record()
        learning_rate = lr_scheduler.get_last_lr()[0] if lr_scheduler is not None else None
        self._pending.append((state.global_step + 1, learning_rate, host, event))
        self._flags = self._saved = None
        self.poll(state)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.poll(state, wait_all=True)  # before the epoch's evaluation: a divergence is reported first

    on_train_end = on_epoch_end

    def poll(self, state, wait_all: bool = False) -> None:
        """Read the flags that are due: at once off CUDA, else those over `LAG` steps old (the same in all)."""
        while self._pending:
            step, learning_rate, host, event = self._pending[0]
            if event is not None:
                if not wait_all and len(self._pending) <= LAG:
                    return
                event.synchronize()
            self._pending.popleft()
            bad, loss_bad, consecutive, stop, budget, elapsed = (int(v) for v in host.numpy())  # host: no device read
            self.stop_agreed, self.budget_agreed = self.stop_agreed or stop, self.budget_agreed or budget
            if elapsed:  # set at the end of the step before this one
                self.elapsed_agreed = (step - 1, elapsed / 1000)
            if bad:
                self._report(state, step, learning_rate, bool(loss_bad), consecutive)

    def _report(self, state, step: int, learning_rate: float | None, loss_bad: bool, consecutive: int) -> None:
        self.bad_steps += 1
        if self.bad_steps <= 100:  # in trainer_state.json, where the sweeps find the first one
            state.log_history.append({"step": step, "nonfinite_step": step, "nonfinite_loss": loss_bad})
        rate = f"{learning_rate:.3g}" if learning_rate is not None else "?"
        if consecutive >= self.max_consecutive:
            raise TrainingDiverged(
                f"Training diverged: {consecutive} optimizer steps in a row ({step - consecutive + 1}-{step}) had a "
                f"non-finite loss or gradient, at learning rate {rate}; none of them was applied.",
                step,
                learning_rate,
            )
        if self.bad_steps <= LOGGED_STEPS or self.bad_steps % 100 == 0:
            logger.warning(
                f"Step {step}: non-finite {'loss' if loss_bad else 'gradients'} (learning rate {rate}); the update "
                f"was skipped. {consecutive} such step(s) in a row, {self.bad_steps} in all; training stops at "
                f"{self.max_consecutive} in a row (`max_nonfinite_steps`)."
            )
