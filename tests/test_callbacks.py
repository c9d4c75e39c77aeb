"""Training-budget callbacks, the run clock, EMA of weights, and the Trainer's flip TTA and soft-target loss."""

import dataclasses
import datetime
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import TrainerControl, TrainerState, TrainingArguments, get_scheduler

from finetune.augment import BatchTransform
from finetune.callbacks import (
    EMACallback,
    ModelEMA,
    ResumeCheck,
    ResumeRefused,
    RunClock,
    TrainingBudgetCallback,
    evaluation_line,
    set_schedule_length,
    total_batch_size,
)
from finetune.trainer import ImageClassificationTrainer, classification_loss
from finetune.training_args import ImageClassificationTrainingArguments, check_batches
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


def test_budget_schedule_is_planned_again_when_its_first_steps_were_slow(tmp_path):
    clock = FakeClock()
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=1000)
    run_clock, callback = _budget(1, clock, fit_schedule=True, calibration_fraction=0.1)
    args, state, control = _args(tmp_path), TrainerState(max_steps=1000), TrainerControl()
    _begin([run_clock, callback], args, state, control)
    while not control.should_training_stop:
        clock.now += 5.0 if state.global_step < 3 else 0.5  # three slow first steps, then ten times faster
        state.global_step += 1
        callback.on_step_end(args, state, control, lr_scheduler=scheduler)
    # Planned once, from the slow steps, the schedule ended at step 12 with 40 of the 60 s left.
    assert state.global_step > 60 and clock.now - 1000.0 >= 0.85 * 60


