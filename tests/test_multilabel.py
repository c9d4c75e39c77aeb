"""Multi-label classification through the real pipeline on scikit-learn's digits turned into tags of the digit
("even", "big" for 5 and up, "round" for 0, 6, 8, 9): a list column in parquet files and `;`-separated labels in a
csv, BCE training with MixUp/CutMix, mAP and per-label thresholds in results.json, predict's labels above them, and
the one-line errors of bad labels."""

import csv
import json
import logging
import logging.handlers
import shutil
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.metrics import average_precision_score, f1_score
from test_nonfinite import run_script
from test_run import TINY_SCRATCH

from finetune import run
from finetune.arguments import parse_args
from finetune.augment import MixUpCutMix
from finetune.data import load_image_data
from finetune.data.sources import open_source
from finetune.metrics import multi_label_report, multi_label_scores
from finetune.models import build_model
from finetune.tools import predict
from finetune.tools.compare import write_comparison
from finetune.tools.model_card import build_model_card
from finetune.trainer import balanced_class_weights, multi_label_loss


TAGS = {"even": lambda d: d % 2 == 0, "big": lambda d: d >= 5, "round": lambda d: d in (0, 6, 8, 9)}


def tags(digit: int) -> list[str]:
    return [tag for tag, has in TAGS.items() if has(digit)]


def digit_images(start: int, stop: int) -> tuple[list[Image.Image], list[int]]:
    digits = load_digits()
    pixels = np.round(digits.images[start:stop] * (255.0 / 16.0)).astype(np.uint8)  # as `sklearn:digits` loads them
    return [Image.fromarray(p) for p in pixels], digits.target[start:stop].tolist()


def write_parquet(path: Path, images: list[Image.Image], labels: list, item=None) -> None:
    """A parquet file with an image column and a list column of labels (items of the feature `item`, default str)."""
    item = item or datasets.Value("string")
    features = datasets.Features({"image": datasets.Image(), "labels": datasets.List(item)})
    datasets.Dataset.from_dict({"image": images, "labels": labels}, features=features).to_parquet(path)


def tagged(path: Path, start: int, stop: int) -> None:
    images, digits = digit_images(start, stop)
    write_parquet(path, images, [tags(d) for d in digits])


