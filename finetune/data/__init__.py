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
"""

import hashlib
import json
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import datasets
import numpy as np
import pyarrow as pa
import torch
from huggingface_hub import constants as hub_constants
from PIL import Image
from transformers.utils import logging

from finetune.arguments import DataArguments
from finetune.data.decode import IMAGE_EXTENSIONS, decode_image
from finetune.locations import looks_like_local_path, offline_switch


logger = logging.get_logger(__name__)

IMAGE_COLUMNS = ("img", "image")
LABEL_COLUMNS = ("label", "labels")
TABLE_EXTENSIONS = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}
SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
}
SKLEARN_DATASETS = ("sklearn:digits",)
ACCEPTED_SOURCES = (
    "a Hub dataset id (e.g. uoft-cs/cifar10), sklearn:digits, a parquet/arrow/csv file, a folder of such files "
    "(split by file name: train*, valid*/val*, test*), a folder saved with `save_to_disk`, an image folder (one "
    "subfolder per class, optionally under train/ validation/ test/), or a cifar-10-batches-py folder"
)
# Bump when the layout of cached files or the decoding itself changes, so old caches are not reused.
CACHE_FORMAT_VERSION = 2
MAX_LISTED_CORRUPT = 10


class ImageSplit(torch.utils.data.Dataset):
    """One split held in memory: `pixel_values` uint8 `(N, C, H, W)` and `labels` int64 `(N,)`.

    `__getitems__` serves a whole batch with one tensor index, which torch's `DataLoader` uses instead of calling
    `__getitem__` once per image; pair it with `collate_batch`.
    """

    def __init__(self, pixel_values: torch.Tensor, labels: torch.Tensor):
        if pixel_values.dtype != torch.uint8 or pixel_values.ndim != 4:
            raise ValueError(
                f"`pixel_values` must be uint8 (N, C, H, W), got {pixel_values.dtype} {tuple(pixel_values.shape)}."
            )
        if labels.ndim != 1 or len(labels) != len(pixel_values):
            raise ValueError(
                f"`labels` must be 1-D with one label per image ({len(pixel_values)}), got {tuple(labels.shape)}."
            )
        self.pixel_values = pixel_values
        self.labels = labels.to(torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        return {"pixel_values": self.pixel_values[index], "labels": self.labels[index]}

    @property
    def num_channels(self) -> int:
        return self.pixel_values.shape[1]

    @property
    def image_size(self) -> tuple[int, int]:
        """`(H, W)` of the stored images."""
        return tuple(self.pixel_values.shape[2:])

    def select(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> "ImageSplit":
        """A new split with the images at `indices`, in that order."""
        index = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        return ImageSplit(self.pixel_values[index], self.labels[index])


def collate_batch(batch) -> dict[str, torch.Tensor]:
    """Collate for `ImageSplit`: pass a batch from `__getitems__` through, or stack a list of per-image dicts."""
    if isinstance(batch, Mapping):
        return dict(batch)
    return {key: torch.stack([item[key] for item in batch]) for key in batch[0]}


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


@dataclass
class _Source:
    """Raw splits before decoding: `datasets.Dataset`s with encoded images, or arrays that need no decoding."""

    description: str
    # Identifies the content of every split, for the decoded cache; see `_files_fingerprint`.
    fingerprint: str
    encoded: dict[str, datasets.Dataset] = field(default_factory=dict)
    decoded: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    label_names: list[str] | None = None


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
    _check_labels(splits, label_names)
    if data_args.include_labels:
        splits, label_names = _keep_classes(splits, label_names, list(data_args.include_labels))

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


# ---------------------------------------------------------------------------------------------------------------------
# Sources


def _open_source(data_args: DataArguments) -> _Source:
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: path for split, path in files.items() if path is not None}
    if files:
        if "train" not in files:
            raise ValueError("`validation_file` / `test_file` need a `train_file` as well.")
        return _open_split_files(files, data_args)
    name = data_args.dataset_name
    if name.startswith("sklearn:"):
        return _open_sklearn(name)
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return _open_local(path, data_args)
    if _looks_like_path(name):
        raise FileNotFoundError(
            f"The dataset path {name!r} does not exist. `dataset_name` accepts {ACCEPTED_SOURCES}."
        )
    return _open_hub(name, data_args.dataset_config_name)


def _looks_like_path(name: str) -> bool:
    """Whether `name` is meant as a local path rather than a Hub id: written as a path, or named like a data file."""
    return (
        looks_like_local_path(name)
        or os.path.splitext(name)[1].lower() in TABLE_EXTENSIONS
        or os.path.basename(name) == "cifar-10-batches-py"
    )


def _open_hub(name: str, config_name: str | None) -> _Source:
    try:
        loaded = datasets.load_dataset(name, config_name)
    except Exception as error:
        offline = offline_switch(datasets=True)
        config = f" (config {config_name!r})" if config_name else ""
        why = f"Offline mode is on ({offline}=1) and it is not cached locally. " if offline else ""
        raise ConnectionError(
            f"Could not load the Hub dataset {name!r}{config} (there is no local path of that name either): "
            f"{type(error).__name__}: {error}\n{why}Fix: connect to "
            "the internet (and log in with `hf auth login` for gated datasets), or point `dataset_name` at a local "
            "copy: a parquet file or folder, an image folder, or a cifar-10-batches-py folder."
        ) from error
    splits = _named_splits(dict(loaded), name)
    fingerprint = _hash({split: ds._fingerprint for split, ds in splits.items()})
    description = name if config_name is None else f"{name} ({config_name})"
    return _Source(description, fingerprint, encoded=splits)


def _open_sklearn(name: str) -> _Source:
    if name not in SKLEARN_DATASETS:
        raise ValueError(f"Unknown scikit-learn dataset {name!r}; supported: {list(SKLEARN_DATASETS)}.")
    from sklearn.datasets import load_digits

    digits = load_digits()
    # The pixels are counts 0..16 of set pixels in a 4x4 block; stretch them to the uint8 range of ordinary images.
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]  # (N, 8, 8) -> (N, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    return _Source(name, name, decoded={"train": (pixels, labels)}, label_names=[str(i) for i in range(10)])


def _open_local(path: str, data_args: DataArguments) -> _Source:
    if os.path.isfile(path):
        return _open_split_files({"train": path}, data_args)
    if os.path.isfile(os.path.join(path, "batches.meta")) and os.path.isfile(os.path.join(path, "data_batch_1")):
        return _open_cifar_batches(path)
    if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(os.path.join(path, "state.json")):
        loaded = datasets.load_from_disk(path)
        loaded = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return _Source(path, _files_fingerprint([path]), encoded=_named_splits(loaded, path))
    try:
        patterns = datasets.data_files.get_data_patterns(path)
        resolved = datasets.data_files.DataFilesDict.from_patterns(patterns, base_path=path)
    except FileNotFoundError as error:  # EmptyDatasetError and friends
        raise FileNotFoundError(
            f"No data files found in {path!r}. `dataset_name` accepts {ACCEPTED_SOURCES}."
        ) from error
    tables = {
        split: [f for f in files if os.path.splitext(f)[1].lower() in TABLE_EXTENSIONS]
        for split, files in resolved.items()
    }
    tables = {split: files for split, files in tables.items() if files}
    if tables:
        return _open_split_files(tables, data_args, description=path)
    has_images = any(os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS for files in resolved.values() for f in files)
    if not has_images:
        raise FileNotFoundError(
            f"{path!r} holds neither parquet/arrow/csv files nor images. `dataset_name` accepts {ACCEPTED_SOURCES}."
        )
    loaded = datasets.load_dataset("imagefolder", data_dir=path)
    return _Source(path, _files_fingerprint([path]), encoded=_named_splits(dict(loaded), path))


def _open_split_files(files: dict[str, str | list[str]], data_args: DataArguments, description: str = "") -> _Source:
    """Parquet/arrow/csv files (or a folder of them) per split."""
    splits, fingerprint_paths = {}, []
    for split, paths in files.items():
        paths = [paths] if isinstance(paths, str) else list(paths)
        parts = []
        for path in paths:
            path = os.path.expanduser(path)
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"The {split} data path {path!r} does not exist. Accepted: {ACCEPTED_SOURCES}."
                )
            if os.path.isdir(path):
                # A folder given as train_file/validation_file: take its (single or train) split.
                sub = _open_local(path, data_args)
                if sub.decoded:
                    raise ValueError(f"{path!r} cannot be used as a single split; pass it as `dataset_name`.")
                parts.append(sub.encoded["train"])
                fingerprint_paths.append(path)
                continue
            extension = os.path.splitext(path)[1].lower()
            if extension not in TABLE_EXTENSIONS:
                raise ValueError(
                    f"Unsupported data file {path!r}: expected one of {sorted(TABLE_EXTENSIONS)}. "
                    f"`dataset_name` accepts {ACCEPTED_SOURCES}."
                )
            if extension == ".csv":
                dataset, image_paths = _read_csv(path, data_args.image_column_name)
                fingerprint_paths += image_paths
            else:
                dataset = datasets.load_dataset(TABLE_EXTENSIONS[extension], data_files=path, split="train")
            parts.append(dataset)
            fingerprint_paths.append(path)
        splits[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if not description:
        description = ", ".join(f"{split}: {p}" for split, p in files.items()) if len(files) > 1 else files["train"]
    return _Source(str(description), _files_fingerprint(fingerprint_paths), encoded=splits)


def _read_csv(path: str, image_column_name: str | None) -> tuple[datasets.Dataset, list[str]]:
    """A csv of image paths (relative to the csv file) and labels, with the paths made absolute."""
    import pandas as pd

    frame = pd.read_csv(path)
    column = _pick_column(list(frame.columns), image_column_name, IMAGE_COLUMNS, "image", path)
    base = os.path.dirname(os.path.abspath(path))
    frame[column] = [p if os.path.isabs(p) else os.path.join(base, p) for p in frame[column].astype(str)]
    return datasets.Dataset.from_pandas(frame, preserve_index=False), list(frame[column])


def _open_cifar_batches(path: str) -> _Source:
    """The original CIFAR-10 python pickles: uint8 rows of 3,072 values, the 3 planes of a 32x32 image in a row.

    These are pickles: load only a copy you trust (the official archive from cs.toronto.edu).
    """

    def read(name: str) -> dict:
        with open(os.path.join(path, name), "rb") as f:
            return pickle.load(f, encoding="bytes")

    def arrays(batches: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        data = np.concatenate([b[b"data"] for b in batches]).astype(np.uint8)
        pixels = data.reshape(-1, 3, 32, 32)  # (N, 3072) -> (N, C, H, W): rows are channel-major
        labels = np.concatenate([np.asarray(b[b"labels"], dtype=np.int64) for b in batches])
        return pixels, labels

    train_names = sorted(n for n in os.listdir(path) if n.startswith("data_batch_"))
    splits = {"train": arrays([read(n) for n in train_names])}
    if os.path.isfile(os.path.join(path, "test_batch")):
        splits["test"] = arrays([read("test_batch")])
    label_names = [n.decode() if isinstance(n, bytes) else n for n in read("batches.meta")[b"label_names"]]
    return _Source(path, _files_fingerprint([path]), decoded=splits, label_names=label_names)


def _named_splits(splits: dict[str, datasets.Dataset], where: str) -> dict[str, datasets.Dataset]:
    """Keep train/validation/test under their canonical names (`val` -> `validation`, ...)."""
    if len(splits) == 1 and next(iter(splits)) not in SPLIT_ALIASES:
        return {"train": next(iter(splits.values()))}
    named = {}
    for name, dataset in splits.items():
        canonical = SPLIT_ALIASES.get(str(name).lower())
        if canonical is None:
            logger.info(f"Ignoring split {name!r} of {where}: not a train/validation/test split.")
        elif canonical in named:
            raise ValueError(f"{where} has two {canonical} splits ({list(splits)}); keep one.")
        else:
            named[canonical] = dataset
    if "train" not in named:
        raise ValueError(f"{where} has no train split; its splits are {list(splits)}.")
    return named


def _files_fingerprint(paths: Sequence[str]) -> str:
    """Hash of path, size and modification time of every file (folders walked), so any edit invalidates the cache."""
    stats = []
    for path in paths:
        path = os.path.abspath(path)
        walked = [path] if os.path.isfile(path) else []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            walked += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        for file in walked:
            try:
                stat = os.stat(file)
            except OSError:
                stats.append((file, None, None))  # a missing image: decoding will report it
                continue
            stats.append((file, stat.st_size, stat.st_mtime_ns))
    return _hash(stats)


def _hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------------------------------
# Columns and labels


def _pick_column(columns: list[str], explicit: str | None, candidates: tuple[str, ...], kind: str, where: str) -> str:
    argument = f"{kind}_column_name"
    if explicit is not None:
        if explicit not in columns:
            raise ValueError(f"`{argument}`={explicit!r} is not a column of {where}; its columns are {columns}.")
        return explicit
    for candidate in candidates:
        if candidate in columns:
            return candidate
    raise ValueError(
        f"Found no {kind} column in {where} (looked for {list(candidates)}); its columns are {columns}. "
        f"Set `{argument}` to the column holding the {kind}s."
    )


def _find_columns(dataset: datasets.Dataset, data_args: DataArguments, where: str) -> tuple[str, str]:
    columns = list(dataset.column_names)
    features = dataset.features
    # Beyond the usual names, a column is found by its type when it is the only one of that type.
    images = [c for c in columns if isinstance(features[c], datasets.Image)]
    labels = [c for c in columns if isinstance(features[c], datasets.ClassLabel)]
    image_candidates = IMAGE_COLUMNS + (tuple(images) if len(images) == 1 else ())
    label_candidates = LABEL_COLUMNS + (tuple(labels) if len(labels) == 1 else ())
    image_column = _pick_column(columns, data_args.image_column_name, image_candidates, "image", where)
    label_column = _pick_column(columns, data_args.label_column_name, label_candidates, "label", where)
    return image_column, label_column


def _label_names(splits: dict[str, datasets.Dataset], label_column: str) -> tuple[list[str], Callable]:
    """Label names and a function from a split's raw label column to int64 ids."""
    feature = splits["train"].features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names), lambda values: np.asarray(values, dtype=np.int64)
    values = {name: _column(ds, label_column) for name, ds in splits.items()}
    if any(v is None for vs in values.values() for v in vs):
        raise ValueError(f"The label column {label_column!r} has missing values; every image needs a label.")
    if all(isinstance(v, str) for vs in values.values() for v in vs):
        names = sorted({v for vs in values.values() for v in vs})
        ids = {name: i for i, name in enumerate(names)}
        return names, lambda column: np.asarray([ids[v] for v in column], dtype=np.int64)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for vs in values.values() for v in vs):
        largest = max((max(vs) for vs in values.values() if vs), default=0)
        return [str(i) for i in range(largest + 1)], lambda column: np.asarray(column, dtype=np.int64)
    raise ValueError(
        f"The label column {label_column!r} must hold class names (str), class ids (int) or a ClassLabel; "
        f"got {feature}. Set `label_column_name` if another column holds the labels."
    )


