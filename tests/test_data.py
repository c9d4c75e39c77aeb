"""load_image_data on tiny synthetic datasets of every source type, written in tmp_path with the real libraries.

Each synthetic image carries its own index in pixel (channel 0, row 0, column 0), so a decoded image can be matched
with its source whatever the order of the splits, and compared pixel for pixel.
"""

import csv
import json
import logging
import os
import pickle
import re
import shutil

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from test_photos import TINY_RUN

import finetune.data.cache as data_cache
import finetune.data.sources as data_sources
from finetune import run
from finetune.arguments import DataArguments
from finetune.data import ImageSplit, collate_batch, load_image_data, stratified_split
from finetune.data.splits import choose_rows
from finetune.errors import run_command
from finetune.tools import predict


NAMES = ["cat", "dog", "frog"]


def _images(n, size=8, channels=3, seed=0):
    """uint8 images (N, H, W, C), or (N, H, W) for grayscale, with image i holding i at its first pixel."""
    shape = (n, size, size, channels) if channels == 3 else (n, size, size)
    images = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    images.reshape(n, -1)[:, 0] = np.arange(n)
    return images


def _labels(n):
    return [i % len(NAMES) for i in range(n)]


def _chw(images):
    return images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)


def _args(**kwargs):
    kwargs.setdefault("decoded_cache_dir", "none")
    return DataArguments(**kwargs)


def _dataset(images, labels, image_column="img", label_column="label", names=NAMES):
    features = datasets.Features({image_column: datasets.Image(), label_column: datasets.ClassLabel(names=names)})
    pil = [Image.fromarray(a) for a in images]
    return datasets.Dataset.from_dict({image_column: pil, label_column: labels}, features=features)


def _write_png_folder(root, images, labels):
    paths = []
    for i, (image, label) in enumerate(zip(images, labels)):
        os.makedirs(root / NAMES[label], exist_ok=True)
        paths.append(root / NAMES[label] / f"{i}.png")
        Image.fromarray(image).save(paths[-1])
    return paths


def _assert_split_matches(split, images, labels):
    """Every image of `split` equals the source image with the same index, and carries its label."""
    assert isinstance(split, ImageSplit)
    assert split.pixel_values.dtype == torch.uint8 and split.labels.dtype == torch.int64
    source = _chw(images)
    assert split.pixel_values.shape[1:] == source.shape[1:]
    ids = split.pixel_values[:, 0, 0, 0].numpy().astype(np.int64)
    np.testing.assert_array_equal(split.pixel_values.numpy(), source[ids])
    np.testing.assert_array_equal(split.labels.numpy(), np.asarray(labels)[ids])
    return set(ids.tolist())


def _assert_covers(data, images, labels):
    """train + validation (+ test) hold every source image exactly once."""
    splits = [data.train, data.validation] + ([data.test] if data.test is not None else [])
    ids = [_assert_split_matches(split, images, labels) for split in splits]
    assert sum(len(s) for s in splits) == len(images)
    assert set().union(*ids) == set(range(len(images)))


# ---------------------------------------------------------------------------------------------------------------------
# Sources


def test_parquet_with_image_and_classlabel_features(tmp_path):
    images, labels = _images(30), _labels(30)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    data = load_image_data(_args(dataset_name=str(path), validation_size=6), seed=0)
    assert (len(data.train), len(data.validation), data.test) == (24, 6, None)
    assert data.label_names == NAMES and data.num_channels == 3 and str(path) in data.source
    assert data.id2label == {0: "cat", 1: "dog", 2: "frog"} and data.label2id["frog"] == 2
    assert data.train.pixel_values.shape == (24, 3, 8, 8)
    _assert_covers(data, images, labels)


def test_an_image_column_of_another_name_beside_file_names_is_the_images(tmp_path):
    """`file_name` (the image folder's metadata.csv column) is an image column only where no `Image` column is."""
    images, labels = _images(30), _labels(30)
    dataset = _dataset(images, labels, image_column="photo").add_column("file_name", [f"{i}.png" for i in range(30)])
    dataset.to_parquet(path := tmp_path / "train.parquet")
    data = load_image_data(_args(dataset_name=str(path), validation_size=6), seed=0)
    _assert_covers(data, images, labels)


def test_a_parquet_file_cut_short_is_one_error_naming_it(tmp_path, capfd):
    """`datasets` logged "Failed to read schema", then raised "Parquet magic bytes not found", naming no file."""
    images, labels = _images(30), _labels(30)
    whole, cut = tmp_path / "whole.parquet", tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(whole)
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"train\.parquet cannot be read as a \.parquet file \(ArrowInvalid: .*cut"):
        load_image_data(_args(dataset_name=str(cut), validation_size=6), seed=0)
    assert "Failed to read schema" not in capfd.readouterr().err
    # An arrow stream cut short reads its schema, then fails in `datasets`' generation ("unexpected").
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(whole)
    with pa.OSFile(str(tmp_path / "whole.arrow"), "wb") as file, pa.ipc.new_stream(file, table.schema) as stream:
        stream.write_table(table)
    stream_bytes = (tmp_path / "whole.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(stream_bytes[: len(stream_bytes) // 2])
    with pytest.raises(ValueError, match=r"cut\.arrow cannot be read as a \.arrow file \(OSError: .*\): it is dama"):
        load_image_data(_args(dataset_name=str(tmp_path / "cut.arrow"), validation_size=6), seed=0)


def test_grayscale_source_stays_one_channel(tmp_path):
    images, labels = _images(12, channels=1), _labels(12)
    path = tmp_path / "gray.parquet"
    _dataset(images, labels, image_column="image").to_parquet(path)
    data = load_image_data(_args(dataset_name=str(path), validation_size=3), seed=0)
    assert data.num_channels == 1 and data.train.pixel_values.shape == (9, 1, 8, 8)
    _assert_covers(data, images, labels)


def test_save_to_disk_folder_keeps_its_test_split(tmp_path):
    images, labels = _images(20), _labels(20)
    dataset_dict = datasets.DatasetDict(
        train=_dataset(images[:14], labels[:14]), test=_dataset(images[14:], labels[14:])
    )
    dataset_dict.save_to_disk(tmp_path / "saved")
    data = load_image_data(_args(dataset_name=str(tmp_path / "saved"), validation_size=4), seed=0)
    # The fingerprint runs recorded in results.json: a new one would refuse to evaluate their models ("changed since").
    assert data.fingerprint == data_sources._files_fingerprint([str(tmp_path / "saved")])
    assert (len(data.train), len(data.validation), len(data.test)) == (10, 4, 6)
    assert _assert_split_matches(data.test, images, labels) == set(range(14, 20))
    _assert_covers(data, images, labels)


@pytest.mark.parametrize("name", ["validation", "Validation", "TEST"])
def test_a_save_to_disk_folder_of_only_a_validation_or_test_split_is_refused(tmp_path, name):
    """A lone split is the training data unless named as another split, in any case: `Validation` trained on."""
    images, labels = _images(10), _labels(10)
    datasets.DatasetDict({name: _dataset(images, labels)}).save_to_disk(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"has no train split; its splits are \['" + name):
        load_image_data(_args(dataset_name=str(tmp_path / "saved"), validation_size=3), seed=0)


def test_arrow_file(tmp_path):
    images, labels = _images(10), _labels(10)
    _dataset(images, labels).save_to_disk(tmp_path / "saved")
    arrow_file = next((tmp_path / "saved").glob("*.arrow"))
    data = load_image_data(_args(dataset_name=str(arrow_file), validation_size=3), seed=0)
    _assert_covers(data, images, labels)


def test_folder_of_parquet_files_split_by_file_name(tmp_path):
    images, labels = _images(24), _labels(24)
    _dataset(images[:12], labels[:12]).to_parquet(tmp_path / "train-00000-of-00001.parquet")
    _dataset(images[12:18], labels[12:18]).to_parquet(tmp_path / "val.parquet")
    _dataset(images[18:], labels[18:]).to_parquet(tmp_path / "test.parquet")
    data = load_image_data(_args(dataset_name=str(tmp_path)), seed=0)
    assert _assert_split_matches(data.train, images, labels) == set(range(12))
    assert _assert_split_matches(data.validation, images, labels) == set(range(12, 18))
    assert _assert_split_matches(data.test, images, labels) == set(range(18, 24))


def test_explicit_train_validation_test_files(tmp_path, caplog):
    images, labels = _images(18), _labels(18)
    for name, part in (("a", slice(0, 10)), ("b", slice(10, 14)), ("c", slice(14, 18))):
        _dataset(images[part], labels[part]).to_parquet(tmp_path / f"{name}.parquet")
    args = _args(
        train_file=str(tmp_path / "a.parquet"),
        validation_file=str(tmp_path / "b.parquet"),
        test_file=str(tmp_path / "c.parquet"),
    )
    data = load_image_data(args, seed=0)
    assert _assert_split_matches(data.validation, images, labels) == set(range(10, 14))
    assert _assert_split_matches(data.test, images, labels) == set(range(14, 18))
    _assert_covers(data, images, labels)
    args.dataset_name = "sklearn:digits"  # e.g. from a config: the files win, and it is named as unused
    with caplog.at_level(logging.WARNING, logger="finetune"):
        assert load_image_data(args, seed=0).label_names == NAMES
    assert "`dataset_name` sklearn:digits is not used: the data comes from `train_file`" in caplog.text
    caplog.clear()
    args.dataset_config_name = "plain_text"  # a Hub dataset's configuration, read by nothing else
    with caplog.at_level(logging.WARNING, logger="finetune"):
        load_image_data(args, seed=0)
    assert "`dataset_config_name` plain_text is not used: it names a configuration of a Hub dataset" in caplog.text


def test_splits_made_separately_are_matched_by_class_name(tmp_path):
    # Each folder or file read on its own gets its own ClassLabel: a validation folder without "dog" numbers "frog" 1.
    images, labels = _images(24), _labels(24)
    _write_png_folder(tmp_path / "train", images[:12], labels[:12])
    keep = [i for i in range(12, 24) if NAMES[labels[i]] != "dog"]
    _write_png_folder(tmp_path / "val", images[keep], [labels[i] for i in keep])
    data = load_image_data(_args(train_file=str(tmp_path / "train"), validation_file=str(tmp_path / "val")), seed=0)
    assert data.label_names == NAMES
    assert _assert_split_matches(data.validation, images, labels) == set(keep)
    # The same with parquet files whose ClassLabels name the classes in another order, and with a csv of names.
    _dataset(images[12:], [NAMES.index(NAMES[y]) for y in labels[12:]], names=NAMES).to_parquet(tmp_path / "v.parquet")
    reordered = ["frog", "cat", "dog"]
    _dataset(images[:12], [reordered.index(NAMES[y]) for y in labels[:12]], names=reordered).to_parquet(
        tmp_path / "t.parquet"
    )
    data = load_image_data(
        _args(train_file=str(tmp_path / "t.parquet"), validation_file=str(tmp_path / "v.parquet")), 0
    )
    assert data.label_names == reordered
    _assert_split_matches(data.validation, images, [reordered.index(NAMES[y]) for y in labels])
    paths = _write_png_folder(tmp_path / "csv_images", images[12:], labels[12:])
    (tmp_path / "val.csv").write_text(
        "image,label\n" + "".join(f"{p},{NAMES[y]}\n" for p, y in zip(paths, labels[12:]))
    )
    data = load_image_data(_args(train_file=str(tmp_path / "train"), validation_file=str(tmp_path / "val.csv")), 0)
    assert data.label_names == NAMES
    assert _assert_split_matches(data.validation, images, labels) == set(range(12, 24))


def test_a_folder_of_several_splits_as_one_split_is_refused(tmp_path):
    # Its train split was read as the validation split: the model scored on images it trained on, exit 0.
    images, labels = _images(24), _labels(24)
    _write_png_folder(tmp_path / "data" / "train", images[:12], labels[:12])
    _write_png_folder(tmp_path / "data" / "validation", images[12:], labels[12:])
    _write_png_folder(tmp_path / "other", images[:12], labels[:12])
    args = _args(train_file=str(tmp_path / "other"), validation_file=str(tmp_path / "data"))
    with pytest.raises(ValueError, match=r"validation data path .*data holds the splits train, validation: pass it"):
        load_image_data(args, seed=0)
    args.validation_file = str(tmp_path / "data" / "validation")
    assert _assert_split_matches(load_image_data(args, seed=0).validation, images, labels) == set(range(12, 24))


@pytest.mark.parametrize("kind", ["parquet shards", "image folder of one class"])
def test_a_folder_of_one_split_is_that_split_whatever_its_files_are_named(tmp_path, kind):
    # `validation-0000*.parquet`: "KeyError: 'train'"; one class folder: "lacks column(s) ['label']".
    images, labels = _images(24), _labels(24)
    _write_png_folder(tmp_path / "train", images[:12], labels[:12])
    held = [i for i in range(12, 24) if labels[i] == 0] if kind.startswith("image") else list(range(12, 24))
    if kind == "parquet shards":
        (tmp_path / "val").mkdir()
        for shard, part in enumerate((held[:6], held[6:])):
            shard_file = tmp_path / f"val/validation-{shard}.parquet"
            _dataset(images[part], [labels[i] for i in part], image_column="image").to_parquet(shard_file)
    else:
        _write_png_folder(tmp_path / "val", images[held], [labels[i] for i in held])
    for option in ("validation_file", "test_file"):
        data = load_image_data(_args(train_file=str(tmp_path / "train"), **{option: str(tmp_path / "val")}), seed=0)
        split = data.validation if option == "validation_file" else data.test
        assert data.label_names == NAMES and _assert_split_matches(split, images, labels) == set(held)


def test_images_datasets_leaves_out_are_named_and_other_files_do_not_hide_them(tmp_path, caplog):
    # A `val.txt` beside the class folders (or a run's `train_results.json`) made datasets' patterns read it alone:
    # "holds neither parquet/arrow/csv files nor images". A `__old` folder's images were left out without a word.
    images, labels = _images(18), _labels(18)
    _write_png_folder(tmp_path / "data", images[:15], labels[:15])
    (tmp_path / "data" / "val.txt").write_text("notes")
    _write_png_folder(tmp_path / "data" / "cat" / "__old", images[15:], labels[15:])
    (tmp_path / "data" / "__MACOSX").mkdir()
    (tmp_path / "data" / "__MACOSX" / "._0.png").write_bytes(b"resource fork")
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "data"), validation_size=3), seed=0)
    assert len(data.train) + len(data.validation) == 15 and data.label_names == NAMES
    assert re.search(r"Leaving out the 3 image\(s\) of .*cat/__old: .* skips folders whose names start", caplog.text)
    assert "__MACOSX" not in caplog.text
    # Images beside split folders are not in any split.
    _write_png_folder(tmp_path / "splits" / "train", images[:12], labels[:12])
    Image.fromarray(images[12]).save(tmp_path / "splits" / "stray.png")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "splits"), validation_size=3), seed=0)
    assert len(data.train) + len(data.validation) == 12
    assert (
        "Leaving out the 1 image(s) at the top of" in caplog.text
        and "(e.g. stray.png), beside its split" in caplog.text
    )


