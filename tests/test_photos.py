"""Photos of mixed sizes: the storage size read from the model, a folder of mixed-size JPEGs stored as center-cropped
squares, both model paths trained on it, and two processes sharing one decoded cache."""

import csv
import json
import logging
import os
import shutil

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from test_run import launch_two_processes
from transformers import BitImageProcessor, ViTConfig, ViTForImageClassification, ViTImageProcessor

from finetune import run
from finetune.arguments import DataArguments, ModelArguments, ScratchViTArguments
from finetune.data import load_image_data
from finetune.errors import run_command
from finetune.models import storage_size
from finetune.tools import compare, model_card, predict


CLASSES = ["beans", "leaves", "pods"]
# (width, height) of the photos, landscape, portrait and square; no two classes share a size pattern.
SIZES = [(40, 30), (24, 36), (32, 32), (50, 20)]


def write_photo_folder(root, per_class: int = 4, seed: int = 0):
    """JPEGs of mixed sizes in one subfolder per class; each class has its own dominant colour channel."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            width, height = SIZES[(i + k) % len(SIZES)]
            image = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
            image[..., k] += 180
            Image.fromarray(image).save(root / name / f"{i}.jpg", quality=95)
    return root


def tiny_vit_checkpoint(path, processor, labels: list[str] | None = None) -> str:
    config = ViTConfig(
        image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    if labels:
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
    ViTForImageClassification(config).save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


def test_storage_size_comes_from_the_model_with_a_crop_margin(tmp_path):
    scratch = ScratchViTArguments(image_size=224)
    assert storage_size("scratch", ModelArguments(model_type="scratch"), scratch) == 256
    vit = tiny_vit_checkpoint(tmp_path / "vit", ViTImageProcessor(size={"height": 112, "width": 112}))
    assert storage_size("pretrained", ModelArguments(model_name_or_path=vit), scratch) == 128
    # A processor that resizes then center-crops (ConvNeXt, BiT): its resize size when that is the larger.
    cropping = BitImageProcessor(size={"shortest_edge": 160}, crop_size={"height": 112, "width": 112})
    bit = tiny_vit_checkpoint(tmp_path / "bit", cropping)
    assert storage_size("pretrained", ModelArguments(model_name_or_path=bit), scratch) == 160
    assert storage_size("both", ModelArguments(model_type="both", model_name_or_path=vit), scratch) == 256
    # Without `RandomResizedCrop`, no margin: the size the saved processor resizes a photo to.
    assert storage_size("scratch", ModelArguments(model_type="scratch"), scratch, margin=False) == 224
    assert storage_size("pretrained", ModelArguments(model_name_or_path=vit), scratch, margin=False) == 112
    assert storage_size("pretrained", ModelArguments(model_name_or_path=bit), scratch, margin=False) == 160


def test_mixed_size_photos_are_stored_as_center_cropped_squares(tmp_path):
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    wide = np.zeros((20, 60, 3), np.uint8)  # left third red, middle green, right third blue
    wide[:, :20, 0], wide[:, 20:40, 1], wide[:, 40:, 2] = 255, 255, 255
    for copy in (1, 2):  # two of each: a classifier is trained on two classes or more
        Image.fromarray(wide).save(root / "a" / f"wide{copy}.png")
        Image.fromarray(np.full((30, 10, 3), 128, np.uint8)).save(root / "b" / f"tall{copy}.png")
    args = DataArguments(dataset_name=str(root), validation_size=0.5, decoded_cache_dir="none")
    data = load_image_data(args, seed=0, target_size=20)  # the wide photo needs no resize, only the crop
    assert data.train.image_size == (20, 20) and data.validation.image_size == (20, 20)
    images = {
        int(label): split.pixel_values[i]
        for split in (data.train, data.validation)
        for i, label in enumerate(split.labels)
    }
    # The wide photo keeps its green middle only, with its aspect ratio (no squeeze).
    assert images[0][1].min() == 255 and images[0][0].max() == 0 and images[0][2].max() == 0
    assert int(images[1].float().mean().round()) == 128


def test_a_folder_of_mixed_size_photos_loads_without_options(tmp_path):
    root = write_photo_folder(tmp_path / "photos")
    data = load_image_data(DataArguments(dataset_name=str(root), decoded_cache_dir="none"), seed=0, target_size=18)
    assert data.train.image_size == (18, 18) and len(data.train) + len(data.validation) == 12
    # Each class's own colour channel dominates after decoding and cropping.
    for split in (data.train, data.validation):
        means = split.pixel_values.float().mean(dim=(2, 3))  # (N, C, H, W) -> (N, C)
        assert means.argmax(dim=1).tolist() == split.labels.tolist()


# A tiny ViT at 16 px over a folder of photos, one epoch, no option about image sizes or augmentation.
TINY_RUN = [
    "--image_size", "16", "--patch_size", "4", "--hidden_size", "16", "--num_hidden_layers", "1",
    "--num_attention_heads", "2", "--intermediate_size", "32", "--per_device_train_batch_size", "4",
    "--per_device_eval_batch_size", "4", "--num_train_epochs", "1", "--validation_size", "3", "--seed", "0",
    "--report_to", "none",
]  # fmt: skip


@pytest.mark.parametrize("model_type", ["scratch", "pretrained"])
def test_both_model_paths_train_on_a_folder_of_mixed_size_photos(tmp_path, model_type, caplog):
    photos = write_photo_folder(tmp_path / "photos")
    args = [*TINY_RUN, "--model_type", model_type, "--dataset_name", str(photos)]
    args += ["--decoded_cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "run")]
    if model_type == "pretrained":
        processor = ViTImageProcessor(size={"height": 16, "width": 16})
        args += ["--model_name_or_path", tiny_vit_checkpoint(tmp_path / "checkpoint", processor)]
    with caplog.at_level(logging.INFO):
        results = run.main(args)[model_type]
    assert results.num_samples == {"train": 9, "validation": 3, "test": None}
    assert results.image_size == 16
    # Stored at 16 * 256 / 224 = 18 px, cropped at random to 16 px for training: RandomResizedCrop chosen by itself.
    assert "image size 18x18" in caplog.text
    assert "Training augmentation: RandomResizedCrop(scale=(0.08, 1.0)" in caplog.text
    assert "evaluation: resize to 16x16" in caplog.text
    assert "random_crop_padding" not in caplog.text  # left at its default: nothing to say


def test_a_run_scored_in_part_on_its_training_photos_says_so_in_its_results_report_and_card(tmp_path):
    photos = write_photo_folder(tmp_path / "train")
    validation = write_photo_folder(tmp_path / "validation", per_class=1, seed=1)
    shutil.copy(photos / "beans" / "2.jpg", validation / "beans" / "seen.jpg")  # a training photo saved twice
    args = [*TINY_RUN, "--model_type", "scratch", "--train_file", str(photos), "--validation_file", str(validation)]
    args += ["--decoded_cache_dir", "none", "--output_dir", str(tmp_path / "run")]
    results = run.main(args)["scratch"]
    assert results.training_image_copies == {"validation": 1}
    assert json.loads((tmp_path / "run" / "results.json").read_text())["training_image_copies"] == {"validation": 1}
    note = "1 of its 4 validation images has the pixels of training images (a photo saved twice): its validation "
    report = compare.write_comparison([tmp_path / "run"], tmp_path / "report").read_text()
    assert f"**run**: {note}figures read high." in report
    card = model_card.main([str(tmp_path / "run")]).read_text()
    assert f"**Scored in part on training images**: {note}figures read high." in card


@pytest.mark.parametrize("choice", ["auto", "false"])
def test_a_padding_that_randomresizedcrop_replaces_is_named_as_ignored(tmp_path, choice, caplog):
    # `--random_crop_padding 0` meant "no crop"; photos stored larger than the model get RandomResizedCrop instead.
    args = [*TINY_RUN, "--model_type", "scratch", "--dataset_name", str(write_photo_folder(tmp_path / "photos"))]
    args += ["--random_crop_padding", "0", "--random_resized_crop", choice, "--decoded_cache_dir", "none"]
    # And the reverse: RandomResizedCrop's box options where the padded crop trains; and a pretrained model's options,
    # which a ScratchViT, new and random, ignores (a run's folder meant to train on from).
    args += ["--crop_scale", "0.5", "1", "--model_name_or_path", str(tmp_path)]
    run.main([*args, "--max_steps", "1", "--output_dir", str(tmp_path / "run")])
    warnings = [r.getMessage() for r in caplog.records if "random_crop_padding" in r.getMessage()]
    expected = "`random_crop_padding: 0` is ignored: training crops with RandomResizedCrop (`random_resized_crop: auto"
    assert [w.startswith(expected) for w in warnings] == ([True] if choice == "auto" else [])
    warnings = [r.getMessage() for r in caplog.records if "`crop_scale` ignored" in r.getMessage()]
    expected = "`crop_scale` ignored: training crops with the padded random crop, not RandomResizedCrop"
    assert [w.startswith(expected) for w in warnings] == ([True] if choice == "false" else [])
    expected = "--model_name_or_path: ignored by `model_type: scratch`, which trains a new ScratchViT from random"
    assert expected in caplog.text


@pytest.mark.slow
def test_two_processes_share_one_decoded_cache(tmp_path):
    photos = write_photo_folder(tmp_path / "photos")
    out, cache = tmp_path / "run", tmp_path / "cache"
    args = [*TINY_RUN, "--model_type", "scratch", "--dataset_name", str(photos), "--decoded_cache_dir", str(cache)]
    args += ["--output_dir", str(out), "--log_level_replica", "info"]  # the second process logs what it does too
    proc = launch_two_processes(args, tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert json.loads((out / "results.json").read_text())["hyperparameters"]["world_size"] == 2
    assert "Process 0 of 2" in log and "Process 1 of 2" in log
    # One process decoded the split (train and validation come from it); the other mapped the file it wrote.
    assert log.count("Decoded 12 images of the train split") == 1, log[-3000:]
    assert log.count("skipped decoding") == 1, log[-3000:]
    assert len([entry for entry in os.listdir(cache) if not entry.startswith(".")]) == 1


def evaluate_files(tmp_path, paths):
    """An evaluation-only run of a tiny ViT (16 px) on `paths` (labelled by their folder) into tmp_path/evaluation:
    the model's folder, the rows of its predictions CSV and their top-3 probabilities (N, 3)."""
    index = tmp_path / "index.csv"
    index.write_text("image,label\n" + "".join(f"{path},{path.parent.name}\n" for path in paths))
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    model_dir = tiny_vit_checkpoint(tmp_path / "checkpoint", processor, labels=CLASSES)
    run.main(
        ["--do_train", "false", "--model_name_or_path", model_dir, "--train_file", str(index),
         "--validation_file", str(index), "--decoded_cache_dir", "none", "--bf16", "false",
         "--output_dir", str(tmp_path / "evaluation"), "--report_to", "none"]
    )  # fmt: skip
    with open(tmp_path / "evaluation" / "predictions_validation.csv") as f:
        rows = list(csv.DictReader(f))
    return model_dir, rows, np.array([[float(row[f"top{k}_probability"]) for k in (1, 2, 3)] for row in rows])


