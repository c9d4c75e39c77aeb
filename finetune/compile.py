"""torch.compile of the training forward pass that is never fatal and, under `auto`, never slower than eager.

`TrainingCompiler` compiles instead of the Trainer, which would compile evaluation too and end the run on a compiler
error. Only training steps at the first step's batch size run compiled (no recompilation for an epoch's last batch;
in evaluation CUDA graphs would overwrite the logits the loop keeps). A step that fails compiled runs again eagerly
and training goes on eagerly, with a warning. Under `auto` (`verify`) the eager step is timed over `window` steps
(evaluations and checkpoints left out), then, after `warmup` compiled steps, the compiled step, and the faster is
kept. With several processes the times are averaged and a compiler error in one turns all eager, so all decide alike.

CUDA graphs (what `auto` compiles with) remove the launch cost of a step's kernels, which matters only while the GPU
waits for the host. If the eager steps queue their kernels in under `LAUNCH_BOUND` of the step's time, the GPU sets
the pace and `auto` stays eager without compiling: on one H200 (benchmarks/README.md#the-gpu-suite), ViT-B/16 at batch
512 ran 177.8 ms per step eager against 210.7 ms compiled, after 37.6 s of compilation in a 69.1 s run; at batch 32 the
host is the bottleneck and compiling halves the step (20.4 against 36.4 ms). Nor does `auto` compile a run whose
eager steps left would take under `WORTH_COMPILING` seconds: the compile could not pay for itself.
"""

import time
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.utils import logging

from finetune.errors import one_line
from finetune.hardware import CompileChoice


logger = logging.get_logger(__name__)

T = TypeVar("T")