def test_validation_size_beside_a_validation_split_is_named_unused(tmp_path, caplog):
    images, labels = _images(18), _labels(18)
    _dataset(images[:12], labels[:12]).to_parquet(tmp_path / "train.parquet")
    _dataset(images[12:], labels[12:]).to_parquet(tmp_path / "validation.parquet")
    for size, named in ((0.1, False), (5000, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="finetune"):
            data = load_image_data(_args(dataset_name=str(tmp_path), validation_size=size), seed=0)
        assert len(data.validation) == 6
        unused = "`validation_size`=5000 is not used: the dataset has a validation split of its own (6 images)"
        assert (unused in caplog.text) is named


def test_a_table_no_split_takes_is_named(tmp_path, caplog):
    # Beside train.parquet, datasets reads only split-named files: more.parquet was left out without a word.
    images, labels = _images(24), _labels(24)
    _dataset(images[:12], labels[:12]).to_parquet(tmp_path / "train.parquet")
    _dataset(images[12:], labels[12:]).to_parquet(tmp_path / "more.parquet")
    (tmp_path / ".hidden").mkdir()
    _dataset(images[12:], labels[12:]).to_parquet(tmp_path / ".hidden" / "x.parquet")
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path), validation_size=3), seed=0)
    assert len(data.train) + len(data.validation) == 12
    assert "Leaving out 1 table(s) of" in caplog.text and "that no split takes (more.parquet)" in caplog.text
    caplog.clear()
    (tmp_path / "more.parquet").rename(tmp_path / "train-2.parquet")
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path), validation_size=3), seed=0)
    assert len(data.train) + len(data.validation) == 24 and "Leaving out" not in caplog.text


@pytest.mark.parametrize("layout", ["classes", "splits"])
def test_an_empty_class_folder_is_named(tmp_path, caplog, layout):
    # bird/ holds no image: the head had three classes instead of four, without a word.
    images, labels = _images(24), _labels(24)
    root = tmp_path / "train" if layout == "splits" else tmp_path
    _write_png_folder(root, images, labels)
    (root / "bird").mkdir()
    (root / "bird" / "IMG_1.heic").write_bytes(b"not read")
    (root / ".thumbnails").mkdir()
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path), validation_size=6), seed=0)
    assert data.label_names == NAMES
    assert (
        "Leaving out the class folder(s) bird of" in caplog.text
        and "learns the 3 class(es) cat, dog, frog" in caplog.text
    )
    if layout == "classes":  # one class left: refused, and the empty folder is named too
        for name in ("dog", "frog"):
            for image in (root / name).iterdir():
                image.unlink()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="finetune"), pytest.raises(ValueError):
            load_image_data(_args(dataset_name=str(tmp_path), validation_size=2), seed=0)
        assert "Leaving out the class folder(s) bird, dog, frog of" in caplog.text


def test_shards_of_a_split_whose_class_labels_differ_are_matched_by_name(tmp_path):
    # Each shard saved with the classes it holds, in its own order: datasets refused to concatenate them.
    images, labels = _images(24), _labels(24)
    second = [i for i in range(12, 24) if NAMES[labels[i]] != "dog"]
    _dataset(images[:12], labels[:12]).to_parquet(tmp_path / "train-0.parquet")
    own = ["frog", "cat"]
    _dataset(images[second], [own.index(NAMES[labels[i]]) for i in second], names=own).to_parquet(
        tmp_path / "train-1.parquet"
    )
    data = load_image_data(_args(dataset_name=str(tmp_path), validation_size=4), seed=0)
    assert data.label_names == NAMES
    covered = set().union(*(_assert_split_matches(s, images, labels) for s in (data.train, data.validation)))
    assert covered == set(range(12)) | set(second)


def test_a_class_without_training_images_is_kept_and_named(tmp_path, caplog):
    images, labels = _images(24), _labels(24)
    train = [i for i in range(12) if NAMES[labels[i]] != "frog"]
    _write_png_folder(tmp_path / "train", images[train], [labels[i] for i in train])
    _write_png_folder(tmp_path / "val", images[12:], labels[12:])
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(train_file=str(tmp_path / "train"), validation_file=str(tmp_path / "val")), 0)
    assert data.label_names == NAMES and len(data.validation) == 12
    assert "No training image is of the class(es) ['frog']" in caplog.text


def test_copies_of_training_images_held_out_for_validation_are_counted(tmp_path, caplog):
    images, labels = _images(60), _labels(60)
    paths = _write_png_folder(tmp_path, images, labels)
    # 12 images saved twice under their own labels: the seed holds out some copies, not their twins.
    for i in range(12):
        shutil.copy(paths[i], paths[i].with_name(f"copy{i}.png"))
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path), validation_size=0.4), 0)
    train = data.train.pixel_values
    twins = [any(torch.equal(image, other) for other in train) for image in data.validation.pixel_values]
    assert 0 < sum(twins) < 12
    assert (
        f"{sum(twins)} of the {len(twins)} validation images {'has' if sum(twins) == 1 else 'have'} the same "
        "pixels as training images (e.g. "
        f"{data.validation.files[twins.index(True)]} (" in caplog.text
    )
    assert "scored on images it trained on" in caplog.text and "with other labels" not in caplog.text
    assert data.training_image_copies == {"validation": sum(twins)}  # for results.json


def test_copies_are_found_alike_in_a_tensor_and_in_a_memory_map_whatever_the_order_of_rows(tmp_path):
    pixels = _chw(_images(300, size=16))
    pixels[[7, 250]] = pixels[3]  # 3, 7 and 250 are one image; 9 differs from it in one pixel off the sampled lines
    pixels[9] = pixels[3]
    pixels[9, 0, 0, 1] ^= 1
    np.save(tmp_path / "pixels.npy", pixels)
    for images in (torch.from_numpy(pixels), np.load(tmp_path / "pixels.npy", mmap_mode="r")):
        rows = np.array([r for r in range(299, -1, -1) if r != 5])  # reversed, no 5: 250 at 49, 9 at 290, 3 at 295
        split = ImageSplit(images, np.zeros(299), rows=rows)
        assert split.copies_in(split) == [(292, 49), (295, 49)]  # 7 and 3, copies of 250; not 9
        held_out = ImageSplit(images, np.zeros(3), rows=np.array([9, 250, 5]))
        assert held_out.copies_in(split) == [(0, 290), (1, 49)]  # 9 found past 250, whose lines it shares