def test_predict_gives_each_photo_the_probabilities_evaluation_gives(tmp_path):
    """Predict frames, resizes and normalizes a photo as training's evaluation does: its probabilities for a folder of
    mixed-size photos equal those in an evaluation-only run's predictions CSV, where the processor's own resize
    (which squeezes a photo that is not square into the model's square) gives other ones."""
    photos = write_photo_folder(tmp_path / "photos")
    large = np.random.default_rng(1).integers(0, 256, (200, 300, 3), dtype=np.uint8)
    Image.fromarray(large).save(photos / "pods" / "large.jpg")  # decoded at 1/8 scale by both paths (JPEG draft)
    paths = sorted(photos.rglob("*.jpg"))
    model_dir, rows, evaluation = evaluate_files(tmp_path, paths)

    model, processor = predict.load_classifier(model_dir, device="cpu")
    predictions, skipped = predict.predict_files(model, processor, paths, top_k=3)
    assert not skipped and [p.path for p in predictions] == [str(path) for path in paths]
    assert [p.labels[0] for p in predictions] == [row["top1"] for row in rows]
    np.testing.assert_allclose(np.array([p.scores for p in predictions]), evaluation, atol=2e-6)

    images, _, _ = predict.load_images(paths, "RGB")
    squeezed = processor([np.asarray(image) for image in images], return_tensors="pt")["pixel_values"]
    squeezed = predict.class_probabilities(model, squeezed).sort(dim=-1, descending=True).values.numpy()
    not_square = [i for i, image in enumerate(images) if image.width != image.height]
    assert np.abs(squeezed[not_square] - evaluation[not_square]).max() > 1e-4


