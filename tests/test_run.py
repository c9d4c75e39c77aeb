"""End-to-end runs of `finetune/run.py` on tiny data: real Trainer, real datasets, real processes, no network.

The data is scikit-learn's digits (shipped with the package); the "Hub checkpoint" of the pretrained path is a small
`ViTForImageClassification` saved to a temporary directory.
"""

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForImageClassification, ViTConfig, ViTForImageClassification, ViTImageProcessor

from finetune import run
from finetune.arguments import DataArguments, parse_args
from finetune.augment import BatchTransform, preprocessing_from
from finetune.checkpoints import FINISHED
from finetune.data import load_image_data
from finetune.errors import run_command


ROOT = Path(__file__).resolve().parent.parent

# A tiny ScratchViT on digits: 8 px images, patch 2, one epoch over 240 images.
TINY_SCRATCH = [
    "--model_type", "scratch", "--dataset_name", "sklearn:digits", "--max_train_samples", "240",
    "--max_eval_samples", "45", "--validation_size", "0.2", "--image_size", "8", "--patch_size", "2",
    "--hidden_size", "16", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "32",
    "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "16", "--num_train_epochs", "2",
    "--learning_rate", "3e-3", "--logging_steps", "2", "--horizontal_flip", "false", "--seed", "0",
    "--decoded_cache_dir", "none",
]  # fmt: skip


def tiny_vit_checkpoint(path: Path, num_channels: int = 1, num_labels: int = 3) -> Path:
    """A small transformers ViT with an image processor, standing in for a Hub checkpoint."""
    config = ViTConfig(
        image_size=8, patch_size=2, num_channels=num_channels, hidden_size=16, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=32, num_labels=num_labels,
    )  # fmt: skip
    ViTForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(
        size={"height": 8, "width": 8}, image_mean=[0.5] * num_channels, image_std=[0.5] * num_channels
    ).save_pretrained(path)
    return path


def read_results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def evaluate_independently(run_dir: Path, split: str) -> tuple[float, int, float]:
    """Accuracy, images and mean cross-entropy of a saved model on a split, with a plain loop (no Trainer, one
    process)."""
    model = AutoModelForImageClassification.from_pretrained(run_dir).eval()
    processor = ViTImageProcessor.from_pretrained(run_dir)
    data = load_image_data(
        DataArguments(dataset_name="sklearn:digits", max_train_samples=240, max_eval_samples=45, validation_size=0.2,
                      decoded_cache_dir="none"),
        seed=0,
        target_size=8,
    )  # fmt: skip
    images = getattr(data, split)
    prep = preprocessing_from(processor, model.config)
    transform = BatchTransform(prep.image_size, prep.image_mean, prep.image_std, data.num_channels, prep.num_channels)
    bf16 = read_results(run_dir)["hyperparameters"]["mixed_precision"] == "bf16"  # the run's evaluations were too
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(pixel_values=transform(images.pixel_values, train=False)).logits.float()
    correct = (logits.argmax(-1) == images.labels).sum().item()
    return correct / len(images), len(images), torch.nn.functional.cross_entropy(logits, images.labels).item()


def test_scratch_run_writes_a_loadable_model_repo_and_results(tmp_path):
    out = tmp_path / "scratch"
    results = run.main([*TINY_SCRATCH, "--output_dir", str(out), "--report_to", "tensorboard"])["scratch"]

    for name in ("config.json", "model.safetensors", "preprocessor_config.json", "modeling_scratch_vit.py",
                 "configuration_scratch_vit.py", "results.json", "trainer_state.json"):  # fmt: skip
        assert (out / name).is_file(), name
    assert list((out / "runs").rglob("events.out.tfevents*")), "TensorBoard logs were asked for"
    saved = read_results(out)
    assert saved["architecture"] == "ScratchViTForImageClassification"
    assert saved["num_samples"] == {"train": 240, "validation": 45, "test": None}
    assert saved["label_names"] == [str(i) for i in range(10)]
    assert saved["num_parameters"] == sum(
        p.numel() for p in AutoModelForImageClassification.from_pretrained(out).parameters()
    )
    assert len(saved["history"]) == 2 and saved["history"][-1]["epoch"] == pytest.approx(2.0)
    assert np.array(saved["confusion_matrix"]).sum() == 45 and saved["confusion_split"] == "validation"
    assert saved["train"]["images_per_second"] > 0 and saved["wall_seconds"] > 0
    assert 0 < saved["train"]["seconds"] < saved["wall_seconds"]
    # 2 epochs of 240 images (7.5 batches of 32): 480 images, not 16 full batches' 512.
    assert saved["train"]["images_per_second"] * saved["train"]["seconds"] == pytest.approx(480, rel=1e-3)
    assert saved["train"]["data_seconds"] is None  # timed by benchmarks/timed_run.py only
    assert saved["train"]["steps"] == saved["history"][-1]["step"]
    assert saved["hardware"]["device"] == "cpu" and saved["hardware"]["world_size"] == 1
    assert "max_steps" not in saved["hyperparameters"]  # not set: the epochs say how long it trained
    assert results.validation.accuracy == saved["validation"]["accuracy"]

    # The saved (best) model really has the reported validation accuracy.
    accuracy, n, loss = evaluate_independently(out, "validation")
    assert n == 45
    assert accuracy == pytest.approx(saved["validation"]["accuracy"], abs=1e-9)
    assert loss == pytest.approx(saved["validation"]["loss"], rel=1e-5)
    best = max(row["eval_accuracy"] for row in saved["history"])
    assert saved["validation"]["accuracy"] == pytest.approx(best)