def test_copies_among_many_images_alike_on_the_sampled_lines_read_each_image_a_few_times_not_once_a_pair(monkeypatch):
    # Dark photos or a placeholder image saved thousands of times share the three sampled lines: a comparison per pair
    # took 88 s for 1,000 such images, 14 s for 8,000 identical ones (growing as the square).
    pixels = np.zeros((400, 1, 16, 16), dtype=np.uint8)  # alike on lines 4, 8 and 12; image i holds i on line 0
    pixels[:, 0, 0, :2] = np.stack([np.arange(400) % 256, np.arange(400) // 256], axis=1)
    pixels[399] = pixels[5]
    split = ImageSplit(torch.from_numpy(pixels), np.zeros(400))
    held_out = ImageSplit(torch.from_numpy(pixels), np.zeros(2), rows=np.array([399, 7]))
    read, take = [], ImageSplit.take
    monkeypatch.setattr(ImageSplit, "take", lambda self, indices: read.append(len(indices)) or take(self, indices))
    assert split.copies_in(split) == [(399, 5)]
    assert held_out.copies_in(split) == [(0, 5), (1, 7)]
    assert sum(read) <= 3 * 402


def test_an_image_under_two_labels_or_in_two_splits_is_named_and_copies_under_one_label_are_not(tmp_path, caplog):
    images, labels = _images(40), _labels(40)
    paths = _write_png_folder(tmp_path / "train", images[:30], labels[:30])
    _write_png_folder(tmp_path / "val", images[30:], labels[30:])
    shutil.copy(paths[1], paths[1].with_name("copy1.png"))  # a copy under its own label, in train alone
    args = _args(train_file=str(tmp_path / "train"), validation_file=str(tmp_path / "val"))
    with caplog.at_level(logging.WARNING, logger="finetune"):
        assert load_image_data(args, 0).training_image_copies == {}
    assert "same pixels" not in caplog.text

    shutil.copy(paths[0], tmp_path / "train" / "dog" / "cat0.png")  # a cat filed as a dog too
    shutil.copy(paths[3], tmp_path / "val" / "cat" / "seen.png")  # a training image in validation
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finetune"):
        load_image_data(args, 0)
    assert re.search(
        r"1 training image\(s\) have the same pixels as another training image with other labels \(e\.g\. \S+"
        r"/train/dog/cat0\.png \(dog\) and \S+/train/cat/0\.png \(cat\)\): the model is taught both\.",
        caplog.text,
    )
    assert re.search(
        r"1 of the 11 validation images has the same pixels as training images \(e\.g\. \S+/val/cat/seen\.png "
        r"\(cat\) and \S+/train/cat/3\.png \(cat\)\)",
        caplog.text,
    )


def test_a_copy_without_a_file_is_named_by_its_place_in_the_source_split_it_was_taken_from(tmp_path, caplog):
    # A validation split held out from a parquet file of bytes: its image 33 was "validation image 33" of a source
    # that has no validation split.
    images, labels = _images(30), _labels(30)
    images, labels = np.concatenate([images, images[:10]]), labels + labels[:10]  # 30 to 39: copies of 0 to 9
    _dataset(images, labels).to_parquet(tmp_path / "train.parquet")
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "train.parquet"), validation_size=0.5), 0)
    assert data.training_image_copies["validation"] > 0
    assert re.search(
        r"validation images ha(s|ve) the same pixels as training images \(e\.g\. train image \d+ of the source "
        r"\(\w+\) and train image \d+ of the source \(\w+\)\)",
        caplog.text,
    )
    # Held out by the run, the validation split has no files of its own to remove the copies from.
    assert "figures read high. Keep one copy of each image in the dataset." in caplog.text


def test_csv_with_relative_image_paths_and_string_labels(tmp_path):
    images, labels = _images(15), _labels(15)
    paths = _write_png_folder(tmp_path / "pictures", images, labels)
    lines = ["file,category"] + [f"{p.relative_to(tmp_path)},{NAMES[y]}" for p, y in zip(paths, labels)]
    (tmp_path / "index.csv").write_text("\n".join(lines) + "\n")
    args = _args(
        dataset_name=str(tmp_path / "index.csv"),
        image_column_name="file",
        label_column_name="category",
        validation_size=3,
    )
    data = load_image_data(args, seed=0)
    assert data.label_names == sorted(NAMES)  # string labels: sorted unique names
    _assert_covers(data, images, labels)


def test_class_names_of_a_csv_differing_by_spaces_are_one_class(tmp_path):
    # `cat ` beside `cat` was a third class, named alike in config.json, exit 0.
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "pictures", images, labels)
    rows = [f"{p},{NAMES[y]}{' ' * (i % 2)}" for i, (p, y) in enumerate(zip(paths, labels))]
    (tmp_path / "index.csv").write_text("\n".join(["image,label", *rows, f"{paths[0]},  "]) + "\n")
    with pytest.raises(ValueError, match="has missing values"):  # a blank cell: no label
        load_image_data(_args(dataset_name=str(tmp_path / "index.csv"), validation_size=3), seed=0)
    (tmp_path / "index.csv").write_text("\n".join(["image,label", *rows]) + "\n")
    data = load_image_data(_args(dataset_name=str(tmp_path / "index.csv"), validation_size=3), seed=0)
    assert data.label_names == sorted(NAMES)
    _assert_covers(data, images, [sorted(NAMES).index(NAMES[y]) for y in labels])


@pytest.mark.parametrize("feature", ["path strings", "Image without bytes"])
def test_relative_image_paths_of_a_parquet_are_read_from_its_folder(tmp_path, monkeypatch, feature):
    # They were read from the working directory: a run elsewhere found no image (or another folder's).
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "tables" / "pictures", images, labels)

    def write(table_file, relative_to):
        monkeypatch.chdir(relative_to)  # datasets reads the files' sizes as it writes an `Image` of paths
        table = datasets.Dataset.from_dict(
            {"image": [str(p.relative_to(relative_to)) for p in paths], "label": labels},
            features=datasets.Features({"image": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES)}),
        )
        table = table.cast_column("image", datasets.Image()) if feature == "Image without bytes" else table
        table.to_parquet(table_file)

    write(tmp_path / "tables" / "index.parquet", tmp_path / "tables")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    data = load_image_data(_args(dataset_name="../tables/index.parquet", validation_size=3), seed=0)
    _assert_covers(data, images, labels)
    write(tmp_path / "tables" / "from_here.parquet", tmp_path)  # written from the working directory: read from there
    data = load_image_data(_args(dataset_name="tables/from_here.parquet", validation_size=3), seed=0)
    _assert_covers(data, images, labels)


def test_a_tables_images_held_as_bytes_are_read_as_they_are(tmp_path):
    """A Hub download's parquet names each image by a bare file name beside its bytes: its column was copied whole
    into memory (4x the file's size) to make paths absolute that nothing reads. Rows read from files still are."""
    from finetune.data.sources import _image_paths

    images, labels = _images(12), _labels(12)
    hub = _dataset(images, labels, image_column="image")  # bytes, and the name `image.png`-like paths below
    hub = hub.cast_column("image", datasets.Image(decode=False))
    hub = hub.map(
        lambda row, i: {"image": {"bytes": row["image"]["bytes"], "path": f"img_{i}.png"}}, with_indices=True
    )
    hub.to_parquet(tmp_path / "hub.parquet")
    table = datasets.load_dataset("parquet", data_files=str(tmp_path / "hub.parquet"), split="train")
    assert _image_paths(table, _args(), str(tmp_path / "hub.parquet"))[0] is table
    data = load_image_data(_args(dataset_name=str(tmp_path / "hub.parquet"), validation_size=3), seed=0)
    _assert_covers(data, images, labels)
    # One row read from a file beside the table (bytes dropped), the others from their bytes.
    paths = _write_png_folder(tmp_path / "pictures", images[:1], labels[:1])
    mixed = table.cast_column("image", datasets.Image(decode=False)).map(
        lambda row, i: {
            "image": {"bytes": None, "path": str(paths[0].relative_to(tmp_path))} if i == 0 else row["image"]
        },
        with_indices=True,
    )
    read = _image_paths(mixed, _args(), str(tmp_path / "mixed.parquet"))[0]
    column = read.cast_column("image", datasets.Image(decode=False))["image"]
    assert column[0]["path"] == str(paths[0]) and column[1] == mixed[1]["image"]


def test_a_folder_of_tables_without_a_train_one_is_named(tmp_path):
    """`data.csv` beside `test.csv`: datasets makes a test split only, and the run stopped on "KeyError: 'train'"."""
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "tables" / "pictures", images, labels)
    rows = [f"{p.relative_to(tmp_path / 'tables')},{NAMES[y]}" for p, y in zip(paths, labels)]
    (tmp_path / "tables" / "data.csv").write_text("\n".join(["image,label", *rows[:9]]) + "\n")
    (tmp_path / "tables" / "test.csv").write_text("\n".join(["image,label", *rows[9:]]) + "\n")
    with pytest.raises(ValueError, match=r"has no train split \(its splits: test\)\. Name the training file"):
        load_image_data(_args(dataset_name=str(tmp_path / "tables")), seed=0)


def test_one_place_for_two_splits_is_refused_for_training(tmp_path):
    """The same csv as `train_file` and `validation_file`, or a folder holding the train file as `validation_file`,
    scored the model on its training images, exit 0. An evaluation reads a `train_file` for its labels only."""
    from finetune import run
    from finetune.data import check_separate_files

    table = tmp_path / "data" / "train.csv"
    same = _args(train_file=str(table), validation_file=str(table))
    with pytest.raises(ValueError, match=r"`train_file` .*train.csv is `validation_file` .*: the model would be"):
        check_separate_files(same)
    with pytest.raises(ValueError, match=r"^`validation_file` .*data holds `train_file` .*train.csv"):
        check_separate_files(_args(train_file=str(table), validation_file=str(tmp_path / "data")))
    check_separate_files(_args(train_file=str(table), validation_file=str(tmp_path / "data" / "val.csv")))
    with pytest.raises(ValueError, match=r"is `validation_file`"):  # before the data loads: the files need not exist
        run.main(["--train_file", str(table), "--validation_file", str(table), "--output_dir", str(tmp_path / "o")])


