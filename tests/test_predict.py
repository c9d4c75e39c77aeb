"""Prediction on image files of every kind, with both kinds of model, at the training and at other resolutions."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_runs import make_images, make_run_dir, run_trained_on_photos, tiny_scratch_model, tiny_vit_model
from PIL import Image
from test_backbones import checkpoint, needs_timm

from finetune.augment import photo_size
from finetune.models import LORA_DEFAULT_TARGETS
from finetune.results import Results
from finetune.tools import predict


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    models = {
        "scratch-learned": tiny_scratch_model(),
        "scratch-sinusoidal-mean": tiny_scratch_model(position_embedding_type="sinusoidal", pooling="mean", seed=1),
        "scratch-gray": tiny_scratch_model(num_channels=1, seed=2),
        "vit": tiny_vit_model(seed=3),
    }
    return {
        name: make_run_dir(root / name, "pretrained" if name == "vit" else "scratch", model=model, extras=False)
        for name, model in models.items()
    }


def test_collect_image_paths_recurses_and_keeps_explicit_files(images):
    folder = images["jpg"].parent
    found = predict.collect_image_paths([folder])
    expected = {p for name, p in images.items()}  # broken.jpg is named like an image: found, then skipped
    assert set(found) == expected
    assert predict.collect_image_paths([folder / "notes.txt"]) == [folder / "notes.txt"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        predict.collect_image_paths([folder / "missing.png"])


def test_a_folders_heic_photos_are_named_not_left_out_without_a_word(tmp_path, caplog):
    """iPhones' HEIC photos in a folder were left out of predict's output without a word (training names them)."""
    (tmp_path / "phone").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "phone" / "IMG_0001.JPG")
    for name in ("IMG_0002.HEIC", "IMG_0003.heic"):
        (tmp_path / "phone" / name).write_bytes(b"\x00\x00\x00\x18ftypheic")
    with caplog.at_level("WARNING"):
        assert predict.collect_image_paths([tmp_path / "phone"]) == [tmp_path / "phone" / "IMG_0001.JPG"]
    assert "Leaving out 2 photo(s) of" in caplog.text and "IMG_0002.HEIC): convert them to JPEG or PNG" in caplog.text


def test_collect_image_paths_follows_links_to_folders(images, tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "linked").symlink_to(images["jpg"].parent, target_is_directory=True)
    found = predict.collect_image_paths([tmp_path / "photos"])
    assert sorted(p.name for p in found) == sorted(p.name for p in images.values())
    # A link back up (a loop) found each image 40 times, through up/up/up/...; a second link to the same folder twice.
    (tmp_path / "photos" / "linked_again").symlink_to(images["jpg"].parent, target_is_directory=True)
    (tmp_path / "photos" / "up").symlink_to(tmp_path / "photos", target_is_directory=True)
    found = predict.collect_image_paths([tmp_path / "photos"])
    assert sorted(p.name for p in found) == sorted(p.name for p in images.values())


def test_a_folder_gives_the_files_training_reads_of_it(tmp_path):
    """datasets' imagefolder, which reads training's image folders, reads .jfif and leaves out hidden files and
    folders and `__*` folders (macOS's __MACOSX): predict reads the same files of a folder."""
    import datasets

    names = ["cat/a.jpg", "cat/b.jfif", "cat/C.JPG", "dog/sub/d.png", "cat/.h.jpg", "cat/.thumbnails/t.jpg"]
    for name in [*names, "cat/__MACOSX/m.jpg", ".cache/x/e.png"]:
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "photos" / name, format="PNG")
    (tmp_path / "photos" / "dog" / "notes.txt").write_text("not an image")
    found = [str(p.relative_to(tmp_path / "photos")) for p in predict.collect_image_paths([tmp_path / "photos"])]
    assert found == ["cat/C.JPG", "cat/a.jpg", "cat/b.jfif", "dog/sub/d.png"]
    loaded = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "photos"), cache_dir=str(tmp_path / "hf"))
    read = loaded["train"].cast_column("image", datasets.Image(decode=False))["image"]
    assert sorted(os.path.relpath(image["path"], tmp_path / "photos") for image in read) == sorted(found)