def test_dataloader_drop_last_drops_training_images_only(tmp_path):
    """transformers applies `dataloader_drop_last` to evaluation too: 45 validation images in batches of 16 were scored
    as 32. Training drops its last partial batch (240 images, batches of 32: 7 steps an epoch, not 8)."""
    out = tmp_path / "run"
    run.main([*TINY_SCRATCH, "--dataloader_drop_last", "true", "--output_dir", str(out), "--report_to", "none"])
    saved = read_results(out)
    assert np.array(saved["confusion_matrix"]).sum() == 45
    accuracy, n, loss = evaluate_independently(out, "validation")
    assert accuracy == pytest.approx(saved["validation"]["accuracy"], abs=1e-9)
    assert loss == pytest.approx(saved["validation"]["loss"], rel=1e-5)
    assert saved["train"]["steps"] == 2 * 7


def test_batches_an_epoch_cannot_give_are_said_before_training(tmp_path, caplog):
    """No full batch with `dataloader_drop_last` is refused (transformers asked for `max_steps`); accumulating more
    batches than an epoch has is said, with the images each optimizer step really averages."""
    out = tmp_path / "run"
    argv = [*TINY_SCRATCH, "--per_device_train_batch_size", "256", "--dataloader_drop_last", "true"]
    with pytest.raises(ValueError, match=r"drops every training image: 240 of them give no full batch of 256"):
        run.main([*argv, "--output_dir", str(out), "--report_to", "none"])
    assert not (out / "model.safetensors").exists()
    with caplog.at_level(logging.WARNING, logger="finetune"):
        argv = [*TINY_SCRATCH, "--gradient_accumulation_steps", "10", "--num_train_epochs", "1"]
        run.main([*argv, "--output_dir", str(out), "--report_to", "none"])
    assert "`gradient_accumulation_steps: 10` is more than the 8 batch(es) of 32" in caplog.text
    assert "averages 8 (the epoch's 240 images, not 320)" in caplog.text
    assert read_results(out)["train"]["steps"] == 1


