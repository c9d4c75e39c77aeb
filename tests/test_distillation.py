"""Knowledge distillation (`teacher_model_name_or_path`): the loss against hand-written references, and real runs of
`finetune.run.main` in which a trained tiny ViT teaches a ScratchViT on scikit-learn's digits."""

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from test_run import TINY_SCRATCH, tiny_vit_checkpoint

from finetune import run
from finetune.callbacks import ResumeRefused
from finetune.tools.compare import write_comparison
from finetune.tools.model_card import build_model_card
from finetune.trainer import classification_loss, distillation_loss


def logits_and_labels(seed: int = 0, B: int = 6, K: int = 5):
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(B, K, generator=generator) * 2
    teacher = torch.randn(B, K, generator=generator) * 3
    return student, teacher, torch.randint(0, K, (B,), generator=generator)


def test_soft_distillation_is_kl_times_t_squared():
    student, teacher, labels = logits_and_labels()
    T, alpha = 3.0, 0.7
    # Reference, element by element: KL(p_teacher || p_student) at temperature T, averaged over the batch.
    kl = 0.0
    for s, t in zip(student.tolist(), teacher.tolist()):
        p_s = [math.exp(v / T) / sum(math.exp(u / T) for u in s) for v in s]
        p_t = [math.exp(v / T) / sum(math.exp(u / T) for u in t) for v in t]
        kl += sum(q * (math.log(q) - math.log(p)) for q, p in zip(p_t, p_s)) / len(labels)
    ce = sum(-math.log(math.exp(s[y]) / sum(map(math.exp, s))) for s, y in zip(student.tolist(), labels.tolist()))
    expected = (1 - alpha) * ce / len(labels) + alpha * kl * T**2
    loss = distillation_loss(student, teacher, labels, alpha, temperature=T, kind="soft")
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_hard_distillation_is_cross_entropy_on_the_teachers_top_class():
    student, teacher, labels = logits_and_labels(1)
    top = teacher.argmax(-1).tolist()
    assert top != labels.tolist(), "the teacher's classes must differ from the labels for the test to tell them apart"
    rows = student.tolist()
    ce_on = lambda targets: sum(-math.log(math.exp(s[y]) / sum(map(math.exp, s))) for s, y in zip(rows, targets))  # noqa: E731
    expected = 0.25 * ce_on(labels.tolist()) / 6 + 0.75 * ce_on(top) / 6
    loss = distillation_loss(student, teacher, labels, 0.75, temperature=4.0, kind="hard")
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_alpha_zero_is_the_plain_loss_and_alpha_one_ignores_the_labels(kind):
    student, teacher, labels = logits_and_labels(2)
    soft_targets = torch.softmax(torch.randn(6, 5), -1)  # as MixUp/CutMix make them
    weight = torch.rand(5) + 0.5
    for targets in (labels, soft_targets):
        plain = classification_loss(student, targets, 0.1, weight)
        assert torch.equal(distillation_loss(student, teacher, targets, 0.0, 2.0, kind, 0.1, weight), plain)
    taught = distillation_loss(student, teacher, labels, 1.0, 2.0, kind)
    assert torch.equal(taught, distillation_loss(student, teacher, (labels + 1) % 5, 1.0, 2.0, kind))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny ViT fine-tuned on the digits for one epoch (normalised with mean 0.5, std 0.5, unlike the student)."""
    root = tmp_path_factory.mktemp("teacher")
    source = tiny_vit_checkpoint(root / "source", num_labels=10)
    output = root / "run"
    args = [*TINY_SCRATCH, "--model_type", "pretrained", "--model_name_or_path", str(source)]
    run.main([*args, "--num_train_epochs", "1", "--output_dir", str(output), "--report_to", "none"])
    return output


def record_inputs(monkeypatch) -> tuple[dict[str, list[torch.Tensor]], list]:
    """The pixel values the student (training forwards only) and the teacher of the runs' trainers are given, and the
    trainers, as runs that start after this append them."""
    seen, trainers, make_trainer = {"student": [], "teacher": []}, [], run.make_trainer

    def recording(name, module):
        def hook(module, args, kwargs):
            if name == "teacher" or module.training:  # the student's training forwards, not its evaluations
                seen[name].append(kwargs["pixel_values"].detach().clone())

        module.register_forward_pre_hook(hook, with_kwargs=True)

    def make_recording_trainer(*args, **kwargs):
        trainer = make_trainer(*args, **kwargs)
        recording("student", trainer.model)
        recording("teacher", trainer.teacher)
        trainers.append(trainer)
        return trainer

    monkeypatch.setattr(run, "make_trainer", make_recording_trainer)
    return seen, trainers


def test_a_teachers_channels_are_converted_as_the_run_allows(tmp_path, monkeypatch):
    """An RGB teacher of grayscale digits takes them with the gray channel repeated, as a student would; with
    `convert_channels: false` the run refuses it as it would refuse such a student (the teacher converted anyway)."""
    source = tiny_vit_checkpoint(tmp_path / "source", num_channels=3, num_labels=10)
    teacher = tmp_path / "teacher"
    args = [*TINY_SCRATCH, "--model_type", "pretrained", "--model_name_or_path", str(source), "--report_to", "none"]
    run.main([*args, "--num_train_epochs", "1", "--output_dir", str(teacher)])
    seen, _ = record_inputs(monkeypatch)
    taught = [*TINY_SCRATCH, "--num_train_epochs", "1", "--teacher_model_name_or_path", str(teacher)]
    taught += ["--report_to", "none"]
    with pytest.raises(ValueError, match=r"expects 3-channel images .* Fix: set `convert_channels: true`"):
        run.main([*taught, "--convert_channels", "false", "--output_dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused" / "results.json").exists()
    run.main([*taught, "--output_dir", str(tmp_path / "taught")])
    gray, rgb = seen["student"][0], seen["teacher"][0]
    assert gray.shape[1] == 1 and rgb.shape[1] == 3 and torch.equal(rgb[:, 0], rgb[:, 2])


def test_a_taught_run_sees_the_students_images_and_names_its_teacher(teacher_dir, tmp_path, monkeypatch):
    seen, trainers = record_inputs(monkeypatch)
    output = tmp_path / "taught"
    # Crops, flips and MixUp: a teacher that augmented or mixed on its own would see other images.
    options = ["--random_crop_padding", "2", "--horizontal_flip", "true", "--mixup_alpha", "0.4"]
    distill = ["--teacher_model_name_or_path", str(teacher_dir), "--distillation_alpha", "0.7"]
    results = run.main([*TINY_SCRATCH, *options, *distill, "--output_dir", str(output), "--report_to", "none"])

    trainer = trainers[0]
    assert not trainer.teacher.training and not any(p.requires_grad for p in trainer.teacher.parameters())
    assert len(seen["teacher"]) == len(seen["student"]) == results["scratch"].train.steps > 0
    student_norm, teacher_norm = trainer.batch_transform.normalize, trainer.teacher_transform.normalize
    assert not torch.equal(student_norm.mean, teacher_norm.mean), "the two normalisations must differ"
    for student_input, teacher_input in zip(seen["student"], seen["teacher"]):
        # Undo each model's normalisation: the same pixels, at the same resolution here (8 px).
        student_pixels = student_input * student_norm.std + student_norm.mean
        teacher_pixels = teacher_input * teacher_norm.std + teacher_norm.mean
        torch.testing.assert_close(teacher_pixels, student_pixels, atol=1e-5, rtol=1e-5)
    assert not torch.equal(seen["student"][0], seen["student"][1])

    saved = json.loads((output / "results.json").read_text())
    assert saved["teacher_is_local"] is True, "the card names it a local model after the folder moved too"
    saved = saved["hyperparameters"]
    assert saved["teacher_model_name_or_path"] == str(teacher_dir)
    assert (saved["distillation_type"], saved["distillation_alpha"], saved["distillation_temperature"]) == (
        "soft",
        0.7,
        2.0,
    )
    assert not (output / "teacher").exists() and "teacher" not in json.dumps(
        json.loads((output / "config.json").read_text())
    ), "the teacher is never saved with the student"
    report = write_comparison([teacher_dir, output], tmp_path / "comparison").read_text()
    assert f"scratch, taught by `{teacher_dir.parent.name}/{teacher_dir.name}`" in report
    # The card said "trained from random initialisation" and named no teacher.
    card = build_model_card(output).text
    taught = (
        f"It was taught by a local model, `{teacher_dir.parent.name}/{teacher_dir.name}` (soft distillation, alpha "
        "0.7, temperature 2"
    )
    assert taught in card


def test_a_teacher_whose_evaluation_crops_sees_the_centre_it_evaluates(teacher_dir, tmp_path, monkeypatch):
    """A teacher whose processor resizes to 10 and crops 8 saw the student's whole image resized to 8, not the centre
    its own evaluation sees (62% where it scores 88%): it sees the centre 8/10 of the student's view."""
    import shutil

    from transformers import ViTImageProcessor

    from finetune.augment import Resize

    teacher = Path(shutil.copytree(teacher_dir, tmp_path / "teacher"))
    crop = {"do_center_crop": True, "crop_size": {"height": 8, "width": 8}}
    ViTImageProcessor(size={"height": 10, "width": 10}, image_mean=[0.5], image_std=[0.5], **crop).save_pretrained(
        teacher
    )
    seen, trainers = record_inputs(monkeypatch)
    distill = ["--teacher_model_name_or_path", str(teacher), "--random_crop_padding", "0", "--num_train_epochs", "1"]
    run.main([*TINY_SCRATCH, *distill, "--output_dir", str(tmp_path / "taught"), "--report_to", "none"])
    student_norm, teacher_norm = trainers[0].batch_transform.normalize, trainers[0].teacher_transform.normalize
    assert len(seen["teacher"]) == len(seen["student"]) > 0
    for student_input, teacher_input in zip(seen["student"], seen["teacher"]):
        centre = (student_input * student_norm.std + student_norm.mean)[..., 1:7, 1:7]  # round(8 * 0.8) = 6 px
        teacher_pixels = teacher_input * teacher_norm.std + teacher_norm.mean
        torch.testing.assert_close(teacher_pixels, Resize((8, 8))(centre), atol=1e-5, rtol=1e-5)