def predict_gives_the_evaluations_scores(tmp_path, train, validation) -> list[int]:
    """Scores the `validation` files in an evaluation-only run of a tiny ViT (16 px) with `train` as its train split,
    checks that predict, given the run's results.json, gives each file the evaluation's probabilities, and returns the
    size the run stored its images at."""
    for name, paths in (("train.csv", train), ("val.csv", validation)):
        (tmp_path / name).write_text("image,label\n" + "".join(f"{p},{p.parent.name}\n" for p in paths))
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    model_dir = tiny_vit_checkpoint(tmp_path / "checkpoint", processor, labels=CLASSES)
    run.main(
        ["--do_train", "false", "--model_name_or_path", model_dir, "--train_file", str(tmp_path / "train.csv"),
         "--validation_file", str(tmp_path / "val.csv"), "--decoded_cache_dir", "none", "--bf16", "false",
         "--output_dir", str(tmp_path / "evaluation"), "--report_to", "none"]
    )  # fmt: skip
    with open(tmp_path / "evaluation" / "predictions_validation.csv") as f:
        rows = list(csv.DictReader(f))
    evaluation = np.array([[float(row[f"top{k}_probability"]) for k in (1, 2, 3)] for row in rows])
    results = (tmp_path / "evaluation" / "results.json").read_text()
    (tmp_path / "checkpoint" / "results.json").write_text(results)
    predictions = predict.main([model_dir, *[row["file"] for row in rows], "--top_k", "3"])
    assert sorted(p.path for p in predictions) == sorted(map(str, validation))
    np.testing.assert_allclose(np.array([p.scores for p in predictions]), evaluation, atol=2e-6)
    return json.loads(results)["stored_image_size"]