@pytest.mark.parametrize("name", ["scratch-learned", "scratch-sinusoidal-mean", "scratch-gray", "vit"])
def test_predictions_on_every_kind_of_image(run_dirs, images, name):
    model, processor = predict.load_classifier(run_dirs[name])
    paths = predict.collect_image_paths([images["jpg"].parent])
    predictions, skipped = predict.predict_files(model, processor, paths, top_k=2, batch_size=3)
    assert [path for path, _ in skipped] == [str(images["broken"])]
    assert "UnidentifiedImageError" in skipped[0][1]
    assert len(predictions) == len(paths) - 1
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    for p in predictions:
        assert sum(p.probabilities) == pytest.approx(1.0, abs=1e-5)
        assert len(p.labels) == 2 and p.scores[0] >= p.scores[1]
        assert p.labels[0] == labels[int(np.argmax(p.probabilities))]


@pytest.mark.parametrize("name", ["scratch-learned", "vit"])
def test_top1_is_argmax_of_the_models_logits(run_dirs, images, name):
    model, processor = predict.load_classifier(run_dirs[name])
    [p], _ = predict.predict_files(model, processor, [images["jpg"]], top_k=3)
    # 53x37: decoded at half scale (JPEG draft) and framed as its centre square, as training stores photos
    size = photo_size(predict.model_preprocessing(model, processor))
    decoded, _, _ = predict.load_images([images["jpg"]], "RGB", size)
    pixel_values = predict.preprocess(decoded, model, processor)
    with torch.no_grad():
        logits = model(pixel_values=pixel_values).logits[0]
    assert p.labels[0] == model.config.id2label[int(logits.argmax())]
    np.testing.assert_allclose(p.probabilities, logits.softmax(-1).numpy(), rtol=1e-5, atol=1e-6)


def test_a_run_evaluated_with_flip_tta_is_predicted_with_it(run_dirs, images, tmp_path):
    """Its figures and multi-label thresholds are of the mean logits with the mirror image: predict used one view."""
    run = Path(shutil.copytree(run_dirs["scratch-learned"], tmp_path / "run"))
    results = json.loads((run / "results.json").read_text())
    results["hyperparameters"]["flip_tta"] = True
    (run / "results.json").write_text(json.dumps(results))
    [p] = predict.main([str(run), str(images["jpg"])])
    model, processor = predict.load_classifier(run)
    size = photo_size(predict.model_preprocessing(model, processor))
    pixel_values = predict.preprocess(predict.load_images([images["jpg"]], "RGB", size)[0], model, processor)
    with torch.no_grad():
        logits = (model(pixel_values=pixel_values).logits + model(pixel_values=pixel_values.flip(-1)).logits) / 2
    np.testing.assert_allclose(p.probabilities, logits[0].softmax(-1).numpy(), rtol=1e-5, atol=1e-6)
    [one_view] = predict.main([str(run_dirs["scratch-learned"]), str(images["jpg"])])
    assert not np.allclose(one_view.probabilities, p.probabilities, atol=1e-4)


@pytest.mark.parametrize("name", ["scratch-learned", "scratch-sinusoidal-mean", "vit"])
def test_other_resolution(run_dirs, images, name):
    model, processor = predict.load_classifier(run_dirs[name])
    assert model.config.image_size == 16
    pixel_values = predict.preprocess([Image.open(images["png"]).convert("RGB")], model, processor, image_size=24)
    assert pixel_values.shape == (1, 3, 24, 24)
    with pytest.raises(ValueError):  # without interpolation the model refuses another grid
        model(pixel_values=pixel_values)
    predictions, skipped = predict.predict_files(model, processor, [images["png"], images["gray"]], image_size=24)
    assert len(predictions) == 2 and not skipped
    for p in predictions:
        assert sum(p.probabilities) == pytest.approx(1.0, abs=1e-5)
    probabilities = predict.class_probabilities(model, pixel_values, interpolate_pos_encoding=True)
    np.testing.assert_allclose(predictions[0].probabilities, probabilities[0].numpy(), rtol=1e-5, atol=1e-6)


