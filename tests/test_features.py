"""Training options users of image-classification fine-tuning ask for, each through the real pipeline on tiny data:
early stopping, class weighting, random erasing and stochastic depth."""

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from test_backbones import TRAIN, checkpoint

from finetune import run
from finetune.arguments import parse_args
from finetune.data import load_image_data
from finetune.models import build_model
from finetune.tools.model_card import build_model_card
from finetune.trainer import classification_loss


sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_nonfinite import run_script  # noqa: E402
from test_run import TINY_SCRATCH, tiny_vit_checkpoint  # noqa: E402


RUN = [*TINY_SCRATCH, "--report_to", "none"]


def test_early_stopping_ends_a_run_that_stopped_improving_and_says_so(tmp_path, caplog):
    out = tmp_path / "run"
    # A learning rate of 0 never improves the validation accuracy after the first evaluation.
    args = [*RUN, "--output_dir", str(out), "--num_train_epochs", "10", "--learning_rate", "0"]
    with caplog.at_level(logging.INFO, logger="finetune"):
        results = run.main([*args, "--early_stopping_patience", "2"])["scratch"]
    assert results.train.stopped_by == "early_stopping" and results.epochs == pytest.approx(3.0)
    assert "Early stopping at epoch 3.00: `accuracy` did not improve" in caplog.text
    saved = json.loads((out / "results.json").read_text())
    assert saved["train"]["stopped_by"] == "early_stopping"
    assert saved["hyperparameters"]["early_stopping_patience"] == 2


def test_early_stopping_that_comes_at_the_last_step_did_not_end_the_run(tmp_path, caplog):
    """The patience ran out at the last epoch's evaluation: the run trained all its steps, stopped by nothing."""
    args = [*RUN, "--output_dir", str(tmp_path / "run"), "--num_train_epochs", "3", "--learning_rate", "0"]
    with caplog.at_level(logging.INFO, logger="finetune"):
        results = run.main([*args, "--early_stopping_patience", "2"])["scratch"]
    assert results.epochs == pytest.approx(3.0) and results.train.stopped_by is None
    assert "Early stopping" not in caplog.text


def test_early_stopping_needs_a_best_model(tmp_path):
    with pytest.raises(ValueError, match="`early_stopping_patience` keeps the best model"):
        parse_args([*RUN, "--early_stopping_patience", "2", "--load_best_model_at_end", "false"])


def test_balanced_class_weights_weight_the_loss_by_inverse_frequency(tmp_path):
    out = tmp_path / "run"
    # Digits 0-2 only, with 1 kept in a tenth of its images: an imbalanced training split.
    args = [*RUN, "--output_dir", str(out), "--include_labels", "0", "1", "2", "--num_train_epochs", "1"]
    results = run.main([*args, "--class_weighting", "balanced"])["scratch"]
    assert results.hyperparameters["class_weighting"] == "balanced"

    model_args, data_args, scratch_args, training_args = parse_args([*args, "--class_weighting", "balanced"])
    data = load_image_data(data_args, seed=training_args.seed, target_size=8)
    counts = torch.bincount(data.train.labels, minlength=3).float()
    expected = counts.sum() / (3 * counts)
    model_args, _ = run.choose_attention("scratch", model_args, scratch_args, training_args)
    model, processor, prep = build_model("scratch", model_args, scratch_args, data)
    trainer = run.make_trainer(model, processor, prep, data_args, training_args, data)
    torch.testing.assert_close(trainer.class_weights, expected)
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 2, 1, 0])
    weighted = classification_loss(logits, labels, weight=trainer.class_weights)
    per_image = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    torch.testing.assert_close(weighted, (per_image * expected[labels]).sum() / expected[labels].sum())


def test_class_weights_refuse_a_class_without_training_images(tmp_path):
    out = tmp_path / "run"
    args = [*RUN, "--output_dir", str(out), "--max_train_samples", "4", "--class_weighting", "balanced"]
    proc = run_script(["-m", "finetune.run", *args])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "`class_weighting: balanced` needs training images of every class" in errors[0]
    assert "`include_labels`" in errors[0] and "`class_weighting: none`" in errors[0]


def test_random_erasing_and_stochastic_depth_reach_the_run(tmp_path, caplog):
    out = tmp_path / "run"
    args = [*RUN, "--output_dir", str(out), "--num_train_epochs", "1", "--random_erasing", "0.25"]
    with caplog.at_level(logging.INFO, logger="finetune"):
        run.main([*args, "--drop_path_rate", "0.2"])
    assert "random erasing" in caplog.text
    assert json.loads((out / "config.json").read_text())["drop_path_rate"] == 0.2
    # Recorded with the results, and in the card's architecture with the rest of the config (`qk_norm` was not).
    recorded = json.loads((out / "results.json").read_text())["hyperparameters"]
    assert recorded["drop_path_rate"] == 0.2
    assert (recorded["adam_beta2"], recorded["max_grad_norm"]) == (0.999, 1.0)  # and the optimizer's settings
    assert recorded["augmentation"] == "random crop with 4 px padding, no flip, random erasing (p=0.25)"
    card = build_model_card(out, str(out)).text
    assert "| `drop_path_rate` | 0.2 |" in card and "| `qk_norm` | False |" in card
    with pytest.raises(ValueError, match="`random_erasing` must be a probability"):
        parse_args([*args, "--random_erasing", "1.5"])


def test_stochastic_depth_on_a_pretrained_model_that_has_it_or_a_clear_refusal(tmp_path):
    vit = tiny_vit_checkpoint(tmp_path / "vit", num_channels=1, num_labels=10)
    with pytest.raises(ValueError, match=r"\(vit\) has no stochastic depth"):
        run.main(
            ["--model_name_or_path", str(vit), *TRAIN, "--output_dir", str(tmp_path / "a"), "--drop_path_rate", "0.1"]
        )
    # Said before the data loads (here, before a missing dataset is found), also for `both`.
    for model_type in ("pretrained", "both"):
        with pytest.raises(ValueError, match=r"\(vit\) has no stochastic depth"):
            missing = ["--dataset_name", str(tmp_path / "missing.parquet")]
            run.main(["--model_name_or_path", str(vit), *TRAIN, "--output_dir", str(tmp_path / "a"), "--model_type",
                      model_type, "--drop_path_rate", "0.1", *missing])  # fmt: skip
    out = tmp_path / "b"
    beit = checkpoint(tmp_path, "beit")
    run.main(["--model_name_or_path", str(beit), *TRAIN, "--output_dir", str(out), "--drop_path_rate", "0.1"])
    assert json.loads((out / "config.json").read_text())["drop_path_rate"] == 0.1
    assert json.loads((out / "results.json").read_text())["hyperparameters"]["drop_path_rate"] == 0.1