def test_a_split_of_one_small_size_is_stored_as_the_train_photos_are(tmp_path):
    """Train photos of mixed sizes are stored as centre squares; validation images that all share one size small
    enough to store whole were stored whole, and evaluated squeezed, a view that neither training nor predict (which
    frames the centre square of every image) gives: probabilities 3.5e-3 from predict's for the same files."""
    train = sorted(write_photo_folder(tmp_path / "photos").rglob("*.jpg"))
    rng, validation = np.random.default_rng(3), []
    for k, name in enumerate(CLASSES):
        (tmp_path / "val" / name).mkdir(parents=True)
        for i in range(3):
            image = rng.integers(0, 256, (12, 24, 3), dtype=np.uint8)  # small enough to store whole at 16 px
            image[:, :4, k] = 255
            validation.append(tmp_path / "val" / name / f"{i}.png")
            Image.fromarray(image).save(validation[-1])
    assert predict_gives_the_evaluations_scores(tmp_path, train, validation) == [16, 16]  # as the processor resizes


def test_predict_resizes_whole_images_where_training_stored_them_whole(tmp_path):
    """Images that all have one size that is not square are stored whole and resized by evaluation, edges included:
    predict reads that from the run's results.json and does the same (a centre square would drop the edges)."""
    rng = np.random.default_rng(2)
    for k, name in enumerate(CLASSES):
        (tmp_path / "wide" / name).mkdir(parents=True)
        for i in range(3):
            image = rng.integers(0, 256, (16, 48, 3), dtype=np.uint8)
            image[:, :8, k] = 255  # each class marked at the left edge only
            Image.fromarray(image).save(tmp_path / "wide" / name / f"{i}.png")
    paths = sorted((tmp_path / "wide").rglob("*.png"))
    model_dir, _, evaluation = evaluate_files(tmp_path, paths)
    assert json.loads((tmp_path / "evaluation" / "results.json").read_text())["stored_image_size"] == [16, 48]

    (tmp_path / "checkpoint" / "results.json").write_text((tmp_path / "evaluation" / "results.json").read_text())
    predictions = predict.main([model_dir, str(tmp_path / "wide"), "--top_k", "3"])
    assert [p.path for p in predictions] == [str(path) for path in paths]
    np.testing.assert_allclose(np.array([p.scores for p in predictions]), evaluation, atol=2e-6)
    model, processor = predict.load_classifier(model_dir, device="cpu")
    cropped, _ = predict.predict_files(model, processor, paths, top_k=3)  # no run's results: centre squares
    assert np.abs(np.array([p.scores for p in cropped]) - evaluation).max() > 1e-4