def test_a_teacher_with_other_labels_is_refused_in_one_line(tmp_path):
    other = tiny_vit_checkpoint(tmp_path / "three_classes", num_labels=3)
    with pytest.raises(ValueError) as error:
        run.main([*TINY_SCRATCH, "--teacher_model_name_or_path", str(other), "--output_dir", str(tmp_path / "out")])
    message = str(error.value)
    assert "\n" not in message
    assert "same labels in the same order" in message and "LABEL_0" in message and "'9'" in message
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_teacher_trained_on_this_runs_validation_images_is_refused(teacher_dir, tmp_path):
    """The teacher held out its validation split with seed 0; a student holding out another (seed 1) would be
    validated on images its teacher trained on (it was, with exit 0)."""
    args = [*TINY_SCRATCH, "--teacher_model_name_or_path", str(teacher_dir), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"^The teacher .* would hold out images it trained on") as error:
        run.main([*args, "--seed", "1"])
    assert str(error.value).endswith("Fix: `--seed 0`, or a teacher trained with this run's split.")
    assert not (tmp_path / "out").exists()


def test_a_teacher_checkpoint_of_an_unfinished_run_is_held_to_its_split(teacher_dir, tmp_path):
    """A checkpoint of a run still training (or stopped) has no results.json: its split went unchecked, and a
    student holding out another one was validated on images its teacher trained on. The checkpoint saved it."""
    unfinished = Path(shutil.copytree(teacher_dir, tmp_path / "unfinished"))
    (unfinished / "results.json").unlink()  # written when a run ends
    checkpoint = next(unfinished.glob("checkpoint-*"))
    args = [*TINY_SCRATCH, "--teacher_model_name_or_path", str(checkpoint), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"^The teacher .*checkpoint-\d+ was trained on sklearn:digits holding out .*"
                                         r"seed 0.*would hold out images it trained on. Fix: `--seed 0`"):  # fmt: skip
        run.main([*args, "--seed", "1"])
    assert not (tmp_path / "out").exists()