def run_args(dataset: str, out: Path) -> list[str]:
    """The tiny ScratchViT of the other run tests, without `sklearn:digits`' subsets, trained a little longer."""
    drop = {"--dataset_name", "--max_train_samples", "--max_eval_samples", "--num_train_epochs", "--learning_rate"}
    pairs = [TINY_SCRATCH[i : i + 2] for i in range(0, len(TINY_SCRATCH), 2)]
    kept = [value for pair in pairs if pair[0] not in drop for value in pair]
    return [*kept, "--dataset_name", dataset, "--output_dir", str(out), "--report_to", "none", "--disable_tqdm",
            "true", "--num_train_epochs", "12", "--learning_rate", "3e-3", "--random_crop_padding", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One multi-label run with MixUp and CutMix: 600 digits to train and validate on, 200 to test."""
    data = tmp_path_factory.mktemp("tags")
    tagged(data / "train.parquet", 0, 600)
    tagged(data / "test.parquet", 600, 800)
    out = tmp_path_factory.mktemp("run") / "run"
    logged = logging.handlers.BufferingHandler(capacity=10_000)
    logging.getLogger("finetune").addHandler(logged)
    try:
        results = run.main([*run_args(str(data), out), "--mixup_alpha", "0.2", "--cutmix_alpha", "1.0"])["scratch"]
    finally:
        logging.getLogger("finetune").removeHandler(logged)
    LOGGED.extend(record.getMessage() for record in logged.buffer)
    return results, out, data


LOGGED: list[str] = []  # the lines the run in `trained` logged


def test_a_multi_label_run_learns_the_tags_and_saves_its_thresholds(trained):
    results, out, _ = trained
    saved = json.loads((out / "results.json").read_text())
    assert saved["multi_label"] is True and saved["label_names"] == ["big", "even", "round"]
    assert json.loads((out / "config.json").read_text())["problem_type"] == "multi_label_classification"
    assert saved["hyperparameters"]["mixup_alpha"] == 0.2 and saved["hyperparameters"]["cutmix_alpha"] == 1.0
    [augmentation] = [line for line in LOGGED if line.startswith("Training augmentation")]
    assert "MixUp (alpha 0.2) or CutMix (alpha 1) per batch" in augmentation, augmentation
    # Chance mAP is each tag's share of the test images (a constant score ranks nothing): about 0.47 here.
    chance = np.mean([n / 200 for n in saved["per_class_support"].values()])
    assert saved["test"]["map"] > chance + 0.15, (saved["test"], chance)
    assert saved["test"]["accuracy"] is None and saved["confusion_matrix"] == []
    for split in ("validation", "test"):
        assert 0 < saved[split]["micro_f1"] <= 1 and 0 < saved[split]["macro_f1"] <= 1
    assert set(saved["per_class_threshold"]) == set(saved["label_names"])
    assert all(0 < t < 1 for t in saved["per_class_threshold"].values())
    assert saved["confusion_split"] == "test" and sum(saved["per_class_support"].values()) == sum(
        len(tags(d)) for d in digit_images(600, 800)[1]
    )
    # The best checkpoint was chosen by mAP: the kept model's validation mAP is the best of the history.
    assert saved["validation"]["map"] == pytest.approx(max(row["eval_map"] for row in saved["history"]))
    assert "validation mAP" in run.summary({"scratch": results}, {"scratch": out}, None)


def test_predict_prints_every_label_above_its_threshold(trained, tmp_path, capsys, caplog):
    results, out, _ = trained
    images, digits = digit_images(1500, 1540)
    for i, (image, digit) in enumerate(zip(images, digits)):
        image.save(tmp_path / f"{i:02d}_{digit}.png")
    predict.main([str(out), str(tmp_path), "--output", str(tmp_path / "predictions.json")])
    lines = capsys.readouterr().out.splitlines()[:-1]  # the last says where the file went
    # The saved predictions hold the printed labels, and so does a copy of the model inside the run folder (as
    # merged/ or checkpoint-* are), which reads the run's thresholds from the folder around it.
    saved = json.loads((tmp_path / "predictions.json").read_text())["predictions"]
    assert [f"{p['path']}: " + (", ".join(f"{t['label']} {t['score']:.4f}" for t in p["top_k"]) or
            "no label above its threshold") for p in saved] == lines  # fmt: skip
    inner = tmp_path / "run" / "copy"
    shutil.copytree(out, inner, ignore=shutil.ignore_patterns("checkpoint-*", "results.json"))
    shutil.copy(out / "results.json", inner.parent)
    assert [p.labels for p in predict.main([str(inner), *map(str, sorted(tmp_path.glob("*.png")))])] == [
        [t["label"] for t in p["top_k"]] for p in saved
    ]
    assert "thresholds are those its run chose" not in caplog.text
    # A checkpoint's thresholds are its run's too, chosen for the model the run kept: said, as it may be another one.
    checkpoint = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    predict.main([str(checkpoint), str(tmp_path / f"00_{digits[0]}.png")])
    assert f"{checkpoint}: the per-label thresholds are those its run chose on validation" in caplog.text
    capsys.readouterr()

    # Independently: the model's sigmoid probabilities against the thresholds saved in results.json.
    model, processor = predict.load_classifier(out, device="cpu")
    paths = sorted(tmp_path.glob("*.png"))
    with torch.no_grad():
        logits = model(pixel_values=predict.preprocess([Image.open(p) for p in paths], model, processor)).logits
    names = [model.config.id2label[i] for i in range(3)]
    thresholds = torch.tensor([results.per_class_threshold[n] for n in names])
    above = logits.sigmoid() >= thresholds  # (N, K)
    assert len(lines) == len(paths)
    right = 0
    for path, line, row, digit in zip(paths, lines, above, [int(p.stem.split("_")[1]) for p in paths]):
        printed = line.removeprefix(f"{path}: ")
        expected = {n for n, on in zip(names, row.tolist()) if on}
        if expected:
            assert {part.split(" ")[0] for part in printed.split(", ")} == expected, line
        else:
            assert printed == "no label above its threshold"
        right += expected == set(tags(digit))
    assert right > 40 * 0.2  # a model guessing each of three tags at random gets 1 image in 8 exactly right


def test_the_comparison_report_and_the_model_card_show_the_multi_label_figures(trained, tmp_path):
    results, out, _ = trained
    report = write_comparison([out], tmp_path / "comparison").read_text()
    assert "| Validation mAP | Test mAP | Micro F1 | Macro F1 |" in report
    assert f"| {100 * results.validation.map:.2f}% | {100 * results.test.map:.2f}% |" in report
    assert "run threshold | run AP |" in report and "Confusion matrices" not in report
    assert "so optimistic" not in report  # its F1 figures are the test split's
    # Without a test split, the F1 figures are on the images the thresholds were chosen on: said so.
    recorded = json.loads((out / "results.json").read_text())
    (untested := tmp_path / "untested").mkdir()
    (untested / "results.json").write_text(json.dumps({**recorded, "test": None, "run_name": "untested"}))
    report = write_comparison([untested], tmp_path / "comparison2").read_text()
    assert (
        "**untested**: multi-label, without a test split: its F1, precision and recall are at the per-label " in report
    )
    shutil.copytree(out, copy := tmp_path / "copy", ignore=shutil.ignore_patterns("checkpoint-*"))
    (copy / "results.json").write_text(json.dumps({**recorded, "test": None}))
    optimistic = "Without a test split, these are the validation images the thresholds were chosen on"
    assert optimistic in str(build_model_card(copy))
    card = str(build_model_card(out))
    assert optimistic not in card
    assert "| Split | mAP | Micro F1 | Macro F1 | Loss | Images |" in card and "Validation mAP |" in card
    big = [results.per_class_threshold["big"], results.per_class_precision["big"], results.per_class_recall["big"]]
    assert "| big | " + " | ".join(f"{100 * v:.2f}%" for v in big) in card
    assert "type: mean_average_precision" in card and f"value: {results.test.map}" in card
    thresholds = [round(results.per_class_threshold[name], 4) for name in results.label_names]
    assert f"thresholds = {thresholds}" in card and "p >= thresholds[i]" in card  # the card's code uses them


def test_evaluating_the_saved_model_scores_it_again_and_writes_its_predictions(trained, tmp_path):
    results, out, data = trained
    args = [*run_args(str(data), tmp_path / "eval"), "--do_train", "false"]
    again = run.main([*args, "--model_name_or_path", str(out)])["scratch"]
    assert again.multi_label and again.test.map == pytest.approx(results.test.map, abs=1e-6)
    assert again.per_class_threshold == pytest.approx(results.per_class_threshold, abs=1e-6)
    rows = list(csv.DictReader(open(tmp_path / "eval" / "predictions_test.csv")))
    assert len(rows) == 200 and rows[0]["labels"] == ";".join(
        t for t in again.label_names if t in tags(digit_images(600, 601)[1][0])
    )
    for row in rows:
        above = [n for n in again.label_names if float(row[f"{n}_probability"]) >= again.per_class_threshold[n]]
        assert row["predicted"] == ";".join(above)
    # Micro and macro F1 are those of the predicted labels (at the thresholds), in the evaluation and the training run.
    for split in ("validation", "test"):
        rows = list(csv.DictReader(open(tmp_path / "eval" / f"predictions_{split}.csv")))
        truth, predicted = ([[n in row[key].split(";") for n in again.label_names] for row in rows]
                            for key in ("labels", "predicted"))  # fmt: skip
        for average in ("micro", "macro"):
            expected = f1_score(truth, predicted, average=average)
            assert getattr(getattr(again, split), f"{average}_f1") == pytest.approx(expected), (split, average)
            assert getattr(getattr(results, split), f"{average}_f1") == pytest.approx(expected, abs=1e-6)
    assert not (tmp_path / "eval" / "confusion_matrix.png").exists()


def test_class_weights_weigh_positives_and_distillation_and_map_on_single_labels_are_refused(trained, tmp_path):
    _, out, data_dir = trained
    args = [*run_args(str(data_dir), tmp_path / "weighted"), "--class_weighting", "balanced"]
    model_args, data_args, scratch_args, training_args = parse_args(args)
    data = load_image_data(data_args, seed=training_args.seed, target_size=8)
    model_args, _ = run.choose_attention("scratch", model_args, scratch_args, training_args)
    model, processor, prep = build_model("scratch", model_args, scratch_args, data)
    trainer = run.make_trainer(model, processor, prep, data_args, training_args, data)
    positives = data.train.labels.sum(0)
    torch.testing.assert_close(trainer.class_weights, (len(data.train) - positives) / positives)
    assert trainer.loss_fn is multi_label_loss and training_args.metric_for_best_model == "map"
    single_label = parse_args(
        [*TINY_SCRATCH, "--output_dir", str(tmp_path / "single"), "--metric_for_best_model", "map"]
    )
    digits = load_image_data(single_label[1], seed=0, target_size=8)
    with pytest.raises(ValueError, match="`metric_for_best_model: map` is for data with several labels per image"):
        run.make_trainer(model, processor, prep, single_label[1], single_label[3], digits)
    training_args.teacher_model_name_or_path = str(out)  # a multi-label model of the same labels
    with pytest.raises(ValueError, match="Distillation teaches one class per image"):
        run.make_trainer(model, processor, prep, data_args, training_args, data)


def test_a_multi_label_run_fine_tunes_on_single_labels_with_their_loss(trained, tmp_path):
    _, out, _ = trained
    args = [a if a != "scratch" else "pretrained" for a in TINY_SCRATCH]
    run.main([*args, "--model_name_or_path", str(out), "--max_steps", "2", "--output_dir", str(tmp_path / "digits")])
    config = json.loads((tmp_path / "digits" / "config.json").read_text())
    assert config.get("problem_type") != "multi_label_classification" and config["id2label"]["9"] == "9"


def test_label_smoothing_of_multi_label_data_is_applied_without_transformers_false_warning(trained, tmp_path):
    """transformers warns that it disables label smoothing for multi-label models; the pipeline's BCE smooths."""
    _, _, data = trained
    losses = []
    for smoothing in ("0", "0.3"):
        args = [*run_args(str(data), tmp_path / smoothing), "--max_steps", "2", "--label_smoothing_factor", smoothing]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses.append(run.main(args)["scratch"].train.loss)
        assert not [w for w in caught if "Label smoothing" in str(w.message)]
    assert losses[0] != pytest.approx(losses[1], abs=1e-4)  # the same seed and steps: the smoothing changed the loss


def test_csv_labels_separated_by_semicolons_and_a_label_unknown_to_train(tmp_path):
    images, digits = digit_images(0, 120)
    (tmp_path / "images").mkdir()
    rows = ["image,labels"]
    for i, (image, digit) in enumerate(zip(images, digits)):
        image.save(tmp_path / "images" / f"{i}.png")
        rows.append(f"images/{i}.png,{';'.join(tags(digit))}")  # an empty cell: none of the tags
    (tmp_path / "train.csv").write_text("\n".join(rows[:101]) + "\n")
    args = run_args("unused", tmp_path / "out")
    model_args, data_args, _, training_args = parse_args([*args, "--train_file", str(tmp_path / "train.csv")])
    data = load_image_data(data_args, seed=0, target_size=8)
    assert data.multi_label and data.label_names == ["big", "even", "round"]
    both = torch.cat([data.train.labels, data.validation.labels])
    expected = torch.tensor([[t in tags(d) for t in data.label_names] for d in digits[:100]], dtype=torch.float32)
    assert both.shape == (100, 3) and torch.equal(both.sum(0), expected.sum(0))
    # `include_labels` keeps every image with only those labels, in its order.
    data_args.include_labels = ["round", "even"]
    kept = load_image_data(data_args, seed=0, target_size=8)
    assert kept.label_names == ["round", "even"] and torch.equal(kept.train.labels, data.train.labels[:, [2, 1]])

    # The validation file names a tag no training image has: one line naming it and the split, and a failed run.
    (tmp_path / "validation.csv").write_text("\n".join([rows[0], *rows[101:], "images/0.png,even;odd"]) + "\n")
    command = ["-m", "finetune.run", *args, "--train_file", str(tmp_path / "train.csv")]
    command += ["--validation_file", str(tmp_path / "validation.csv")]
    proc = run_script(command)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "The validation split has the label(s) ['odd'] that no training image has" in errors[0]
    assert "Traceback" not in proc.stderr
    # Unless `include_labels` leaves it out, as single-label data leaves out the images of such a class.
    data_args.validation_file = str(tmp_path / "validation.csv")
    kept = load_image_data(data_args, seed=0, target_size=8)
    assert kept.label_names == ["round", "even"] and kept.validation.labels[-1].tolist() == [0.0, 1.0]
    # A validation csv of one label per image has no `;`: a blank cell is still an image with none of the labels.
    (tmp_path / "single.csv").write_text("image,labels\nimages/0.png,even\nimages/1.png,\n")
    data_args.include_labels, data_args.validation_file = None, str(tmp_path / "single.csv")
    data = load_image_data(data_args, seed=0, target_size=8)
    assert data.label_names == ["big", "even", "round"] and data.validation.labels.tolist() == [[0, 1, 0], [0, 0, 0]]


def test_an_image_without_labels_and_a_label_without_training_images_are_refused(tmp_path):
    images, digits = digit_images(0, 40)
    labels = [tags(d) for d in digits]
    labels[3] = None
    write_parquet(tmp_path / "a.parquet", images, labels)
    _, data_args, _, _ = parse_args(run_args(str(tmp_path / "a.parquet"), tmp_path / "out"))
    with pytest.raises(ValueError, match=r"Image 3 of the train split has no labels \('labels' is missing\)"):
        load_image_data(data_args, seed=0, target_size=8)

    # A ClassLabel names "rare", which no image has: nothing can learn it.
    names = [*TAGS, "rare"]
    labels = [[names.index(t) for t in tags(d)] for d in digits]
    write_parquet(tmp_path / "b.parquet", images, labels, datasets.ClassLabel(names=names))
    _, data_args, _, _ = parse_args(run_args(str(tmp_path / "b.parquet"), tmp_path / "out"))
    with pytest.raises(ValueError, match=r"No training image has the label\(s\) \['rare'\]"):
        load_image_data(data_args, seed=0, target_size=8)


def test_each_threshold_maximises_its_labels_f1_and_map_is_scikit_learns():
    rng = np.random.default_rng(0)
    labels = (rng.random((80, 3)) < 0.4).astype(np.float32)
    logits = 1.5 * labels + rng.normal(size=(80, 3))  # informative and noisy
    report = multi_label_report(logits, labels, ["a", "b", "c"], logits, labels)
    probabilities = 1 / (1 + np.exp(-logits))
    for k, name in enumerate("abc"):
        best = max(f1_score(labels[:, k], probabilities[:, k] >= t) for t in probabilities[:, k])  # every cut tried
        assert f1_score(labels[:, k], probabilities[:, k] >= report["per_class_threshold"][name]) == pytest.approx(
            best
        )
        assert (
            report["per_class_f1"][name] == pytest.approx(best)
            and report["per_class_support"][name] == labels[:, k].sum()
        )
    expected = average_precision_score(labels, logits, average="macro")
    assert multi_label_scores(logits, labels)["map"] == pytest.approx(expected)
    # A label no image has counts in neither mAP nor macro F1: every prediction right scores 1, not 0.5.
    scores = multi_label_scores(np.array([[2.0, -1.0], [-1.0, -2.0], [1.0, -3.0]]), np.array([[1, 0], [0, 0], [1, 0]]))
    assert scores == {"map": 1.0, "micro_f1": 1.0, "macro_f1": 1.0}


def test_a_nan_score_is_the_lowest_not_an_error():
    """scikit-learn's average precision refused NaN ("Input contains NaN"), stopping the run's evaluation; a NaN is
    now never above a threshold and ranks below every real score (infinite scores are clipped, not refused)."""
    labels = np.array([[1, 0], [0, 1], [1, 0], [0, 0]])
    logits = np.array([[3.0, -1.0], [np.nan, 2.0], [np.nan, -np.inf], [-2.0, np.inf]])
    scores = multi_label_scores(logits, labels)
    # a: positives 0 (3.0) and 2 (NaN, ranked last) -> precision 1 at rank 1, 2/4 at rank 4: AP 0.75; b: AP 1 with
    # +inf on the one negative ranked first -> its positive (2.0) is second: AP 0.5.
    assert scores["map"] == pytest.approx((0.75 + 0.5) / 2)
    report = multi_label_report(logits, labels, ["a", "b"], logits, labels)
    assert report["per_class_average_precision"] == pytest.approx({"a": 0.75, "b": 0.5})


def test_bce_loss_with_label_smoothing_and_balanced_positive_weights():
    logits = torch.randn(6, 3)
    targets = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0], [0, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float32)
    smoothed = targets * 0.8 + 0.1
    p = logits.sigmoid()
    reference = -(smoothed * p.log() + (1 - smoothed) * (1 - p).log()).mean()
    torch.testing.assert_close(multi_label_loss(logits, targets, label_smoothing=0.2), reference)

    pos_weight = balanced_class_weights(targets, ["a", "b", "c"])
    torch.testing.assert_close(pos_weight, torch.tensor([1.0, 2.0, 2.0]))  # negatives / positives per label
    weighted = -(pos_weight * targets * p.log() + (1 - targets) * (1 - p).log()).mean()
    torch.testing.assert_close(multi_label_loss(logits, targets, pos_weight=pos_weight), weighted)
    # A label every image has still learns: its weight is 1 / positives, not 0.
    everywhere = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(balanced_class_weights(everywhere, ["a", "b", "c"]), torch.tensor([0.25, 1.0, 1.0]))


