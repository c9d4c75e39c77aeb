"""Training-budget callbacks, EMA of weights, and the Trainer's flip TTA and soft-target (MixUp) loss."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import TrainerControl, TrainerState, TrainingArguments, get_scheduler

from finetune.augment import BatchTransform
from finetune.callbacks import (
    EMACallback,
    ModelEMA,
    RunClock,
    TrainingBudgetCallback,
    set_schedule_length,
)
from finetune.trainer import ImageClassificationTrainer
from finetune.training_args import ImageClassificationTrainingArguments
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _args(tmp_path, **kwargs):
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)


def _budget(max_minutes, fake_time, **kwargs):
    """A budget callback on a `RunClock` driven by `fake_time`, started as the Trainer starts both."""
    clock = RunClock(time_fn=fake_time)
    return clock, TrainingBudgetCallback(max_minutes, clock=clock, **kwargs)


def _begin(callbacks, args, state, control):
    for callback in callbacks:
        callback.on_train_begin(args, state, control)


def test_budget_stops_only_once_the_time_is_spent(tmp_path):
    clock = FakeClock()
    run_clock, callback = _budget(2, clock)
    args, state, control = _args(tmp_path), TrainerState(), TrainerControl()
    _begin([run_clock, callback], args, state, control)
    for step in range(1, 12):
        clock.now += 10.0  # 10 s per step: the budget (120 s) is spent at step 12
        state.global_step = step
        callback.on_step_end(args, state, control)
        assert not control.should_training_stop, f"stopped early at step {step}"
    clock.now += 10.0
    state.global_step = 12
    callback.on_step_end(args, state, control)
    assert control.should_training_stop and callback.stopped_at == 12


def test_budget_spent_by_an_evaluation_stops_before_the_next_step(tmp_path):
    clock = FakeClock()
    run_clock, callback = _budget(1, clock)
    args, state, control = _args(tmp_path), TrainerState(), TrainerControl()
    _begin([run_clock, callback], args, state, control)
    clock.now += 59.0
    callback.on_step_end(args, state, control)
    assert not control.should_training_stop
    clock.now += 5.0  # a long evaluation
    callback.on_evaluate(args, state, control)
    assert control.should_training_stop


def test_budget_schedule_ends_the_cosine_decay_at_the_budget(tmp_path):
    clock = FakeClock()
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=2, num_training_steps=1000)
    run_clock, callback = _budget(1, clock, fit_schedule=True, calibration_fraction=0.1)
    args, state, control = _args(tmp_path), TrainerState(max_steps=1000), TrainerControl()
    _begin([run_clock, callback], args, state, control)
    lrs = []
    while not control.should_training_stop:
        clock.now += 0.5  # 0.5 s per step: 120 steps fit in the minute
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
        state.global_step += 1
        callback.on_step_end(args, state, control, lr_scheduler=scheduler)
    assert callback.planned_steps == 120 and state.global_step == 120
    assert lrs[1] == pytest.approx(1.0), "the warmup is kept"
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12), "the schedule reaches its end at the budget"
    assert lrs[59] == pytest.approx(0.5 * (1 + torch.cos(torch.tensor(torch.pi * 58 / 118)).item()), abs=1e-6)


def test_set_schedule_length_refuses_a_constant_schedule():
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    assert not set_schedule_length(get_scheduler("constant", optimizer), 10)
    assert set_schedule_length(get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=100), 10)


def test_elapsed_time_is_stamped_on_each_log_entry(tmp_path):
    clock = FakeClock()
    callback = RunClock(time_fn=clock)
    args, state, control = _args(tmp_path), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    clock.now += 42.5
    state.log_history.append({"eval_accuracy": 0.5})
    callback.on_log(args, state, control, logs={"eval_accuracy": 0.5})
    assert state.log_history[-1]["elapsed_seconds"] == 42.5


def test_ema_equals_the_closed_form_after_k_steps(tmp_path):
    model = nn.Linear(3, 2)
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    decay, k = 0.9, 5
    ema = ModelEMA(model, decay, warmup=False)
    callback = EMACallback(ema)
    args, state, control = _args(tmp_path), TrainerState(), TrainerControl()
    values = []
    for step in range(1, k + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(step)  # the weights after step `step`
        values.append({n: v.clone() for n, v in model.state_dict().items()})
        state.global_step = step
        callback.on_step_end(args, state, control, model=model)
    expected = {}
    for name in w0:
        # ema_k = d^k w_0 + sum_i (1 - d) d^(k - i) w_i
        expected[name] = decay**k * w0[name] + sum(
            (1 - decay) * decay ** (k - i) * values[i - 1][name] for i in range(1, k + 1)
        )
        torch.testing.assert_close(ema.shadow[name], expected[name])
    raw = {n: v.clone() for n, v in model.state_dict().items()}
    ema.swap(model)  # the model now holds the average, the EMA the raw weights
    for name in w0:
        torch.testing.assert_close(model.state_dict()[name], expected[name])
    ema.swap(model)
    for name in w0:
        torch.testing.assert_close(model.state_dict()[name], raw[name])


def test_ema_warmup_decay_follows_timm():
    ema = ModelEMA(nn.Linear(1, 1), 0.999)
    assert ema.current_decay() == pytest.approx(1 / 10)
    ema.num_updates = 10_000
    assert ema.current_decay() == 0.999


def _tiny_trainer(tmp_path, **kwargs):
    torch.manual_seed(0)
    config = ScratchViTConfig(
        image_size=8, patch_size=4, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    config.num_labels = 3
    model = ScratchViTForImageClassification(config)
    transform = BatchTransform(8, (0.5,) * 3, (0.5,) * 3, in_channels=3, out_channels=3)
    args = ImageClassificationTrainingArguments(
        output_dir=str(tmp_path), report_to="none", eval_strategy="no", load_best_model_at_end=False, **kwargs,
        bf16=False, fp16=False, tf32=None, torch_compile=False,  # built in code: no `auto` (hardware.choose_settings)
    )  # fmt: skip
    return ImageClassificationTrainer(model=model, args=args, batch_transform=transform), model


def test_flip_tta_logits_are_the_mean_of_both_passes(tmp_path):
    trainer, model = _tiny_trainer(tmp_path, flip_tta=True)
    model.eval()
    x = torch.randn(4, 3, 8, 8)
    labels = torch.tensor([0, 1, 2, 0])
    loss, outputs = trainer.compute_loss(model, {"pixel_values": x, "labels": labels}, return_outputs=True)
    with torch.no_grad():
        expected = (model(pixel_values=x).logits + model(pixel_values=x.flip(-1)).logits) / 2
    torch.testing.assert_close(outputs.logits, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, F.cross_entropy(expected, labels), rtol=1e-5, atol=1e-6)
    # Training is untouched: the model's own loss on the unflipped batch.
    model.train()
    assert torch.equal(
        trainer.compute_loss(model, {"pixel_values": x, "labels": labels}), model(pixel_values=x, labels=labels).loss
    )


def test_soft_target_loss_mixes_the_two_cross_entropies(tmp_path):
    trainer, model = _tiny_trainer(tmp_path)
    model.train()
    x = torch.randn(4, 3, 8, 8)
    a, b, lam = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 1, 0, 2]), 0.3
    soft = lam * F.one_hot(a, 3).float() + (1 - lam) * F.one_hot(b, 3).float()
    loss = trainer.compute_loss(model, {"pixel_values": x, "soft_labels": soft})
    logits = model(pixel_values=x).logits
    expected = lam * F.cross_entropy(logits, a) + (1 - lam) * F.cross_entropy(logits, b)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_run_clock_leaves_out_evaluations_inside_an_epoch_and_samples_the_data_path(tmp_path):
    """`eval_strategy: steps`: an evaluation between two steps is not training time, and an evaluation's log entry
    (written before `on_evaluate`) counts the epoch up to its last step. The data path: each epoch's first step as
    measured (loader start-up), the others scaled up from the sampled ones."""
    fake = FakeClock()
    clock = RunClock(time_fn=fake, data_timing_interval=4)
    args, state, control = _args(tmp_path, per_device_train_batch_size=8), TrainerState(), TrainerControl()
    clock.on_train_begin(args, state, control)
    clock.on_epoch_begin(args, state, control)
    timed = []
    for step in range(8):
        timed.append(clock.times_data_of_step(step))
        if timed[-1]:
            clock.add_data_time(3.0 if step == 0 else 0.5, new_step=True)
        fake.now += 2.0
        clock.on_step_end(args, state, control)
        if step == 3:
            fake.now += 50.0  # an evaluation
            state.log_history.append({"eval_accuracy": 0.5})
            clock.on_log(args, state, control)
            clock.on_evaluate(args, state, control)
    clock.on_epoch_end(args, state, control)
    assert timed == [True, False, False, False, True, False, False, False]
    assert clock.train_seconds == pytest.approx(16.0)
    entry = state.log_history[-1]
    assert entry["train_seconds"] == pytest.approx(8.0) and entry["train_steps"] == 4
    assert entry["train_images_per_second"] == pytest.approx(4 * 8 / 8.0)
    # step 0's 3 s as measured; step 4's 0.5 s stands for the other 7 steps
    assert clock.data_seconds == pytest.approx(3.0 + 0.5 * 7)
    clock.on_epoch_begin(args, state, control)
    assert clock.times_data_of_step(8) is True  # the next epoch's first step