def test_a_resumed_budget_keeps_its_planned_schedule_its_stop_and_its_elapsed_time(tmp_path):
    """The plan, the stop and the seconds spent (evaluations included) are saved with each checkpoint: the resumed
    schedule used to go back to the epochs' length (its learning rate jumped up), a stopped run trained on, and the
    budget looked less spent by the evaluations' seconds (`elapsed_seconds` went backwards)."""
    clock = FakeClock()
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=1000)
    run_clock, callback = _budget(1, clock, fit_schedule=True, calibration_fraction=0.1)
    args, state, control = (
        _args(tmp_path),
        TrainerState(max_steps=1000, stateful_callbacks=[run_clock, callback]),
        TrainerControl(),
    )
    _begin([run_clock, callback], args, state, control)
    run_clock.on_epoch_begin(args, state, control)
    for _ in range(20):
        clock.now += 0.5
        optimizer.step()
        scheduler.step()
        state.global_step += 1
        run_clock.on_step_end(args, state, control)
        callback.on_step_end(args, state, control, lr_scheduler=scheduler)
    clock.now += 5.0  # an evaluation
    run_clock.on_evaluate(args, state, control)
    assert callback.planned_steps == 120 and run_clock.elapsed() == pytest.approx(15.0)
    for saved in (run_clock, callback):  # as the Trainer does when it saves a checkpoint
        state.stateful_callbacks[type(saved).__name__] = saved.state()
    state.save_to_json(str(tmp_path / "trainer_state.json"))

    def resumed(control, minutes=1, fit_schedule=True):
        new_scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=1000)
        new_scheduler.load_state_dict(scheduler.state_dict())
        clock.now += 100.0  # the restart is not the run's time
        new_clock, new_callback = _budget(minutes, clock, fit_schedule=fit_schedule)
        loaded = TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
        new_clock.on_train_begin(args, loaded, control)
        new_callback.on_train_begin(args, loaded, control, lr_scheduler=new_scheduler)
        return new_clock, new_callback, new_scheduler

    new_clock, new_callback, new_scheduler = resumed(TrainerControl())
    assert new_clock.elapsed() == pytest.approx(15.0) and new_callback.planned_steps == 120
    optimizer.step()
    new_scheduler.step()
    scheduler.step()
    assert new_scheduler.get_last_lr() == pytest.approx(scheduler.get_last_lr())

    callback.stopped_at, callback.stopped_budget = 20, 60.0  # the schedule ended before the budget
    state.stateful_callbacks["TrainingBudgetCallback"] = callback.state()
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    control = TrainerControl()
    resumed(control)
    assert control.should_training_stop, "training had ended: stopped before its first step"
    # A larger budget cannot extend a schedule fitted to the one that ended, whether this run fits one or not (without
    # `budget_schedule` it went on at the ended schedule's learning rate 0, and stopped after a step).
    for fit_schedule in (True, False):
        with pytest.raises(ResumeRefused, match="a larger `max_train_minutes` cannot extend it"):
            resumed(TrainerControl(), minutes=2, fit_schedule=fit_schedule)
    # Where no schedule was fitted, a larger budget trains on.
    callback.planned_steps = None
    state.stateful_callbacks["TrainingBudgetCallback"] = callback.state()
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    control = TrainerControl()
    _, larger, _ = resumed(control, minutes=2, fit_schedule=False)
    assert not control.should_training_stop and larger.stopped_at is None


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
    callback = EMACallback(ema, model)
    args, state, control = _args(tmp_path), TrainerState(), TrainerControl()
    values = []
    for step in range(1, k + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(step)  # the weights after step `step`
        values.append({n: v.clone() for n, v in model.state_dict().items()})
        callback.on_optimizer_step(args, state, control)
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


def test_ema_without_warmup_averages_as_torchs_averaged_model():
    """The same average as `torch.optim.swa_utils.AveragedModel` with its EMA function, which `ModelEMA` is measured
    against (`benchmarks/ema_update.py`), buffers included."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ema = ModelEMA(model, 0.9, warmup=False)
    reference = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9), use_buffers=True
    )
    reference.update_parameters(model)  # its first update copies the weights, as `ModelEMA.__init__` does
    for _ in range(4):
        model.train()(torch.randn(8, 3)).sum().backward()  # BatchNorm's running statistics move too
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.1 * p.grad)
                p.grad = None
        ema.update(model)
        reference.update_parameters(model)
    averaged = dict(reference.module.named_parameters()) | dict(reference.module.named_buffers())
    assert set(ema.shadow) == {name for name, t in averaged.items() if t.is_floating_point()}
    for name, tensor in ema.shadow.items():
        torch.testing.assert_close(tensor, averaged[name])


def test_ema_warmup_decay_follows_timm():
    ema = ModelEMA(nn.Linear(1, 1), 0.999)
    assert ema.current_decay() == pytest.approx(1 / 10)
    ema.num_updates = 10_000
    assert ema.current_decay() == 0.999


def test_ema_is_swapped_in_for_an_evaluation_or_save_and_out_before_the_next_step(tmp_path):
    model = nn.Linear(2, 2)
    ema = ModelEMA(model, 0.5, warmup=False)
    callback = EMACallback(ema, model)
    args, state, control = _args(tmp_path, load_best_model_at_end=False), TrainerState(), TrainerControl()
    with torch.no_grad():
        model.weight.add_(1.0)
    callback.on_optimizer_step(args, state, control)
    raw, average = model.weight.detach().clone(), ema.shadow["weight"].clone()
    callback.on_step_end(args, state, control)  # nothing to evaluate or save: the raw weights stay
    assert torch.equal(model.weight, raw)
    control.should_save = True
    callback.on_step_end(args, state, control)
    assert torch.equal(model.weight, average)
    callback.restorer.on_step_begin(args, state, control)
    assert torch.equal(model.weight, raw)
    callback.on_train_end(args, state, control)  # training ends with the average in the model
    assert torch.equal(model.weight, average)


def test_run_clock_totals_survive_a_resume(tmp_path):
    """The clock's totals are saved in the checkpoint's trainer state and taken up by the resumed run's clock."""
    fake = FakeClock()
    clock = RunClock(time_fn=fake)
    args, control = _args(tmp_path), TrainerControl()
    state = TrainerState(stateful_callbacks=[clock])
    clock.on_train_begin(args, state, control)
    clock.on_epoch_begin(args, state, control)
    for loss in (2.0, 1.0):
        fake.now += 3.0
        clock.add_loss(torch.tensor(loss))
        clock.on_step_end(args, state, control)
    state.stateful_callbacks["RunClock"] = clock.state()  # as the Trainer does when it saves a checkpoint
    state.save_to_json(str(tmp_path / "trainer_state.json"))

    resumed = RunClock(time_fn=fake)
    resumed.on_train_begin(args, TrainerState.load_from_json(str(tmp_path / "trainer_state.json")), control)
    resumed.on_epoch_begin(args, state, control)
    fake.now += 3.0
    resumed.add_loss(torch.tensor(3.0))
    resumed.on_step_end(args, state, control)
    resumed.on_train_end(args, state, control)
    assert resumed.steps == 3 and resumed.figures(args)["train_loss"] == pytest.approx(2.0)
    assert resumed.train_seconds == pytest.approx(9.0)


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


def test_images_per_step_count_every_gpu_of_a_process_that_splits_its_batch_with_dataparallel(tmp_path):
    args = _args(tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=3)
    clock = RunClock()
    clock.steps = 10
    assert total_batch_size(args) == 24 and clock.images(args) == 240
    args._n_gpu = 2  # what TrainingArguments finds on a machine with two GPUs, in one process
    assert args.train_batch_size == 16 and total_batch_size(args) == 48 and clock.images(args) == 480
    clock.num_images, clock.epoch = 90, 1.0  # a whole epoch of 90 images: 80 in full batches of 16 when dropping
    assert clock.images(args) == 90
    args.dataloader_drop_last = True
    assert clock.images(args) == 80


def test_no_full_batch_of_a_process_that_splits_its_batch_with_dataparallel_is_refused(tmp_path):
    # 20 images give a full batch of 16 but none of 32, a process's batch on two GPUs: the run stopped in transformers.
    args = _args(tmp_path, per_device_train_batch_size=16, dataloader_drop_last=True)
    check_batches(args, 20)
    args._n_gpu = 2
    with pytest.raises(ValueError, match="give no full batch of 32 to each of 1 process"):
        check_batches(args, 20)


def test_flip_tta_logits_are_the_mean_of_both_passes(tmp_path):
    trainer, model = _tiny_trainer(tmp_path, flip_tta=True)
    model.eval()
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0])
    loss, logits, returned = trainer.prediction_step(model, {"pixel_values": images, "labels": labels}, False)
    x = trainer.batch_transform(images, train=False)
    with torch.no_grad():
        expected = (model(pixel_values=x).logits + model(pixel_values=x.flip(-1)).logits) / 2
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, F.cross_entropy(expected, labels), rtol=1e-5, atol=1e-6)
    assert torch.equal(returned, labels)