def test_photos_of_mixed_sizes_are_framed_as_whole_train_images_that_are_not_square(tmp_path):
    """Train images all 48x16 are stored whole; validation photos of mixed sizes were stored as centre squares, a view
    that neither training nor predict gives (the three disagreed by 5 points on a run of digits): they are centre
    fitted at 48x16 as the train images, and predict, reading that size in results.json, gives the evaluation's
    scores."""
    rng, files = np.random.default_rng(4), {"train": [], "val": []}
    for split, sizes in (("train", [(16, 48)] * 3), ("val", [(20, 30), (40, 24), (12, 12)])):
        for k, name in enumerate(CLASSES):
            (tmp_path / split / name).mkdir(parents=True)
            for i, (height, width) in enumerate(sizes):
                image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                image[:, : width // 4, k] = 255
                files[split].append(tmp_path / split / name / f"{i}.png")
                Image.fromarray(image).save(files[split][-1])
    assert predict_gives_the_evaluations_scores(tmp_path, files["train"], files["val"]) == [16, 48]


def test_each_prediction_names_its_photo_by_file_and_position_in_the_source(tmp_path, caplog):
    """An evaluation's predictions CSV names each photo by its file in the dataset folder and its position in the
    source split (the corrupt-image warning's numbering), for a validation split held out from train and after a
    skipped corrupt photo: each row's file, opened by predict, gets the row's probabilities."""
    photos = write_photo_folder(tmp_path / "photos", per_class=6)
    (photos / "beans" / "0broken.jpg").write_bytes(b"not a jpeg")
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    model_dir = tiny_vit_checkpoint(tmp_path / "checkpoint", processor, labels=CLASSES)
    with caplog.at_level(logging.WARNING):
        run.main(
            ["--do_train", "false", "--model_name_or_path", model_dir, "--dataset_name", str(photos),
             "--validation_size", "9", "--decoded_cache_dir", "none", "--bf16", "false",
             "--output_dir", str(tmp_path / "evaluation"), "--report_to", "none"]
        )  # fmt: skip
    with open(tmp_path / "evaluation" / "predictions_validation.csv") as f:
        rows = list(csv.DictReader(f))
    source = datasets.load_dataset("imagefolder", data_dir=str(photos), split="train")
    files = [
        os.path.relpath(image["path"], photos)
        for image in source.cast_column("image", datasets.Image(decode=False))["image"]
    ]
    assert f"index {files.index('beans/0broken.jpg')} ({photos / 'beans' / '0broken.jpg'})" in caplog.text
    assert len(rows) == 9 and all(files[int(row["index"])] == row["file"] for row in rows)
    assert all(row["file"].split("/")[0] == row["label"] for row in rows)
    model, processor = predict.load_classifier(model_dir, device="cpu")
    predictions, _ = predict.predict_files(model, processor, [photos / row["file"] for row in rows], top_k=3)
    evaluation = [[float(row[f"top{k}_probability"]) for k in (1, 2, 3)] for row in rows]
    np.testing.assert_allclose([p.scores for p in predictions], evaluation, atol=2e-6)


def write_framed_photos(root, per_class: int = 12):
    """Class `centre_red`: red squares, and wide and tall photos whose centre square is red and whose sides are blue;
    class `centre_blue` the other way round. Only the centre square tells them apart."""
    colours = {"centre_red": ((255, 0, 0), (0, 0, 255)), "centre_blue": ((0, 0, 255), (255, 0, 0))}
    for name, (centre, sides) in colours.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            width, height = [(32, 32), (96, 32), (32, 96)][i % 3]
            image = np.full((height, width, 3), sides, np.uint8)
            top, left = (height - 32) // 2, (width - 32) // 2
            image[top : top + 32, left : left + 32] = centre
            Image.fromarray(image).save(root / name / f"{i}.png")
    return root


@pytest.mark.parametrize("model_type", ["scratch", "pretrained"])
def test_the_saved_processor_frames_photos_as_predict_does(tmp_path, model_type):
    """`pipeline()` and the model card's code, which load the run's preprocessor_config.json, take the centre square of
    a wide or tall photo, as training stored it and predict frames it: same top label, same probabilities (up to
    resampling). A processor that squeezes the whole photo sees mostly the sides, the other class's colour."""
    from transformers import pipeline

    photos = write_framed_photos(tmp_path / "photos")
    args = [*TINY_RUN, "--model_type", model_type, "--dataset_name", str(photos), "--num_train_epochs", "4"]
    args += ["--learning_rate", "3e-3", "--decoded_cache_dir", "none", "--output_dir", str(tmp_path / "run")]
    if model_type == "pretrained":
        processor = ViTImageProcessor(size={"height": 16, "width": 16})
        args += ["--model_name_or_path", tiny_vit_checkpoint(tmp_path / "checkpoint", processor)]
    run.main(args)
    out = str(tmp_path / "run")
    not_square = sorted(path for path in photos.rglob("*.png") if Image.open(path).size != (32, 32))

    model, processor = predict.load_classifier(out, device="cpu")
    assert predict.model_preprocessing(model, processor).image_size == (16, 16)  # as training read it
    predictions, _ = predict.predict_files(model, processor, not_square, top_k=2)
    assert [p.labels[0] for p in predictions] == [path.parent.name for path in not_square]  # it learned the centres
    classifier = pipeline("image-classification", model=out, trust_remote_code=model_type == "scratch", top_k=2)
    served = classifier([str(path) for path in not_square])
    assert [s[0]["label"] for s in served] == [p.labels[0] for p in predictions]
    np.testing.assert_allclose([[s[0]["score"] for s in served]], [[p.scores[0] for p in predictions]], atol=1e-3)


def test_without_random_resized_crop_the_saved_processor_gives_evaluations_pixels(tmp_path):
    """32 px images for an 8 px model were stored at 9 px (a margin for crops that were not drawn), so evaluation
    resized them twice and `pipeline()` once: 95% against 83% on digits."""
    from transformers import AutoImageProcessor

    rng = np.random.default_rng(0)
    for name in CLASSES:
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(4):
            image = np.kron(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), np.ones((4, 4, 1), np.uint8))
            Image.fromarray(image).save(tmp_path / "photos" / name / f"{i}.png")  # 32 px, sharp 4 px blocks
    args = [*TINY_RUN, "--model_type", "scratch", "--dataset_name", str(tmp_path / "photos"), "--image_size", "8"]
    args += ["--random_resized_crop", "false", "--decoded_cache_dir", "none", "--output_dir", str(tmp_path / "run")]
    run.main(args)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["stored_image_size"] == [8, 8]
    files = sorted((tmp_path / "photos").rglob("*.png"))
    model, processor = predict.load_classifier(tmp_path / "run", device="cpu")
    evaluated = predict.preprocess(predict.load_images(files, "RGB")[0], model, processor, stored_size=[8, 8])
    served = AutoImageProcessor.from_pretrained(tmp_path / "run")(images=[Image.open(f) for f in files])
    torch.testing.assert_close(torch.as_tensor(np.asarray(served.pixel_values)), evaluated, rtol=0, atol=1e-5)