def _column(dataset: datasets.Dataset, column: str) -> list:
    return dataset.select_columns([column]).with_format("arrow")[:].column(column).to_pylist()


def _check_labels(splits: dict[str, ImageSplit], label_names: list[str]) -> None:
    for name, split in splits.items():
        if len(split) == 0:
            raise ValueError(f"The {name} split is empty (after dropping corrupt images).")
        low, high = int(split.labels.min()), int(split.labels.max())
        if low < 0 or high >= len(label_names):
            raise ValueError(
                f"The {name} split has label ids in [{low}, {high}], outside the {len(label_names)} classes "
                f"{label_names[:10]}{'...' if len(label_names) > 10 else ''}."
            )


def _keep_classes(
    splits: dict[str, ImageSplit], label_names: list[str], keep: list[str]
) -> tuple[dict[str, ImageSplit], list[str]]:
    """Only the images of the classes in `keep`, renumbered in the order of `keep`."""
    unknown = [name for name in keep if name not in label_names]
    if unknown or len(set(keep)) != len(keep):
        problem = f"unknown label(s) {unknown}" if unknown else f"repeated labels in {keep}"
        raise ValueError(f"`include_labels` has {problem}; the dataset's labels are {label_names}.")
    new_id = torch.full((len(label_names),), -1, dtype=torch.int64)
    new_id[[label_names.index(name) for name in keep]] = torch.arange(len(keep))
    kept = {}
    for name, split in splits.items():
        labels = new_id[split.labels]
        index = torch.nonzero(labels >= 0).flatten()
        kept[name] = ImageSplit(split.pixel_values[index], labels[index])
    logger.info(f"Kept the {len(keep)} classes of `include_labels` {keep}, renumbered in that order.")
    return kept, keep