def test_class_names_written_as_numbers_in_a_csv_are_kept_as_written(tmp_path):
    """pandas read `007`, `08`, `09` as 7, 8, 9: the names then matched neither `include_labels 007` nor an image
    folder of the same classes. Ids written as plain numbers stay ids."""
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "pictures", images, labels)
    for name, classes in (("padded.csv", ["007", "08", "09"]), ("ids.csv", ["2", "0", "1"])):
        rows = [f"{p.relative_to(tmp_path)},{classes[y]}" for p, y in zip(paths, labels)]
        (tmp_path / name).write_text("\n".join(["image,label", *rows]) + "\n")
    data = load_image_data(_args(dataset_name=str(tmp_path / "padded.csv"), validation_size=3), seed=0)
    assert data.label_names == ["007", "08", "09"]
    data = load_image_data(_args(dataset_name=str(tmp_path / "ids.csv"), validation_size=3), seed=0)
    assert data.label_names == ["0", "1", "2"]


def test_splits_that_name_and_number_their_classes_are_refused(tmp_path):
    """Train with a ClassLabel (or names) and validation with ids 0..2: the ids were read as names "0", "1", "2",
    classes no training image has (a 6-way head, 0% accuracy). Which id is which class is not said anywhere."""
    images, labels = _images(12), _labels(12)
    _dataset(images[:9], labels[:9]).to_parquet(tmp_path / "train.parquet")
    numbered = datasets.Dataset.from_dict(
        {"img": [Image.fromarray(a) for a in images[9:]], "label": labels[9:]},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")}),
    )
    numbered.to_parquet(tmp_path / "validation.parquet")
    args = _args(train_file=str(tmp_path / "train.parquet"), validation_file=str(tmp_path / "validation.parquet"))
    with pytest.raises(ValueError, match=r"The train split\(s\) name their classes and the validation split\(s\) "):
        load_image_data(args, seed=0)


def test_a_csv_of_paths_from_another_folder_names_the_missing_file(tmp_path, caplog):
    # Paths written from the folder above the csv's: every file missing, which the error had called "12 corrupt",
    # naming no file and no reason (the warning that named them comes after decoding, which never started).
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "data" / "pictures", images, labels)
    lines = ["image,label"] + [f"{p.relative_to(tmp_path)},{NAMES[y]}" for p, y in zip(paths, labels)]
    (tmp_path / "data" / "index.csv").write_text("\n".join(lines) + "\n")
    first = re.escape(f"index 0 ({tmp_path}/data/data/pictures/cat/0.png)")
    with pytest.raises(
        ValueError, match=rf"^No image of .*index.csv could be decoded: {first}: FileNotFoundError: .*, and 11 more\.$"
    ):
        load_image_data(_args(dataset_name=str(tmp_path / "data" / "index.csv")), seed=0)
    # Some missing: the warning names the reason too.
    (tmp_path / "data" / "index.csv").write_text("\n".join(lines[:7] + [line[5:] for line in lines[7:]]) + "\n")
    with caplog.at_level(logging.WARNING, logger="finetune.data"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "data" / "index.csv"), validation_size=2), seed=0)
    assert len(data.train) + len(data.validation) == 6
    assert re.search(
        rf"Skipped 6 missing image file\(s\) of .*\(FileNotFoundError: .* for the first\): {first}, ", caplog.text
    )


def test_a_blank_image_cell_of_a_csv_is_a_skipped_image(tmp_path, caplog):
    # pandas reads a blank cell as NaN, which stopped the run with a TypeError from os.path.isabs.
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "pictures", images, labels)
    rows = [f"{'' if i == 4 else p},{NAMES[y]}" for i, (p, y) in enumerate(zip(paths, labels))]
    (tmp_path / "index.csv").write_text("image,label\n" + "\n".join(rows) + "\n")
    with caplog.at_level(logging.WARNING, logger="finetune.data"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "index.csv"), validation_size=2), seed=0)
    assert len(data.train) + len(data.validation) == 11
    assert "the image is missing (no bytes, no path) for the first): index 4" in caplog.text


def test_a_split_without_labels_is_named_with_the_fix(tmp_path):
    # A test split of -1 labels (the Hub's "no label"), as competitions publish, was "label ids outside the classes".
    images, labels = _images(12), _labels(12)
    _dataset(images[:9], labels[:9]).to_parquet(tmp_path / "train.parquet")
    _dataset(images[9:], [-1] * 3).to_parquet(tmp_path / "test.parquet")
    with pytest.raises(ValueError, match=r"3 of its 3 images have no label \(a negative id\): label them"):
        load_image_data(_args(dataset_name=str(tmp_path), validation_size=3), seed=0)
    # A test.csv without a label column: "Found no label column in test.csv ... Set `label_column_name`", a wrong fix.
    paths = _write_png_folder(tmp_path / "csv" / "pictures", images, labels)
    rows = [f"{p.relative_to(tmp_path / 'csv')},{NAMES[y]}" for p, y in zip(paths, labels)]
    (tmp_path / "csv" / "train.csv").write_text("image,label\n" + "\n".join(rows[:9]) + "\n")
    (tmp_path / "csv" / "test.csv").write_text("image\n" + "\n".join(row.split(",")[0] for row in rows[9:]) + "\n")
    with pytest.raises(ValueError, match=r"The test split of .* lacks column\(s\) \['label'\]; .* Label its images"):
        load_image_data(_args(dataset_name=str(tmp_path / "csv"), validation_size=3), seed=0)


def test_folder_of_csv_files_with_default_columns(tmp_path):
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "data" / "pictures", images, labels)
    for name, part in (("train", slice(0, 8)), ("test", slice(8, 12))):
        rows = [f"pictures/{p.parent.name}/{p.name},{y}" for p, y in zip(paths[part], labels[part])]
        (tmp_path / "data" / f"{name}.csv").write_text("image,label\n" + "\n".join(rows) + "\n")
    data = load_image_data(_args(dataset_name=str(tmp_path / "data"), validation_size=2), seed=0)
    assert data.label_names == ["0", "1", "2"]  # int labels without a ClassLabel
    assert _assert_split_matches(data.test, images, labels) == set(range(8, 12))
    _assert_covers(data, images, labels)


@pytest.mark.parametrize("split_folders", [False, True])
def test_image_folder_labelled_by_its_metadata_csv(tmp_path, split_folders):
    """Hugging Face's image folder format: `metadata.csv` names each image (`file_name`, relative to its folder)
    beside its label. Its `file_name` column was not looked for ("Found no image column ... Set image_column_name")."""
    images, labels = _images(18), _labels(18)
    for name, part in (("train", slice(0, 12)), ("test", slice(12, 18))) if split_folders else (("", slice(0, 18)),):
        folder = tmp_path / "photos" / name
        paths = _write_png_folder(folder / "images", images[part], labels[part])
        rows = [f"{p.relative_to(folder)},{NAMES[y]}" for p, y in zip(paths, labels[part])]
        (folder / "metadata.csv").write_text("file_name,label\n" + "\n".join(rows) + "\n")
    data = load_image_data(_args(dataset_name=str(tmp_path / "photos"), validation_size=3), seed=0)
    assert data.label_names == sorted(NAMES)
    if split_folders:
        assert _assert_split_matches(data.test, images, labels) == set(range(12, 18))
    _assert_covers(data, images, labels)


@pytest.mark.parametrize("metadata", ["metadata.csv", "metadata.jsonl"])
def test_images_a_metadata_file_does_not_name_are_named(tmp_path, caplog, metadata):
    # datasets drops them: 3 of 15 images were left out of training without a word.
    images, labels = _images(15), _labels(15)
    paths = _write_png_folder(tmp_path / "photos", images, labels)
    rows = [(str(p.relative_to(tmp_path / "photos")), NAMES[y]) for p, y in zip(paths, labels)][3:]
    if metadata == "metadata.csv":
        text = "file_name,label\n" + "".join(f"{f},{y}\n" for f, y in rows)
    else:
        text = "".join(json.dumps({"file_name": f, "label": y}) + "\n" for f, y in rows)
    (tmp_path / "photos" / metadata).write_text(text)
    with caplog.at_level(logging.WARNING, logger="finetune.data"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "photos"), validation_size=3), seed=0)
    assert len(data.train) + len(data.validation) == 12
    assert "Leaving out 3 image(s) of " in caplog.text and "does not name (e.g. cat/0.png)" in caplog.text
    caplog.clear()
    (tmp_path / "photos" / metadata).unlink()  # labelled by the class folders: every image
    with caplog.at_level(logging.WARNING, logger="finetune.data"):
        load_image_data(_args(dataset_name=str(tmp_path / "photos"), validation_size=3), seed=0)
    assert "Leaving out" not in caplog.text


def test_a_folder_with_both_a_metadata_csv_and_jsonl_is_refused(tmp_path):
    # The table labelled the images and the metadata.jsonl's other labels were left unread without a word.
    images, labels = _images(12), _labels(12)
    paths = _write_png_folder(tmp_path / "photos", images, labels)
    rows = [(str(p.relative_to(tmp_path / "photos")), NAMES[y]) for p, y in zip(paths, labels)]
    (tmp_path / "photos" / "metadata.csv").write_text("file_name,label\n" + "".join(f"{f},{y}\n" for f, y in rows))
    jsonl = "".join(json.dumps({"file_name": f, "label": NAMES[0]}) + "\n" for f, _ in rows)
    (tmp_path / "photos" / "metadata.jsonl").write_text(jsonl)
    with pytest.raises(ValueError, match=r"photos holds both a metadata.csv and a metadata.jsonl: only one labels"):
        load_image_data(_args(dataset_name=str(tmp_path / "photos"), validation_size=3), seed=0)
    (tmp_path / "photos" / "metadata.jsonl").unlink()
    data = load_image_data(_args(dataset_name=str(tmp_path / "photos"), validation_size=3), seed=0)
    assert data.label_names == NAMES


def test_image_folder_with_one_subfolder_per_class(tmp_path):
    images, labels = _images(18), _labels(18)
    _write_png_folder(tmp_path / "pets", images, labels)
    data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), validation_size=6), seed=0)
    assert data.label_names == NAMES and data.test is None
    _assert_covers(data, images, labels)


def test_a_folder_of_jfif_photos_is_read_as_an_image_folder(tmp_path):
    """Any extension the datasets image folder reads (here only .jfif, a phone's JPEGs) makes a folder of photos."""
    for i, label in enumerate(_labels(12)):
        os.makedirs(tmp_path / "pets" / NAMES[label], exist_ok=True)
        Image.fromarray(_images(1, seed=i)[0]).save(tmp_path / "pets" / NAMES[label] / f"{i}.jfif", format="JPEG")
    data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), validation_size=3), seed=0)
    assert data.label_names == NAMES and (len(data.train), len(data.validation)) == (9, 3)