def test_a_larger_image_size_sees_the_detail_a_run_of_stored_photos_framed_away(tmp_path):
    """A run that stored its photos at its 16 px input, predicted at `--image_size 32`, framed each photo at 16 px
    first: 1-px stripes became uniform grey before the model saw them (exit 0, other probabilities). The stored size
    now scales with the input; data of a lower resolution of its own (8 px for a 16 px model) stays as stored."""
    model, processor = predict.load_classifier(make_run_dir(tmp_path / "run", "scratch", extras=False))
    stripes = tmp_path / "stripes.png"
    Image.fromarray(np.tile(np.array([[255], [0]], dtype=np.uint8), (16, 32))).save(stripes)
    assert predict.stored_size_at([16, 16], model, processor, 32) == [32, 32]
    assert predict.stored_size_at([18, 18], model, processor, 32) == [36, 36]  # RandomResizedCrop's margin
    assert predict.stored_size_at([8, 8], model, processor, 32) == [8, 8]
    assert predict.stored_size_at([16, 16], model, processor, None) == [16, 16]
    [p], _ = predict.predict_files(model, processor, [stripes], image_size=32, stored_size=[16, 16])
    image = Image.open(stripes).convert("RGB")
    for stored, same in (([32, 32], True), ([16, 16], False)):
        pixel_values = predict.preprocess([image], model, processor, image_size=32, stored_size=stored)
        if stored == [32, 32]:
            assert pixel_values[0, 0, :2, 0].tolist() == [1.0, -1.0]  # the stripes reach the model
        probabilities = predict.class_probabilities(model, pixel_values, interpolate_pos_encoding=True)[0].numpy()
        assert np.allclose(p.probabilities, probabilities, atol=1e-6) == same


def test_image_size_keeps_the_part_of_the_image_a_cropping_processors_evaluation_sees(images, tmp_path):
    """A processor that resizes to 18 and center-crops 16 (a DeiT's 256 and 224): `--image_size 16`, the model's own
    size, predicts as without it, and other sizes crop the same part of the image (36 and 32 for 32)."""
    from transformers import ViTImageProcessor

    run = make_run_dir(tmp_path / "run", "pretrained", model=tiny_vit_model(seed=3), extras=False)
    crop = {"height": 16, "width": 16}
    ViTImageProcessor(size={"shortest_edge": 18}, do_center_crop=True, crop_size=crop).save_pretrained(run)
    [native] = predict.main([str(run), str(images["jpg"])])
    [same_size] = predict.main([str(run), str(images["jpg"]), "--image_size", "16"])
    assert same_size.probabilities == native.probabilities
    model, processor = predict.load_classifier(run)
    prep = predict.model_preprocessing(model, processor, image_size=32)
    assert (prep.image_size, prep.resize_size) == ((32, 32), (36, 36))


def test_load_images_modes(images, tmp_path):
    def load(path, mode):
        loaded, _, skipped = predict.load_images([path], mode)
        assert not skipped
        return loaded[0]

    assert load(images["gray"], "RGB").mode == "RGB"
    assert load(images["rgba"], "L").mode == "L"
    assert load(images["palette"], "RGB").size == (33, 17)
    transparent = tmp_path / "transparent.png"
    Image.new("RGBA", (4, 4), (0, 0, 0, 0)).save(transparent)
    assert load(transparent, "RGB").getpixel((0, 0)) == (255, 255, 255)  # composited on white


def test_cli_json_and_csv(run_dirs, images, tmp_path, capsys):
    folder = images["jpg"].parent
    json_path = tmp_path / "preds.json"
    predictions = predict.main([str(run_dirs["vit"]), str(folder), "--top-k", "5", "--output", str(json_path)])
    out, err = capsys.readouterr()
    assert f"{images['jpg']}: " in out and f"Wrote {len(images) - 1} prediction(s)" in out
    assert "Skipped 1 unreadable file(s): " + str(images["broken"]) in err
    payload = json.loads(json_path.read_text())
    assert [p["path"] for p in payload["predictions"]] == [p.path for p in predictions]
    assert payload["skipped"][0]["path"] == str(images["broken"])
    first = payload["predictions"][0]
    assert len(first["top_k"]) == 3  # top-k is capped at the number of classes
    assert first["label"] == first["top_k"][0]["label"] and first["score"] == pytest.approx(predictions[0].scores[0])

    csv_path = tmp_path / "preds.csv"
    predict.main([str(run_dirs["scratch-gray"]), str(images["rgba"]), str(images["bmp"]), "--output", str(csv_path)])
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["path"] for row in rows] == [str(images["rgba"]), str(images["bmp"])]
    assert {"top1_label", "top1_probability", "top3_label"} <= set(rows[0])
    assert float(rows[0]["top1_probability"]) >= float(rows[0]["top2_probability"])