def test_without_progress_bars_each_log_and_evaluation_is_one_logged_line_not_a_dict_per_log(tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="finetune"):
        run.main([*TINY_SCRATCH, "--output_dir", str(tmp_path), "--report_to", "none", "--disable_tqdm", "true"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1.00", "epoch 2.00"], lines
    assert "validation accuracy" in lines[0] and "(training loss" in lines[0]
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split(" (")[0] for line in steps] == [f"step {n}/16" for n in range(2, 17, 2)], steps
    speed = r"\S+ steps/s, 0:00:00 of training left"
    assert re.fullmatch(
        rf"step 16/16 \(epoch 2\.00\): training loss \d+\.\d{{4}}, learning rate \S+; {speed}", steps[-1]
    )
    assert "{'loss'" not in capsys.readouterr().out  # transformers' PrinterCallback


def test_output_to_a_file_gets_lines_not_progress_bars_unless_asked(tmp_path):
    """tqdm redraws its bars with carriage returns and cursor moves, which fill a log file; where stderr is not a
    terminal the run logs lines instead, and `--disable_tqdm false` still draws the bars."""
    logs = {}
    for name, extra in (("default", []), ("bars", ["--disable_tqdm", "false"])):
        with open(tmp_path / f"{name}.log", "w") as log:
            command = [sys.executable, "-m", "finetune.run", *TINY_SCRATCH, "--output_dir", str(tmp_path / name)]
            subprocess.run(
                [*command, *extra], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, timeout=300, check=True
            )
        logs[name] = (tmp_path / f"{name}.log").read_bytes().decode()  # read_text turns "\r" into "\n"
    assert "\r" not in logs["default"] and "\x1b" not in logs["default"], logs["default"]
    assert re.search(r"^step 16/16 \(epoch 2\.00\): training loss", logs["default"], re.M), logs["default"]
    assert re.search(r"^epoch 2\.00: validation accuracy", logs["default"], re.M), logs["default"]
    assert "16/16 [" in logs["bars"] and "\r" in logs["bars"] and "step 16/16" not in logs["bars"], logs["bars"]


def test_a_budget_spent_under_steps_evaluation_evaluates_once_at_the_stop(tmp_path):
    """The budget's stop asks for an evaluation and a save at the stopping step; that evaluation, itself past the
    budget, must not ask for a second one (a duplicate row in the history, the report and the card)."""
    out = tmp_path / "run"
    args = ["--max_train_minutes", "0.0001", "--num_train_epochs", "20", "--eval_strategy", "steps"]
    args += ["--eval_steps", "1000", "--save_strategy", "steps", "--save_steps", "1000"]
    run.main([*TINY_SCRATCH, *args, "--output_dir", str(out), "--report_to", "none"])
    state = json.loads((out / "trainer_state.json").read_text())
    evaluations = [row["step"] for row in state["log_history"] if "eval_accuracy" in row]
    assert len(evaluations) == 1 and evaluations[0] < 1000, evaluations
    assert [row["step"] for row in read_results(out)["history"]] == evaluations


def test_pretrained_path_replaces_the_head_and_uses_the_checkpoint_processor(tmp_path, caplog):
    checkpoint = tiny_vit_checkpoint(tmp_path / "hub_stand_in", num_channels=3, num_labels=3)
    out = tmp_path / "pretrained"
    args = [a for a in TINY_SCRATCH]
    args[args.index("scratch")] = "pretrained"
    results = run.main([*args, "--model_name_or_path", str(checkpoint), "--output_dir", str(out)])["pretrained"]
    # The new head is said once, in the pipeline's words; transformers' "You passed `num_labels=10` which is
    # incompatible to the `id2label` map of length `3`" named an option the user never passed.
    assert not [r for r in caplog.records if "incompatible" in r.getMessage()]
    assert [r for r in caplog.records if "a new 10-class head starts" in r.getMessage()]

    model = AutoModelForImageClassification.from_pretrained(out)
    assert type(model).__name__ == "ViTForImageClassification"
    assert model.config.num_labels == 10 and model.config.id2label[3] == "3"
    assert model.config.num_channels == 3  # grayscale digits were converted for the RGB checkpoint
    assert list(ViTImageProcessor.from_pretrained(out).image_mean) == [0.5, 0.5, 0.5]
    assert results.model_name_or_path == str(checkpoint) and results.model_is_local is True
    assert results.validation.accuracy == pytest.approx(evaluate_independently(out, "validation")[0])


@pytest.mark.parametrize("model_type", ["vit", "deit", "vit_msn", "scratch_vit", "scratch_vit_mean"])
def test_position_embeddings_resize_as_the_models_own_interpolation(model_type):
    """At another resolution the resized model computes what its own `interpolate_pos_encoding=True` computes from
    the checkpoint's grid, without being told (DeiT: two prefix tokens; ScratchViT with mean pooling: none)."""
    from transformers import AutoConfig, DeiTForImageClassification, ViTMSNForImageClassification

    from finetune.models import resize_position_embeddings
    from scratch_vit import ScratchViTForImageClassification

    kwargs = {"pooling": "mean"} if model_type == "scratch_vit_mean" else {}
    config = AutoConfig.for_model(
        model_type.removesuffix("_mean"), image_size=8, patch_size=2, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, num_labels=3, **kwargs,
    )  # fmt: skip
    classes = {"vit": ViTForImageClassification, "deit": DeiTForImageClassification}
    classes |= {"vit_msn": ViTMSNForImageClassification, "scratch_vit": ScratchViTForImageClassification}
    model = classes[model_type.removesuffix("_mean")](config).eval()
    if model_type.startswith("scratch_vit"):  # initialised to zeros: make them differ per position
        model.base_model.embeddings.position_embeddings.position_embeddings.data.normal_()
    pixel_values = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        expected = model(pixel_values, interpolate_pos_encoding=True).logits
        resize_position_embeddings(model, (12, 12))
        assert torch.allclose(model(pixel_values).logits, expected, atol=1e-6)
    assert model.config.image_size == 12
    with pytest.raises(ValueError, match="multiples of its 2-pixel patches. Fix: an image processor"):
        resize_position_embeddings(model, (13, 13))


def test_a_scratch_checkpoint_fine_tunes_at_another_size(tmp_path):
    """A ScratchViT run fine-tuned as `pretrained` with a processor of twice its size trains there (it stopped at the
    first step with "pass `interpolate_pos_encoding=True`", which a run cannot); sinusoidal positions, which follow
    the token index, are refused at start-up in one line that says what to keep."""
    processor = tmp_path / "processor_16"
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5]).save_pretrained(processor)
    for positions in ("learned", "sinusoidal"):
        source, out = tmp_path / f"scratch_{positions}", tmp_path / f"fine_tuned_{positions}"
        run.main([*TINY_SCRATCH, "--position_embedding_type", positions, "--num_train_epochs", "1",
                  "--output_dir", str(source), "--report_to", "none"])  # fmt: skip
        args = [a for a in TINY_SCRATCH]
        args[args.index("scratch")] = "pretrained"
        args += ["--model_name_or_path", str(source), "--image_processor_name", str(processor)]
        if positions == "sinusoidal":
            with pytest.raises(ValueError, match=r"16x16 images; this ScratchViT takes 8x8, and its sinusoidal .* "
                               r"Fix: an image processor of 8x8, or none \(`image_processor_name`\)"):  # fmt: skip
                run.main([*args, "--output_dir", str(out), "--report_to", "none"])
            continue
        run.main([*args, "--output_dir", str(out), "--report_to", "none"])
        model = AutoModelForImageClassification.from_pretrained(out, trust_remote_code=True).eval()
        assert model.config.image_size == 16
        assert model.base_model.embeddings.position_embeddings.position_embeddings.shape[1] == 1 + 8 * 8
        with torch.no_grad():
            assert model(torch.zeros(1, 1, 16, 16)).logits.shape == (1, 10)
        accuracy = read_results(out)["validation"]["accuracy"]
        assert accuracy == pytest.approx(evaluate_independently(out, "validation")[0])