def test_photos_in_formats_the_image_folder_does_not_read_are_named(tmp_path, caplog):
    # An iPhone's HEIC photos and AVIF downloads beside the PNGs: left out of training without a word.
    images, labels = _images(12), _labels(12)
    _write_png_folder(tmp_path / "pets", images, labels)
    Image.fromarray(images[0]).save(tmp_path / "pets" / "dog" / "web.avif")
    (tmp_path / "pets" / "cat" / "IMG_0001.HEIC").write_bytes(b"an iPhone photo")
    with caplog.at_level(logging.WARNING, logger="finetune.data"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), validation_size=3), seed=0)
    _assert_covers(data, images, labels)
    assert re.search(r"Leaving out 2 photo\(s\) of .*pets in a format .*\(e.g. cat/IMG_0001.HEIC\)", caplog.text)


def test_image_folder_with_split_subfolders(tmp_path):
    images, labels = _images(24), _labels(24)
    _write_png_folder(tmp_path / "pets" / "train", images[:12], labels[:12])
    for i in range(12, 18):
        os.makedirs(tmp_path / "pets" / "val" / NAMES[labels[i]], exist_ok=True)
        Image.fromarray(images[i]).save(tmp_path / "pets" / "val" / NAMES[labels[i]] / f"{i}.png")
    for i in range(18, 24):
        os.makedirs(tmp_path / "pets" / "test" / NAMES[labels[i]], exist_ok=True)
        Image.fromarray(images[i]).save(tmp_path / "pets" / "test" / NAMES[labels[i]] / f"{i}.png")
    data = load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)
    assert data.label_names == NAMES
    assert _assert_split_matches(data.train, images, labels) == set(range(12))
    assert _assert_split_matches(data.validation, images, labels) == set(range(12, 18))
    assert _assert_split_matches(data.test, images, labels) == set(range(18, 24))


def test_a_split_folder_of_unlabelled_images_is_named_with_the_fix(tmp_path):
    # Kaggle's layout: train/CLASS/... and a test/ of unlabelled images. The error had named no split and no image
    # ("needs one subfolder per class"), although train/ has them.
    images, labels = _images(21), _labels(21)
    _write_png_folder(tmp_path / "pets" / "train", images[:18], labels[:18])
    os.makedirs(tmp_path / "pets" / "test")
    for i in range(18, 21):
        Image.fromarray(images[i]).save(tmp_path / "pets" / "test" / f"{i}.png")
    unlabelled = r"^3 image\(s\) of .*pets lie outside its class folders \(cat, dog, frog\);.*predict.*"
    with pytest.raises(ValueError, match=unlabelled + r"move test/18.png, test/19.png, test/20.png into one\.$"):
        load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)


def test_an_image_is_labelled_by_its_class_folder_whatever_the_depth_below_it(tmp_path):
    # datasets' image folder labels by the parent folder: cat/2023/ and dog/2023/ would be one class "2023", and
    # cat/raw/ + dog/raw/ or images at mixed depths no class at all.
    images, labels = _images(24), _labels(24)
    for i, (image, label) in enumerate(zip(images, labels)):
        for folder in (
            tmp_path / "pets" / NAMES[label] / ["2023", "2024"][i % 2],
            tmp_path / "split" / ("train" if i < 18 else "test") / NAMES[label] / ["raw", "", "a/b"][i // 3 % 3],
        ):
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i}.png")
    (tmp_path / "link").symlink_to(tmp_path / "pets")  # datasets names the images by their real paths
    for folder in ("pets", "link"):
        data = load_image_data(_args(dataset_name=str(tmp_path / folder), validation_size=6), seed=0)
        assert data.label_names == NAMES
        _assert_covers(data, images, labels)
    data = load_image_data(_args(dataset_name=str(tmp_path / "split"), validation_size=6), seed=0)
    assert data.label_names == NAMES and _assert_split_matches(data.test, images, labels) == set(range(18, 24))
    _assert_covers(data, images, labels)


def test_a_metadata_file_of_an_image_folder_keeps_its_say_over_the_class_folders(tmp_path):
    # A metadata.jsonl column is the user's labelling: the class folders must not replace it without a word.
    images, labels = _images(12), _labels(12)
    _write_png_folder(tmp_path / "pets", images, labels)
    rows = [
        {"file_name": f"{NAMES[label]}/{i}.png", "size": ("big", "small")[i % 2]} for i, label in enumerate(labels)
    ]
    (tmp_path / "pets" / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"Found no label column .*'size'.*label_column_name"):
        load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)
    data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), label_column_name="size"), seed=0)
    assert data.label_names == ["big", "small"]


def test_a_table_in_one_split_folder_only_is_refused(tmp_path):
    # train/metadata.csv made the folder a table source of its train split alone: test/'s images were dropped, exit 0.
    images, labels = _images(18), _labels(18)
    train = _write_png_folder(tmp_path / "pets" / "train", images[:12], labels[:12])
    _write_png_folder(tmp_path / "pets" / "test", images[12:], labels[12:])
    rows = [f"{path.relative_to(tmp_path / 'pets' / 'train')},{NAMES[label]}" for path, label in zip(train, labels)]
    (tmp_path / "pets" / "train" / "metadata.csv").write_text("file_name,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"the test split has images but no table, which would be left out"):
        load_image_data(_args(dataset_name=str(tmp_path / "pets"), image_column_name="file_name"), seed=0)
    # A metadata.jsonl: the test images were read without labels, refused as "missing values" of the label column.
    (tmp_path / "pets" / "train" / "metadata.csv").unlink()
    lines = [json.dumps({"file_name": row.split(",")[0], "label": row.split(",")[1]}) + "\n" for row in rows]
    (tmp_path / "pets" / "train" / "metadata.jsonl").write_text("".join(lines))
    with pytest.raises(ValueError, match=r"the train split is labelled by its metadata.jsonl and the test split has"):
        load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)


def test_split_folders_are_found_whatever_their_case(tmp_path):
    images, labels = _images(18), _labels(18)
    _write_png_folder(tmp_path / "pets" / "Train", images[:12], labels[:12])
    _write_png_folder(tmp_path / "pets" / "Test", images[12:], labels[12:])
    data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), validation_size=3), seed=0)
    assert data.label_names == NAMES and len(data.train) + len(data.validation) == 12
    assert _assert_split_matches(data.test, images, labels) == set(range(12, 18))
    _write_png_folder(tmp_path / "pets" / "train", images[:3], labels[:3])
    with pytest.raises(ValueError, match=r"has two train folders \(\['Test', 'Train', 'train'\]\); keep one"):
        load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)


def test_several_folders_of_one_split_are_named(tmp_path, caplog):
    """datasets reads `train/` and `train_backup/` (or `val/` and `validation/`) as one split: a backup copy put twins
    of the held-out validation images in train, silently."""
    images, labels = _images(18), _labels(18)
    _write_png_folder(tmp_path / "pets" / "train", images[:9], labels[:9])
    _write_png_folder(tmp_path / "pets" / "train_backup", images[9:], labels[9:])
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), validation_size=3), seed=0)
    assert len(data.train) + len(data.validation) == 18
    assert "The train split of" in caplog.text and "is the folders train/, train_backup/ together" in caplog.text


def test_a_class_folder_named_like_a_split_is_a_class(tmp_path):
    # Only top-level folders are split folders: datasets' `**/train/**` took the class `train` below `test/` for a
    # training split (its images in training and test), and refused `car/ bus/ train/` or `valid/ invalid/`.
    images = _images(24)
    layouts = {
        "split": (["bus", "car", "train"], lambda i, name: f"{'train' if i < 12 else 'test'}/{name}"),
        "flat": (["bus", "car", "train"], lambda i, name: name),
        "checks": (["invalid", "valid"], lambda i, name: name),
    }
    for layout, (names, folder_of) in layouts.items():
        labels = [i % len(names) for i in range(24)]
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = tmp_path / layout / folder_of(i, names[label])
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i}.png")
        data = load_image_data(_args(dataset_name=str(tmp_path / layout), validation_size=6), seed=0)
        assert data.label_names == names
        _assert_covers(data, images, labels)  # every image in one split only
        assert (data.test is not None) == (layout == "split")
        if data.test is not None:
            assert _assert_split_matches(data.test, images, labels) == set(range(12, 24))
    # Split folders of class folders beside another folder: neither reading is safe (classes `train`, `test`, `extra`
    # would train on nonsense labels; splits would drop `extra`).
    os.makedirs(tmp_path / "split" / "extra")
    Image.fromarray(images[0]).save(tmp_path / "split" / "extra" / "0.png")
    with pytest.raises(
        ValueError, match=r"holds split folders with class folders in them \(test, train\) beside other"
    ):
        load_image_data(_args(dataset_name=str(tmp_path / "split")), seed=0)


def test_an_image_folder_with_a_linked_class_folder_is_refused(tmp_path):
    # `datasets` does not follow links to folders: the class would be left out without a word.
    images, labels = _images(12), _labels(12)
    _write_png_folder(tmp_path / "elsewhere", images, labels)
    (tmp_path / "pets").mkdir()
    for name in NAMES:
        (tmp_path / "pets" / name).symlink_to(tmp_path / "elsewhere" / name, target_is_directory=True)
    with pytest.raises(ValueError, match=r"pets/\w+ is a link to a folder, which `datasets` does not follow"):
        load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)


def _write_cifar_batches(root, per_batch=6):
    """The real format: pickled dicts with b"data" uint8 (N, 3072) in CHW row-major order and b"labels"."""
    os.makedirs(root)
    rng = np.random.default_rng(0)
    batches = {}
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        batches[name] = (data, labels)
        with open(root / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels}, f)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, f)
    return batches


def test_cifar_10_batches_py_folder(tmp_path):
    batches = _write_cifar_batches(tmp_path / "cifar-10-batches-py")
    args = _args(dataset_name=str(tmp_path / "cifar-10-batches-py"), validation_size=2)
    data = load_image_data(args, seed=0)
    assert data.label_names[:3] == ["airplane", "automobile", "bird"] and len(data.label_names) == 10
    assert (len(data.train), len(data.validation), len(data.test)) == (10, 2, 6)
    test_data, test_labels = batches["test_batch"]
    # Row layout: 1024 red values, then green, then blue, each 32 rows of 32.
    assert data.test.pixel_values[0, 1, 0, 5].item() == test_data[0, 1024 + 5]
    assert data.test.pixel_values[3, 2, 31, 31].item() == test_data[3, 3071]
    np.testing.assert_array_equal(data.test.pixel_values.numpy(), test_data.reshape(6, 3, 32, 32))
    np.testing.assert_array_equal(data.test.labels.numpy(), test_labels)
    train = np.concatenate([batches["data_batch_1"][0], batches["data_batch_2"][0]]).reshape(12, 3, 32, 32)
    seen = np.concatenate([data.train.pixel_values.numpy(), data.validation.pixel_values.numpy()])
    assert sorted(map(bytes, seen)) == sorted(map(bytes, train))