def test_image_size_must_fit_the_patches(run_dirs, images, capsys):
    model, processor = predict.load_classifier(run_dirs["vit"])
    with pytest.raises(ValueError, match=r"multiple of the model's patch size \(4\), got 18. Try 16"):
        predict.predict_files(model, processor, [images["jpg"]], image_size=18)
    with pytest.raises(ValueError, match="multiple of the model's patch size"):  # one `error:` line
        predict.main([str(run_dirs["vit"]), str(images["jpg"]), "--image-size", "18"])


@pytest.mark.parametrize("device, message", [("bogus", r"is not a torch device: use cpu"), ("cuda:7", r"has (no|\d)")])
def test_a_device_this_machine_lacks_is_refused_with_the_fix(run_dirs, images, device, message):
    """torch's own errors listed every device type it knows, or named the missing NVIDIA driver, without the fix."""
    with pytest.raises(ValueError, match=rf"^`--device {device}`.*{message}"):
        predict.main([str(run_dirs["vit"]), str(images["jpg"]), "--device", device])


@pytest.mark.parametrize("command", ["predict", "attention", "export"])
def test_a_misspelt_model_dir_is_said_not_to_exist(run_dirs, images, tmp_path, monkeypatch, command):
    from finetune.tools import attention, export

    main = {"predict": predict.main, "attention": attention.main, "export": export.main}[command]
    rest = {"predict": [str(images["png"])], "attention": [str(images["png"]), "--output", "maps"]}
    rest["export"] = ["--format", "onnx"]
    monkeypatch.chdir(run_dirs["vit"].parent)  # holds vit/: "vitt/" is a typo, not a Hub repo
    for typo in ("./vitt", f"{run_dirs['vit']}t", os.path.join("vit", "checkpoint-7"), "outputs/quick/pretrnied"):
        with pytest.raises(FileNotFoundError, match=rf"^{re.escape(typo)} does not exist: pass the output directory"):
            main([typo, *rest[command]])
    weights = run_dirs["vit"] / "model.safetensors"  # the model's file, not its folder
    with pytest.raises(NotADirectoryError, match=rf"^{re.escape(str(weights))} is a file: pass the folder that holds"):
        main([str(weights), *rest[command]])
    # A Hub id, offline, keeps transformers' own message about the Hub.
    with pytest.raises(OSError) as raised:
        main(["google/vit-base-patch16-224", *rest[command]])
    assert "does not exist" not in str(raised.value)


@needs_timm
def test_a_timm_model_at_another_size_is_one_line_naming_its_own(images, tmp_path):
    from finetune.tools import attention

    base = checkpoint(tmp_path, "timm")  # trained at 8 x 8; timm fixes its position embeddings at creation
    assert predict.main([str(base), str(images["png"]), "--image_size", "8"])
    for main, rest in ((predict.main, []), (attention.main, ["--output", str(tmp_path / "maps")])):
        with pytest.raises(ValueError, match=r"runs only at the size it was trained at \(8x8\): drop `--image_size`"):
            main([str(base), str(images["png"]), "--image_size", "16", *rest])


def test_a_checkpoint_removed_while_it_is_read_is_named_so(run_dirs, images, tmp_path, monkeypatch):
    """A training run rotating its checkpoints removed the one being read: transformers then read the path as a Hub id
    ("Repo id must be in the form 'repo_name'")."""
    from finetune import models

    checkpoint = Path(shutil.copytree(run_dirs["vit"], tmp_path / "run" / "checkpoint-8"))
    load = models.load_saved_classifier

    def rotated_away(path, **kwargs):
        shutil.rmtree(checkpoint)  # as `save_total_limit` does, between the checks and the loading
        return load(path, **kwargs)

    monkeypatch.setattr(models, "load_saved_classifier", rotated_away)
    with pytest.raises(FileNotFoundError, match=r"checkpoint-8 was removed while it was read \(a run still training"):
        predict.main([str(checkpoint), str(images["png"])])


