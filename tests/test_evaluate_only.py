"""`do_train: false`: a saved model is scored on the validation and test splits by the real Trainer, which never
enters its training loop; results.json, the confusion matrix and per-image predictions are written."""

import csv
import json
import os
import shutil
import signal

import numpy as np
import pytest
from test_run import TINY_SCRATCH, tiny_vit_checkpoint
from transformers import Trainer

from finetune import run
from finetune.errors import run_command
from finetune.results import Results
from finetune.tools.report import write_predictions_csv


DIGITS = [
    "--dataset_name", "sklearn:digits", "--max_train_samples", "240", "--max_eval_samples", "45",
    "--validation_size", "0.2", "--per_device_eval_batch_size", "16", "--seed", "0", "--decoded_cache_dir", "none",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained_scratch(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "scratch"
    args = [*TINY_SCRATCH, "--output_dir", str(out), "--num_train_epochs", "1", "--save_strategy", "no"]
    run.main([*args, "--eval_strategy", "no", "--load_best_model_at_end", "false"])
    return out


@pytest.fixture(scope="module")
def lora_of_scratch(trained_scratch, tmp_path_factory):
    """`trained_scratch` fine-tuned by LoRA (`model_type: pretrained`), with its merged model in merged/."""
    out = tmp_path_factory.mktemp("lora") / "lora"
    run.main(
        [*TINY_SCRATCH, "--model_type", "pretrained", "--model_name_or_path", str(trained_scratch),
         "--trust_remote_code", "true", "--finetune_method", "lora", "--merge_lora", "true", "--output_dir", str(out),
         "--num_train_epochs", "1", "--save_strategy", "no", "--eval_strategy", "no", "--load_best_model_at_end",
         "false"]
    )  # fmt: skip
    return out


def test_the_closing_summary_names_only_what_the_run_wrote(trained_scratch):
    results = Results.load(trained_scratch)  # `save_strategy: no`: no checkpoint-*
    closing = run.summary({"scratch": results}, {"scratch": trained_scratch}, None)
    assert f"files: {trained_scratch}/ (model, results.json)" in closing


@pytest.fixture()
def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the training loop ran")

    monkeypatch.setattr(Trainer, "_inner_training_loop", refuse)
    monkeypatch.setattr(Trainer, "create_optimizer", refuse)


def test_scores_a_saved_scratch_model_without_training(trained_scratch, tmp_path, no_training, caplog):
    out = tmp_path / "eval"
    with caplog.at_level("INFO"):
        results = run.main(
            ["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(trained_scratch), *DIGITS,
             "--output_dir", str(out)]
        )["scratch"]  # fmt: skip
    assert "Evaluation: resize to 8x8." in caplog.text and "Training augmentation" not in caplog.text  # none trains
    trained = json.loads((trained_scratch / "results.json").read_text())
    written = json.loads((out / "results.json").read_text())
    # The same weights on the same split give the training run's final figures.
    assert written["validation"]["accuracy"] == pytest.approx(trained["validation"]["accuracy"])
    assert written["confusion_matrix"] == trained["confusion_matrix"]
    assert written["train"]["steps"] is None and written["hyperparameters"]["evaluation_only"] is True
    assert written["architecture"] == "ScratchViTForImageClassification" and results.model_type == "scratch"
    assert written["validation"]["top5_accuracy"] is not None and written["per_class_f1"]
    assert (out / "confusion_matrix.png").stat().st_size > 0
    assert not (out / "model.safetensors").exists()
    closing = run.summary({"scratch": results}, {"scratch": out}, None)  # names the files written, and only those
    assert f"files: {out}/ (results.json, predictions_*.csv, confusion_matrix.png)" in closing
    with open(out / "predictions_validation.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == written["num_samples"]["validation"]
    assert list(rows[0])[:7] == ["index", "label", "predicted", "top1", "top1_probability", "top2", "top2_probability"]
    correct = sum(row["label"] == row["predicted"] for row in rows)
    assert correct / len(rows) == pytest.approx(written["validation"]["accuracy"])
    assert all(row["predicted"] == row["top1"] for row in rows)
    # A second evaluation into the same folder would replace the first: refused unless asked.
    again = ["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(trained_scratch), *DIGITS,
             "--output_dir", str(out)]  # fmt: skip
    with pytest.raises(FileExistsError, match="overwrite_output_dir"):
        run.main(again)
    # Stopped before its results.json (written last, after the predictions): the same command, once refused, redoes it.
    (out / "results.json").unlink()
    assert run.main(again)["scratch"].validation.accuracy == pytest.approx(written["validation"]["accuracy"])
    assert json.loads((out / "results.json").read_text())["confusion_matrix"] == written["confusion_matrix"]


def test_the_tools_name_an_evaluations_folder_as_such(trained_scratch, tmp_path, no_training):
    """predict, export, attention, teaching and training from it said only "has no config.json: it is not a saved
    model"; card and push said what it is."""
    from finetune.tools import predict

    out = tmp_path / "eval"
    run.main(["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(trained_scratch), *DIGITS,
              "--output_dir", str(out)])  # fmt: skip
    said = r"holds the results of an evaluation \(`do_train: false`\), which saves no model: pass the folder of the"
    with pytest.raises(FileNotFoundError, match=said):
        predict.load_classifier(out)
    with pytest.raises(FileNotFoundError, match=said):
        run.main([*TINY_SCRATCH, "--model_type", "pretrained", "--model_name_or_path", str(out), "--output_dir",
                  str(tmp_path / "again")])  # fmt: skip


def test_an_evaluation_follows_the_flip_tta_of_the_models_run(trained_scratch, tmp_path, no_training):
    """The run's figures, and predict's probabilities, average each image with its mirror image where it evaluated so
    (`flip_tta: true`): so does an evaluation of its model, unless told otherwise."""
    model = shutil.copytree(trained_scratch, tmp_path / "model")
    recorded = json.loads((model / "results.json").read_text())
    recorded["hyperparameters"]["flip_tta"] = True  # as a run with `flip_tta: true` records it
    (model / "results.json").write_text(json.dumps(recorded))

    def evaluate(name, *extra):
        out = tmp_path / name
        argv = ["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(model), *DIGITS,
                "--output_dir", str(out), *extra]  # fmt: skip
        result = run.main(argv)["scratch"]
        with open(out / "predictions_validation.csv") as f:
            return result, [row["top1_probability"] for row in csv.DictReader(f)]

    (followed, followed_p), (_, flipped_p) = evaluate("followed"), evaluate("flipped", "--flip_tta", "true")
    alone, alone_p = evaluate("alone", "--flip_tta", "false")
    assert followed.hyperparameters.get("flip_tta") is True and followed_p == flipped_p
    assert "flip_tta" not in alone.hyperparameters and alone_p != followed_p
    assert alone.validation.accuracy == pytest.approx(recorded["validation"]["accuracy"])  # as the run, which did not


@pytest.mark.parametrize(
    "change, fix",
    [
        (["--seed", "42"], "Fix: `--seed 0`."),
        (["--data_seed", "7"], "Fix: `--data_seed 0`."),
        (["--validation_size", "0.3"], "Fix: `--validation_size 0.2`."),
        (["--seed", "42", "--data_seed", "0"], None),  # `data_seed: 0` is the seed 0, not "unset": the same split
    ],
)
def test_a_held_out_split_other_than_trainings_is_refused(
    trained_scratch, lora_of_scratch, tmp_path, no_training, change, fix
):
    # digits has no validation split: another seed or size held out images the model trained on, and scored them.
    assert Results.load(trained_scratch).hyperparameters["validation_size"] == 0.2
    run_dir = tmp_path / "run"  # a checkpoint-* is checked against its run's results.json, a LoRA run's merged/ too
    shutil.copytree(trained_scratch, run_dir / "checkpoint-8", ignore=shutil.ignore_patterns("results.json"))
    shutil.copy(trained_scratch / "results.json", run_dir)
    for model in (trained_scratch, run_dir / "checkpoint-8", lora_of_scratch / "merged"):
        argv = ["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(model), *DIGITS, *change,
                "--output_dir", str(tmp_path / "eval")]  # fmt: skip
        if fix is None:
            trained = Results.load(lora_of_scratch if model.name == "merged" else trained_scratch)
            evaluated = run.main([*argv, "--overwrite_output_dir", "true"])["scratch"]
            assert evaluated.validation.accuracy == pytest.approx(trained.validation.accuracy)
            continue
        with pytest.raises(ValueError, match="would hold out images it trained on") as error:
            run.main(argv)
        assert str(error.value).endswith(fix) and "\n" not in str(error.value)
        assert not (tmp_path / "eval" / "results.json").exists()


def test_a_run_from_a_model_of_the_same_data_holds_out_the_split_it_held_out(tmp_path):
    """Fine-tuning a run's model on its data held out the same split only by chance: another seed went on (exit 0,
    100% validation accuracy at a learning rate of 1e-9). A model of some classes (`include_labels`, the quickstart's
    pretrained model) holds out the images a run on all of them holds out; one trained before the split was drawn from
    every class is refused."""
    quick = ["--num_train_epochs", "1", "--save_strategy", "no", "--eval_strategy", "no", "--load_best_model_at_end",
             "false", "--report_to", "none"]  # fmt: skip
    source = tmp_path / "source"
    run.main([*TINY_SCRATCH, *quick, "--include_labels", "0", "1", "2", "3", "4", "--output_dir", str(source)])
    assert Results.load(source).hyperparameters["held_out_images"] == round(0.2 * 1797)
    tuned = [*TINY_SCRATCH, *quick, "--model_type", "pretrained", "--model_name_or_path", str(source)]
    with pytest.raises(
        ValueError,
        match=r"^The pretrained model \S+source was trained on sklearn:digits holding out "
        r"its validation split with seed 0, validation_size 0.2: this run's \(seed 1",
    ):
        run.main([*tuned, "--seed", "1", "--output_dir", str(tmp_path / "other_seed")])
    assert not (tmp_path / "other_seed").exists()
    assert run.main([*tuned, "--output_dir", str(tmp_path / "tuned")])["pretrained"].validation is not None
    # Other classes than it trained on (a transfer benchmark's target classes): no image of theirs it trained on.
    other = ["--include_labels", "5", "6", "7", "8", "9", "--seed", "1", "--validation_size", "0.3"]
    assert run.main([*tuned, *other, "--output_dir", str(tmp_path / "other_classes")])["pretrained"].validation
    older = json.loads((source / "results.json").read_text())
    del older["hyperparameters"]["held_out_images"]
    (source / "results.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"trained on some classes of sklearn:digits .* Fix: train it again"):
        run.main([*tuned, "--output_dir", str(tmp_path / "from_older")])


def test_a_model_saved_before_the_count_was_recorded_is_held_to_the_images_it_held_out(tmp_path):
    """A results.json without `held_out_images`, of a run on every class holding out a number of images: that number
    of the whole train split. The same number with `include_labels` now holds out that share of every class."""
    quick = ["--num_train_epochs", "1", "--save_strategy", "no", "--eval_strategy", "no", "--load_best_model_at_end",
             "false", "--report_to", "none", "--validation_size", "120"]  # fmt: skip
    source = tmp_path / "source"
    run.main([*TINY_SCRATCH, *quick, "--output_dir", str(source)])
    older = json.loads((source / "results.json").read_text())
    assert older["hyperparameters"].pop("held_out_images") == 120
    (source / "results.json").write_text(json.dumps(older))
    tuned = [*TINY_SCRATCH, *quick, "--model_type", "pretrained", "--model_name_or_path", str(source)]
    with pytest.raises(
        ValueError, match=r"Fix: a `validation_size` that holds out 120 images of the whole train split"
    ):
        run.main([*tuned, "--include_labels", "0", "1", "2", "--output_dir", str(tmp_path / "some")])
    assert run.main([*tuned, "--output_dir", str(tmp_path / "every")])["pretrained"].validation is not None


def test_a_local_dataset_is_known_by_its_files_not_the_spelling_of_its_path(tmp_path, monkeypatch):
    """Trained on `digits` (relative), evaluated on its absolute path or through a symlink with another seed: refused
    (it was evaluated on images it trained on); a different folder of the same relative name is another dataset:
    evaluated."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for folder, count in (("a", 60), ("b", 45)):
        for i in range(count):
            class_dir = tmp_path / folder / "digits" / str(digits.target[i] % 3)
            class_dir.mkdir(parents=True, exist_ok=True)
            Image.fromarray((digits.images[i] * 15).astype(np.uint8)).save(class_dir / f"{i}.png")
    monkeypatch.chdir(tmp_path / "a")
    args = ["digits" if a == "sklearn:digits" else a for a in TINY_SCRATCH]
    run.main([*args, "--output_dir", "model", "--num_train_epochs", "1", "--save_strategy", "no",
              "--eval_strategy", "no", "--load_best_model_at_end", "false"])  # fmt: skip
    evaluate = [*args, "--do_train", "false", "--model_name_or_path", str(tmp_path / "a" / "model"), "--seed", "42"]
    with pytest.raises(ValueError, match="would hold out images it trained on. Fix: `--seed 0`"):
        run.main([*evaluate, "--dataset_name", str(tmp_path / "a" / "digits"), "--output_dir", "eval"])
    (tmp_path / "link").symlink_to(tmp_path / "a" / "digits")  # the same files through a link: the same dataset
    with pytest.raises(ValueError, match="would hold out images it trained on. Fix: `--seed 0`"):
        run.main([*evaluate, "--dataset_name", str(tmp_path / "link"), "--output_dir", "eval"])
    # One image more in the folder: the same seed holds out another split, with images the model trained on.
    shutil.copy(tmp_path / "a" / "digits" / "0" / "0.png", tmp_path / "a" / "digits" / "1" / "new.png")
    with pytest.raises(ValueError, match=r"its files have changed since, so this evaluation's held-out validation"):
        run.main([*evaluate[:-1], "0", "--output_dir", "eval"])
    monkeypatch.chdir(tmp_path / "b")
    assert run.main([*evaluate, "--output_dir", "eval"])["scratch"].validation is not None


def test_pretrained_path_checks_the_heads_labels(tmp_path, no_training):
    checkpoint = tiny_vit_checkpoint(tmp_path / "vit3", num_labels=3)
    with pytest.raises(ValueError, match="classifies 3 classes but the dataset has 10"):
        run.main(["--do_train", "false", "--model_name_or_path", str(checkpoint), *DIGITS,
                  "--output_dir", str(tmp_path / "o")])  # fmt: skip
    checkpoint = tiny_vit_checkpoint(tmp_path / "vit10", num_labels=10)
    results = run.main(
        ["--do_train", "false", "--model_name_or_path", str(checkpoint), *DIGITS, "--output_dir", str(tmp_path / "e")]
    )["pretrained"]
    assert results.model_type == "pretrained" and results.validation.accuracy is not None


def test_an_evaluation_at_another_processors_size_scores_the_resized_model(tmp_path, no_training, caplog):
    """An `image_processor_name` of another size evaluates the checkpoint as fine-tuning would start from it (position
    embeddings resized); it stopped mid-evaluation with "Input image size (16*16) doesn't match model (8*8)". The
    checkpoint itself stays as it was."""
    from transformers import AutoConfig, ViTImageProcessor

    checkpoint = tiny_vit_checkpoint(tmp_path / "vit10", num_labels=10)
    processor = tmp_path / "processor_16"
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5], image_std=[0.5]).save_pretrained(processor)
    with caplog.at_level("INFO"):
        results = run.main(
            ["--do_train", "false", "--model_name_or_path", str(checkpoint), "--image_processor_name", str(processor),
             *DIGITS, "--output_dir", str(tmp_path / "e")]
        )["pretrained"]  # fmt: skip
    assert "Position embeddings resized from 8x8 to 16x16" in caplog.text
    assert results.validation.accuracy is not None and results.num_samples["validation"] == 45
    assert AutoConfig.from_pretrained(checkpoint).image_size == 8


def test_the_results_name_what_the_evaluated_model_is(trained_scratch, lora_of_scratch, tmp_path, no_training):
    """Not the `model_type` given: a ViT is `pretrained`, a ScratchViT fine-tuned by LoRA (its adapter or its merged
    model) what its run recorded, `pretrained`, and a ScratchViT without its run's results.json `scratch`."""
    vit = tiny_vit_checkpoint(tmp_path / "vit", num_labels=10)
    bare = shutil.copytree(trained_scratch, tmp_path / "bare", ignore=shutil.ignore_patterns("results.json"))
    for model, given, expected in (
        (vit, "scratch", "pretrained"),
        (lora_of_scratch, "pretrained", "pretrained"),
        (lora_of_scratch / "merged", "scratch", "pretrained"),
        (bare, "pretrained", "scratch"),
    ):
        out = tmp_path / f"eval_{model.name}"
        argv = ["--do_train", "false", "--model_type", given, "--model_name_or_path", str(model), *DIGITS]
        results = run.main([*argv, "--output_dir", str(out)])[given]
        assert json.loads((out / "results.json").read_text())["model_type"] == expected, model
        assert f"  {expected}: validation accuracy" in run.summary({given: results}, {given: out}, None), model


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model_type", "both"], "`model_type: both` trains two"),
        (["--model_type", "scratch"], "needs a trained ScratchViT to score"),
    ],
)
def test_refusals_name_the_fix(args, message, tmp_path, caplog):
    with pytest.raises(ValueError, match=message):
        run.main(["--do_train", "false", *args, *DIGITS, "--output_dir", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
    # Alone: a run's config given (`--hidden_size`) was first warned of as ignored, "Fix: drop them", then refused.
    caplog.clear()
    with pytest.raises(ValueError, match=message):
        run.main(["--do_train", "false", *args, *DIGITS, "--hidden_size", "32", "--output_dir", str(tmp_path / "o")])
    assert "ignored by" not in caplog.text


def test_predictions_csv_by_hand(tmp_path):
    logits = np.log(np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]]))
    path = write_predictions_csv(tmp_path / "p.csv", logits, np.array([2, 0]), ["a", "b", "c"], top_k=2)
    assert path.read_text().splitlines() == [
        "index,label,predicted,top1,top1_probability,top2,top2_probability",
        "0,c,b,b,0.500000,c,0.300000",
        "1,a,a,a,0.600000,c,0.300000",
    ]
    # Rows named by their images: position in the source split and file.
    path = write_predictions_csv(
        path, logits, np.array([2, 0]), "abc", top_k=1, positions=[7, 3], files=["x.png", None]
    )
    assert path.read_text().splitlines()[:2] == [
        "index,file,label,predicted,top1,top1_probability",
        "7,x.png,c,b,b,0.500000",
    ]


@pytest.mark.parametrize(
    ("where", "doing"),
    [("finetune.models.load_trained_model", "loading the model to evaluate"),
     ("transformers.Trainer.predict", "evaluating the model, before its results were written")],
)  # fmt: skip
def test_a_signal_while_evaluating_names_the_stage(trained_scratch, tmp_path, monkeypatch, capsys, where, doing):
    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(where, signalled)
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    out = tmp_path / "eval"
    argv = ["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(trained_scratch), *DIGITS,
            "--output_dir", str(out)]  # fmt: skip
    assert run_command(run.main, argv) == 143
    err = capsys.readouterr().err
    assert err == f"error: stopped by SIGTERM while {doing}. Nothing was saved: rerun the same command.\n", err
    assert not (out / "results.json").exists()


def test_scratch_options_given_to_an_evaluation_are_named_as_ignored(trained_scratch, tmp_path, no_training, caplog):
    # The saved model is scored as it is, at its own resolution: `--image_size 16` would change nothing, said so.
    run.main(["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(trained_scratch), *DIGITS,
              "--image_size", "16", "--hidden_size", "32", "--output_dir", str(tmp_path / "eval")])  # fmt: skip
    [warning] = [r.getMessage() for r in caplog.records if "ScratchViT options" in r.getMessage()]
    assert warning.startswith("--image_size, --hidden_size: ScratchViT options, ignored by `do_train: false`")
    assert Results.load(tmp_path / "eval").image_size == Results.load(trained_scratch).image_size
    # Training options too (they went by without a word); label smoothing as well: the evaluation loss is plain
    # cross-entropy (a comment said it took the smoothing, and an evaluation ignored it without a word).
    run.main(["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(trained_scratch), *DIGITS,
              "--ema_decay", "0.9", "--mixup_alpha", "0.5", "--learning_rate", "1e-3", "--label_smoothing_factor",
              "0.1", "--output_dir", str(tmp_path / "eval2")])  # fmt: skip
    [warning] = [r.getMessage() for r in caplog.records if "training options" in r.getMessage()]
    assert warning.startswith(
        "`label_smoothing_factor`, `learning_rate`, `ema_decay`, `mixup_alpha`: training options, ignored by `do_train"
    )
    loss = [json.loads((tmp_path / e / "results.json").read_text())["validation"]["loss"] for e in ("eval", "eval2")]
    assert loss[0] == loss[1]


def test_an_evaluation_records_the_images_it_scored_as_compare_reads_them(trained_scratch, tmp_path, no_training):
    """An evaluation recorded no seed nor split: that of a model no run here wrote, on other validation images of the
    same count (`--seed 1`), compared beside the run of `--seed 0` without a word."""
    from finetune.tools import compare

    bare = tmp_path / "bare"  # the weights alone, as a model from elsewhere
    shutil.copytree(trained_scratch, bare, ignore=shutil.ignore_patterns("results.json"))
    evaluate = ["--do_train", "false", "--model_type", "scratch", "--model_name_or_path", str(bare), *DIGITS]
    run.main([*evaluate, "--output_dir", str(tmp_path / "same")])
    run.main([*evaluate, "--seed", "1", "--output_dir", str(tmp_path / "other")])
    same = compare.write_comparison([trained_scratch, tmp_path / "same"], tmp_path / "r1").read_text()
    assert "Not scored" not in same
    other = compare.write_comparison([trained_scratch, tmp_path / "other"], tmp_path / "r2").read_text()
    assert "the runs differ in their held-out validation split (its seed or size), evaluated subsets" in other