def test_sklearn_digits():
    from sklearn.datasets import load_digits

    data = load_image_data(_args(dataset_name="sklearn:digits", validation_size=0.2), seed=0)
    assert data.label_names == [str(i) for i in range(10)] and data.num_channels == 1 and data.test is None
    assert (len(data.train), len(data.validation)) == (1438, 359)
    assert data.train.pixel_values.shape[1:] == (1, 8, 8)
    digits = load_digits()
    expected = np.round(digits.images * 255 / 16).astype(np.uint8)
    assert int(data.train.pixel_values.max()) == 255 and int(data.train.pixel_values.min()) == 0
    seen = np.concatenate([data.train.pixel_values.numpy(), data.validation.pixel_values.numpy()])[:, 0]
    assert sorted(map(bytes, seen)) == sorted(map(bytes, expected))


# ---------------------------------------------------------------------------------------------------------------------
# Columns and errors


def test_columns_found_by_type_or_given_by_name(tmp_path):
    images, labels = _images(9), _labels(9)
    path = tmp_path / "train.parquet"
    _dataset(images, labels, image_column="picture", label_column="target").to_parquet(path)
    found = load_image_data(_args(dataset_name=str(path), validation_size=3), seed=0)
    named = load_image_data(
        _args(dataset_name=str(path), validation_size=3, image_column_name="picture", label_column_name="target"),
        seed=0,
    )
    assert torch.equal(found.train.pixel_values, named.train.pixel_values)
    _assert_covers(named, images, labels)
    with pytest.raises(ValueError, match=r"`image_column_name`='photo' is not a column .*\['picture', 'target'\]"):
        load_image_data(_args(dataset_name=str(path), image_column_name="photo"), seed=0)


def test_no_label_column_lists_columns_and_names_the_argument(tmp_path):
    images = _images(9)
    features = datasets.Features({"img": datasets.Image(), "target": datasets.Value("int64")})
    dataset = datasets.Dataset.from_dict(
        {"img": [Image.fromarray(a) for a in images], "target": _labels(9)}, features=features
    )
    path = tmp_path / "train.parquet"
    dataset.to_parquet(path)
    with pytest.raises(ValueError, match="label_column_name") as error:
        load_image_data(_args(dataset_name=str(path)), seed=0)
    assert "['img', 'target']" in str(error.value)
    data = load_image_data(_args(dataset_name=str(path), label_column_name="target", validation_size=3), seed=0)
    assert data.label_names == ["0", "1", "2"]
    _assert_covers(data, images, _labels(9))


