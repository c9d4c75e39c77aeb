"""Load an image-classification dataset once as uint8 `(N, C, H, W)` splits, decoded into a memory-mapped cache.

Every image is decoded a single time (by `finetune.data.decode.decode_image`, the decoding predict and attention use
too), in parallel over the cores, straight into a `.npy` file that every process of the node maps (`cache.py`):
the dataset never sits whole in a process's memory, and batches copy only their own rows. Augmentation happens
later, on whole batches on the device (`finetune/augment.py`). A second run with the same data skips decoding;
the run's processes wait for the first one to decode (`main_process_first`) and then map its file.

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

import numpy as np
import torch
from transformers.utils import logging

from finetune.arguments import DataArguments
from finetune.data.cache import CACHE_FORMAT_VERSION, _cache_root, _finish_entry, _load_cache, _start_entry
from finetune.data.decode import (
    DECODE_CHUNK,
    IMAGE_EXTENSIONS,
    MAX_LISTED_CORRUPT,
    _decode_images,
    _image_items,
    decode_image,
)
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
    _Rows,
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
    """Load, decode (or map from the decoded cache) and split the dataset that `data_args` describes.

    The images each split takes (class filter, validation split, `max_*_samples` subsets) are chosen from the labels
    first; only those images are decoded.

    Args:
        data_args: where the data is and how to split it (`dataset_name`, `validation_size`, `max_train_samples`,
            `corrupt_images`, `decoded_cache_dir`, `decode_size`, `decode_workers`, ...).
        seed: seeds the validation split carved from train and the `max_*_samples` subsets.
        target_size: the square size to store images of mixed sizes at when `decode_size` is unset (the run passes
            `finetune.models.storage_size`: the model's input plus a margin for crops).

    Returns:
        `ImageData` with uint8 `(N, C, H, W)` splits, memory-mapped from the decoded cache for encoded sources.
        Grayscale sources keep 1 channel; `BatchTransform` converts channels for the model on the device.
    """
    source = _open_source(data_args)
    columns = None
    if source.encoded:
        columns = _find_columns(source.encoded["train"], data_args, source.description)
        for name, dataset in source.encoded.items():
            missing = [c for c in columns if c not in dataset.column_names]
            if missing:
                raise ValueError(
                    f"The {name} split of {source.description} lacks column(s) {missing}; its columns are "
                    f"{dataset.column_names}."
                )
        label_names, encode_labels = _label_names(source.encoded, columns[1])
        labels = {name: encode_labels(_column(dataset, columns[1])) for name, dataset in source.encoded.items()}
    else:
        label_names = source.label_names
        labels = {name: np.asarray(y, dtype=np.int64) for name, (_, y) in source.decoded.items()}
    chosen = {name: _Rows(name, np.arange(len(y)), y) for name, y in labels.items()}
    _check_labels(chosen, label_names)
    if data_args.include_labels:
        chosen, label_names = _keep_classes(chosen, label_names, list(data_args.include_labels))

    train, test = chosen["train"], chosen.get("test")
    if "validation" in chosen:
        validation, how = chosen["validation"], "validation split of the source"
    else:
        train_index, validation_index = stratified_split(train.labels, data_args.validation_size, seed)
        train, validation = train.select(train_index), train.select(validation_index)
        how = f"held out from train: validation_size={data_args.validation_size}, stratified, seed {seed}"
    chosen = {
        "train": _subsample(train, data_args.max_train_samples, seed, salt=1),
        "validation": _subsample(validation, data_args.max_eval_samples, seed, salt=2),
    }
    if test is not None:
        chosen["test"] = _subsample(test, data_args.max_eval_samples, seed, salt=3)

    splits = _materialize(source, chosen, labels, columns, data_args, target_size)
    num_channels = max(split.num_channels for split in splits.values())
    for name, split in splits.items():
        if split.num_channels != num_channels:
            # A grayscale split next to RGB ones (e.g. a test set saved differently): store all splits alike.
            logger.info(f"Repeating the 1-channel {name} images to {num_channels} channels to match the other splits.")
            splits[name] = ImageSplit(split.pixel_values.expand(-1, num_channels, -1, -1).contiguous(), split.labels)
    splits, label_names = _renumber_sparse_ids(splits, label_names)
    _check_labels(splits, label_names)
    _check_num_classes(splits["train"], label_names)
    train, validation, test = splits["train"], splits["validation"], splits.get("test")

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


def _materialize(
    source: _Source,
    chosen: dict[str, _Rows],
    labels: dict[str, np.ndarray],
    columns: tuple[str, str] | None,
    data_args: DataArguments,
    target_size: int | None,
) -> dict[str, ImageSplit]:
    """The chosen images of every split: decoded (only the images some split takes) or taken from the arrays."""
    splits = {}
    for source_split in dict.fromkeys(rows.source for rows in chosen.values()):
        parts = {name: rows for name, rows in chosen.items() if rows.source == source_split}
        needed = np.unique(np.concatenate([rows.positions for rows in parts.values()]))
        if source.encoded:
            pixels, row_of = _decode_split(
                source, source_split, needed, labels[source_split], columns, data_args, target_size
            )
        else:
            pixels = torch.from_numpy(source.decoded[source_split][0])
            row_of = np.arange(len(pixels))
        for name, rows in parts.items():
            row = row_of[rows.positions]
            ok = row >= 0  # corrupt images, skipped when decoding, drop out here
            splits[name] = ImageSplit(pixels, rows.labels[ok], row[ok])
    return splits


def _decode_split(
    source: _Source,
    name: str,
    needed: np.ndarray,
    labels: np.ndarray,
    columns: tuple[str, str],
    data_args: DataArguments,
    target_size: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode (or map from the cache) the images at positions `needed` of a source split, whose labels are `labels`.

    Returns the memory-mapped pixels and, for every position of the split, its row in them (-1: not decoded).
    """
    dataset = source.encoded[name]
    where = f"the {name} split of {source.description}"
    subset = len(needed) < len(dataset)
    key_fields = {
        "version": CACHE_FORMAT_VERSION,
        "source": source.fingerprint,
        "split": name,
        "columns": list(columns),
        "corrupt_images": data_args.corrupt_images,
        # A run on a subset (`max_*_samples`) decodes and caches only that subset.
        "images": _hash(needed.tolist()) if subset else "all",
    }
    # Without decode_size, same-size images are stored at their native size whatever the model's resolution, so the
    # cache is shared between models; only sources of mixed sizes depend on target_size ("fallback").
    if data_args.decode_size is not None:
        decode_modes = [f"resize:{data_args.decode_size}"]
    else:
        decode_modes = ["native"] + ([f"fallback:{target_size}"] if target_size is not None else [])
    cache_root = _cache_root(data_args)
    paths = {
        mode: os.path.join(cache_root, _hash({**key_fields, "decode": mode})) if cache_root is not None else None
        for mode in decode_modes
    }
    row_of = np.full(len(dataset), -1, dtype=np.int64)
    if cache_root is not None:
        for path in paths.values():
            cached = _load_cache(path, where)
            if cached is not None:
                pixels, _, meta = cached
                row_of[np.asarray(meta["positions"], dtype=np.int64)] = np.asarray(meta["rows"], dtype=np.int64)
                return pixels, row_of

    selected = dataset.select(needed) if subset else dataset
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = data_args.decode_workers or cores
    tmp = _start_entry(paths[decode_modes[0]])
    start = time.perf_counter()
    pixels, kept, rows, skipped, used_fallback = _decode_images(
        lambda: _image_items(selected, columns[0]),
        len(needed),
        resize_to=data_args.decode_size,
        fallback_size=target_size,
        corrupt_images=data_args.corrupt_images,
        where=where,
        out_path=os.path.join(tmp, "pixel_values.npy"),
        workers=workers,
        positions=needed,
    )
    seconds = time.perf_counter() - start
    logger.info(
        f"Decoded {len(kept):,} images of {where} in {seconds:.1f}s ({len(needed) / max(seconds, 1e-9):,.0f} "
        f"images/s, {min(workers, max(1, -(-len(needed) // DECODE_CHUNK)))} process(es))."
    )
    positions = needed[kept]
    row_of[positions] = rows
    mode = decode_modes[-1] if used_fallback else decode_modes[0]
    meta = {
        "num_channels": int(pixels.shape[1]),
        "skipped": skipped,
        "positions": positions.tolist(),
        "rows": rows.tolist(),
    }
    _finish_entry(tmp, paths[mode], labels[positions], meta)
    return pixels, row_of