def test_a_resume_that_would_store_the_photos_at_another_size_is_refused(tmp_path, capsys):
    """`random_resized_crop: false` stores them without the crops' margin: a run resumed so went on (and scored its
    best model) on other pixels than its first evaluations, without a word."""
    photos = write_photo_folder(tmp_path / "photos")
    args = [*TINY_RUN, "--model_type", "scratch", "--dataset_name", str(photos), "--decoded_cache_dir", "none",
            "--output_dir", str(tmp_path / "run"), "--num_train_epochs", "2"]  # fmt: skip
    run.main([*args, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "3", "--eval_strategy", "steps",
              "--eval_steps", "3"])  # fmt: skip
    resume = [*args, "--resume_from_checkpoint", "true", "--random_resized_crop", "false"]
    assert run_command(run.main, resume) == 1
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "was trained with stored_image_size [18, 18] (now [16, 16]): its evaluations so far (of images" in line


def test_scoring_a_scratch_run_on_its_photos_gives_its_figures_without_its_options(tmp_path):
    """An evaluation-only run of a saved ScratchViT stores the photos at that model's size (its processor), not at the
    size the ScratchViT options of the command would build: without them it scored other pixels than the run did."""
    photos = write_photo_folder(tmp_path / "photos", per_class=6)
    out = tmp_path / "run"
    run.main([*TINY_RUN, "--model_type", "scratch", "--dataset_name", str(photos), "--decoded_cache_dir", "none",
              "--output_dir", str(out)])  # fmt: skip
    trained = json.loads((out / "results.json").read_text())
    run.main(["--model_type", "scratch", "--do_train", "false", "--model_name_or_path", str(out), "--dataset_name",
              str(photos), "--validation_size", "3", "--seed", "0", "--decoded_cache_dir", "none", "--report_to",
              "none", "--output_dir", str(tmp_path / "scored")])  # fmt: skip
    scored = json.loads((tmp_path / "scored" / "results.json").read_text())
    assert scored["stored_image_size"] == trained["stored_image_size"] == [18, 18]
    assert scored["validation"]["loss"] == pytest.approx(trained["validation"]["loss"], rel=1e-5)
