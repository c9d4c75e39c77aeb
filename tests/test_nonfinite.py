"""No run trains on a non-finite loss: the guard's step skipping, and runs made to go non-finite on purpose (a poisoned
batch, poisoned batches from the second epoch on, an absurd learning rate, one poisoned process of two)."""

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import AutoModelForImageClassification, TrainerState

from finetune import run
from finetune.augment import BatchTransform
from finetune.nonfinite import NonFiniteGuard, TrainingDiverged


sys.path.insert(0, str(Path(__file__).resolve().parent))
from poisoned_run import poisoned_forward  # noqa: E402
from test_run import ROOT, TINY_SCRATCH  # noqa: E402


# The tiny scratch run with a convolutional stem, whose BatchNorm statistics a NaN batch would poison for good.
STEM_RUN = [*TINY_SCRATCH, "--patch_embedding_type", "conv_stem", "--report_to", "none", "--save_total_limit", "5"]
STEPS_PER_EPOCH = 8  # 240 training images, batch 32


class TinyNet(nn.Module):
    """A linear layer and a BatchNorm: parameters, optimizer state and running statistics a step changes."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.norm(self.linear(x)).sum()


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    tensors = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, state in enumerate(optimizer.state.values()):
        tensors.update({f"optimizer.{i}.{k}": v.detach().clone() for k, v in state.items()})
    return tensors


class Hooks:
    """Calls a guard's Trainer hooks in the Trainer's order around an optimizer step, at learning rate `lr`."""

    def __init__(self, guard: NonFiniteGuard, optimizer: torch.optim.Optimizer, lr: float = 0.1):
        self.guard, self.optimizer = guard, optimizer
        self.args, self.state, self.control = SimpleNamespace(device=torch.device("cpu")), TrainerState(), None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr / 0.1)

    def begin(self):
        self.guard.on_step_begin(self.args, self.state, self.control)

    def before(self):
        self.guard.on_pre_optimizer_step(self.args, self.state, self.control, optimizer=self.optimizer)

    def after(self):
        hooks = dict(optimizer=self.optimizer, lr_scheduler=self.scheduler)
        self.guard.on_optimizer_step(self.args, self.state, self.control, **hooks)
        self.state.global_step += 1


def guarded_step(model, hooks: Hooks, x):
    hooks.begin()
    loss = model(x)
    loss.backward()
    hooks.guard.observe_loss(loss)
    hooks.before()
    hooks.optimizer.step()
    hooks.after()
    hooks.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_a_non_finite_step_changes_nothing_and_a_finite_one_does(fused, caplog):
    torch.manual_seed(0)
    model = TinyNet().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused, foreach=None if fused else True)
    guard = NonFiniteGuard(model, max_consecutive=3)
    hooks = Hooks(guard, optimizer)
    x = torch.randn(8, 4)
    guarded_step(model, hooks, x)  # a good step creates the optimizer state
    before = state_of(model, optimizer)

    with caplog.at_level(logging.WARNING, logger="finetune.nonfinite"):
        guarded_step(model, hooks, torch.full_like(x, float("nan")))
    after = state_of(model, optimizer)
    for name, value in before.items():
        assert torch.equal(after[name], value), f"{name} changed in a skipped step"
    assert "Step 2: non-finite loss (learning rate 0.1); the update was skipped" in caplog.text
    assert guard.bad_steps == 1

    guarded_step(model, hooks, x)
    after = state_of(model, optimizer)
    assert not torch.equal(after["model.linear.weight"], before["model.linear.weight"])
    assert not torch.equal(after["model.norm.running_mean"], before["model.norm.running_mean"])


def test_consecutive_bad_steps_end_training_and_a_good_step_resets_the_count():
    torch.manual_seed(0)
    model = TinyNet().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    guard = NonFiniteGuard(model, max_consecutive=3)
    hooks = Hooks(guard, optimizer, lr=0.05)
    good, bad = torch.randn(8, 4), torch.full((8, 4), float("inf"))
    for x in (bad, bad, good, bad, bad):  # never three in a row
        guarded_step(model, hooks, x)
    assert guard.bad_steps == 4
    with pytest.raises(TrainingDiverged) as error:
        guarded_step(model, hooks, bad)
    assert str(error.value) == (
        "Training diverged: 3 optimizer steps in a row (4-6) had a non-finite loss or gradient, at learning rate "
        "0.05; none of them was applied."
    )
    skipped = [e["nonfinite_step"] for e in hooks.state.log_history]
    assert skipped == [1, 2, 4, 5, 6]


def test_a_poisoned_batch_is_skipped_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(BatchTransform, "finish", poisoned_forward(3, only_one=True))
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="finetune.nonfinite"):
        results = run.main([*STEM_RUN, "--output_dir", str(out)])["scratch"]
    assert "Step 3: non-finite loss" in caplog.text
    assert caplog.text.count("non-finite") == 1
    assert results.train.steps == 2 * STEPS_PER_EPOCH
    model = AutoModelForImageClassification.from_pretrained(out, trust_remote_code=True)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())
    # The BatchNorm statistics were restored after the NaN batch (checked above), so evaluation is meaningful.
    assert math.isfinite(results.validation.loss)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert all(entry["loss"] == entry["loss"] for entry in history if "loss" in entry), "a NaN reached the log"
    assert results.train.nonfinite_steps == 1
    # Resumed after it (from the first epoch's checkpoint), the results count it still (they said 0).
    monkeypatch.undo()
    resumed = tmp_path / "resumed"
    shutil.copytree(out / f"checkpoint-{STEPS_PER_EPOCH}", resumed / f"checkpoint-{STEPS_PER_EPOCH}")
    results = run.main([*STEM_RUN, "--output_dir", str(resumed), "--resume_from_checkpoint", "true"])["scratch"]
    assert results.train.nonfinite_steps == 1 and results.train.steps == 2 * STEPS_PER_EPOCH


def test_divergence_stops_the_run_and_keeps_the_good_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(BatchTransform, "finish", poisoned_forward(STEPS_PER_EPOCH + 2))
    out = tmp_path / "run"
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingDiverged) as error:
        run.main([*STEM_RUN, "--output_dir", str(out), "--max_nonfinite_steps", "3"])
    # Training's signal handlers are gone with it: a stale one would swallow the next Ctrl-C of a notebook.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    message = str(error.value)
    first = STEPS_PER_EPOCH + 2
    assert f"3 optimizer steps in a row ({first}-{first + 2})" in message
    checkpoint = out / f"checkpoint-{STEPS_PER_EPOCH}"
    assert f"the last checkpoint {checkpoint}" in message and "validation accuracy" in message
    assert "Try a lower `learning_rate`" in message and "`qk_norm: true`" in message
    assert not (out / "results.json").exists(), "a diverged run must not look like a finished one"

    state = json.loads((out / "trainer_state.json").read_text())
    evaluations = [e for e in state["log_history"] if "eval_accuracy" in e]
    assert [e["epoch"] for e in evaluations] == [1.0]
    skipped = [e["nonfinite_step"] for e in state["log_history"] if "nonfinite_step" in e]
    assert skipped == [first, first + 1, first + 2]
    model = AutoModelForImageClassification.from_pretrained(checkpoint, trust_remote_code=True)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())


def run_script(args: list[str], env: dict | None = None, launcher: list[str] | None = None, cwd: Path = ROOT):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    command = [*(launcher or [sys.executable]), *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_an_absurd_learning_rate_ends_the_run_with_one_error_line(tmp_path):
    out = tmp_path / "run"
    # ViT's patch projection (no BatchNorm to hold the activations in range) goes NaN in the first epoch.
    run_args = [*TINY_SCRATCH, "--report_to", "none", "--output_dir", str(out), "--learning_rate", "1e6"]
    proc = run_script(["-m", "finetune.run", *run_args])
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: Training diverged: 5 optimizer steps in a row")
    assert "Traceback" not in proc.stderr
    assert not (out / "results.json").exists()


@pytest.mark.slow
def test_two_processes_stop_together_when_one_of_them_goes_non_finite(tmp_path):
    out = tmp_path / "ddp"
    launcher = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", "0",
    ]  # fmt: skip
    proc = run_script(
        [str(ROOT / "tests" / "poisoned_run.py"), *STEM_RUN, "--output_dir", str(out), "--max_nonfinite_steps", "2"],
        env={"POISON_FROM": "2", "POISON_RANK": "1"},
        launcher=launcher,
    )
    output = proc.stdout + proc.stderr
    assert "Process 0 of 2" in output, "accelerate must really have started two processes"
    assert proc.returncode != 0
    # Each process ends on the same steps (said once: every process raises it), although only the second one saw NaN
    # batches. (One's error line may follow the other's progress bar on the same line.)
    assert proc.stderr.count("error: Training diverged: 2 optimizer steps in a row (2-3)") == 1, output[-3000:]
    assert proc.stderr.count("error:") == 1


def test_under_a_loss_scaler_overflowing_gradients_are_the_scalers_business():
    """fp16: the scaler skips steps whose scaled gradients overflow and lowers its scale; the guard counts such a step
    only once the scale is below 1, and always counts a non-finite loss."""
    torch.manual_seed(0)
    linear = nn.Linear(4, 3)
    model = nn.Sequential(linear, nn.Flatten(0)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    guard = NonFiniteGuard(model, max_consecutive=2, scaler=scaler)
    hooks = Hooks(guard, optimizer)

    def scaled_step(x):
        hooks.begin()
        loss = model(x).sum()
        scaler.scale(loss).backward()
        guard.observe_loss(loss)
        scaler.unscale_(optimizer)
        hooks.before()
        scaler.step(optimizer)
        hooks.after()
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    huge = torch.full((8, 4), 1e34)  # a finite loss; its weight gradients (8e34) overflow once scaled by 2**16
    for _ in range(2):
        scaled_step(huge)
    assert guard.bad_steps == 0 and scaler.get_scale() == 2.0**14  # two overflows, two halvings
    scaled_step(torch.full((8, 4), float("nan")))
    assert guard.bad_steps == 1
    with pytest.raises(TrainingDiverged):
        scaled_step(torch.full((8, 4), float("nan")))


def test_a_step_whose_optimizer_call_was_skipped_leaves_nothing_behind():
    """A loss scaler may not call a non-fused optimizer at all for an overflowing step: the next optimizer step
    starts afresh (`on_step_begin` resets the guard's state), so it is neither skipped nor flagged."""
    torch.manual_seed(0)
    model = TinyNet().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=True)
    guard = NonFiniteGuard(model, max_consecutive=3)
    hooks = Hooks(guard, optimizer)
    hooks.begin()
    model(torch.full((8, 4), float("nan"))).backward()
    guard.observe_loss(torch.tensor(float("nan")))  # ... and the scaler never called optimizer.step
    optimizer.zero_grad(set_to_none=True)
    before = model.linear.weight.detach().clone()
    guarded_step(model, hooks, torch.randn(8, 4))
    assert not torch.equal(model.linear.weight, before) and guard.bad_steps == 0


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_skip_step_skips_without_counting_a_non_finite_step(fused):
    torch.manual_seed(0)
    model = TinyNet().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused, foreach=None if fused else True)
    guard = NonFiniteGuard(model, max_consecutive=1)
    hooks = Hooks(guard, optimizer)
    hooks.begin()
    loss = model(torch.randn(8, 4))
    loss.backward()
    guard.observe_loss(loss)
    guard.skip_step()
    before = model.linear.weight.detach().clone()
    hooks.before()
    optimizer.step()
    hooks.after()
    assert torch.equal(model.linear.weight, before) and guard.bad_steps == 0


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "unclipped"])
def test_skip_step_skips_under_a_loss_scaler_too(clipped):
    """fp16: the step after a compiled step that failed was applied, with whatever gradients it had left. Gradient
    clipping unscales before the hook; without it, the scaler's step does."""
    torch.manual_seed(0)
    model = TinyNet().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    guard = NonFiniteGuard(model, max_consecutive=1, scaler=scaler)
    hooks = Hooks(guard, optimizer)
    hooks.begin()
    loss = model(torch.randn(8, 4))
    scaler.scale(loss).backward()
    guard.observe_loss(loss)
    guard.skip_step()
    if clipped:
        scaler.unscale_(optimizer)
    before = model.linear.weight.detach().clone()
    hooks.before()
    scaler.step(optimizer)
    hooks.after()
    scaler.update()
    assert torch.equal(model.linear.weight, before) and guard.bad_steps == 0
    assert scaler.get_scale() == 2.0**4, "a skipped step is no overflow"
    guarded_step(model, hooks, torch.randn(8, 4))  # the next one is applied
    assert not torch.equal(model.linear.weight, before)


def test_a_run_at_chance_level_says_so(tmp_path, caplog):
    """A diverged run whose loss stays finite (BatchNorm holds a convolutional stem's activations in range under SGD
    at a learning rate of 100, in float32 and bf16 and at seeds 0-5; Adam at 1e6 went non-finite at most seeds) exits
    normally but warns that its model learned nothing."""
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="finetune.run"):
        run.main([*STEM_RUN, "--output_dir", str(out), "--optim", "sgd", "--learning_rate", "100"])
    assert "is at chance level" in caplog.text and "the model learned nothing" in caplog.text
