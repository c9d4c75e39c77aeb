"""Load an image-classification dataset once into memory as uint8 tensors.

Every image is decoded a single time (by `finetune.data.decode.decode_image`, the decoding predict and attention use
too) to a `(C, H, W)` uint8 array and the whole split is kept as one tensor (airbench style); augmentation happens
later, on whole batches on the device (`finetune/augment.py`). Decoded splits are cached on disk, so a second run
with the same data skips decoding.

Sources, chosen from `DataArguments.dataset_name` (or `train_file` / `validation_file` / `test_file`):

- a Hub dataset id (`uoft-cs/cifar10`, `ylecun/mnist`), loaded with `datasets.load_dataset`;
- `sklearn:digits`, scikit-learn's 1,797 8x8 digits (no download needed);
- a local parquet, arrow or csv file, or a folder of them split by file name (`train*`, `valid*`/`val*`, `test*`);
  a csv has a column of image paths relative to the csv file and a label column;
- a folder saved with `Dataset.save_to_disk` / `DatasetDict.save_to_disk`;
- an image folder with one subfolder per class, optionally under `train/`, `validation/` (`val/`), `test/`;
- the original CIFAR-10 python folder `cifar-10-batches-py`.

The package: `sources.py` opens these, `decode.py` decodes images (one decoding for training, predict and
attention), `cache.py` keeps decoded splits on disk, `splits.py` holds the in-memory splits, the validation split and
subsets; this file puts them together in `load_image_data`.
"""

import os
import time
from dataclasses import dataclass

import torch
from transformers.utils import logging

from finetune.arguments import DataArguments
from finetune.data.cache import CACHE_FORMAT_VERSION, _cache_root, _load_cache, _save_cache
from finetune.data.decode import IMAGE_EXTENSIONS, MAX_LISTED_CORRUPT, _decode_images, _image_items, decode_image
from finetune.data.sources import (
    ACCEPTED_SOURCES,
    IMAGE_COLUMNS,
    LABEL_COLUMNS,
    SKLEARN_DATASETS,
    SPLIT_ALIASES,
    TABLE_EXTENSIONS,
    _column,
    _find_columns,
    _hash,
    _label_names,
    _open_source,
    _Source,
)
from finetune.data.splits import (
    ImageSplit,
    _check_labels,
    _check_num_classes,
    _keep_classes,
    _renumber_sparse_ids,
    _subsample,
    collate_batch,
    stratified_split,
)


logger = logging.get_logger(__name__)

__all__ = [
    "ACCEPTED_SOURCES",
    "CACHE_FORMAT_VERSION",
    "IMAGE_COLUMNS",
    "IMAGE_EXTENSIONS",
    "LABEL_COLUMNS",
    "MAX_LISTED_CORRUPT",
    "SKLEARN_DATASETS",
    "SPLIT_ALIASES",
    "TABLE_EXTENSIONS",
    "ImageData",
    "ImageSplit",
    "collate_batch",
    "decode_image",
    "load_image_data",
    "stratified_split",
]


@dataclass
class ImageData:
    """The splits of one dataset, decoded, with its label names.

    `test` is `None` when the source has no test split; it is meant only for the final evaluation.
    """

    train: ImageSplit
    validation: ImageSplit
    test: ImageSplit | None
    label_names: list[str]
    num_channels: int
    source: str

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}