# Under `auto` with CUDA graphs: compile only if the host took at least this share of an eager step to queue it.
LAUNCH_BOUND = 0.5
# Under `auto`: compile only if the eager steps left would take at least this many seconds. On one H200 the first
# compiled step took 6 s (ViT-B/16, inductor's cache warm) to 27 s (the quickstart's 136K-parameter ViT) and 34-42 s
# (ViT-B/16, cold), and CUDA graphs saved at most 73% of an eager step (9.9 against 36.2 ms): below a minute of steps
# the compile costs about what it can save. The quickstart compiled 47 s in its 74 s of training on that GPU.
WORTH_COMPILING = 60.0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainingCompiler(TrainerCallback):
    """Which module runs a training step's forward pass; as a callback, it times the check of `auto`."""

    def __init__(
        self,
        choice: CompileChoice,
        device: torch.device,
        world_size: int = 1,
        warmup: int = 3,
        window: int = 10,
        time_fn: Callable[[], float] = time.perf_counter,
        seconds_left: Callable[[], float] | None = None,
    ):
        self.choice, self.device, self.world_size, self.time_fn = choice, device, world_size, time_fn
        self.seconds_left = seconds_left  # a time budget's seconds left, if the run has one
        self.window = window
        self.active = choice.enabled
        self.batch_size: int | None = None
        self.used = False  # the step now running uses the compiled module
        self.compile_seconds: float | None = None
        self.outcome = "compiled" if choice.enabled else "eager"
        self._compiled: dict[int, nn.Module] = {}
        self.failed = False
        # The check's (name, steps) still to run; with several processes an agreement point after warm-up, so that a
        # compiler error in one turns all eager.
        self._phases = [("warmup", warmup)] if choice.enabled and world_size > 1 else []
        if choice.enabled and choice.verify:
            self._phases = [("eager warmup", 2), ("eager", window), ("warmup", warmup), ("compiled", window)]
        # The step that compiles (a one-off cost a time budget measures its rate after: `settle_steps`).
        self.first_compiled_step = 1 + sum(steps for name, steps in self._phases if name.startswith("eager"))
        self._phase_steps, self._phase_seconds = 0, 0.0
        self._segment_start = self._last_end = self._step_start = None
        self._times: dict[str, float] = {}
        self._queued = [0.0, 0.0]  # eager steps: seconds until the host had queued the step, and until it ended

    def module_for(self, model: nn.Module, batch_size: int) -> nn.Module:
        """The module to run a training micro-batch of `batch_size` images through."""
        self.used = False
        if not self.active or not model.training:
            return model
        if self.batch_size is None:  # the first training step's, also where `auto` runs it eagerly
            self.batch_size = batch_size
        if batch_size != self.batch_size or (self._phases and self._phases[0][0].startswith("eager")):
            return model  # an epoch's smaller last batch (no recompilation), or `auto`'s eager steps
        if self.choice.cuda_graphs:
            # A new iteration: outputs of the previous step's CUDA graphs may be overwritten from here on.
            torch.compiler.cudagraph_mark_step_begin()
        key = id(model)
        if key not in self._compiled:
            self._compiled[key] = torch.compile(
                model, backend=self.choice.backend, mode=self.choice.mode, dynamic=False
            )
        self.used = True
        return self._compiled[key]

    def run(self, step: Callable[[], T], on_fallback: Callable[[], None] = lambda: None) -> T:
        """`step()`, which takes its module from `module_for`; if it fails compiled and succeeds eagerly, training
        goes on eagerly and `on_fallback()` is called (the Trainer skips that optimizer step: a compiled backward that
        failed halfway may have added its gradients already)."""
        first = self.active and self.compile_seconds is None
        start = self.time_fn()
        try:
            result = step()
        except Exception as error:
            if not self.used:
                raise
            self.active = False
            result = step()
            self.fall_back(error)
            on_fallback()
            return result
        if first and self.used:
            synchronize(self.device)
            self.compile_seconds = self.time_fn() - start
            logger.info(f"torch.compile: the first compiled step took {self.compile_seconds:.1f} s.")
        return result

    def fall_back(self, error: BaseException) -> None:
        """Eager from now on, with a warning; in a multi-process run the others follow at the agreement point."""
        self.active, self.failed = False, True
        if self.world_size == 1:
            self._phases.clear()
        self.outcome = f"eager after a compiler error ({one_line(error)})"
        logger.warning(
            f"torch.compile failed ({one_line(error)}); training goes on without compilation. Set "
            "`torch_compile: false` to skip the attempt, or `--debug` for the traceback of a run that fails for good."
        )

    def on_step_begin(self, *args, **kwargs) -> None:
        if self._phases:
            synchronize(self.device)  # only in the few steps of the check
            self._step_start = self.time_fn()
            if self._segment_start is None:
                self._segment_start = self._step_start

    def on_step_end(self, args=None, state=None, control=None, **kwargs) -> None:
        if not self._phases or self._segment_start is None:
            return
        queued = self.time_fn()
        synchronize(self.device)
        self._last_end = self.time_fn()
        self._phase_steps += 1
        name, steps = self._phases[0]
        if name == "eager":
            self._queued[0] += queued - self._step_start
            self._queued[1] += self._last_end - self._step_start
        if self._phase_steps < steps:
            return
        self._close_segment()
        self._times[name] = self._phase_seconds / steps
        self._phases.pop(0)
        self._phase_steps, self._phase_seconds = 0, 0.0
        if name == "eager" and self.choice.cuda_graphs and self._gpu_bound():
            return
        if name == "eager" and self.choice.verify and self._too_short(state):
            return
        if not self._phases:
            self._decide()

    def interrupted(self, *args, **kwargs) -> None:
        """An evaluation, a checkpoint or an epoch's end: the timed phase pauses at the last step's end."""
        if self._phases:
            self._close_segment()

    on_evaluate = on_save = on_epoch_end = interrupted

    def _close_segment(self) -> None:
        if self._last_end is not None and self._last_end > self._segment_start:  # a step ended since it started
            self._phase_seconds += self._last_end - self._segment_start
        self._segment_start = self._last_end = None

    def _mean_over_processes(self, *values: float) -> list[float]:
        if self.world_size > 1 and torch.distributed.is_initialized():
            stats = torch.tensor(values, dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(stats)
            return [float(t) / self.world_size for t in stats.cpu()]
        return list(values)

    def _gpu_bound(self) -> bool:
        """After the eager window: eager for good where the GPU, not the kernel launches, sets the pace."""
        queued, total = self._mean_over_processes(*self._queued)
        if total <= 0 or queued >= LAUNCH_BOUND * total:
            return False
        queued_ms, step_ms = 1000 * queued / self.window, 1000 * total / self.window
        timing = f"the host queued a step in {queued_ms:.1f} of its {step_ms:.1f} ms"
        self._stay_eager(
            f"eager, the GPU sets the pace ({timing})",
            f"{timing}, so the GPU, not the kernel launches, sets the pace; training on in eager mode "
            "without compiling",
        )
        return True

    def _too_short(self, state) -> bool:
        """After the eager window: eager for good where the eager steps left (to `max_steps`, or to the end of a time
        budget) would take under `WORTH_COMPILING` seconds."""
        if state is None or not state.max_steps:
            return False
        left = (state.max_steps - state.global_step) * self._times["eager"]
        budget = self.seconds_left() if self.seconds_left is not None else float("inf")
        left = min(self._mean_over_processes(left, budget))
        if left >= WORTH_COMPILING:
            return False
        self._stay_eager(
            f"eager, too short a run to pay for compiling (about {left:.0f} s of eager steps left)",
            f"about {left:.0f} s of eager steps are left, too few to pay for compiling; training on in eager mode",
        )
        return True

    def _stay_eager(self, outcome: str, why: str) -> None:
        """`auto`'s check ends before compiling: eager for good."""
        self.active = False
        self._phases.clear()
        self.outcome = outcome
        logger.info(f"torch.compile: {why} (`torch_compile: true` compiles anyway).")

    def _decide(self) -> None:
        compiled, eager = self._times.get("compiled", 0.0), self._times.get("eager", 0.0)
        compiled, eager, failed = self._mean_over_processes(compiled, eager, float(self.failed))
        if failed:
            if not self.failed:
                self.active = False
                self.outcome = "eager after a compiler error in another process"
                logger.warning("torch.compile failed in another process of the run; training goes on without it.")
            return
        if not self.choice.verify:
            return
        comparison = f"{1000 * compiled:.1f} ms per step compiled against {1000 * eager:.1f} ms eager"
        if compiled <= eager:
            self.outcome = f"compiled ({comparison})"
            logger.info(f"torch.compile: {comparison}; training on compiled.")
        else:
            self.active = False
            self.outcome = f"eager, faster here ({comparison})"
            logger.warning(f"torch.compile: {comparison}; training on in eager mode, which is faster here.")

    def summary(self) -> str:
        """What the run trained with, for results.json."""
        if not self.choice.enabled:
            return self.choice.summary
        first = f"; first compiled step {self.compile_seconds:.1f} s" if self.compile_seconds is not None else ""
        outcome = self.outcome
        if outcome == "compiled" and self.compile_seconds is None:  # e.g. a run within `auto`'s eager steps
            outcome = "eager, training ended before the first compiled step"
        return f"{outcome}{first}; {self.choice.summary}"