@pytest.mark.parametrize("mix", [{"mixup_alpha": 0.4}, {"cutmix_alpha": 1.0}])
def test_mixup_and_cutmix_mix_multi_hot_labels_as_they_mix_the_images(mix):
    torch.manual_seed(0)
    labels = (torch.rand(8, 5) < 0.4).float()  # (B, K) multi-hot
    # Images whose channel k is label k everywhere: the mean of a mixed image's channel is its label's mixed value,
    # for MixUp's ratio and for CutMix's area-adjusted one alike.
    images = labels[:, :, None, None].expand(-1, -1, 16, 16).clone()  # (B, K) -> (B, K, H, W)
    mixed_images, targets = MixUpCutMix(5, **mix)(images, labels)
    assert targets.shape == (8, 5)
    torch.testing.assert_close(targets, mixed_images.mean(dim=(2, 3)))
    assert not torch.equal(targets, labels)


def csv_split(path: Path, cells: list, images: Path) -> Path:
    """A csv of the digit images `images/{i}.png` (written once) with the given label cells."""
    digits, _ = digit_images(0, len(cells))
    images.mkdir(exist_ok=True)
    rows = ["image,labels"]
    for i, (image, cell) in enumerate(zip(digits, cells)):
        image.save(images / f"{i}.png")
        rows.append(f"{images.name}/{i}.png,{cell}")
    path.write_text("\n".join(rows) + "\n")
    return path