# ---------------------------------------------------------------------------------------------------------------------
# Decoding and the decoded cache


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


def _image_items(dataset: datasets.Dataset, column: str) -> Iterator[tuple[bytes | None, str | None]]:
    """`(bytes, path)` of every image, read from arrow in batches so the encoded images never all sit in Python."""
    for batch in dataset.select_columns([column]).with_format("arrow").iter(batch_size=1000):
        values = batch.column(column).combine_chunks()
        if isinstance(values.type, pa.StructType):
            data = values.field("bytes").to_pylist() if values.type.get_field_index("bytes") >= 0 else None
            paths = values.field("path").to_pylist() if values.type.get_field_index("path") >= 0 else None
            n = len(values)
            yield from zip(data or [None] * n, paths or [None] * n)
        elif values.type in (pa.string(), pa.large_string()):
            yield from ((None, path) for path in values.to_pylist())
        elif values.type in (pa.binary(), pa.large_binary()):
            yield from ((data, None) for data in values.to_pylist())
        else:
            raise ValueError(
                f"The image column {column!r} holds {values.type}; expected encoded images (an Image feature, bytes) "
                "or image file paths. Set `image_column_name` if another column holds the images."
            )


class _Restart(Exception):
    """Raised inside a decoding pass when a later image shows the pass started with the wrong mode or size."""

    def __init__(self, mode: str | None = None, size: tuple[int, int] | None = None):
        self.mode, self.size = mode, size


