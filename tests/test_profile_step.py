"""benchmarks/profile_step.py at a CPU size: a real run profiled over a window of steps, which then stops."""

import json

import pytest
import torch
from test_sweeps import benchmark, tiny_inputs
from transformers import TrainerControl, TrainerState


def test_a_window_of_steps_is_timed_profiled_and_ends_the_run(tmp_path):
    tiny_inputs(tmp_path)
    (tmp_path / "tiny.yaml").write_text((tmp_path / "tiny.yaml").read_text().replace("max_steps: 2", "max_steps: 40"))
    done = benchmark(
        "profile_step.py", "--profile_output", "prof", "--profile_after", "6", "--profile_steps", "3",
        "--config", "tiny.yaml", "--dataset_name", "data.parquet", "--output_dir", "run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert (figures["device"], figures["steps"], figures["after_step"]) == ("cpu", 3, 6)
    assert figures["plain_ms_per_step"] > 0 and figures["profiled_ms_per_step"] > 0
    assert figures["device_busy_ms_per_step"] is None and figures["kernel_launches_per_step"] == 0
    assert any(op["name"].startswith("aten::") and op["ms_per_step"] > 0 for op in figures["top_host_ops"])
    text = (tmp_path / "prof" / "profile.md").read_text()
    assert "cpu, steps 7-9" in text and "most host time (3 steps)" in text and "aten::" in text
    # Training stopped at the window's end instead of going on to max_steps.
    assert json.loads((tmp_path / "run" / "results.json").read_text())["train"]["steps"] == 9


@pytest.mark.slow
def test_a_window_past_the_run_is_one_line_and_writes_nothing(tmp_path):
    tiny_inputs(tmp_path)
    done = benchmark(
        "profile_step.py", "--profile_output", "prof", "--config", "tiny.yaml", "--dataset_name", "data.parquet",
        "--output_dir", "run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: training ended before step 80, the profiled window's end; give the run more steps or lower "
        "--profile_after / --profile_steps"
    )
    assert not (tmp_path / "prof").exists()


def test_a_run_that_ends_inside_the_window_stops_the_profiler():
    """Training that ends after the profiler started (`max_steps`, a time budget, early stopping) does not leave it
    recording the final evaluations and saves; the report then says the window was not reached."""
    import profile_step

    profiler = profile_step.StepProfiler(after=2, steps=3, device=torch.device("cpu"))
    state, control = TrainerState(global_step=2), TrainerControl()
    profiler.on_step_begin(None, state, control)
    try:
        assert torch.autograd._profiler_enabled()
        profiler.on_train_end(None, state, control)
        assert not torch.autograd._profiler_enabled()
    finally:
        if torch.autograd._profiler_enabled():
            profiler.profiler.stop()
    with pytest.raises(RuntimeError, match="training ended before step 5"):
        profiler.report()