def test_cli_rejects_unknown_output_format(run_dirs, images):
    with pytest.raises(ValueError, match=r"--output must end in .csv or .json"):
        predict.main([str(run_dirs["vit"]), str(images["jpg"]), "--output", "preds.txt"])
    with pytest.raises(ValueError, match=".csv or .json"):
        predict.write_predictions([], "preds.txt")


def test_an_output_that_would_replace_a_file_of_the_run_is_refused(run_dirs, images, tmp_path):
    run = Path(shutil.copytree(run_dirs["vit"], tmp_path / "run"))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for name in ("results.json", "config.json", "preprocessor_config.json"):
        output = run / name
        refused = rf"^--output {re.escape(str(output))} already exists in the model or run folder"
        with pytest.raises(ValueError, match=refused):
            predict.main([str(run), str(images["png"]), "--output", str(output)])
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # A new file beside the run's is written, as is a file outside a model's folder, again and again.
    for output in (run / "new.csv", tmp_path / "preds.json", tmp_path / "preds.json", run / "new.csv"):
        predict.main([str(run), str(images["png"]), "--output", str(output)])
        assert output.is_file()
    # A multi-label model's, where no image had a label above its threshold: a header without label columns.
    (tmp_path / "none_above.csv").write_text("path\n/images/a.png\n")
    assert predict.is_predictions_file(tmp_path / "none_above.csv")
    # Another file of that name, anywhere (a comparison's data, a dataset's labels), is kept: it was replaced.
    comparison, labels = tmp_path / "comparison" / "comparison.json", tmp_path / "labels.csv"
    comparison.parent.mkdir()
    comparison.write_text('{"runs": []}')
    labels.write_text("file,label\na.png,cat\n")
    for output in (comparison, labels):
        kept = output.read_bytes()
        with pytest.raises(ValueError, match=r"already exists and holds no predictions of this command"):
            predict.main([str(run), str(images["png"]), "--output", str(output)])
        assert output.read_bytes() == kept


def test_grayscale_images_preprocess_without_numpy_warnings(run_dirs, images):
    model, processor = predict.load_classifier(run_dirs["scratch-gray"], device="cpu")
    gray = Image.open(images["png"]).convert("L")  # a 2-D array once decoded: torch warned it was not writable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert predict.preprocess([gray], model, processor).shape == (1, 1, 16, 16)