def _decode_images(
    read_items: Callable[[], Iterator[tuple[bytes | None, str | None]]],
    num_images: int,
    resize_to: int | None,
    fallback_size: int | None,
    corrupt_images: str,
    where: str,
) -> tuple[np.ndarray, np.ndarray, list[str], bool]:
    """Decode every image once to uint8 `(N, C, H, W)`.

    The first image decides the starting mode ("L" for grayscale, else "RGB") and size; a pass restarts in RGB when
    a colour image follows grayscale ones, and at `fallback_size` when sizes differ. Restarts are rare and happen at
    most once each, which keeps the common case to one pass into a preallocated array.

    Returns:
        `(pixels, kept, skipped, used_fallback)`: the decoded images, the indices of the images kept, descriptions of
        the skipped corrupt images, and whether the images were resized to `fallback_size` because their sizes differ.
    """
    mode = None
    size = (resize_to, resize_to) if resize_to is not None else None
    while True:
        try:
            pixels, kept, skipped = _decode_pass(read_items(), num_images, mode, size, corrupt_images, where)
        except _Restart as restart:
            if restart.mode is not None:
                mode = restart.mode
            if restart.size is not None:
                if fallback_size is None:
                    raise ValueError(
                        f"The images of {where} differ in size ({restart.size[0]}x{restart.size[1]} and others) "
                        "and no size to resize them to is known: set `decode_size`."
                    ) from None
                size = (fallback_size, fallback_size)
                logger.info(f"The images of {where} differ in size: resizing them to {fallback_size}x{fallback_size}.")
            continue
        if skipped:
            listed = ", ".join(skipped[:MAX_LISTED_CORRUPT]) + (", ..." if len(skipped) > MAX_LISTED_CORRUPT else "")
            logger.warning(f"Skipped {len(skipped)} corrupt image(s) of {where} that could not be decoded: {listed}.")
        used_fallback = resize_to is None and size is not None
        return pixels, np.asarray(kept, dtype=np.int64), skipped, used_fallback