def test_position_embeddings_of_other_geometries_are_left_alone():
    """Only ViT, DeiT, ViT-MSN and ScratchViT are resized: a Hiera (list sizes, position embeddings in its unrolled
    token order) stopped with "unsupported operand type(s) for %: 'int' and 'list'" even at its own size."""
    from transformers import HieraConfig, HieraForImageClassification

    from finetune.models import resize_position_embeddings

    config = HieraConfig(
        embed_dim=8, image_size=[64, 64], patch_size=[7, 7], patch_stride=[4, 4], patch_padding=[3, 3],
        depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], num_labels=3,
    )  # fmt: skip
    model = HieraForImageClassification(config)
    before = model.base_model.embeddings.position_embeddings.detach().clone()
    for size in ((64, 64), (96, 96)):
        resize_position_embeddings(model, size)
        assert torch.equal(model.base_model.embeddings.position_embeddings, before)
    assert model.config.image_size == [64, 64]


def test_a_processor_of_another_size_fine_tunes_at_that_size(tmp_path, caplog):
    """`image_processor_name` at 16 px for an 8 px checkpoint trains at 16 px (it stopped at the first step with
    "Input image size (16*16) doesn't match model (8*8)") and saves a model that takes 16 px natively."""
    checkpoint = tiny_vit_checkpoint(tmp_path / "hub_stand_in")
    processor = tmp_path / "processor_16"
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5]).save_pretrained(processor)
    out = tmp_path / "run"
    args = [a for a in TINY_SCRATCH]
    args[args.index("scratch")] = "pretrained"
    args += ["--model_name_or_path", str(checkpoint), "--image_processor_name", str(processor)]
    with caplog.at_level(logging.INFO):
        run.main([*args, "--output_dir", str(out), "--report_to", "none"])
    assert "Position embeddings resized from 8x8 to 16x16" in caplog.text
    model = AutoModelForImageClassification.from_pretrained(out).eval()
    assert model.config.image_size == 16
    with torch.no_grad():
        assert model(torch.zeros(1, 1, 16, 16)).logits.shape == (1, 10)
    assert read_results(out)["validation"]["accuracy"] == pytest.approx(evaluate_independently(out, "validation")[0])


def test_resume_continues_an_interrupted_run(tmp_path):
    out = tmp_path / "resume"
    # "Interrupted": stop after the first epoch's checkpoint (max_steps = one epoch of 240 / 32 = 8 steps).
    every_8_steps = ["--save_strategy", "steps", "--save_steps", "8", "--eval_strategy", "steps", "--eval_steps", "8"]
    run.main([*TINY_SCRATCH, *every_8_steps, "--output_dir", str(out), "--max_steps", "8"])
    assert (out / "checkpoint-8").is_dir()
    assert read_results(out)["hyperparameters"]["max_steps"] == 8  # what ended the run, not its 2 epochs
    with pytest.raises(FileExistsError, match="resume_from_checkpoint"):
        run.main([*TINY_SCRATCH, "--output_dir", str(out)])
    assert (out / "checkpoint-8").is_dir(), "a refused run must not touch the earlier run"
    with pytest.raises(ValueError, match="resumed checkpoint is at step 8, past `max_steps` 4"):
        run.main([*TINY_SCRATCH, *every_8_steps, "--output_dir", str(out), "--resume_from_checkpoint", "true",
                  "--max_steps", "4"])  # fmt: skip

    run.main([*TINY_SCRATCH, *every_8_steps, "--output_dir", str(out), "--resume_from_checkpoint", "true",
              "--max_steps", "16"])  # fmt: skip
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 16
    steps_logged = [e["step"] for e in state["log_history"] if "loss" in e]
    assert steps_logged == sorted(set(steps_logged)), "resumed run must continue, not restart, the step count"
    assert read_results(out)["epochs"] == pytest.approx(2.0)
    # Fewer epochs than the checkpoint's were taken as they were: results.json said 2 epochs and `num_train_epochs` 1.
    with pytest.raises(ValueError, match=r"at step 16, past `num_train_epochs` 1 \(8 steps\)"):
        run.main([*TINY_SCRATCH, *every_8_steps, "--output_dir", str(out), "--resume_from_checkpoint", "true",
                  "--num_train_epochs", "1"])  # fmt: skip