def test_no_image_column_lists_columns_and_names_the_argument(tmp_path):
    images, labels = _images(6), _labels(6)
    paths = _write_png_folder(tmp_path / "pictures", images, labels)
    rows = [f"{p.relative_to(tmp_path)},{y}" for p, y in zip(paths, labels)]
    (tmp_path / "train.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match="image_column_name") as error:
        load_image_data(_args(dataset_name=str(tmp_path / "train.csv")), seed=0)
    assert "['path', 'label']" in str(error.value)


def test_missing_path_says_what_is_accepted(tmp_path):
    missing = str(tmp_path / "nowhere" / "train.parquet")
    with pytest.raises(FileNotFoundError, match="does not exist") as error:
        load_image_data(_args(dataset_name=missing), seed=0)
    assert missing in str(error.value) and "image folder" in str(error.value)
    with pytest.raises(FileNotFoundError, match="nowhere.parquet"):
        load_image_data(_args(train_file=str(tmp_path / "nowhere.parquet")), seed=0)


@pytest.mark.skipif(not os.environ.get("HF_HUB_OFFLINE"), reason="checks the offline error without network access")
def test_unreachable_hub_dataset_explains_the_fix():
    with pytest.raises(ConnectionError, match="hf-internal-testing-nonexistent/dataset") as error:
        load_image_data(_args(dataset_name="hf-internal-testing-nonexistent/dataset"), seed=0)
    assert "local copy" in str(error.value) and "dataset_name" in str(error.value)


def test_corrupt_image_is_skipped_with_a_warning(tmp_path, caplog):
    images, labels = _images(12), _labels(12)
    _write_png_folder(tmp_path / "pets", images, labels)
    (tmp_path / "pets" / "dog" / "broken.png").write_bytes(b"this is not a png")
    with caplog.at_level(logging.WARNING, logger="finetune.data"):
        data = load_image_data(_args(dataset_name=str(tmp_path / "pets"), validation_size=3), seed=0)
    _assert_covers(data, images, labels)  # the 12 good images, nothing else
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("Skipped 1 corrupt image" in m and "broken.png" in m for m in warnings), warnings


def test_a_split_most_of_whose_images_are_corrupt_is_refused(tmp_path):
    """Of 200 images, 187 did not decode: the run trained on 11, scored 0% on 2 and exited 0. Skipping is for a few."""
    _write_png_folder(tmp_path / "pets", _images(6), _labels(6))
    for i in range(7):
        (tmp_path / "pets" / "cat" / f"broken{i}.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(
        ValueError, match=r"^7 of the 13 images of .* could not be decoded \(.*\): `corrupt_images: skip` "
    ):
        load_image_data(_args(dataset_name=str(tmp_path / "pets")), seed=0)


def test_corrupt_image_raises_with_policy_error(tmp_path):
    _write_png_folder(tmp_path / "pets", _images(6), _labels(6))
    (tmp_path / "pets" / "cat" / "broken.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(ValueError, match="broken.png") as error:
        load_image_data(_args(dataset_name=str(tmp_path / "pets"), corrupt_images="error"), seed=0)
    assert "corrupt_images=skip" in str(error.value)


def test_images_of_different_sizes_are_resized(tmp_path):
    images = [np.full((8, 8, 3), 10 * i, np.uint8) for i in range(4)] + [np.full((10, 6, 3), 99, np.uint8)] * 2
    dataset = _dataset([np.asarray(a) for a in images], _labels(6))
    path = tmp_path / "mixed.parquet"
    dataset.to_parquet(path)
    with pytest.raises(ValueError, match="decode_size"):
        load_image_data(_args(dataset_name=str(path), validation_size=3), seed=0)
    data = load_image_data(_args(dataset_name=str(path), validation_size=3), seed=0, target_size=5)
    assert data.train.image_size == (5, 5) and data.validation.image_size == (5, 5)
    values = torch.cat([data.train.pixel_values, data.validation.pixel_values])
    assert sorted(int(v) for v in values[:, 0, 2, 2]) == [0, 10, 20, 30, 99, 99]  # constant images stay constant
    data = load_image_data(_args(dataset_name=str(path), validation_size=3, decode_size=4), seed=0, target_size=5)
    assert data.train.image_size == (4, 4)


def test_options_for_encoded_images_on_decoded_arrays_are_said_to_do_nothing(caplog):
    """scikit-learn's digits (like CIFAR-10's python batches) are arrays with labels already: `decode_size` and the
    column names cannot apply."""
    with caplog.at_level(logging.WARNING, logger="finetune"):
        data = load_image_data(_args(dataset_name="sklearn:digits", decode_size=16, image_column_name="img"), seed=0)
    assert data.train.image_size == (8, 8)
    assert "`decode_size`, `image_column_name` are for tables and files of encoded images" in caplog.text
    assert "holds 8x8 arrays" in caplog.text


def test_same_size_images_stay_native_whatever_the_target(tmp_path):
    images, labels = _images(6), _labels(6)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    data = load_image_data(_args(dataset_name=str(path), validation_size=3), seed=0, target_size=224)
    assert data.train.image_size == (8, 8)


def test_a_cached_native_entry_larger_than_the_target_is_not_used(tmp_path, monkeypatch):
    # A larger model's run cached these 12x12 images as they are; a run for an 8 px storage size stores them at 8x8,
    # as it does with an empty cache (it mapped the 12x12 entry: results depended on what the cache held).
    images, labels = _images(6, size=12), _labels(6)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    args = _args(dataset_name=str(path), validation_size=3, decoded_cache_dir=str(tmp_path / "cache"))
    calls = _count_decodes(monkeypatch)
    assert load_image_data(args, seed=0, target_size=16).train.image_size == (12, 12)
    cached = load_image_data(args, seed=0, target_size=8)
    fresh = load_image_data(_args(**{**vars(args), "decoded_cache_dir": "none"}), seed=0, target_size=8)
    assert cached.train.image_size == (8, 8) and torch.equal(cached.train.pixel_values, fresh.train.pixel_values)
    calls.clear()
    load_image_data(args, seed=0, target_size=16)  # both entries are kept and found again
    assert load_image_data(args, seed=0, target_size=8).train.image_size == (8, 8) and not calls


def test_large_photos_of_one_size_are_stored_at_the_models_size(tmp_path, caplog):
    """One phone's landscape photos, all 600x400 (far more than a 16 px model needs), are decoded and cached as centre
    squares at the model's storage size (18 px), as photos of mixed sizes are; a run trains on them, and predict gives
    each photo the probabilities evaluation gave it."""
    rng = np.random.default_rng(0)
    paths = []
    for k, name in enumerate(NAMES):
        os.makedirs(tmp_path / "photos" / name)
        for i in range(4):
            photo = rng.integers(0, 60, (400, 600, 3), dtype=np.uint8)
            photo[..., k] += 180
            paths.append(tmp_path / "photos" / name / f"{i}.jpg")
            Image.fromarray(photo).save(paths[-1])
    index, validation = tmp_path / "index.csv", tmp_path / "validation.csv"  # the same photos: storage is the point
    for table in (index, validation):
        table.write_text("image,label\n" + "".join(f"{path},{path.parent.name}\n" for path in paths))
    out, cache = tmp_path / "run", tmp_path / "cache"
    args = [*TINY_RUN, "--model_type", "scratch", "--train_file", str(index), "--validation_file", str(validation)]
    with caplog.at_level(logging.INFO):
        run.main([*args, "--decoded_cache_dir", str(cache), "--output_dir", str(out)])
    assert "are 600x400, larger than the model needs: storing them as 18x18 squares" in caplog.text
    shapes = [np.load(path, mmap_mode="r").shape for path in cache.glob("*/pixel_values.npy")]
    assert shapes == [(12, 3, 18, 18)] * 2  # the train and validation splits

    evaluation_only = ["--do_train", "false", "--model_name_or_path", str(out), "--bf16", "false"]  # predict's float32
    run.main([*args, *evaluation_only, "--decoded_cache_dir", str(cache), "--output_dir", str(tmp_path / "eval")])
    predictions = predict.main([str(out), *map(str, paths), "--top_k", "3"])
    with open(tmp_path / "eval" / "predictions_validation.csv") as f:
        evaluation = [[float(row[f"top{k}_probability"]) for k in (1, 2, 3)] for row in csv.DictReader(f)]
    np.testing.assert_allclose([p.scores for p in predictions], evaluation, atol=2e-6)


def test_grayscale_then_colour_images_decode_as_rgb(tmp_path):
    gray, colour = _images(4, channels=1), _images(4, seed=1)
    dataset = _dataset(list(gray) + list(colour), _labels(8))  # the first images decide "L", a later one says RGB
    path = tmp_path / "mixed_modes.parquet"
    dataset.to_parquet(path)
    data = load_image_data(_args(dataset_name=str(path), validation_size=2), seed=0)
    assert data.num_channels == 3
    pixels = torch.cat([data.train.pixel_values, data.validation.pixel_values]).numpy()
    expected = [np.repeat(g[None], 3, axis=0) for g in gray] + list(colour.transpose(0, 3, 1, 2))
    assert sorted(map(bytes, pixels)) == sorted(map(bytes, expected))


# ---------------------------------------------------------------------------------------------------------------------
# Splits


def test_stratified_split_keeps_class_proportions():
    labels = np.array([0] * 100 + [1] * 50 + [2] * 10)
    train, validation = stratified_split(labels, 0.2, seed=0)
    assert np.bincount(labels[validation]).tolist() == [20, 10, 2]
    assert len(np.intersect1d(train, validation)) == 0 and len(train) + len(validation) == 160
    assert sorted(np.concatenate([train, validation]).tolist()) == list(range(160))
    again_train, again_validation = stratified_split(labels, 0.2, seed=0)
    assert np.array_equal(validation, again_validation) and np.array_equal(train, again_train)
    assert not np.array_equal(validation, stratified_split(labels, 0.2, seed=1)[1])
    _, absolute = stratified_split(labels, 16, seed=0)
    assert len(absolute) == 16 and np.bincount(labels[absolute]).tolist() == [10, 5, 1]


def test_stratified_split_rounds_to_the_exact_size():
    labels = np.repeat(np.arange(7), [13, 7, 29, 3, 11, 5, 2])
    for size in (0.1, 0.33, 17, 1):
        _, validation = stratified_split(labels, size, seed=3)
        expected = int(round(size * len(labels))) if size < 1 else size
        assert len(validation) == expected
        share = np.bincount(labels, minlength=7) * expected / len(labels)
        assert np.all(np.abs(np.bincount(labels[validation], minlength=7) - share) < 1)
    with pytest.raises(ValueError, match="validation_size"):
        stratified_split(labels, len(labels), seed=0)


def test_a_class_of_one_image_is_never_held_out_while_the_size_allows():
    """A class whose one image went to validation was never trained on, and scored 0% there."""
    labels = np.array([0] * 5 + [1] * 5 + [2])  # shares 2.27, 2.27, 0.45: the largest remainder is the lone image's
    for seed in range(5):
        _, validation = stratified_split(labels, 5, seed=seed)
        assert len(validation) == 5 and 10 not in validation.tolist()
    _, validation = stratified_split(np.arange(4), 2, seed=0)  # only classes of one image: held out all the same
    assert len(validation) == 2


@pytest.mark.parametrize("size", [0.15, 120])
def test_a_run_on_some_classes_holds_out_the_images_a_run_on_all_classes_holds_out(size):
    """The quickstart pretrains on the digits 0-4 and fine-tunes on all ten, both holding out 0.15 with seed 42: its
    validation split held 65 of 270 images the pretrained model trained on, the first split drawn from 0-4 alone."""
    from sklearn.datasets import load_digits

    labels, names = load_digits().target.astype(np.int64), [str(i) for i in range(10)]
    keep = ["3", "0", "4"]

    def rows(include_labels, validation_size):
        args = _args(dataset_name="sklearn:digits", validation_size=validation_size, include_labels=include_labels)
        chosen, label_names, _, held_out = choose_rows({"train": labels}, names, args, 42)
        return {split: set(chosen[split].positions.tolist()) for split in chosen}, label_names, held_out

    some, label_names, held_out = rows(keep, size)
    assert label_names == keep
    kept = set(np.flatnonzero(np.isin(labels, [0, 3, 4])).tolist())
    # A fraction is one of every class's images; a number, of the kept classes' images (of all: their share).
    expected = round(size * len(labels)) if size < 1 else round(size / len(kept) * len(labels))
    assert held_out == expected and (size < 1 or abs(len(some["validation"]) - size) <= 3)
    every, _, held_out_of_every = rows(None, size if size < 1 else held_out)
    assert held_out_of_every == held_out
    assert some["validation"] == every["validation"] & kept and some["train"] == every["train"] & kept
    with pytest.raises(ValueError, match=r"validation_size`=600 would hold out all 542 training images of the `incl"):
        rows(keep, 600)


def test_a_share_that_holds_out_none_of_the_kept_classes_is_refused_with_its_fix():
    """Ten classes of 2 images kept among ten of 105: 10% of every class's images falls on the large classes, and
    the error named the validation split as one without images of the classes, fixed by naming one of those."""
    labels, names = np.repeat(np.arange(20), [2] * 10 + [105] * 10), [f"c{i}" for i in range(20)]
    args = _args(dataset_name="sklearn:digits", validation_size=0.1, include_labels=names[:10])
    with pytest.raises(ValueError, match=r"holds out none of the `include_labels` classes' images. Fix: a larger"):
        choose_rows({"train": labels}, names, args, 0)


def test_validation_split_end_to_end_is_seeded_and_disjoint():
    args = _args(dataset_name="sklearn:digits", validation_size=0.25)
    first, again, other = (load_image_data(args, seed=s) for s in (7, 7, 8))
    assert torch.equal(first.validation.pixel_values, again.validation.pixel_values)
    assert torch.equal(first.train.labels, again.train.labels)
    assert not torch.equal(first.validation.pixel_values, other.validation.pixel_values)
    counts = torch.bincount(first.validation.labels, minlength=10).float()
    totals = counts + torch.bincount(first.train.labels, minlength=10).float()
    assert torch.all((counts - totals * 0.25).abs() < 1)
    train, validation = (set(map(bytes, s.pixel_values.numpy())) for s in (first.train, first.validation))
    assert len(first.train) + len(first.validation) == 1797
    # digits has a few duplicate images; beyond those, no image may sit on both sides.
    assert len(train & validation) <= 5


def test_max_samples_take_a_seeded_subset(tmp_path):
    full = load_image_data(_args(dataset_name="sklearn:digits", validation_size=0.2), seed=0)
    args = _args(dataset_name="sklearn:digits", validation_size=0.2, max_train_samples=100, max_eval_samples=50)
    small, again = load_image_data(args, seed=0), load_image_data(args, seed=0)
    assert (len(small.train), len(small.validation)) == (100, 50)
    assert torch.equal(small.train.pixel_values, again.train.pixel_values)
    # The validation split is carved before subsetting, so it is the same whatever max_train_samples is.
    assert set(map(bytes, small.validation.pixel_values.numpy())) <= set(
        map(bytes, full.validation.pixel_values.numpy())
    )
    assert set(map(bytes, small.train.pixel_values.numpy())) <= set(map(bytes, full.train.pixel_values.numpy()))
    _write_cifar_batches(tmp_path / "cifar-10-batches-py")
    cifar = load_image_data(
        _args(dataset_name=str(tmp_path / "cifar-10-batches-py"), validation_size=2, max_eval_samples=4), seed=0
    )
    assert (len(cifar.validation), len(cifar.test)) == (2, 4)


def test_include_labels_keeps_and_renumbers_classes():
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * 255 / 16).astype(np.uint8)
    data = load_image_data(_args(dataset_name="sklearn:digits", include_labels=["7", "2"]), seed=0)
    assert data.label_names == ["7", "2"]
    images = torch.cat([data.train.pixel_values, data.validation.pixel_values])[:, 0].numpy()
    labels = torch.cat([data.train.labels, data.validation.labels]).numpy()
    for new_id, digit in enumerate((7, 2)):
        assert sorted(map(bytes, images[labels == new_id])) == sorted(map(bytes, pixels[digits.target == digit]))
    assert set(labels.tolist()) == {0, 1}
    with pytest.raises(ValueError, match="unknown label"):
        load_image_data(_args(dataset_name="sklearn:digits", include_labels=["ten"]), seed=0)
    # `--include_labels 7,2` is one label, "7,2": the line says how a list is written.
    with pytest.raises(ValueError, match=r"unknown label\(s\) \['7,2'\].*Fix: one name each, apart: `--include_labels "
                       r"7 2` \(in a config `include_labels: \[7, 2\]`\)\.$"):  # fmt: skip
        load_image_data(_args(dataset_name="sklearn:digits", include_labels=["7,2"]), seed=0)


def test_include_labels_that_leave_a_split_of_the_source_empty_are_named(tmp_path):
    # The validation folder has cats only: the error had been "No image of the validation split could be decoded
    # (0 corrupt)".
    images, labels = _images(12), _labels(12)
    _write_png_folder(tmp_path / "pets" / "train", images, labels)
    _write_png_folder(tmp_path / "pets" / "val", images[:1], labels[:1])
    with pytest.raises(
        ValueError,
        match=r"^The validation split has no images of the `include_labels` classes \['dog', 'frog'\]; it has "
        r"\['cat'\]. Fix: name one of those in `include_labels` too.$",
    ):
        load_image_data(_args(dataset_name=str(tmp_path / "pets"), include_labels=["dog", "frog"]), seed=0)


# ---------------------------------------------------------------------------------------------------------------------
# The decoded cache


def _count_decodes(monkeypatch):
    calls = []
    real = data_cache.decode_images

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(data_cache, "decode_images", counting)
    return calls


def test_second_load_reads_the_cache_without_decoding(tmp_path, monkeypatch, caplog):
    images, labels = _images(12), _labels(12)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    args = _args(dataset_name=str(path), validation_size=3, decoded_cache_dir=str(tmp_path / "cache"))
    calls = _count_decodes(monkeypatch)
    first = load_image_data(args, seed=0)
    assert len(calls) == 1
    entries = os.listdir(tmp_path / "cache")
    assert len(entries) == 1 and not entries[0].startswith(".tmp")
    assert sorted(os.listdir(tmp_path / "cache" / entries[0])) == ["labels.npy", "meta.json", "pixel_values.npy"]

    def fail(*args, **kwargs):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(data_cache, "decode_images", fail)
    with caplog.at_level(logging.INFO, logger="finetune.data"):
        second = load_image_data(args, seed=0)
    assert "skipped decoding" in caplog.text
    assert torch.equal(first.train.pixel_values, second.train.pixel_values)
    assert torch.equal(first.validation.labels, second.validation.labels)
    assert second.label_names == NAMES


def test_cache_key_follows_decode_size_and_source_changes(tmp_path, monkeypatch):
    images, labels = _images(9), _labels(9)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    args = _args(dataset_name=str(path), validation_size=3, decoded_cache_dir=str(tmp_path / "cache"))
    calls = _count_decodes(monkeypatch)
    load_image_data(args, seed=0)
    load_image_data(args, seed=0, target_size=224)  # same-size images: the model's size does not matter
    assert len(calls) == 1
    resized = load_image_data(_args(**{**vars(args), "decode_size": 4}), seed=0)
    assert len(calls) == 2 and resized.train.image_size == (4, 4)
    _dataset(images[::-1].copy(), labels[::-1]).to_parquet(path)  # same size, new content
    os.utime(path, ns=(1, 1))
    load_image_data(args, seed=0)
    assert len(calls) == 3 and len(os.listdir(tmp_path / "cache")) == 3


@pytest.mark.parametrize("given", ["dataset_name", "train_file", "save_to_disk"])
def test_cache_follows_the_image_files_a_parquet_names(tmp_path, monkeypatch, given):
    # `datasets` writes an image folder to parquet with the files' paths in place of their bytes; the parquet file is
    # given as `dataset_name`, or its folder as `train_file` (whose key followed only the folder's own files). A
    # `save_to_disk` folder of path strings keyed only its own files: edited images were served stale, exit 0.
    images, labels = _images(9), _labels(9)
    paths = _write_png_folder(tmp_path / "pets", images, labels)
    path = tmp_path / "tables" / "train.parquet"
    if given == "save_to_disk":
        path = tmp_path / "saved"
        datasets.Dataset.from_dict({"image": list(map(str, paths)), "label": labels}).save_to_disk(path)
    else:
        datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "pets"), split="train").to_parquet(path)
    where = {"train_file": str(path.parent)} if given == "train_file" else {"dataset_name": str(path)}
    args = _args(**where, validation_size=3, decoded_cache_dir=str(tmp_path / "cache"))
    calls = _count_decodes(monkeypatch)
    load_image_data(args, seed=0)
    load_image_data(args, seed=0)
    assert len(calls) == 1
    Image.fromarray(images[0][::-1].copy()).save(paths[0])  # an image edited, the parquet file unchanged
    data = load_image_data(args, seed=0)
    assert len(calls) == 2
    pixels = torch.cat([data.train.pixel_values, data.validation.pixel_values])
    assert any(torch.equal(image, torch.from_numpy(_chw(images[:1][:, ::-1].copy())[0])) for image in pixels)