def _decode_pass(items, num_images, mode, size, corrupt_images, where):
    pixels, kept, skipped = None, [], []
    first_size = None
    progress = logging.tqdm(total=num_images, desc="Decoding images", unit="img", leave=False)
    for i, (data, path) in enumerate(items):
        name = f"index {i}" + (f" ({path})" if path else "")
        try:
            if data is None and path is None:
                raise ValueError("the image is missing (no bytes, no path)")
            # Before the mode is known (or while it is "L"), an image decodes to its own kind; a colour image among
            # grayscale ones restarts the pass in RGB.
            image = decode_image(data if data is not None else path, "RGB" if mode == "RGB" else None)
            if mode is None:
                mode = image.mode
            elif image.mode != mode:
                raise _Restart(mode="RGB")
            if size is None:
                first_size = first_size or image.size
                if image.size != first_size:
                    raise _Restart(size=image.size)
            elif image.size != size:
                image = image.resize(size, Image.BILINEAR)
            array = np.asarray(image)
        except _Restart:
            progress.close()
            raise
        except Exception as error:  # PIL raises many types (OSError, SyntaxError, ValueError...) for broken files
            if corrupt_images == "error":
                progress.close()
                raise ValueError(
                    f"Could not decode image {name} of {where}: {type(error).__name__}: {error}. "
                    "Set `corrupt_images=skip` to drop images that cannot be decoded."
                ) from error
            skipped.append(name)
            progress.update(1)
            continue
        if pixels is None:
            channels = 1 if mode == "L" else 3
            pixels = np.empty((num_images, channels, *array.shape[:2]), dtype=np.uint8)
        pixels[len(kept)] = array[None] if mode == "L" else array.transpose(2, 0, 1)  # (H, W, C) -> (C, H, W)
        kept.append(i)
        progress.update(1)
    progress.close()
    if pixels is None:
        raise ValueError(f"No image of {where} could be decoded ({len(skipped)} corrupt).")
    return pixels[: len(kept)], kept, skipped


