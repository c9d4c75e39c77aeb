"""`python benchmarks/profile_step.py --profile_output DIR [--profile_steps N] [--profile_after K] [finetune.run
arguments]`: where a training step's time goes, from torch.profiler.

A run of `finetune.run` as a user starts it. Steps K-N+1 to K run plain and are timed; steps K+1 to K+N run under the
profiler, after which training stops (K defaults to 60: past `torch_compile: auto`'s check of 25 steps and the
compile). DIR/profile.md then gives the wall time per step with and without the profiler, the device's busy time per
step (the sum of its kernels), kernel and CUDA-graph launches per step, and the operators that take the most host and
device time; DIR/profile.json has the same figures. Evaluations and checkpoints that fall in a window count in it:
choose K and N between them. The profiler lives here, never in a user's run.

    python benchmarks/profile_step.py --profile_output prof --config configs/cifar10_vit_b16.yaml \
        --model_name_or_path CHECKPOINT --output_dir prof/run
"""

import argparse
import json
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from finetune import run  # noqa: E402
from finetune.compile import synchronize  # noqa: E402
from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import check_folder, make_folder  # noqa: E402
from finetune.trainer import ImageClassificationTrainer  # noqa: E402


KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
ROWS = 25


class StepProfiler(TrainerCallback):
    """Times `steps` plain steps that end at step `after`, then profiles the next `steps` and stops training."""

    def __init__(self, after: int, steps: int, device: torch.device):
        self.after, self.steps, self.device = after, steps, device
        self.plain_start = self.plain_seconds = self.start = self.seconds = None
        self.profiler: torch.profiler.profile | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.after - self.steps:
            synchronize(self.device)
            self.plain_start = time.perf_counter()
        if state.global_step == self.after and self.profiler is None:
            synchronize(self.device)
            if self.plain_start is not None:
                self.plain_seconds = time.perf_counter() - self.plain_start
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.start()
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None and self.seconds is None and state.global_step == self.after + self.steps:
            synchronize(self.device)
            self.seconds = time.perf_counter() - self.start
            self.profiler.stop()
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        # Training ended inside the window (`max_steps`, a time budget, early stopping): the profiler stops here
        # instead of recording the final evaluations and saves; `report` then says the window was not reached.
        if self.profiler is not None and self.seconds is None:
            self.profiler.stop()

    def report(self) -> tuple[dict, str]:
        """The figures (profile.json) and profile.md's text."""
        if self.seconds is None:
            raise RuntimeError(
                f"training ended before step {self.after + self.steps}, the profiled window's end; give the run more "
                "steps or lower --profile_after / --profile_steps"
            )
        events = self.profiler.key_averages()
        per_step = 1000 / self.steps
        # The kernels' own time (an operator's device time is its kernels' again), microseconds to milliseconds.
        kernels = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", 0)]
        busy = sum(e.self_device_time_total for e in kernels) / 1000
        figures = {
            "device": str(self.device),
            "steps": self.steps,
            "after_step": self.after,
            "plain_ms_per_step": self.plain_seconds * per_step if self.plain_seconds is not None else None,
            "profiled_ms_per_step": self.seconds * per_step,
            "device_busy_ms_per_step": busy / self.steps if self.device.type == "cuda" else None,
            "kernel_launches_per_step": sum(e.count for e in events if e.key in KERNEL_LAUNCHES) / self.steps,
            "graph_launches_per_step": sum(e.count for e in events if e.key == "cudaGraphLaunch") / self.steps,
            "top_host_ops": top(events, "self_cpu_time_total", per_step),
            "top_device_ops": top(events, "self_device_time_total", per_step) if self.device.type == "cuda" else [],
        }
        plain = figures["plain_ms_per_step"]
        lines = [
            f"# Where a training step's time goes ({self.device}, steps {self.after + 1}-{self.after + self.steps})",
            "",
            f"`python benchmarks/profile_step.py {' '.join(sys.argv[1:])}`",
            "",
            f"- Wall time per step: {plain:.1f} ms plain (steps {self.after - self.steps + 1}-{self.after}), "
            if plain is not None
            else "- Wall time per step: ",
        ]
        lines[-1] += f"{figures['profiled_ms_per_step']:.1f} ms under the profiler."
        if figures["device_busy_ms_per_step"] is not None:
            lines.append(
                f"- Device busy per step (its kernels): {figures['device_busy_ms_per_step']:.1f} ms; kernel launches "
                f"per step: {figures['kernel_launches_per_step']:.0f}; CUDA-graph launches per step: "
                f"{figures['graph_launches_per_step']:.0f}."
            )
        for title, key in (("device", "self_device_time_total"), ("host", "self_cpu_time_total")):
            if key == "self_device_time_total" and self.device.type != "cuda":
                continue
            table = events.table(sort_by=key, row_limit=ROWS, max_name_column_width=70)
            lines += ["", f"## The operators with the most {title} time ({self.steps} steps)", "", "```", table, "```"]
        return figures, "\n".join(lines) + "\n"


def top(events, key: str, per_step: float) -> list[dict]:
    """The `ROWS` operators with the most `key` time, in milliseconds per step."""
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:ROWS]
    return [{"name": e.key, "calls": e.count, "ms_per_step": getattr(e, key) * per_step / 1e6} for e in rows]


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile_output", required=True, help="Folder for profile.md and profile.json.")
    parser.add_argument("--profile_steps", type=int, default=20, help="Steps timed plain, then profiled.")
    parser.add_argument("--profile_after", type=int, default=60, help="The step the profiled window starts after.")
    args, run_argv = parser.parse_known_args(argv)
    if args.profile_steps < 1 or args.profile_after < 0:
        parser.error("--profile_steps must be >= 1 and --profile_after >= 0")
    check_folder(args.profile_output, "--profile_output")  # made once the run has something to write
    trainers = []

    class Profiled(ImageClassificationTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if not trainers:  # `--model_type both`: the first run (pretrained) is profiled, the second trains as is
                self.profiler = StepProfiler(args.profile_after, args.profile_steps, self.args.device)
                self.add_callback(self.profiler)
            trainers.append(self)

    run.ImageClassificationTrainer = Profiled  # the class run.py builds its trainers from
    run.main(run_argv)
    if not trainers:
        raise RuntimeError(
            "the run trained nothing to profile (a finished run kept in its output_dir, or do_train false); give it "
            "a new --output_dir or --overwrite_output_dir true"
        )
    figures, text = trainers[0].profiler.report()
    if not trainers[0].is_world_process_zero():
        return figures
    output = make_folder(args.profile_output, "--profile_output")
    (output / "profile.json").write_text(json.dumps(figures, indent=2) + "\n")
    (output / "profile.md").write_text(text)
    print(text)
    return figures


if __name__ == "__main__":
    sys.exit(run_command(main))
