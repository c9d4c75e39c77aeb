"""torch.compile is never fatal and, under `auto`, never slower than eager: the choice, the fallback after a compiler
error in a real run, the timed comparison, and a compiled run on the CPU (aot_eager: dynamo and AOTAutograd without
inductor's C++ compilation)."""

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from finetune import hardware, run
from finetune.compile import TrainingCompiler
from finetune.hardware import CompileChoice


sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run import TINY_SCRATCH  # noqa: E402


FAILING_BACKEND = "failing_test_backend"


@torch._dynamo.register_backend(name=FAILING_BACKEND)
def failing_backend(graph_module, example_inputs):
    raise AssertionError("tiling_utils.get_pw_red_splits (a compiler bug)")


@pytest.mark.parametrize(
    "requested, device, mode, backend, capability, expected",
    [
        ("auto", "cuda", None, None, (9, 0), (True, "inductor", "reduce-overhead", True)),
        ("auto", "cuda", None, None, (6, 1), (False, None, None, False)),
        ("auto", "cpu", None, None, (0, 0), (False, None, None, False)),
        ("auto", "mps", None, None, (0, 0), (False, None, None, False)),
        ("auto", "cpu", "max-autotune", None, (0, 0), (True, "inductor", "max-autotune", False)),
        ("true", "cpu", None, None, (0, 0), (True, "inductor", None, False)),
        (True, "cuda", None, "cudagraphs", (9, 0), (True, "cudagraphs", None, False)),
        ("false", "cuda", None, None, (9, 0), (False, None, None, False)),
        (False, "cuda", "reduce-overhead", None, (9, 0), (False, None, None, False)),
    ],
)
def test_choose_compile(requested, device, mode, backend, capability, expected):
    choice = hardware.choose_compile(requested, device, mode, backend, cuda_capability=capability)
    assert (choice.enabled, choice.backend, choice.mode, choice.verify) == expected
    assert choice.reason


def test_choose_compile_refuses_other_values():
    with pytest.raises(ValueError, match="`torch_compile` must be auto, true or false"):
        hardware.choose_compile("sometimes", "cuda")


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def drive(compiler: TrainingCompiler, clock: FakeTime, compiled_s: float, eager_s: float, steps: int) -> list[bool]:
    """Run `steps` steps through the compiler's speed check; returns whether each used the compiled module."""
    model = nn.Linear(2, 2).train()
    used = []
    for _ in range(steps):
        compiler.on_step_begin()
        module = compiler.module_for(model, batch_size=8)
        used.append(module is not model)
        clock.now += compiled_s if module is not model else eager_s
        compiler.on_step_end()
    return used


@pytest.mark.parametrize("compiled_s, eager_s, keeps", [(0.010, 0.030, True), (0.040, 0.030, False)])
def test_auto_keeps_compilation_only_where_it_is_faster(compiled_s, eager_s, keeps, caplog):
    clock = FakeTime()
    choice = CompileChoice(True, "aot_eager", None, verify=True, reason="test")
    compiler = TrainingCompiler(choice, torch.device("cpu"), warmup=3, window=4, time_fn=clock)
    with caplog.at_level(logging.INFO, logger="finetune.compile"):
        used = drive(compiler, clock, compiled_s, eager_s, steps=3 + 4 + 2 + 4 + 5)
    # Warm-up and the compiled window compiled, then the eager warm-up and window eager, then the faster one.
    assert used[:7] == [True] * 7 and used[7:13] == [False] * 6
    assert used[13:] == [keeps] * 5
    comparison = f"{1000 * compiled_s:.1f} ms per step compiled against {1000 * eager_s:.1f} ms eager"
    assert comparison in caplog.text and comparison in compiler.summary()
    assert ("training on compiled" in caplog.text) == keeps


def test_an_evaluation_inside_a_timed_window_restarts_it():
    clock = FakeTime()
    compiler = TrainingCompiler(CompileChoice(True, "aot_eager", verify=True), torch.device("cpu"), 1, 1, 3, clock)
    drive(compiler, clock, 0.01, 0.03, steps=2)  # warm-up, then one step of the compiled window
    clock.now += 100.0  # an evaluation
    compiler.interrupted()
    drive(compiler, clock, 0.01, 0.03, steps=3 + 2 + 3)
    assert compiler.outcome.startswith("compiled (10.0 ms per step compiled against 30.0 ms eager")


def test_a_smaller_batch_runs_eagerly_and_so_does_evaluation():
    compiler = TrainingCompiler(CompileChoice(True, "aot_eager"), torch.device("cpu"))
    model = nn.Linear(2, 2).train()
    assert compiler.module_for(model, 32) is not model
    assert compiler.module_for(model, 8) is model  # an epoch's last batch: no recompilation
    assert compiler.module_for(model.eval(), 32) is model


def test_a_compiler_error_falls_back_to_eager_and_the_run_completes(tmp_path, caplog):
    out = tmp_path / "run"
    args = [*TINY_SCRATCH, "--output_dir", str(out), "--report_to", "none"]
    with caplog.at_level(logging.WARNING, logger="finetune.compile"):
        results = run.main([*args, "--torch_compile", "true", "--torch_compile_backend", FAILING_BACKEND])["scratch"]
    assert "torch.compile failed (BackendCompilerFailed" in caplog.text
    assert "training goes on without compilation" in caplog.text
    saved = json.loads((out / "results.json").read_text())
    assert saved["hyperparameters"]["torch_compile"].startswith("eager after a compiler error (BackendCompilerFailed")
    assert results.train.steps == 16 and results.validation.accuracy is not None


def test_a_compiled_run_trains_compiled_and_reports_it(tmp_path):
    out = tmp_path / "run"
    args = [*TINY_SCRATCH, "--output_dir", str(out), "--report_to", "none", "--torch_compile", "true"]
    run.main([*args, "--torch_compile_backend", "aot_eager"])
    saved = json.loads((out / "results.json").read_text())
    summary = saved["hyperparameters"]["torch_compile"]
    assert summary.startswith("compiled; first compiled step") and "torch.compile (aot_eager); as given" in summary
    assert saved["train"]["nonfinite_steps"] == 0


def test_auto_on_this_cpu_trains_eagerly_and_says_why(tmp_path):
    out = tmp_path / "run"
    run.main([*TINY_SCRATCH, "--output_dir", str(out), "--report_to", "none"])
    summary = json.loads((out / "results.json").read_text())["hyperparameters"]["torch_compile"]
    assert summary == "eager; auto: eager on cpu, where torch.compile gained nothing here"
