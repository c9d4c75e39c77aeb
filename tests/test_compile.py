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
from transformers import TrainerState

import finetune.compile
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
        used = drive(compiler, clock, compiled_s, eager_s, steps=2 + 4 + 3 + 4 + 5)
    # The eager warm-up and window eager, then the compiled warm-up and window compiled, then the faster one.
    assert used[:6] == [False] * 6 and used[6:13] == [True] * 7
    assert used[13:] == [keeps] * 5
    comparison = f"{1000 * compiled_s:.1f} ms per step compiled against {1000 * eager_s:.1f} ms eager"
    assert comparison in caplog.text and comparison in compiler.summary()
    assert ("training on compiled" in caplog.text) == keeps


def test_an_evaluation_inside_a_timed_window_restarts_it():
    clock = FakeTime()
    compiler = TrainingCompiler(CompileChoice(True, "aot_eager", verify=True), torch.device("cpu"), 1, 1, 3, clock)
    drive(compiler, clock, 0.01, 0.03, steps=3)  # the eager warm-up, then one step of the eager window
    clock.now += 100.0  # an evaluation
    compiler.interrupted()
    drive(compiler, clock, 0.01, 0.03, steps=2 + 1 + 3)
    assert compiler.outcome.startswith("compiled (10.0 ms per step compiled against 30.0 ms eager")


def drive_queued(
    compiler: TrainingCompiler, queued_share: float, steps: int, step_s: float = 0.1, max_steps: int = 0
) -> list[bool]:
    """Eager steps in which the host queues the kernels in `queued_share` of the step and the device finishes at the
    next synchronisation (the fake clock advances there), in a run of `max_steps` (0: of unknown length); returns
    whether each step used the compiled module."""
    clock, synced = compiler.time_fn, [True]

    def synchronize(device):
        if not synced[0]:
            clock.now += step_s * (1 - queued_share)
            synced[0] = True

    finetune.compile.synchronize = synchronize
    model, used, state = nn.Linear(2, 2).train(), [], TrainerState(max_steps=max_steps)
    for _ in range(steps):
        compiler.on_step_begin()
        used.append(compiler.module_for(model, batch_size=8) is not model)
        clock.now += step_s * queued_share
        synced[0] = False
        state.global_step += 1
        compiler.on_step_end(None, state, None)
    return used


GRAPHS_AUTO = CompileChoice(True, "inductor", "reduce-overhead", verify=True)


@pytest.mark.parametrize("queued_share, compiles", [(0.2, False), (0.9, True)])
def test_auto_compiles_only_where_the_host_sets_the_pace(queued_share, compiles, monkeypatch, caplog):
    """CUDA graphs save launch time: where the eager step's kernels are queued in under half of the step (the GPU is
    the bottleneck, ViT-B/16 at batch 512 on an H200), `auto` stays eager without spending a compilation on it."""
    monkeypatch.setattr("finetune.compile.synchronize", finetune.compile.synchronize)  # restored after the test
    compiler = TrainingCompiler(GRAPHS_AUTO, torch.device("cpu"), warmup=1, window=4, time_fn=FakeTime())
    with caplog.at_level(logging.INFO, logger="finetune.compile"):
        used = drive_queued(compiler, queued_share, steps=2 + 4 + 3)
    assert used[:6] == [False] * 6
    assert used[6:] == [compiles] * 3
    gpu_bound = "the host queued a step in 20.0 of its 100.0 ms"
    assert (gpu_bound in caplog.text) == (not compiles)
    if not compiles:
        assert compiler.summary().startswith(f"eager, the GPU sets the pace ({gpu_bound})")
        assert compiler.compile_seconds is None and not compiler._compiled


@pytest.mark.parametrize("max_steps, budget_left, compiles", [(500, None, False), (700, None, True), (700, 30, False)])
def test_auto_does_not_compile_a_run_too_short_to_pay_for_it(max_steps, budget_left, compiles, monkeypatch, caplog):
    """A launch-bound run whose eager steps left take under a minute (100 ms a step; 494 steps left: 49 s, or a time
    budget with 30 s left) stays eager: on one H200 the quickstart spent 47 s of its 74 s of training compiling."""
    monkeypatch.setattr("finetune.compile.synchronize", finetune.compile.synchronize)  # restored after the test
    seconds_left = None if budget_left is None else lambda: budget_left
    compiler = TrainingCompiler(GRAPHS_AUTO, torch.device("cpu"), 1, 1, 4, FakeTime(), seconds_left)
    with caplog.at_level(logging.INFO, logger="finetune.compile"):
        used = drive_queued(compiler, 0.9, steps=2 + 4 + 3, max_steps=max_steps)
    assert used == [False] * 6 + [compiles] * 3
    if not compiles:
        left = 49 if budget_left is None else 30
        assert compiler.summary().startswith(f"eager, too short a run to pay for compiling (about {left} s of eager")
        assert f"about {left} s of eager steps are left" in caplog.text and not compiler._compiled


def decide_in_process(rank: int, port: int, shares: tuple[float, float], out: Path) -> None:
    torch.distributed.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        compiler = TrainingCompiler(GRAPHS_AUTO, torch.device("cpu"), 2, warmup=1, window=4, time_fn=FakeTime())
        used = drive_queued(compiler, shares[rank], steps=2 + 4 + 1)
        (out / f"{rank}.json").write_text(json.dumps({"used": used, "outcome": compiler.outcome}))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("shares, compiles", [((0.2, 0.6), False), ((0.2, 0.9), True)])
def test_two_processes_decide_alike_on_their_mean(shares, compiles, tmp_path):
    """Two gloo processes whose hosts queue their steps in different shares: both take the decision of the mean
    (0.4 stays eager, 0.55 compiles), so that neither waits for the other inside a collective the other skips."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.multiprocessing.start_processes(
        decide_in_process, args=(port, shares, tmp_path), nprocs=2, start_method="fork"
    )
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["used"] == [False] * 6 + [compiles]
    assert results[0]["outcome"].startswith("eager, the GPU sets the pace") == (not compiles)
    assert results[0]["outcome"] == results[1]["outcome"]


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


def test_the_compiled_batch_size_is_the_first_steps_not_the_first_compiled_steps():
    """`auto` runs its first 12 steps eagerly; an epoch of 13 steps ends with a smaller batch there. It became the
    compiled batch size, and every full batch after it ran eagerly (the compiled window timed eager steps)."""
    compiler = TrainingCompiler(CompileChoice(True, "aot_eager", verify=True), torch.device("cpu"))  # 2 + 10 eager
    model = nn.Linear(2, 2).train()
    used = []
    for batch_size in [32] * 12 + [16] + [32] * 3:
        compiler.on_step_begin()
        used.append(compiler.module_for(model, batch_size) is not model)
        compiler.on_step_end()
    assert compiler.batch_size == 32
    assert used == [False] * 13 + [True] * 3


def test_a_run_that_ends_before_autos_first_compiled_step_reports_eager():
    """A run shorter than the eager part of `auto`'s check never compiled: its results said `compiled`."""
    compiler = TrainingCompiler(GRAPHS_AUTO, torch.device("cpu"), warmup=1, window=4, time_fn=FakeTime())
    drive(compiler, compiler.time_fn, 0.01, 0.03, steps=5)
    assert not compiler._compiled and compiler.compile_seconds is None
    assert compiler.summary().startswith("eager, training ended before the first compiled step;")