def csv_data(tmp_path: Path, train: list, validation: list | None = None, **more):
    images = tmp_path / "images"
    files = {"train_file": str(csv_split(tmp_path / "train.csv", train, images))}
    if validation is not None:
        files["validation_file"] = str(csv_split(tmp_path / "validation.csv", validation, images))
    _, data_args, _, _ = parse_args(
        [*run_args("unused", tmp_path / "out"), *sum(([f"--{k}", v] for k, v in files.items()), [])]
    )
    for key, value in more.items():
        setattr(data_args, key, value)
    return load_image_data(data_args, seed=0, target_size=8)


def test_csv_label_cells_are_stripped_and_only_the_label_column_is_split(tmp_path, caplog):
    # "cat; dog" is cat and dog, "cat;" only cat, an empty cell none of them.
    cells = ["cat; dog", "dog", "cat;", ""] * 5
    with caplog.at_level("INFO", logger="finetune.data.sources"):
        data = csv_data(tmp_path, cells, validation_size=0.2)
    assert data.label_names == ["cat", "dog"]
    both = torch.cat([data.train.labels, data.validation.labels])
    assert torch.equal(both.sum(0), torch.tensor([10.0, 10.0]))
    assert any("'labels'" in r.getMessage() and "several labels" in r.getMessage() for r in caplog.records)
    # A notes column with `;` stays text: only the label column is split.
    path = tmp_path / "notes.csv"
    path.write_text(
        "image,label,notes\n" + "".join(f"images/{i}.png,{'cat' if i % 2 else 'dog'},a;b\n" for i in range(20))
    )
    _, data_args, _, _ = parse_args([*run_args("unused", tmp_path / "out"), "--train_file", str(path)])
    assert open_source(data_args).encoded["train"]["notes"][:2] == ["a;b", "a;b"]
    notes = load_image_data(data_args, seed=0, target_size=8)
    assert not notes.multi_label and notes.label_names == ["cat", "dog"]


