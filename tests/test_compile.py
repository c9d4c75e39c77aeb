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


def test_evaluations_between_windows_pause_the_timing_instead_of_restarting_it():
    """An evaluation every 3 steps (shorter than a window) still lets the comparison finish, and its time is not
    counted."""
    clock = FakeTime()
    compiler = TrainingCompiler(CompileChoice(True, "aot_eager", verify=True), torch.device("cpu"), 1, 2, 4, clock)
    model = nn.Linear(2, 2).train()
    for step in range(1, 40):
        compiler.on_step_begin()
        module = compiler.module_for(model, batch_size=8)
        clock.now += 0.01 if module is not model else 0.03
        compiler.on_step_end()
        if step % 3 == 0:
            clock.now += 100.0  # an evaluation
            compiler.interrupted()
    assert compiler.outcome.startswith("compiled (10.0 ms per step compiled against 30.0 ms eager")


def test_in_a_multi_process_run_a_compiler_error_waits_for_the_agreement_point():
    """With several processes, the one whose compiler failed goes eager at once, but keeps counting steps to the
    agreement point, where every process learns of it (here a single process stands in for them)."""
    compiler = TrainingCompiler(CompileChoice(True, "aot_eager"), torch.device("cpu"), world_size=2, warmup=3)
    model = nn.Linear(2, 2).train()
    compiler.on_step_begin()
    compiler.module_for(model, 8)
    compiler.fall_back(RuntimeError("inductor failed"))
    assert compiler.module_for(model, 8) is model and compiler._phases
    for _ in range(3):
        compiler.on_step_end()
        compiler.on_step_begin()
    assert not compiler._phases and compiler.outcome.startswith("eager after a compiler error")


def test_gradient_accumulation_keeps_auto_away_from_cuda_graphs(caplog):
    choice = hardware.choose_compile("auto", "cuda", cuda_capability=(9, 0), gradient_accumulation_steps=4)
    assert (choice.enabled, choice.mode, choice.verify) == (True, None, True)
    forced = hardware.choose_compile(
        "true", "cuda", "reduce-overhead", cuda_capability=(9, 0), gradient_accumulation_steps=4
    )
    assert forced.mode == "reduce-overhead" and "overwrites the gradients accumulated" in forced.warnings[0]


def test_a_bare_switch_flag_means_true():
    from finetune.arguments import parse_options

    *_, options = parse_options([*TINY_SCRATCH, "--output_dir", "unused", "--torch_compile", "--bf16"])
    settings = hardware.choose_settings(options)
    assert settings.compile.enabled and settings.compile.reason == "as given" and settings.arguments["bf16"] is True