def test_a_resume_with_the_teacher_retrained_in_place_is_refused(teacher_dir, tmp_path):
    """The same teacher folder holding other weights (trained again since) is another teacher: it was accepted, the
    check comparing only its path."""
    from transformers import AutoModelForImageClassification

    teacher = Path(shutil.copytree(teacher_dir, tmp_path / "teacher"))
    taught = [*TINY_SCRATCH, "--teacher_model_name_or_path", str(teacher), "--report_to", "none"]
    run.main([*taught, "--num_train_epochs", "1", "--output_dir", str(tmp_path / "first")])
    checkpoint = str(next((tmp_path / "first").glob("checkpoint-*")))
    shutil.copytree(teacher, tmp_path / "as_it_was")
    retrained = AutoModelForImageClassification.from_pretrained(teacher)
    with torch.no_grad():
        for parameter in retrained.parameters():
            parameter.add_(0.01)
    retrained.save_pretrained(teacher)
    resume = [*taught, "--resume_from_checkpoint", checkpoint, "--output_dir", str(tmp_path / "on")]
    refused = r"trained with teacher_weights \w+ \(now \w+\): its weights, taught so far by another teacher or mix,"
    with pytest.raises(ResumeRefused, match=refused):
        run.main(resume)
    assert not (tmp_path / "on" / "results.json").exists()
    shutil.rmtree(teacher)
    shutil.copytree(tmp_path / "as_it_was", teacher)
    assert run.main(resume)["scratch"].train.steps == 16  # the teacher as it was: the run goes on to 2 epochs