def test_failed_cache_write_leaves_no_cache_entry(tmp_path, monkeypatch):
    images, labels = _images(6), _labels(6)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    args = _args(dataset_name=str(path), validation_size=2, decoded_cache_dir=str(tmp_path / "cache"))
    real_save = np.save

    def crash_on_labels(file, array, *a, **kw):
        if str(file).endswith("labels.npy"):
            raise OSError("disk full")
        return real_save(file, array, *a, **kw)

    monkeypatch.setattr(np, "save", crash_on_labels)
    data = load_image_data(args, seed=0)  # the run goes on without a cache
    _assert_covers(data, images, labels)
    assert os.listdir(tmp_path / "cache") == []
    monkeypatch.setattr(np, "save", real_save)
    calls = _count_decodes(monkeypatch)
    load_image_data(args, seed=0)
    assert len(calls) == 1, "a half-written cache must not be read"


def test_cache_disabled_with_none(tmp_path, monkeypatch):
    path = tmp_path / "train.parquet"
    _dataset(_images(6), _labels(6)).to_parquet(path)
    calls = _count_decodes(monkeypatch)
    for _ in range(2):
        load_image_data(_args(dataset_name=str(path), validation_size=2, decoded_cache_dir="none"), seed=0)
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------------------------------
# ImageSplit and batching


def test_image_split_batches_with_and_without_getitems():
    split = ImageSplit(torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 4, 4), torch.arange(10))
    item = split[3]
    assert item["pixel_values"].shape == (3, 4, 4) and item["labels"].item() == 3 and item["labels"].ndim == 0
    batch = collate_batch(split.__getitems__([4, 1, 7]))
    assert batch["pixel_values"].shape == (3, 3, 4, 4) and batch["labels"].tolist() == [4, 1, 7]
    stacked = collate_batch([split[4], split[1], split[7]])
    assert torch.equal(stacked["pixel_values"], batch["pixel_values"]) and torch.equal(
        stacked["labels"], batch["labels"]
    )
    loader = torch.utils.data.DataLoader(split, batch_size=4, collate_fn=collate_batch)
    batches = list(loader)
    assert [len(b["labels"]) for b in batches] == [4, 4, 2]
    assert batches[0]["pixel_values"].dtype == torch.uint8 and batches[2]["labels"].tolist() == [8, 9]


# ---------------------------------------------------------------------------------------------------------------------
# Scale: a memory-mapped cache, decoded in parallel, only the chosen images


def test_cache_is_memory_mapped_and_batches_copy_only_their_rows(tmp_path):
    images, labels = _images(12), _labels(12)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    args = _args(dataset_name=str(path), validation_size=3, decoded_cache_dir=str(tmp_path / "cache"))
    for data in (load_image_data(args, seed=0), load_image_data(args, seed=0)):  # decoded, then read from the cache
        mapped = data.train._images
        assert isinstance(mapped, np.memmap) and mapped.mode == "r" and mapped.filename.endswith("pixel_values.npy")
        batch = data.train.__getitems__([2, 0])["pixel_values"]
        assert not isinstance(batch.numpy(), np.memmap)  # a copy of two rows, not a view of the file
        np.testing.assert_array_equal(batch.numpy(), data.train.pixel_values.numpy()[[2, 0]])
        _assert_covers(data, images, labels)


def test_parallel_decoding_gives_the_pixels_of_one_process(tmp_path, monkeypatch):
    images, labels = _images(30), _labels(30)
    root = tmp_path / "pets"
    _write_png_folder(root, images, labels)
    (root / "dog" / "broken.png").write_bytes(b"not a png")
    monkeypatch.setattr("finetune.data.decode.DECODE_CHUNK", 4)  # 8 chunks over 2 worker processes
    one, two = (
        load_image_data(_args(dataset_name=str(root), validation_size=5, decode_workers=workers), seed=0)
        for workers in (1, 2)
    )
    for a, b in ((one.train, two.train), (one.validation, two.validation)):
        assert torch.equal(a.pixel_values, b.pixel_values) and torch.equal(a.labels, b.labels)
    _assert_covers(two, images, labels)  # the broken file is skipped in the pool too


def test_max_samples_select_before_decoding(tmp_path, monkeypatch):
    images, labels = _images(30), _labels(30)
    path = tmp_path / "train.parquet"
    _dataset(images, labels).to_parquet(path)
    decoded = []
    real = data_cache.decode_images

    def counting(read_items, num_images, *args, **kwargs):
        decoded.append(num_images)
        return real(read_items, num_images, *args, **kwargs)

    monkeypatch.setattr(data_cache, "decode_images", counting)
    args = _args(dataset_name=str(path), validation_size=10, max_train_samples=5, max_eval_samples=2)
    data = load_image_data(args, seed=0)
    assert decoded == [7] and len(data.train) == 5 and len(data.validation) == 2
    # The same images as choosing after decoding everything: the selection depends on labels and seed only.
    full = load_image_data(_args(dataset_name=str(path), validation_size=10), seed=0)
    assert set(map(bytes, data.train.pixel_values.numpy())) <= set(map(bytes, full.train.pixel_values.numpy()))
    assert set(map(bytes, data.validation.pixel_values.numpy())) <= set(
        map(bytes, full.validation.pixel_values.numpy())
    )


@pytest.mark.parametrize("size", ["nan", "inf"])
def test_a_validation_size_that_is_no_number_is_refused_in_one_line(size, tmp_path, capsys):
    # float("nan") passed every comparison, and int(inf) raised OverflowError: neither named the option.
    argv = ["--dataset_name", "sklearn:digits", "--validation_size", size, "--output_dir", str(tmp_path / "out")]
    assert run_command(run.main, argv) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: `validation_size` must be a fraction in (0, 1)") and err.count("\n") == 1, err
    assert f"got {float(size)}." in err and not (tmp_path / "out").exists()


def test_the_quickstarts_sample_digits_hold_the_pixels_training_reads(tmp_path):
    """Written 4x larger, they went through a blurring resize back to 8 px: `predict` on them scored below the run."""
    from finetune.tools.quickstart import write_sample_images

    write_sample_images(tmp_path / "digits", per_class=3)
    data = load_image_data(_args(dataset_name="sklearn:digits", validation_size=0.5), seed=0)
    stored = {image.numpy().tobytes() for split in (data.train, data.validation) for image in split.pixel_values}
    files = sorted((tmp_path / "digits").rglob("*.png"))
    assert len(files) == 30 and all(Image.open(f).size == (8, 8) for f in files)
    assert all(np.asarray(Image.open(f)).tobytes() in stored for f in files)


def test_class_folders_whose_names_differ_only_in_case_are_said(tmp_path, caplog):
    """`cat/` and `Cat/` (a copy, or photos sorted on two machines) trained as two classes without a word; classes of
    their own where case tells them apart (EMNIST's letters), so a warning."""
    images, labels = _images(12), [i % 2 for i in range(12)]
    _write_png_folder(tmp_path / "photos", images, labels)
    shutil.copytree(tmp_path / "photos" / NAMES[0], tmp_path / "photos" / NAMES[0].title())
    with caplog.at_level(logging.WARNING):
        data = load_image_data(_args(dataset_name=str(tmp_path / "photos")), seed=0)
    assert data.label_names == ["Cat", "cat", "dog"]
    assert "Class folders whose names differ only in case (Cat/ and cat/) are classes of their own" in caplog.text


def test_the_validation_images_are_named_alike_wherever_their_folder_is(tmp_path):
    """A resume compares which images validate (`validation_images`): those of a `validation_file` were named by
    their absolute paths, so the same files reached through a link, or on another machine, read as other images."""
    images, labels = _images(12), [i % 2 for i in range(12)]
    paths = _write_png_folder(tmp_path / "real" / "images", images, labels)
    for split, rows in (("train", range(8)), ("validation", range(8, 12))):
        lines = "".join(f"images/{paths[i].relative_to(tmp_path / 'real' / 'images')},{labels[i]}\n" for i in rows)
        (tmp_path / "real" / f"{split}.csv").write_text("image,label\n" + lines)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    named = [
        load_image_data(_args(train_file=f"{root}/train.csv", validation_file=f"{root}/validation.csv"), seed=0)
        for root in (tmp_path / "real", tmp_path / "link")
    ]
    assert named[0].validation.files != named[1].validation.files  # as the csv joins them: through the link
    assert named[0].validation_images == named[1].validation_images