def load_image_data(data_args: DataArguments, seed: int, target_size: int | None = None) -> ImageData:
    """Load, decode (or read from the decoded cache) and split the dataset that `data_args` describes.

    Args:
        data_args: where the data is and how to split it (`dataset_name`, `validation_size`, `max_train_samples`,
            `corrupt_images`, `decoded_cache_dir`, `decode_size`, ...).
        seed: seeds the validation split carved from train and the `max_*_samples` subsets.
        target_size: the model's resolution, used to resize when images differ in size and `decode_size` is unset.

    Returns:
        `ImageData` with uint8 `(N, C, H, W)` splits. Grayscale sources keep 1 channel; `BatchTransform` converts
        channels for the model on the device.
    """
    source = _open_source(data_args)
    if source.encoded:
        splits, label_names = _decode_source(source, data_args, target_size)
    else:
        splits = {
            name: ImageSplit(torch.from_numpy(px), torch.from_numpy(y)) for name, (px, y) in source.decoded.items()
        }
        label_names = source.label_names
    num_channels = max(split.num_channels for split in splits.values())
    for name, split in splits.items():
        if split.num_channels != num_channels:
            # A grayscale split next to RGB ones (e.g. a test set saved differently): store all splits alike.
            logger.info(f"Repeating the 1-channel {name} images to {num_channels} channels to match the other splits.")
            splits[name] = ImageSplit(split.pixel_values.expand(-1, num_channels, -1, -1).contiguous(), split.labels)
    splits, label_names = _renumber_sparse_ids(splits, label_names)
    _check_labels(splits, label_names)
    if data_args.include_labels:
        splits, label_names = _keep_classes(splits, label_names, list(data_args.include_labels))
    _check_num_classes(splits["train"], label_names)

    train = splits["train"]
    if "validation" in splits:
        validation, how = splits["validation"], "validation split of the source"
    else:
        train_index, validation_index = stratified_split(train.labels.numpy(), data_args.validation_size, seed)
        train, validation = train.select(train_index), train.select(validation_index)
        how = f"held out from train: validation_size={data_args.validation_size}, stratified, seed {seed}"
    test = splits.get("test")
    train = _subsample(train, data_args.max_train_samples, seed, salt=1)
    validation = _subsample(validation, data_args.max_eval_samples, seed, salt=2)
    test = _subsample(test, data_args.max_eval_samples, seed, salt=3) if test is not None else None

    sizes = {name: s.image_size for name, s in (("train", train), ("validation", validation), ("test", test)) if s}
    size_text = ", ".join(f"{name} {h}x{w}" for name, (h, w) in sizes.items())
    if len(set(sizes.values())) == 1:
        size_text = "{}x{}".format(*train.image_size)
    logger.info(
        f"Data from {source.description}: {len(train):,} train, {len(validation):,} validation ({how}), "
        f"{len(test) if test is not None else 0:,} test images; image size {size_text}, {num_channels} channel(s), "
        f"{len(label_names)} classes."
    )
    return ImageData(train, validation, test, list(label_names), num_channels, source.description)


def _decode_source(
    source: _Source, data_args: DataArguments, target_size: int | None
) -> tuple[dict[str, ImageSplit], list[str]]:
    image_column, label_column = _find_columns(source.encoded["train"], data_args, source.description)
    for name, dataset in source.encoded.items():
        missing = [c for c in (image_column, label_column) if c not in dataset.column_names]
        if missing:
            raise ValueError(
                f"The {name} split of {source.description} lacks column(s) {missing}; its columns are "
                f"{dataset.column_names}."
            )
    label_names, encode_labels = _label_names(source.encoded, label_column)
    cache_root = _cache_root(data_args)
    key_fields = {
        "version": CACHE_FORMAT_VERSION,
        "source": source.fingerprint,
        "columns": [image_column, label_column],
        "corrupt_images": data_args.corrupt_images,
        "label_names": label_names,
    }
    # Without decode_size, same-size images are stored at their native size whatever the model's resolution, so the
    # cache is shared between models; only sources of mixed sizes depend on target_size ("fallback").
    if data_args.decode_size is not None:
        decode_modes = [f"resize:{data_args.decode_size}"]
    else:
        decode_modes = ["native"] + ([f"fallback:{target_size}"] if target_size is not None else [])

    splits = {}
    for name, dataset in source.encoded.items():
        where = f"the {name} split of {source.description}"
        keys = {mode: _hash({**key_fields, "split": name, "decode": mode}) for mode in decode_modes}
        cached = None
        if cache_root is not None:
            for key in keys.values():
                cached = _load_cache(os.path.join(cache_root, key), where)
                if cached is not None:
                    break
        if cached is None:
            start = time.perf_counter()
            pixels, kept, skipped, used_fallback = _decode_images(
                lambda dataset=dataset: _image_items(dataset, image_column),
                len(dataset),
                resize_to=data_args.decode_size,
                fallback_size=target_size,
                corrupt_images=data_args.corrupt_images,
                where=where,
            )
            labels = encode_labels(_column(dataset, label_column))[kept]
            logger.info(f"Decoded {len(kept):,} images of {where} in {time.perf_counter() - start:.1f}s.")
            if cache_root is not None:
                mode = decode_modes[-1] if used_fallback else decode_modes[0]
                meta = {"label_names": label_names, "num_channels": int(pixels.shape[1]), "skipped": skipped}
                _save_cache(os.path.join(cache_root, keys[mode]), pixels, labels, meta)
            cached = pixels, labels
        splits[name] = ImageSplit(torch.from_numpy(cached[0]), torch.from_numpy(cached[1]))
    return splits, label_names