def test_a_teacher_folder_that_holds_no_model_is_one_line(tmp_path):
    # An evaluation-only run's output: results and predictions, no model ("Unrecognized model ... model_type").
    results = tmp_path / "evaluation"
    results.mkdir()
    (results / "results.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"{results} has no config.json"):
        run.main([*TINY_SCRATCH, "--teacher_model_name_or_path", str(results), "--output_dir", str(tmp_path / "out")])


@pytest.mark.parametrize("option, value", [("distillation_alpha", "1.5"), ("distillation_temperature", "0")])
def test_bad_distillation_settings_are_refused(tmp_path, option, value):
    with pytest.raises(ValueError, match=f"`{option}`"):
        run.main([*TINY_SCRATCH, f"--{option}", value, "--output_dir", str(tmp_path)])


def test_a_temperature_that_hard_distillation_ignores_is_refused(tmp_path):
    """`hard` trains on the teacher's top class: a temperature changed nothing, and the run trained as if not given."""
    argv = [*TINY_SCRATCH, "--teacher_model_name_or_path", str(tmp_path / "teacher"), "--distillation_type", "hard"]
    with pytest.raises(ValueError, match="`distillation_temperature` set, but `distillation_type: hard`"):
        run.main([*argv, "--distillation_temperature", "4", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_of_hard_distillation_saved_with_a_temperature_resumes_without_it():
    """Before the temperature was refused under `hard`, a run could save one with its checkpoints: the resume, now
    refused with it, was refused without it too (another temperature), though no temperature ever moved its weights."""
    from transformers import TrainerState

    from finetune.callbacks import check_options_kept

    teacher = {"teacher_model_name_or_path": "t", "distillation_type": "hard", "distillation_alpha": 0.5}
    state = TrainerState(global_step=5)
    state.stateful_callbacks = {
        "ResumeCheck": {"attributes": {"options": {**teacher, "distillation_temperature": 4.0}}}
    }
    check_options_kept(state, {**teacher, "distillation_temperature": 2.0})
    with pytest.raises(ResumeRefused, match="distillation_temperature 4 \\(now 2\\)"):
        check_options_kept(state, {**teacher, "distillation_type": "soft", "distillation_temperature": 2.0})


def test_a_taught_step_does_not_wait_for_the_device(teacher_dir, tmp_path):
    """The teacher's forward and the distillation loss read no device value on the host (test_step_sync's check)."""
    from test_step_sync import device_reads_of_training

    from finetune.arguments import parse_args
    from finetune.data import load_image_data
    from finetune.models import build_model

    argv = [
        *TINY_SCRATCH, "--output_dir", str(tmp_path / "run"), "--report_to", "none", "--max_steps", "6",
        "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false",
        "--logging_steps", "1000", "--cutmix_alpha", "1.0", "--torch_compile", "false",
        "--teacher_model_name_or_path", str(teacher_dir), "--distillation_type", "hard",
    ]  # fmt: skip
    model_args, data_args, scratch_args, training_args = parse_args(argv)
    data = load_image_data(data_args, seed=0, target_size=8)
    model_args, _ = run.choose_attention("scratch", model_args, scratch_args, training_args)
    model, processor, prep = build_model("scratch", model_args, scratch_args, data)
    trainer = run.make_trainer(model, processor, prep, data_args, training_args, data)
    reads = device_reads_of_training(
        trainer, [*model.parameters(), *trainer.teacher.parameters(), *trainer.teacher.buffers()]
    )
    assert trainer.state.global_step == 6
    assert reads == [], f"a taught step reads device values on the host: {reads}"


def test_a_larger_teacher_sees_the_photos_at_its_own_size(tmp_path, monkeypatch, caplog):
    """Photos were stored at the student's size (8 px plus the crop margin, 9 px) and RandomResizedCrop's boxes were
    resized to 8 px: a 16 px teacher saw thumbnails upsampled twice (57% where it scored 81%). They are stored at the
    teacher's size, the boxes resized to 16 px for the teacher and from there to 8 px for the student."""
    from test_photos import CLASSES, tiny_vit_checkpoint, write_photo_folder
    from transformers import ViTImageProcessor

    from finetune.augment import Resize

    photos = write_photo_folder(tmp_path / "photos", per_class=8)
    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    teacher = tiny_vit_checkpoint(tmp_path / "teacher", processor, labels=CLASSES)
    seen, trainers = record_inputs(monkeypatch)
    student = ["--model_type", "scratch", "--image_size", "8", "--patch_size", "2", "--hidden_size", "16",
               "--num_hidden_layers", "1", "--num_attention_heads", "2", "--per_device_train_batch_size", "8",
               "--num_train_epochs", "1", "--horizontal_flip", "false", "--decoded_cache_dir", "none"]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="finetune"):
        run.main([*student, "--dataset_name", str(photos), "--teacher_model_name_or_path", teacher,
                  "--output_dir", str(tmp_path / "taught"), "--report_to", "none"])  # fmt: skip
    assert "image size 18x18" in caplog.text  # 16 px plus the crop margin, not 9
    student_norm, teacher_norm = trainers[0].batch_transform.normalize, trainers[0].teacher_transform.normalize
    assert len(seen["teacher"]) == len(seen["student"]) > 0
    for student_input, teacher_input in zip(seen["student"], seen["teacher"]):
        student_pixels = student_input * student_norm.std + student_norm.mean  # (B, 3, 8, 8)
        teacher_pixels = teacher_input * teacher_norm.std + teacher_norm.mean  # (B, 3, 16, 16)
        torch.testing.assert_close(Resize((8, 8))(teacher_pixels), student_pixels, atol=1e-4, rtol=0)
        assert (teacher_pixels - Resize((16, 16))(student_pixels)).abs().max() > 0.05  # more than the 8 px view