def test_lora_run_predicts_from_the_shell_without_a_load_report(tmp_path, images):
    """The base model of a LoRA run loads with the run's labels, so transformers would print its head as MISMATCH /
    Reinit although the adapter's head replaces it: the command prints the predictions and nothing of that."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageClassification, ViTImageProcessor

    base, out = tmp_path / "base", tmp_path / "lora"
    tiny_vit_model(labels=["x", "y"]).save_pretrained(base)
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    labels = dict(enumerate(["cat", "dog", "emu"]))
    model = AutoModelForImageClassification.from_pretrained(
        base, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}, ignore_mismatched_sizes=True
    )
    lora = get_peft_model(model, LoraConfig(target_modules=LORA_DEFAULT_TARGETS, modules_to_save=["classifier"]))
    lora.save_pretrained(out)
    model.config.save_pretrained(out)
    processor.save_pretrained(out)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "finetune.tools.predict", str(out), str(images["png"]), "--top_k", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r".*wide\.png: (cat|dog|emu) [01]\.\d{4}\n", done.stdout)
    assert "LOAD REPORT" not in done.stderr and "MISMATCH" not in done.stderr and "not writable" not in done.stderr


def test_a_lora_runs_checkpoint_predicts_with_the_run_folders_labels(tmp_path, images):
    """A LoRA run's checkpoint-* holds the adapters and the processor but not the model's config.json (the run's
    folder has it): predict reads the labels from there, as from a copy of it in the checkpoint."""
    from peft import LoraConfig, get_peft_model
    from transformers import ViTImageProcessor

    base, run = tmp_path / "base", tmp_path / "lora"
    tiny_vit_model().save_pretrained(base)
    model = tiny_vit_model(labels=["cat", "dog", "emu"], seed=1)
    model.config.save_pretrained(run)
    lora = get_peft_model(model, LoraConfig(target_modules=LORA_DEFAULT_TARGETS, modules_to_save=["classifier"]))
    lora.peft_config["default"].base_model_name_or_path = str(base)
    checkpoint_dir = run / "checkpoint-7"
    lora.save_pretrained(checkpoint_dir)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(checkpoint_dir)
    [prediction] = predict.main([str(checkpoint_dir), str(images["png"])])
    assert set(prediction.labels) == {"cat", "dog", "emu"}
    copy = Path(shutil.copytree(checkpoint_dir, tmp_path / "copy"))
    (copy / "config.json").write_bytes((run / "config.json").read_bytes())
    [expected] = predict.main([str(copy), str(images["png"])])
    assert prediction.probabilities == pytest.approx(expected.probabilities, abs=1e-6)


def test_a_larger_square_image_is_framed_at_the_size_the_run_stored(run_dirs, tmp_path):
    """A run of 16 px images stored them whole at 16 px: a 64 px copy is resized once to 16 px, not through the
    18 px `photo_size` first (the quickstart's 32 px digits, so resized twice, lost 13 points of accuracy); without
    the run's results, at its processor's 16 px, as `pipeline()` frames it."""
    run = Path(shutil.copytree(run_dirs["scratch-gray"], tmp_path / "run"))
    results = json.loads((run / "results.json").read_text())
    results["stored_image_size"] = [16, 16]
    (run / "results.json").write_text(json.dumps(results))
    model, processor = predict.load_classifier(run)
    from sklearn.datasets import load_digits

    digit = (load_digits().images[0] * 255 / 16).astype(np.uint8)  # (8, 8)
    small = np.kron(digit, np.ones((2, 2), np.uint8))  # (16, 16): a digit as the run stored them
    images = [Image.fromarray(small, "L"), Image.fromarray(np.kron(small, np.ones((4, 4), np.uint8)), "L")]
    stored = predict.run_stored_size(Results.load(run))
    prep = predict.model_preprocessing(model, processor)
    assert stored == [16, 16] and predict.model_view(images[1], prep, stored).size == (16, 16)
    # A smaller square too: a run of mixed sizes stored its 10 px images at 16 px (it stayed at 10 px).
    small_one = Image.fromarray(small[:10, :10], "L")
    assert predict.model_view(small_one, prep, stored).size == (16, 16)
    assert predict.model_view(small_one, prep).size == (10, 10)  # without the run's results, as before
    framed = predict.preprocess(images, model, processor, stored_size=stored)
    twice = predict.preprocess(images[1:], model, processor, stored_size=[18, 18])  # through photo_size's 18 px
    assert (framed[1] - framed[0]).abs().mean() < 0.75 * (twice[0] - framed[0]).abs().mean()  # 0.09 against 0.15
    # Without the run's results (a checkpoint, a model from elsewhere): at the size its processor resizes to, once.
    torch.testing.assert_close(predict.preprocess(images, model, processor), framed, rtol=0, atol=1e-6)
    images[1].save(tmp_path / "large.png")
    [p] = predict.main([str(run), str(tmp_path / "large.png")])  # reads the stored size from the run's results
    expected = torch.softmax(model(pixel_values=framed[1:]).logits, -1)[0].detach().numpy()
    np.testing.assert_allclose(p.probabilities, expected, rtol=1e-5, atol=1e-6)


def test_an_rgb_image_for_a_one_channel_model_is_converted_as_training_converts_it(run_dirs, tmp_path):
    """A 1-channel model trained on RGB images takes their luma in float on the device (`BatchTransform`); predict
    had converted each file with Pillow's rounded "L" first (probabilities 1.5e-3 apart)."""
    from finetune.arguments import DataArguments
    from finetune.augment import BatchTransform
    from finetune.data import load_image_data

    model, processor = predict.load_classifier(run_dirs["scratch-gray"], device="cpu")
    prep = predict.model_preprocessing(model, processor)
    photo = Image.fromarray(np.random.default_rng(5).integers(0, 256, (16, 16, 3), dtype=np.uint8), "RGB")
    for i in range(20):  # the same photo in every file: any validation image is its stored copy
        (tmp_path / "data" / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        photo.save(tmp_path / "data" / f"class{i % 2}" / f"{i}.png")
    data_args = DataArguments(dataset_name=str(tmp_path / "data"), decoded_cache_dir="none")
    data = load_image_data(data_args, seed=0, target_size=photo_size(prep), check_classes=False)
    assert data.num_channels == 3 and model.config.num_channels == 1
    evaluated = BatchTransform.for_model(prep, data.num_channels)(data.validation.take([0]), train=False)
    predicted = predict.preprocess(
        predict.load_images([tmp_path / "data" / "class0" / "0.png"], None)[0], model, processor
    )
    torch.testing.assert_close(predicted, evaluated, rtol=0, atol=1e-6)
    [p] = predict.main([str(run_dirs["scratch-gray"]), str(tmp_path / "data" / "class0" / "0.png")])
    expected = torch.softmax(model(pixel_values=evaluated).logits, -1)[0].detach().numpy()
    np.testing.assert_allclose(p.probabilities, expected, rtol=1e-5, atol=1e-6)


def test_an_image_size_the_model_cannot_take_is_refused_in_one_line():
    """LeViT's attention biases are fixed at its size: `--image_size 48` failed in its forward with "The size of tensor
    a (9) must match the size of tensor b (16)"; a ViT, whose position embeddings interpolate, takes it."""
    from transformers import LevitConfig, LevitForImageClassification

    levit = LevitConfig(
        image_size=32, patch_size=4, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
        key_dim=[8, 8, 8], down_ops=[["Subsample", 8, 2, 4, 2, 2], ["Subsample", 8, 4, 4, 2, 2]],
    )  # fmt: skip
    model = LevitForImageClassification(levit).train()
    predict.check_image_size(model, 32)  # its own size
    with pytest.raises(
        ValueError, match=r"^LevitForImageClassification cannot classify 48x48 images \(.*\)\. Fix: drop"
    ):
        predict.check_image_size(model, 48)
    assert model.training  # left as it was
    predict.check_image_size(tiny_vit_model(), 32)  # at 16 px: 32 interpolated


def test_predictions_are_never_written_into_the_images_the_model_trained_on(tmp_path):
    # A preds.csv there made the next run on that folder read it as a table of images and stop, asking for an
    # `image_column_name`.
    run = run_trained_on_photos(tmp_path, model=tiny_scratch_model())
    for output in (tmp_path / "photos" / "preds.csv", tmp_path / "photos" / "cats" / "preds.json"):
        with pytest.raises(
            ValueError, match=r"inside photos, the images the model was trained on.*Nothing was written"
        ):
            predict.main([str(run), str(tmp_path / "photos"), "--output", str(output)])
    assert sorted(p.name for p in (tmp_path / "photos").rglob("*")) == ["cat.png", "cats"]
    assert len(predict.main([str(run), str(tmp_path / "photos"), "--output", str(tmp_path / "preds.csv")])) == 1


def test_an_image_size_whose_attention_would_not_finish_is_refused_at_once(run_dirs, images, tmp_path):
    """`--image_size 4000` for a ViT of 4 px patches (a million patches) ran for hours and held off SIGTERM (the
    forward never returned to Python); it is refused before any forward, with the largest size that runs. A CNN takes
    any size: its cost grows with the pixels, not their square."""
    from transformers import ResNetConfig, ResNetForImageClassification

    argv = ["-m", "finetune.tools.predict", str(run_dirs["vit"]), str(images["jpg"]), "--image_size", "4000"]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)  # hours before
    assert done.returncode == 2
    assert re.search(r"4000` cuts an image into 1,000,000 patches.*`--image_size 512` or less", done.stderr)
    assert predict.main([str(run_dirs["vit"]), str(images["jpg"]), "--image_size", "64"])
    resnet = ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1], layer_type="basic")
    predict.check_image_size(ResNetForImageClassification(resnet).eval(), 2048)