def test_a_split_without_semicolons_is_multi_label_when_another_split_is(tmp_path):
    # Train cells hold one label each, validation cells several: every split is read as label lists.
    data = csv_data(tmp_path, ["cat", "dog"] * 10, ["cat;dog", "dog"] * 3)
    assert data.multi_label and data.label_names == ["cat", "dog"]
    assert torch.equal(data.validation.labels[:2], torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    # Train "1;3" / "2;3" (strings) and validation cells 2 / 3 (read as ints) name the same labels.
    data = csv_data(tmp_path, ["1;3", "2;3"] * 10, [2, 3] * 3)
    assert data.label_names == ["1", "2", "3"]
    assert torch.equal(data.validation.labels[:2], torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


def test_multi_label_data_of_one_label_is_refused(tmp_path):
    images, digits = digit_images(0, 40)
    write_parquet(tmp_path / "a.parquet", images, [["cat"] if d % 2 else [] for d in digits])
    _, data_args, _, _ = parse_args(run_args(str(tmp_path / "a.parquet"), tmp_path / "out"))
    with pytest.raises(
        ValueError, match=r"Multi-label data needs at least 2 labels, got 1 \(cat\): .* `cat` or `none`"
    ):
        load_image_data(data_args, seed=0, target_size=8)


def test_a_multi_label_run_with_a_rare_label_exports_without_images(tmp_path):
    pytest.importorskip("onnxruntime", reason='the export extra is missing: pip install -e ".[export]"')
    from finetune.tools import export

    # "rare" tags two of 60 training images, neither among the 8 (of seed 0) that the export loads beside validation.
    images, digits = digit_images(0, 80)
    labels = [tags(d) + (["rare"] if i in (1, 2) else []) for i, d in enumerate(digits)]
    (tmp_path / "data").mkdir()
    write_parquet(tmp_path / "data" / "train.parquet", images[:60], labels[:60])
    write_parquet(tmp_path / "data" / "validation.parquet", images[60:], labels[60:])
    out = tmp_path / "run"
    run.main([*run_args(str(tmp_path / "data"), out), "--max_steps", "2"])
    result = export.main([str(out), "--format", "onnx"])
    assert result.num_images == export.CHECK_IMAGES and result.max_abs_difference <= export.DEFAULT_ATOL


def test_a_multi_label_model_at_chance_level_is_named(caplog):
    """A constant score ranks nothing: its mAP is each label's share of positive images; at that level the run warns
    that its model learned nothing, above it not."""
    from types import SimpleNamespace

    labels = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 1]], dtype=torch.float32)  # shares 0.5, 0.25, 1
    data = SimpleNamespace(multi_label=True, validation=SimpleNamespace(labels=labels))
    with caplog.at_level(logging.WARNING, logger="finetune.run"):
        run.warn_if_at_chance({"eval_map": 0.58}, data, 0.69)
        assert "Validation mAP 58.00% is at chance level (58.33%, a constant score; training loss 0.69)" in caplog.text
        caplog.clear()
        run.warn_if_at_chance({"eval_map": 0.58}, data, None)  # no step trained: no loss, and no "None" said
        assert "(58.33%, a constant score): the model learned nothing" in caplog.text
        caplog.clear()
        run.warn_if_at_chance({"eval_map": 0.8}, data, 0.3)
        assert not caplog.text