def launch_two_processes(args: list[str], tmp_path: Path, script: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", "0",
        str(script or ROOT / "finetune" / "run.py"), *args,
    ]  # fmt: skip
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_two_processes_give_the_metrics_of_one(tmp_path):
    out = tmp_path / "ddp"
    # `decode_size` has no use for sklearn's arrays: a data warning, which both processes meet; `crop_scale` is of
    # RandomResizedCrop, which 8 px images are not trained with: an option's, which both meet too.
    args = [*TINY_SCRATCH, "--output_dir", str(out), "--logging_steps", "1", "--decode_size", "8"]
    args += ["--crop_scale", "0.5", "1"]
    proc = launch_two_processes(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = read_results(out)
    assert results["hyperparameters"]["world_size"] == 2, "accelerate must really have started two processes"
    assert "Process 0 of 2" in proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("`decode_size` is for tables") == 1, "said by the main process alone"
    assert (proc.stdout + proc.stderr).count("`crop_scale` ignored") == 1, "said by the main process alone"
    # 45 validation images over 2 processes x batch 16 pads the last batch: no image may count twice or be dropped.
    assert np.array(results["confusion_matrix"]).sum() == 45
    accuracy, _, loss = evaluate_independently(out, "validation")
    assert results["validation"]["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    # Each image's loss counts once too: the duplicate of the last, padded batch does not.
    assert results["validation"]["loss"] == pytest.approx(loss, rel=1e-5)
    # The training loss is the mean over both processes' batches, as the Trainer logs each step's (logging_steps 1),
    # not process 0's alone.
    state = json.loads((out / "trainer_state.json").read_text())
    logged = [row["loss"] for row in state["log_history"] if "loss" in row]
    assert len(logged) == results["train"]["steps"]
    assert results["train"]["loss"] == pytest.approx(np.mean(logged), abs=2e-4)
    assert proc.stdout.count("at chance level") + proc.stderr.count("at chance level") <= 1


# `finetune/run.py` that records, in each process, a digest of torch's generator as each training batch is augmented.
RECORD_AUGMENTATION_DRAWS = """
import hashlib, os, sys, torch
sys.path.insert(0, sys.argv.pop(1))
from finetune.augment import BatchTransform
from finetune.errors import run_command
from finetune.run import main
augmented = BatchTransform.augmented
def recorded(self, pixel_values):
    with open(os.path.join(os.environ["DRAWS_DIR"], os.environ["RANK"]), "a") as f:
        f.write(hashlib.sha1(torch.random.get_rng_state().numpy().tobytes()).hexdigest() + chr(10))
    return augmented(self, pixel_values)
BatchTransform.augmented = recorded
sys.exit(run_command(main))
"""


@pytest.mark.slow
def test_two_processes_draw_their_own_augmentations(tmp_path, monkeypatch):
    """Each process augments its own images with draws of its own: seeded alike, every process cropped, flipped,
    erased and mixed its batch exactly as the others did theirs (and dropped the same paths), so that two processes
    gave each step half the distinct augmentations of one process's double batch."""
    script, draws = tmp_path / "record_draws.py", tmp_path / "draws"
    script.write_text(RECORD_AUGMENTATION_DRAWS)
    draws.mkdir()
    monkeypatch.setenv("DRAWS_DIR", str(draws))
    args = [str(ROOT), *TINY_SCRATCH, "--output_dir", str(tmp_path / "ddp"), "--max_steps", "3", "--report_to", "none"]
    proc = launch_two_processes(args, tmp_path, script)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_results(tmp_path / "ddp")["hyperparameters"]["world_size"] == 2
    first, second = ((draws / rank).read_text().split() for rank in ("0", "1"))
    assert len(first) == len(second) == 3
    assert not set(first) & set(second), "the processes drew the same augmentations"


@pytest.mark.slow
def test_two_processes_plan_the_same_budget_schedule(tmp_path):
    """Under `budget_schedule` each process plans from the (step, seconds) they all agreed on through the guard, not
    from its own clock: the same schedule, re-planned at the same steps, ending at the budget in both."""
    out = tmp_path / "ddp"
    budget = ["--max_train_minutes", "0.2", "--budget_schedule", "true", "--lr_scheduler_type", "cosine"]
    budget += ["--num_train_epochs", "1000", "--eval_strategy", "no", "--save_strategy", "no"]
    budget += ["--load_best_model_at_end", "false", "--log_level_replica", "info"]  # the plan, logged by both
    proc = launch_two_processes([*TINY_SCRATCH, *budget, "--output_dir", str(out)], tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    results = read_results(out)
    assert results["hyperparameters"]["world_size"] == 2, "accelerate must really have started two processes"
    plans = re.findall(
        r"Budget schedule: [\d.]+ ms per step so far; the learning-rate schedule now ends at step \d+", output
    )
    assert len(plans) == 2 and plans[0] == plans[1], plans
    stops = re.findall(r"step (\d+), epoch [\d.]+\)", output)
    assert len(stops) == 2 and stops[0] == stops[1], stops
    assert results["train"]["stopped_by"] == "time_budget" and results["train"]["steps"] == int(stops[0])
    # The schedule was fitted to the budget: the run ends near it, with the learning rate annealed.
    assert 0.5 * 12 < results["train"]["seconds"] < 12 + 5, results["train"]
    state = json.loads((out / "trainer_state.json").read_text())
    assert [row["learning_rate"] for row in state["log_history"] if "learning_rate" in row][-1] < 0.2 * 3e-3


@pytest.mark.slow
def test_two_processes_pretrained_path(tmp_path):
    args = [a for a in TINY_SCRATCH]
    args[args.index("scratch")] = "pretrained"
    args += ["--model_name_or_path", str(tiny_vit_checkpoint(tmp_path / "hub_stand_in"))]
    out = tmp_path / "run"
    proc = launch_two_processes([*args, "--output_dir", str(out), "--num_train_epochs", "1"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_results(out)["hyperparameters"]["world_size"] == 2
    assert AutoModelForImageClassification.from_pretrained(out).config.num_labels == 10


def test_scratch_options_given_to_a_pretrained_run_are_named_as_ignored(tmp_path, caplog):
    args = [a for a in TINY_SCRATCH]
    args[args.index("scratch")] = "pretrained"
    args += ["--model_name_or_path", str(tiny_vit_checkpoint(tmp_path / "hub_stand_in"))]
    run.main([*args, "--max_steps", "1", "--output_dir", str(tmp_path / "run"), "--report_to", "none"])
    [warning] = [r.getMessage() for r in caplog.records if "ScratchViT options" in r.getMessage()]
    assert warning.startswith("--image_size, --patch_size, --hidden_size, --num_hidden_layers")


def test_checkpoint_weights_reach_a_transformers_vit(tmp_path):
    """Resuming and keeping the best model load every tensor, also where transformers renames ViT's keys."""
    from finetune.models import load_checkpoint_weights

    checkpoint = tiny_vit_checkpoint(tmp_path / "ckpt", num_channels=3, num_labels=4)
    saved = ViTForImageClassification.from_pretrained(checkpoint).state_dict()
    model = ViTForImageClassification(ViTForImageClassification.config_class.from_pretrained(checkpoint))
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())
    load_checkpoint_weights(model, str(checkpoint))
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_attn_implementation_reaches_both_model_paths_and_is_not_saved(tmp_path):
    from finetune.arguments import ModelArguments, ScratchViTArguments
    from finetune.models import build_model

    data = load_image_data(
        DataArguments(dataset_name="sklearn:digits", max_train_samples=60, decoded_cache_dir="none"), seed=0
    )
    checkpoint = tiny_vit_checkpoint(tmp_path / "hub_stand_in", num_channels=1, num_labels=3)
    for model_type in ("scratch", "pretrained"):
        for attention in ("eager", "sdpa"):
            model_args = ModelArguments(
                model_type=model_type, model_name_or_path=str(checkpoint), attn_implementation=attention
            )
            model, _, _ = build_model(model_type, model_args, ScratchViTArguments(image_size=8, patch_size=2), data)
            assert model.config._attn_implementation == attention, (model_type, attention)
    # A run-time choice: the saved model loads with the default kernel.
    model.save_pretrained(tmp_path / "saved")
    assert "attn_implementation" not in (tmp_path / "saved" / "config.json").read_text()


def test_bf16_run_on_cpu_with_explicit_attention_and_conv_stem(tmp_path):
    """The CPU recipe's mode: bf16 autocast on a CPU, explicit attention, a convolutional stem; the saved weights stay
    float32 and the stem's BatchNorm statistics, trained, are saved with them."""
    out = tmp_path / "bf16"
    argv = [*TINY_SCRATCH, "--output_dir", str(out), "--bf16", "true", "--attn_implementation", "eager"]
    results = run.main([*argv, "--patch_embedding_type", "conv_stem"])
    saved = read_results(out)
    assert saved["hyperparameters"]["mixed_precision"] == "bf16"
    assert saved["hyperparameters"]["attn_implementation"] == "eager"
    model = AutoModelForImageClassification.from_pretrained(out)
    assert model.config.patch_embedding_type == "conv_stem"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    norm = model.vit.embeddings.patch_embeddings.projection[1]
    # One statistics update per training step, up to the saved (best or last) epoch's checkpoint.
    assert norm.num_batches_tracked.item() in {row["step"] for row in saved["history"]}
    assert not torch.equal(norm.running_var, torch.ones_like(norm.running_var))
    assert 0.0 <= results["scratch"].validation.accuracy <= 1.0
    assert all(np.isfinite(row["eval_loss"]) for row in saved["history"])


def test_a_both_run_goes_on_only_with_the_recipe_its_finished_model_trained_with(tmp_path, capsys):
    """Resumed after its pretrained model finished, with another learning rate and length: the scratch model trained
    with them, and the report compared the two as one recipe, exit 0."""
    from helpers_runs import make_run_dir

    out = tmp_path / "both"
    make_run_dir(out / "pretrained", "pretrained")  # finished, at learning rate 2e-4
    finished = (out / "pretrained" / "results.json").read_bytes()
    argv = [*TINY_SCRATCH, "--model_type", "both", "--output_dir", str(out), "--resume_from_checkpoint", "true"]
    assert run_command(run.main, [*argv, "--learning_rate", "1e-3"]) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(
        f"error: The pretrained model ({out / 'pretrained'}) finished with learning_rate 0.0002 (now"
    )
    assert "Nothing was changed. Fix: resume with the options it was trained with" in line, line
    assert (out / "pretrained" / "results.json").read_bytes() == finished and not (out / "scratch").exists()
    # The same recipe: 8 images a step as 4 x 2 accumulated; 16 a step is another.
    recipe = ["--learning_rate", "2e-4", "--num_train_epochs", "3", "--optim", "adamw_torch", "--lr_scheduler_type",
              "cosine", "--warmup_steps", "0.1", "--weight_decay", "0.05", "--label_smoothing_factor", "0.1", "--seed",
              "42", "--per_device_train_batch_size", "4", "--output_dir", str(out)]  # fmt: skip
    dirs, kept = {t: out / t for t in ("pretrained", "scratch")}, {"pretrained": FINISHED, "scratch": None}
    run.check_recipe_of_finished(dirs, kept, parse_args([*recipe, "--gradient_accumulation_steps", "2"])[3])
    with pytest.raises(ValueError, match=r"finished with total_train_batch_size 8 \(now 16\)"):
        run.check_recipe_of_finished(dirs, kept, parse_args([*recipe, "--gradient_accumulation_steps", "4"])[3])
    # Both finished: nothing trains beside them (the quickstart run again with other options keeps them).
    run.check_recipe_of_finished(dirs, dict.fromkeys(dirs, FINISHED), parse_args(recipe)[3])


def test_both_models_report_their_own_times(tmp_path):
    """Under `model_type: both` each model's `wall_seconds` counts that model alone: the two add up to at most the
    whole run, so the second does not include the first's training."""
    checkpoint = tiny_vit_checkpoint(tmp_path / "base", num_channels=1, num_labels=3)
    out = tmp_path / "both"
    start = time.perf_counter()
    args = [*TINY_SCRATCH, "--model_name_or_path", str(checkpoint), "--output_dir", str(out)]
    args[args.index("scratch")] = "both"
    results = run.main(args)
    total = time.perf_counter() - start
    pretrained, scratch = read_results(out / "pretrained"), read_results(out / "scratch")
    assert pretrained["wall_seconds"] + scratch["wall_seconds"] <= total
    for saved in (pretrained, scratch):
        assert 0 < saved["train"]["seconds"] < saved["wall_seconds"]
    assert results["scratch"].wall_seconds == scratch["wall_seconds"]


@pytest.mark.parametrize("native", [False, True])
def test_auto_precision_and_attention_are_chosen_logged_and_recorded(tmp_path, monkeypatch, caplog, native):
    """The defaults (`auto`) follow the CPU: bf16 with the explicit attention path for these small heads where the
    CPU has native bf16, float32 with SDPA where it has not; the log and results.json say so."""
    from finetune import hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: native)

    monkeypatch.setattr(hardware, "measure_cpu_bf16_speedup", lambda: 1.8)  # bf16 as fast as AMD EPYC's
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    out = tmp_path / "auto"
    caplog.set_level(logging.INFO)
    run.main([*TINY_SCRATCH, "--num_train_epochs", "1", "--output_dir", str(out), "--report_to", "none"])
    saved = read_results(out)["hyperparameters"]
    assert saved["mixed_precision"] == ("bf16" if native else "no")
    assert saved["attn_implementation"] == ("eager" if native else "sdpa")
    assert ("has native bf16" if native else "no native bf16") in saved["precision_choice"]
    assert saved["attention_choice"].startswith("auto")
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert f"Attention: {saved['attn_implementation']} (auto" in messages and saved["precision_choice"] in messages


def test_quickstart_runs_offline_end_to_end(tmp_path, monkeypatch):
    """The README's first command: the source model, then both models and the comparison, from an empty folder."""
    from finetune.tools import quickstart

    monkeypatch.chdir(tmp_path)
    results = quickstart.main(["--num_train_epochs", "2"])
    assert set(results) == {"pretrained", "scratch"}
    assert (tmp_path / "outputs/quickstart/comparison/report.md").is_file()
    assert all(0 < r.validation.accuracy <= 1 for r in results.values())
    # Run again, it keeps the trained models (it retrained them over the first run's, with a warning only); with other
    # options it refuses to replace them, as `finetune.run` does.
    kept = {t: (tmp_path / "outputs/quickstart" / t / "results.json").read_bytes() for t in results}
    again = quickstart.main([])
    assert {t: (tmp_path / "outputs/quickstart" / t / "results.json").read_bytes() for t in again} == kept
    with pytest.raises(FileExistsError, match="overwrite_output_dir"):
        quickstart.main(["--num_train_epochs", "1"])
    assert {t: (tmp_path / "outputs/quickstart" / t / "results.json").read_bytes() for t in again} == kept
    # A quickstart folder of a version whose source model's split held the fine-tuning's validation images.
    source = tmp_path / "outputs/quickstart/source_model/results.json"
    older = json.loads(source.read_text())
    del older["hyperparameters"]["held_out_images"]
    source.write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"made by an earlier version.* Fix: remove outputs/quickstart and run"):
        quickstart.main([])


def test_the_quickstart_source_model_starts_from_the_same_weights_every_time(tmp_path):
    """The README's quickstart figures are reproducible only if its "pretrained" model starts from fixed weights."""
    from safetensors.torch import load_file

    from finetune.tools.quickstart import make_source_init

    torch.manual_seed(123)  # whatever the state of the generator before
    make_source_init(tmp_path / "a")
    torch.rand(7)
    make_source_init(tmp_path / "b")
    a, b = load_file(tmp_path / "a/model.safetensors"), load_file(tmp_path / "b/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_quickstart_source_cut_short_is_made_again(tmp_path):
    """Ctrl-C in the quickstart's first step left source_init with an empty config.json and no weights: every later
    quickstart refused it ("holds a config.json but no weights"), naming no way out."""
    from finetune.tools.quickstart import ensure_source_init

    path = tmp_path / "source_init"
    path.mkdir()
    (path / "config.json").write_text("")
    ensure_source_init(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source_init"], "no partial folder is left"
    assert ViTForImageClassification.from_pretrained(path).config.num_labels == 5
    made = (path / "model.safetensors").stat().st_mtime_ns
    ensure_source_init(path)  # whole: kept as it is
    assert (path / "model.safetensors").stat().st_mtime_ns == made


def test_the_quickstart_source_model_is_written_without_a_progress_bar(tmp_path, capfd):
    """Its `save_pretrained` ran before `finetune.run` switched transformers' bars off: the quickstart's log, in a
    file, held a "Writing model shards" bar."""
    import transformers

    from finetune.tools.quickstart import make_source_init

    transformers.utils.logging.enable_progress_bar()  # as in a fresh process
    make_source_init(tmp_path / "a")
    assert "Writing model shards" not in capfd.readouterr().err


def test_a_library_warning_that_names_its_level_is_not_prefixed_twice():
    """transformers' resume warning read "warning: Warning: The following arguments do not match ..."."""
    formatter = run.ConsoleFormatter()
    said = "Warning: The following arguments do not match the ones in the `trainer_state.json` within the checkpoint"
    record = logging.LogRecord("transformers.trainer", logging.WARNING, __file__, 1, said, None, None)
    assert formatter.format(record) == "warning: " + said.removeprefix("Warning: ")
    record.msg = "Warnings of the run: none"
    assert formatter.format(record) == "warning: Warnings of the run: none"
    record.levelno, record.levelname = logging.INFO, "INFO"
    assert formatter.format(record) == "Warnings of the run: none"