def _cache_root(data_args: DataArguments) -> str | None:
    root = data_args.decoded_cache_dir
    if root is not None and root.lower() == "none":
        return None
    return os.path.expanduser(root) if root else os.path.join(hub_constants.HF_HOME, "vit-finetune", "decoded")


def _load_cache(path: str, where: str) -> tuple[np.ndarray, np.ndarray] | None:
    meta_path = os.path.join(path, "meta.json")
    if not os.path.isfile(meta_path):
        return None
    start = time.perf_counter()
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        pixels = np.load(os.path.join(path, "pixel_values.npy"))
        labels = np.load(os.path.join(path, "labels.npy"))
    except (OSError, ValueError) as error:
        logger.warning(f"Ignoring the unreadable decoded cache {path}: {error}")
        return None
    logger.info(
        f"Loaded {len(labels):,} decoded images of {where} from the cache {path} in "
        f"{time.perf_counter() - start:.1f}s; skipped decoding."
    )
    if meta.get("skipped"):
        logger.warning(f"{len(meta['skipped'])} corrupt image(s) of {where} were skipped when the cache was built.")
    return pixels, labels


def _save_cache(path: str, pixels: np.ndarray, labels: np.ndarray, meta: dict) -> None:
    """Write into a temporary folder and rename it into place, so a crash never leaves a half-written cache."""
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(path)}-", dir=parent)
    except OSError as error:
        logger.warning(f"Could not create the decoded cache in {parent}: {error}. Continuing without it.")
        return
    try:
        np.save(os.path.join(tmp, "pixel_values.npy"), pixels)
        np.save(os.path.join(tmp, "labels.npy"), labels)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        os.rename(tmp, path)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        # A concurrent run that renamed its copy first leaves `path` complete; anything else is only a lost cache.
        if not os.path.isfile(os.path.join(path, "meta.json")):
            logger.warning(f"Could not write the decoded cache {path}: {error}. Continuing without it.")
        return
    logger.info(f"Cached the decoded images in {path}.")


# ---------------------------------------------------------------------------------------------------------------------
# Splitting


def stratified_split(labels: np.ndarray, validation_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices `(train, validation)` that hold out `validation_size` of `labels`, with class proportions kept.

    Args:
        labels: int class ids, one per image.
        validation_size: a fraction in (0, 1), or a number of images (>= 1).
        seed: the same seed gives the same split.

    Every class gets its share rounded down; the images left over go to the classes with the largest remainders
    (ties broken at random by the seed), so the validation split has exactly the requested size.
    """
    n = len(labels)
    n_validation = int(round(validation_size * n)) if validation_size < 1 else int(validation_size)
    if not 1 <= n_validation < n:
        raise ValueError(
            f"`validation_size`={validation_size} would hold out {n_validation} of the {n} training images; "
            "it must leave at least one image on each side."
        )
    rng = np.random.default_rng(seed)
    classes, class_of, counts = np.unique(labels, return_inverse=True, return_counts=True)
    share = counts * (n_validation / n)
    quota = np.floor(share).astype(np.int64)
    order = np.lexsort((rng.random(len(classes)), -(share - quota)))  # largest remainder first
    quota[order[: n_validation - quota.sum()]] += 1
    validation = np.concatenate([rng.permutation(np.flatnonzero(class_of == k))[:q] for k, q in enumerate(quota)])
    is_validation = np.zeros(n, dtype=bool)
    is_validation[validation] = True
    return np.flatnonzero(~is_validation), np.flatnonzero(is_validation)


def _subsample(split: ImageSplit, max_samples: int | None, seed: int, salt: int) -> ImageSplit:
    """The first `max_samples` images after a seeded shuffle (kept in source order)."""
    if max_samples is None or max_samples >= len(split):
        return split
    if max_samples < 1:
        raise ValueError(f"`max_*_samples` must be >= 1, got {max_samples}.")
    # Each split gets its own stream, so limiting one split never changes which images another keeps.
    index = np.random.default_rng([seed, salt]).permutation(len(split))[:max_samples]
    return split.select(np.sort(index))