def test_the_training_loss_is_the_models_own_loss_without_mixing(tmp_path):
    trainer, model = _tiny_trainer(tmp_path)
    model.train()
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0])
    torch.manual_seed(1)
    loss = trainer.compute_loss(model, {"pixel_values": images, "labels": labels})
    torch.manual_seed(1)
    x = trainer.batch_transform(images, train=True)  # the same augmentation, from the same seed
    torch.testing.assert_close(loss, model(pixel_values=x, labels=labels).loss)


def test_soft_target_loss_mixes_the_two_cross_entropies():
    logits = torch.randn(4, 3)
    a, b, lam = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 1, 0, 2]), 0.3
    soft = lam * F.one_hot(a, 3).float() + (1 - lam) * F.one_hot(b, 3).float()
    expected = lam * F.cross_entropy(logits, a) + (1 - lam) * F.cross_entropy(logits, b)
    torch.testing.assert_close(classification_loss(logits, soft), expected, rtol=1e-5, atol=1e-6)
    # Label smoothing applies to soft targets as to labels: (1 - s) * target + s / K.
    smoothed = 0.9 * soft + 0.1 / 3
    expected = -(smoothed * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(classification_loss(logits, soft, 0.1), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("settle_steps", [1, 13])
def test_budget_schedule_measures_the_rate_after_autos_first_compiled_step(tmp_path, settle_steps):
    """`torch_compile: auto` runs 12 eager steps, then compiles in the 13th (tens of seconds on a GPU). With the rate
    measured from step 1, the first plan counted the compilation as a step's time and ended the schedule long before
    the budget: here at 43 s of a 300 s budget, before the next plan could correct it. With the first compiled step
    among the steps the rate is measured after (`settle_steps`), the run trains to its budget."""
    clock = FakeClock()
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=0, num_training_steps=100_000)
    run_clock, callback = _budget(5, clock, fit_schedule=True, settle_steps=settle_steps)
    args, state, control = _args(tmp_path), TrainerState(max_steps=100_000), TrainerControl()
    _begin([run_clock, callback], args, state, control)
    while not control.should_training_stop:
        step = state.global_step + 1
        clock.now += 0.036 if step < 13 else 40.0 if step == 13 else 0.02
        state.global_step = step
        callback.on_step_end(args, state, control, lr_scheduler=scheduler)
    reached = clock.now - 1000.0
    assert (reached >= 0.9 * 300) == (settle_steps == 13), f"stopped after {reached:.0f} s of 300"


def test_the_budget_measures_after_the_compilers_first_compiled_step():
    from finetune.compile import TrainingCompiler
    from finetune.hardware import CompileChoice

    cpu = torch.device("cpu")
    auto = CompileChoice(True, "inductor", "reduce-overhead", verify=True)
    assert TrainingCompiler(auto, cpu).first_compiled_step == 13
    assert TrainingCompiler(CompileChoice(True, "inductor"), cpu).first_compiled_step == 1
    assert TrainingCompiler(CompileChoice(False), cpu).first_compiled_step == 1


def test_the_trainers_budget_settles_after_the_compilers_first_compiled_step(tmp_path):
    from finetune.hardware import CompileChoice

    torch.manual_seed(0)
    config = ScratchViTConfig(
        image_size=8, patch_size=4, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    transform = BatchTransform(8, (0.5,) * 3, (0.5,) * 3, in_channels=3, out_channels=3)
    args = ImageClassificationTrainingArguments(
        output_dir=str(tmp_path), report_to="none", eval_strategy="no", load_best_model_at_end=False,
        max_train_minutes=1, budget_schedule=True, bf16=False, fp16=False, tf32=None, torch_compile=False,
    )  # fmt: skip
    auto = CompileChoice(True, "inductor", "reduce-overhead", verify=True)
    trainer = ImageClassificationTrainer(
        model=ScratchViTForImageClassification(config), args=args, batch_transform=transform, compile_choice=auto
    )
    assert trainer.budget.settle_steps == trainer.compiler.first_compiled_step == 13


def test_a_resume_compares_the_options_as_the_checkpoint_saved_them(tmp_path):
    """A tuple in `lr_scheduler_kwargs` (from Python) comes back from the checkpoint JSON as a list: the same options,
    which were refused as "trained with lr_scheduler_kwargs {'milestones': [2, 4]} (now {'milestones': (2, 4)})"."""
    args = TrainingArguments(
        output_dir=str(tmp_path), lr_scheduler_type="cosine", lr_scheduler_kwargs={"milestones": (2, 4)},
        report_to="none",
    )  # fmt: skip
    first = ResumeCheck()
    first.on_train_begin(args, TrainerState(), TrainerControl())
    saved = {"ResumeCheck": json.loads(json.dumps(first.state()))}  # as trainer_state.json holds it
    ResumeCheck().on_train_begin(args, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl())
    args.learning_rate = 1e-2
    with pytest.raises(ResumeRefused, match=r"learning_rate 5e-05 \(now 0.01\)"):
        ResumeCheck().on_train_begin(args, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl())
    args.learning_rate = 5e-5
    # An unset data_seed is the seed (42): given as 42 it keeps the split and order, as 7 it does not.
    args.data_seed = 42
    ResumeCheck().on_train_begin(args, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl())
    args.data_seed = 7
    with pytest.raises(ResumeRefused, match=r"data_seed None \(now 7\)"):
        ResumeCheck().on_train_begin(args, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl())
    args.data_seed = None
    # A schedule fitted to a time budget, resumed without one: it jumped back to the full schedule and trained on.
    fitted = {**saved, "TrainingBudgetCallback": {"args": {}, "attributes": {"planned_steps": 30}}}
    with pytest.raises(ResumeRefused, match=r"fitted to its time budget \(`budget_schedule`, ending at step 30\)"):
        ResumeCheck().on_train_begin(args, TrainerState(global_step=8, stateful_callbacks=fitted), TrainerControl())
    args.lr_scheduler_kwargs = {"since": datetime.date(2024, 1, 1)}  # a YAML date: it failed at the first checkpoint
    with pytest.raises(ValueError, match=r"`lr_scheduler_kwargs` .* cannot be saved with the checkpoints .*Fix: give"):
        ResumeCheck().on_train_begin(args, TrainerState(), TrainerControl())


def test_an_evaluation_line_shows_only_a_training_loss_logged_since_the_previous_evaluation():
    """With `logging_steps` 50 and 13 steps an epoch, the evaluations of epochs 5 and 6 repeated step 50's loss as if
    it were theirs: an evaluation with no training loss logged since the previous one shows none."""
    state = TrainerState(epoch=4.0, global_step=52)
    state.log_history = [{"eval_loss": 1.0, "eval_accuracy": 0.5, "epoch": 3.0, "step": 39}]
    state.log_history += [{"loss": 1.8084, "epoch": 3.85, "step": 50}]
    state.log_history += [{"eval_loss": 0.9, "eval_accuracy": 0.6, "epoch": 4.0, "step": 52}]
    assert evaluation_line(state, state.log_history[-1]) == (
        "epoch 4.00: validation accuracy 60.00%, loss 0.9000 (training loss 1.8084)"
    )
    state.epoch, state.global_step = 5.0, 65
    state.log_history += [{"eval_loss": 0.8, "eval_accuracy": 0.7, "epoch": 5.0, "step": 65}]
    assert evaluation_line(state, state.log_history[-1]) == "epoch 5.00: validation accuracy 70.00%, loss 0.8000"


def test_a_resume_with_another_recipe_goes_on_and_says_so(tmp_path, caplog):
    """MixUp, label smoothing or an augmentation changed on resume: accepted without a word, while results.json
    recorded the new values for the whole run. They are a recipe (MixUp off for the last epochs): said, not refused."""
    args = ImageClassificationTrainingArguments(
        output_dir=str(tmp_path), report_to="none", bf16=False, fp16=False, tf32=None, torch_compile=False,
        mixup_alpha=0.8,
    )  # fmt: skip
    augmentation = {"augmentation": {"random_crop_padding": 4, "crop_scale": (0.08, 1.0)}}
    first = ResumeCheck(augmentation)
    first.on_train_begin(args, TrainerState(), TrainerControl())
    saved = {"ResumeCheck": json.loads(json.dumps(first.state()))}
    with caplog.at_level("WARNING"):
        ResumeCheck(augmentation).on_train_begin(  # `flip_tta` unset is false
            dataclasses.replace(args, flip_tta=False), TrainerState(global_step=8, stateful_callbacks=saved),
            TrainerControl(),
        )  # fmt: skip
        assert not caplog.records  # the same recipe
        changed = dataclasses.replace(args, mixup_alpha=0.0, label_smoothing_factor=0.1)
        other = {"augmentation": {"random_crop_padding": 0, "crop_scale": (0.08, 1.0)}}
        ResumeCheck(other).on_train_begin(
            changed, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl()
        )
    assert caplog.messages == [
        "The resumed checkpoint (step 8) trained with mixup_alpha 0.8 (now 0), label_smoothing_factor 0 (now 0.1), "
        "random_crop_padding 4 (now 0): the run goes on with the new values, and its results.json records them "
        "for the whole run."
    ]


def test_a_resume_with_another_teacher_or_distillation_mix_is_refused(tmp_path, monkeypatch):
    """A run taught by one teacher, resumed with another (or another `distillation_alpha`), went on and its results
    named only the new one. The same folder written another way (`./runs/teacher`, its full path) is the same
    teacher: it was refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "teacher").mkdir(parents=True)
    args = ImageClassificationTrainingArguments(
        output_dir=str(tmp_path), teacher_model_name_or_path="runs/teacher", report_to="none",
        bf16=False, fp16=False, tf32=None, torch_compile=False,
    )  # fmt: skip
    first = ResumeCheck()
    first.on_train_begin(args, TrainerState(), TrainerControl())
    saved = {"ResumeCheck": json.loads(json.dumps(first.state()))}
    for same in ("./runs/teacher", str(tmp_path / "runs" / "teacher"), "runs/teacher"):
        kept = dataclasses.replace(args, teacher_model_name_or_path=same)
        ResumeCheck().on_train_begin(kept, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl())
    for name, value in (("teacher_model_name_or_path", "runs/other"), ("distillation_alpha", 0.9)):
        changed = dataclasses.replace(args, **{name: value})
        with pytest.raises(ResumeRefused, match=rf"trained with {name} .*\(now {value}\): its weights, taught so far"):
            ResumeCheck().on_train_begin(
                changed, TrainerState(global_step=8, stateful_callbacks=saved), TrainerControl()
            )


def test_the_loss_logged_after_a_resume_of_two_processes_covers_the_window_as_their_mean():
    """Two processes losing 1.0 and 3.0 a step (the Trainer logs their mean, 2.0), logging every 2 steps, a checkpoint
    at step 3 (where `ClockBeforeSave` makes the saved sum their mean), resumed: the first log read 3.0, the saved
    mean sum less process 0's own sum at the last log."""
    control, losses = TrainerControl(), (1.0, 3.0)
    state = TrainerState(global_step=0, stateful_callbacks={})
    clocks = [RunClock(), RunClock()]
    for clock in clocks:
        clock.on_train_begin(None, state, control)
    for step in (1, 2, 3):
        for clock, loss in zip(clocks, losses):
            clock.add_loss(torch.tensor(loss))
            clock.on_step_end(None, state, control)
        state.global_step = step
        if step == 2:
            assert [clock.logged_loss(2.0) for clock in clocks] == [2.0, 2.0]
    for clock in clocks:  # `ClockBeforeSave` at the save
        clock.loss_sum = torch.tensor(sum(float(c.loss_sum) for c in clocks) / 2)
    saved = json.loads(json.dumps(clocks[0].state()))  # process 0 writes the checkpoint's trainer state
    resumed = TrainerState(global_step=3, epoch=0.5, stateful_callbacks={"RunClock": saved})
    clocks = [RunClock(), RunClock()]
    for clock, loss in zip(clocks, losses):
        clock.on_train_begin(None, resumed, control)
        clock.add_loss(torch.tensor(loss))
        clock.on_step_end(None, resumed, control)
    assert [clock.logged_loss(2.0) for clock in clocks] == [2.0, 2.0]  # the Trainer's: step 4 alone
