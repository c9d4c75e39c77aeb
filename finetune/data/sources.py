"""Where the data comes from: Hub datasets, scikit-learn's digits, parquet/arrow/csv files, `save_to_disk` folders,
image folders and CIFAR-10 python batches, opened as raw splits (`Source`), with their image and label columns and the
encoded images of a column (`image_items`), the input of decoding."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import pickle
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

from finetune.arguments import is_set
from finetune.errors import one_line
from finetune.locations import looks_like_local_path, offline_switch


if TYPE_CHECKING:
    from finetune.arguments import DataArguments

logger = logging.getLogger(__name__)

# The files read as images in a folder: datasets' image folder reads training's, and predict searches folders for them.
IMAGE_EXTENSIONS = ImageFolder.EXTENSIONS
# Photo formats it leaves out (HEIC is iPhones' default): a folder's are named rather than dropped without a word.
UNREAD_PHOTO_EXTENSIONS = (".avif", ".heic", ".heif")
IMAGE_COLUMNS = ("img", "image")
FILE_NAME_COLUMN = "file_name"  # an image folder's metadata.csv (Hugging Face's format): after an `Image` column
LIST_FEATURES = (datasets.List, datasets.LargeList)  # a multi-label column
LABEL_COLUMNS = ("label", "labels")
TABLE_EXTENSIONS = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}
SPLIT_ALIASES = {
    **dict.fromkeys(("train", "training"), "train"),
    **dict.fromkeys(("validation", "valid", "val", "dev"), "validation"),
    **dict.fromkeys(("test", "testing"), "test"),
}
SKLEARN_DATASETS = ("sklearn:digits",)
ACCEPTED_SOURCES = (
    "a Hub dataset id (e.g. uoft-cs/cifar10), sklearn:digits, a parquet/arrow/csv file, a folder of such files "
    "(split by file name: train*, valid*/val*, test*), a folder saved with `save_to_disk`, an image folder (one "
    "subfolder per class, optionally under train/ validation/ test/), or a cifar-10-batches-py folder"
)


@dataclass
class Source:
    """Raw splits before decoding: `datasets.Dataset`s with encoded images, or arrays that need no decoding."""

    description: str
    fingerprint: str  # of the content of every split, for the decoded cache
    encoded: dict[str, datasets.Dataset] = field(default_factory=dict)
    decoded: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    label_names: list[str] | None = None


def open_source(data_args: DataArguments) -> Source:
    """The raw splits `data_args` points at (`dataset_name`, or `train_file` / `validation_file` / `test_file`)."""
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: path for split, path in files.items() if path is not None}
    name = data_args.dataset_name
    local = files or name.startswith("sklearn:") or os.path.exists(os.path.expanduser(name))
    if data_args.dataset_config_name is not None and local:
        logger.warning(
            f"`dataset_config_name` {data_args.dataset_config_name} is not used: it names a configuration of a Hub "
            f"dataset, and the data comes from {', '.join(files.values()) if files else name}. Drop it."
        )
    if files:
        if "train" not in files:
            raise ValueError("`validation_file` / `test_file` need a `train_file` as well.")
        if is_set(data_args, "dataset_name"):
            logger.warning(
                f"`dataset_name` {data_args.dataset_name} is not used: the data comes from `train_file` (and "
                "`validation_file`, `test_file`). Drop one of them."
            )
        return _open_split_files(files, data_args)
    if name.startswith("sklearn:"):
        return _open_sklearn(name)
    path = os.path.expanduser(name)
    if os.path.exists(path):
        return _open_local(path, data_args)
    # Meant as a local path rather than a Hub id: written as a path, or named like a data file.
    data_file = _extension(name) in TABLE_EXTENSIONS or os.path.basename(name) == "cifar-10-batches-py"
    if looks_like_local_path(name) or data_file:
        raise FileNotFoundError(
            f"The dataset path {name!r} does not exist. `dataset_name` accepts {ACCEPTED_SOURCES}."
        )
    return _open_hub(name, data_args.dataset_config_name)


def _open_hub(name: str, config_name: str | None) -> Source:
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
    # The arrow files of the download change with a new version; a dataset held in memory never reuses a cache.
    files = [f["filename"] for dataset in splits.values() for f in dataset.cache_files]
    held_in_memory = not all(dataset.cache_files for dataset in splits.values())
    fingerprint = content_hash([name, config_name, uuid.uuid4().hex if held_in_memory else _files_fingerprint(files)])
    description = name if config_name is None else f"{name} ({config_name})"
    return Source(description, fingerprint, encoded=splits)


def _open_sklearn(name: str) -> Source:
    if name not in SKLEARN_DATASETS:
        raise ValueError(f"Unknown scikit-learn dataset {name!r}; supported: {list(SKLEARN_DATASETS)}.")
    from sklearn.datasets import load_digits

    digits = load_digits()
    # The pixels are counts 0..16 of set pixels in a 4x4 block; stretch them to the uint8 range of ordinary images.
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]  # (N, 8, 8) -> (N, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    return Source(name, name, decoded={"train": (pixels, labels)}, label_names=[str(i) for i in range(10)])


def _open_local(path: str, data_args: DataArguments, one_split: bool = False) -> Source:
    """A local file or folder; `one_split`: the folder of one split (`validation_file`), whatever it is named, and an
    image folder of it may hold a single class."""
    if os.path.isfile(path):
        return _open_split_files({"train": path}, data_args)
    if os.path.isfile(os.path.join(path, "batches.meta")) and os.path.isfile(os.path.join(path, "data_batch_1")):
        return _open_cifar_batches(path)
    if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(os.path.join(path, "state.json")):
        loaded = datasets.load_from_disk(path)
        loaded = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        splits, referenced = _named_splits(loaded, path, need_train=not one_split), []
        for name, dataset in splits.items():  # a column of file paths: the images lie outside the folder
            splits[name], files = _image_paths(dataset, data_args, path, base=path)
            referenced += files
        # Kept for images held as bytes: a run trained on the folder knows it by this fingerprint (`results.json`).
        fingerprint = _files_fingerprint([path])
        fingerprint = content_hash([fingerprint, _files_fingerprint(referenced)]) if referenced else fingerprint
        return Source(path, fingerprint, splits)
    folders = (os.path.join(root, d) for root, dirs, _ in os.walk(path) for d in dirs)
    linked = next((folder for folder in folders if os.path.islink(folder)), None)
    if linked:
        raise ValueError(
            f"{linked} is a link to a folder, which `datasets` does not follow: its images would be left out. Replace "
            "the link with the folder itself (or a copy)."
        )
    split_folders = _split_folders(path)
    try:
        patterns = split_folders or datasets.data_files.get_data_patterns(path)
        resolved = datasets.data_files.DataFilesDict.from_patterns(patterns, base_path=path)
    except FileNotFoundError as error:  # EmptyDatasetError and friends
        raise FileNotFoundError(
            f"No data files found in {path!r}. `dataset_name` accepts {ACCEPTED_SOURCES}."
        ) from error
    _warn_unread_tables(path, [f for files in resolved.values() for f in files])
    tables = {split: [f for f in files if _extension(f) in TABLE_EXTENSIONS] for split, files in resolved.items()}
    tables = {split: files for split, files in tables.items() if files}
    untabled = [
        s for s, files in resolved.items() if s not in tables and any(_extension(f) in IMAGE_EXTENSIONS for f in files)
    ]
    if tables and untabled:  # the images of those splits would be dropped without a word
        first = next(iter(tables.values()))[0]
        raise ValueError(
            f"{path}: the {', '.join(tables)} split is read from its table ({os.path.relpath(first, path)}) and the "
            f"{', '.join(untabled)} split has images but no table, which would be left out. Fix: give every split a "
            "table (metadata.csv naming its images), or remove the table to label the images by their class folders."
        )
    if tables:
        both = [
            f
            for f in _named(resolved, "metadata.jsonl")
            if os.path.dirname(f) in map(os.path.dirname, _named(resolved, "metadata.csv"))
        ]
        if both:  # the table would label the images and the metadata.jsonl be left unread without a word
            raise ValueError(
                f"{os.path.dirname(both[0])} holds both a metadata.csv and a metadata.jsonl: only one labels its "
                "images. Fix: remove (or rename) the one you do not mean."
            )
        source = _open_split_files(tables, data_args, description=path)
        _warn_unnamed_images(path, [f for files in resolved.values() for f in files], source.encoded, data_args)
        return source
    # Without split folders every folder is a class, `train/` or `test/` included: no split by folder or file name
    # (a `val.txt` beside the class folders made datasets' patterns read that file alone).
    patterns = split_folders or {"train": ["**"]}
    by_split = datasets.data_files.DataFilesDict.from_patterns(patterns, base_path=path)
    files = [f for fs in by_split.values() for f in fs]
    described = [s for s, fs in by_split.items() if any(os.path.basename(f) == "metadata.jsonl" for f in fs)]
    if described and len(described) < len(by_split):  # the other splits' images had no label: "missing values"
        others = [s for s in by_split if s not in described]
        raise ValueError(
            f"{path}: the {', '.join(described)} split is labelled by its metadata.jsonl and the {', '.join(others)} "
            "split has none. Fix: give every split a metadata.jsonl naming its images and their labels, or remove it "
            "to label the images by their class folders."
        )
    unread = sorted(f for f in files if _extension(f) in UNREAD_PHOTO_EXTENSIONS)
    if unread:
        logger.warning(
            f"Leaving out {len(unread)} photo(s) of {path} in a format that datasets' image folder does not read "
            f"(e.g. {os.path.relpath(unread[0], path)}): convert them to JPEG or PNG to train on them."
        )
    if not any(_extension(f) in IMAGE_EXTENSIONS for f in files):
        raise FileNotFoundError(
            f"{path!r} holds neither parquet/arrow/csv files nor images. `dataset_name` accepts {ACCEPTED_SOURCES}."
        )
    _warn_skipped_images(path, bool(split_folders))
    loaded = datasets.load_dataset("imagefolder", data_dir=path, data_files=patterns, drop_labels=True)
    labelled = _label_by_class_folder(loaded, path, depth=1 if split_folders else 0, one_class=one_split)
    if any(dataset.column_names != ["image"] for dataset in loaded.values()):  # labelled by a metadata file
        _warn_unnamed_images(path, files, labelled, data_args)
    return Source(path, _files_fingerprint([path]), encoded=_named_splits(labelled, path, need_train=not one_split))


def _named(data_files: dict, name: str) -> list[str]:
    return [f for files in data_files.values() for f in files if os.path.basename(f) == name]


def _warn_skipped_images(path: str, split_folders: bool) -> None:
    """Name the images of the folder `path` that datasets' image folder leaves out: those in folders named `__*`
    (`__MACOSX`'s resource forks aside), and those beside split folders."""
    for root, folders, _ in os.walk(path):
        skipped = [d for d in folders if d.startswith("__") and d != "__MACOSX"]
        folders[:] = [d for d in folders if not _hidden(d)]
        for folder in (os.path.join(root, d) for d in skipped):
            count = sum(_extension(n) in IMAGE_EXTENSIONS for _, _, names in os.walk(folder) for n in names)
            if count:
                logger.warning(
                    f"Leaving out the {count} image(s) of {folder}: datasets' image folder skips folders whose names "
                    "start with `__`. Rename it to train on them."
                )
    beside = sorted(n for n in os.listdir(path) if _extension(n) in IMAGE_EXTENSIONS and not _hidden(n))
    if split_folders and beside:
        logger.warning(
            f"Leaving out the {len(beside)} image(s) at the top of {path} (e.g. {beside[0]}), beside its split "
            "folders: move them into a split's class folder to use them."
        )


def _warn_unnamed_images(path: str, files: list[str], splits: dict, data_args: DataArguments) -> None:
    """Name the images among `files` that the tables or metadata files of `path` leave out: datasets drops them
    without a word, and an image missing from metadata.csv is not trained on."""
    named = set()
    for dataset in splits.values():
        try:
            paths = _paths(_arrow_column(dataset, find_columns(dataset, data_args, path)[0]))
        except ValueError:
            return  # no image column: `load_image_data` says so
        named |= {os.path.realpath(p) for p in (paths.to_pylist() if paths is not None else []) if p}
    left = sorted(f for f in files if _extension(f) in IMAGE_EXTENSIONS and os.path.realpath(f) not in named)
    if left:
        logger.warning(
            f"Leaving out {len(left)} image(s) of {path} that its metadata file or table does not name (e.g. "
            f"{os.path.relpath(left[0], path)}): add them, with their labels, to train on them."
        )


def _warn_unread_tables(path: str, read: list[str]) -> None:
    """Name the tables of `path` in no split: where some names a split, datasets reads only those (`more.parquet`
    beside `train.parquet` would be left out without a word)."""
    read, unread = {os.path.realpath(f) for f in read}, []
    for root, folders, names in os.walk(path):
        folders[:] = [d for d in folders if not _hidden(d)]
        files = (os.path.join(root, name) for name in names if not _hidden(name))
        unread += [f for f in files if _extension(f) in TABLE_EXTENSIONS and os.path.realpath(f) not in read]
    if unread:
        shown = ", ".join(sorted(os.path.relpath(f, path) for f in unread)[:3])
        logger.warning(
            f"Leaving out {len(unread)} table(s) of {path} that no split takes ({shown}): datasets reads a folder's "
            "splits from names (train*, validation*, test*, or folders so named). Rename or move them to train on "
            "them, or pass files as `train_file` / `validation_file` / `test_file`."
        )


def _hidden(name: str) -> bool:
    """Whether datasets' data files patterns skip a file or folder of this name."""
    return name.startswith((".", "__"))


def _split_folders(path: str) -> dict[str, list[str]]:
    """The data files patterns of `path`'s top-level folders where every one is named as a split (`train/`, `Test/`,
    `val-2024/`); else none, and `car/ bus/ train/` are classes (datasets' `**/train/**` takes them for splits)."""
    folders = sorted(d for d in os.listdir(path) if os.path.isdir(f"{path}/{d}") and not _hidden(d))
    split_of = {d: _split_named(d) for d in folders}
    if None in split_of.values():
        # Split-named folders of class folders beside other folders: which are classes, which splits, is a guess.
        splits = [d for d in folders if split_of[d] and any(e.is_dir() for e in os.scandir(f"{path}/{d}"))]
        if splits:
            others = [d for d in folders if not split_of[d]]
            raise ValueError(
                f"{path} holds split folders with class folders in them ({', '.join(splits)}) beside other folders "
                f"({', '.join(others[:5])}): put every image under the split folders (train/CLASS/...), or, if they "
                "are classes, give the ones named like splits another name."
            )
        return {}
    patterns = {}
    for d, split in split_of.items():
        patterns.setdefault(split, []).append(f"{d}/**")
    for split, names in patterns.items():
        if len({name.lower() for name in names}) < len(names):  # `Train/` and `train/`
            raise ValueError(f"{path} has two {split} folders ({folders}); keep one.")
        if len(names) > 1:  # `train/` and `train_backup/`: a copy would put twins of validation images in train
            joined = ", ".join(name.removesuffix("/**") + "/" for name in names)
            logger.warning(
                f"The {split} split of {path} is the folders {joined} together (a folder named like a split is part "
                "of it, as datasets reads them). Rename or move any that is not."
            )
    return patterns


def _split_named(folder: str) -> str | None:
    """The split a folder's name names, by datasets' patterns of split folders (`train`, `train-1`, `old_test`)."""
    for split, patterns in datasets.data_files.DEFAULT_PATTERNS_SPLIT_IN_DIR_NAME.items():
        names = (pattern.removeprefix("**/").removesuffix("/**") for pattern in patterns)
        if any(fnmatch.fnmatchcase(folder.lower(), name) for name in names):
            return str(split)
    return None


def _label_by_class_folder(
    splits: datasets.DatasetDict, root: str, depth: int, one_class: bool = False
) -> dict[str, datasets.Dataset]:
    """Label each image by its folder at `depth` (1 under split folders: `train/cat/2023/a.jpg`: cat), as torchvision
    does; datasets takes the parent (2023), and no labels at mixed depths. No label column (`find_columns` says why)
    for one class (unless `one_class`: a validation or test folder's) or a metadata file's labels; an error for an
    image outside the class folders (Kaggle's unlabelled `test/`)."""
    if any(dataset.column_names != ["image"] for dataset in splits.values()):
        return dict(splits)  # a metadata file's columns: the user's labels, whatever their name
    root, class_of, classes, stray = os.path.realpath(root), {}, {}, []
    for name, dataset in splits.items():
        paths = _paths(_arrow_column(dataset, "image")).to_pylist()
        parents = [os.path.dirname(path) for path in paths]
        for parent in set(parents) - class_of.keys():
            # Real paths: datasets names the images of a folder reached through a link by their real path.
            folders = os.path.relpath(os.path.realpath(parent), root).split(os.sep)
            class_of[parent] = folders[depth] if depth < len(folders) and folders[depth] != "." else None
        classes[name] = [class_of[parent] for parent in parents]
        stray += [os.path.relpath(os.path.realpath(p), root) for p, c in zip(paths, classes[name]) if c is None]
    names = sorted({c for cs in classes.values() for c in cs if c is not None})
    by_case = {}
    for name in names:
        by_case.setdefault(name.lower(), []).append(name)
    twins = [" and ".join(f"{name}/" for name in group) for group in by_case.values() if len(group) > 1]
    if twins:  # classes of their own where case tells them apart (EMNIST's letters); else a copy, said
        logger.warning(
            f"Class folders whose names differ only in case ({'; '.join(twins)}) are classes of their own in {root}. "
            "Merge each pair into one folder if it is one class."
        )
    tops = [root] if depth == 0 else [e.path for e in os.scandir(root) if e.is_dir() and not _hidden(e.name)]
    folders = {e.name for top in tops for e in os.scandir(top) if e.is_dir() and not _hidden(e.name)}
    if names and (empty := sorted(folders - set(names))):  # a class the head would not have, without a word
        logger.warning(
            f"Leaving out the class folder(s) {', '.join(empty[:5])} of {root}: no split has an image in them that "
            f"datasets' image folder reads. The model learns the {len(names)} class(es) {', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}."
        )
    if len(names) < (1 if one_class else 2):
        return dict(splits)
    if stray:
        shown = ", ".join(sorted(stray)[:3])
        raise ValueError(
            f"{len(stray)} image(s) of {root} lie outside its class folders ({', '.join(names[:5])}); unlabelled "
            "images belong outside it (`vit-finetune predict` classifies them). An image folder needs one subfolder "
            f"per class, at least two (e.g. cat/ and dog/), and no image beside them: move {shown} into one."
        )
    feature = datasets.ClassLabel(names=names)
    return {
        name: ds.add_column("label", feature.str2int(classes[name]), feature=feature) for name, ds in splits.items()
    }


def _open_split_files(files: dict[str, str | list[str]], data_args: DataArguments, description: str = "") -> Source:
    """Parquet/arrow/csv files (or a folder of them) per split."""
    # The folders' own fingerprints cover the image files their tables name, as `_image_paths` does for a file's.
    splits, fingerprint_paths, folder_fingerprints = {}, [], []
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
                # A folder given as train_file/validation_file: its one split, whatever its files are named.
                sub = _open_local(path, data_args, one_split=True)
                if sub.decoded:
                    raise ValueError(f"{path!r} cannot be used as a single split; pass it as `dataset_name`.")
                if len(sub.encoded) > 1:  # its train split alone would be the `split` here: training images
                    raise ValueError(
                        f"The {split} data path {path} holds the splits {', '.join(sub.encoded)}: pass it as "
                        f"`dataset_name`, or the folder of the one meant as `{split}_file`."
                    )
                parts.append(next(iter(sub.encoded.values())))
                folder_fingerprints.append(sub.fingerprint)
                continue
            extension = _extension(path)
            if extension not in TABLE_EXTENSIONS:
                raise ValueError(
                    f"Unsupported data file {path!r}: expected one of {sorted(TABLE_EXTENSIONS)}. "
                    f"`dataset_name` accepts {ACCEPTED_SOURCES}."
                )
            table = _read_csv(path, data_args) if extension == ".csv" else _read_table(path, extension)
            dataset, referenced = _image_paths(table, data_args, path)
            fingerprint_paths += [*referenced, path]
            parts.append(dataset)
        splits[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(_by_one_class_label(parts))
    if not description:
        description = ", ".join(f"{split}: {p}" for split, p in files.items()) if len(files) > 1 else files["train"]
    fingerprint = content_hash([_files_fingerprint(fingerprint_paths), *folder_fingerprints])
    return Source(str(description), fingerprint, encoded=splits)


def _read_table(path: str, extension: str) -> datasets.Dataset:
    """A parquet or arrow file as a Dataset; a damaged one is one error line naming the file (`datasets` logs the
    error, then raises it without the name)."""
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own error line, said below with the fix
    try:
        return datasets.load_dataset(TABLE_EXTENSIONS[extension], data_files=path, split="train")
    except (pa.ArrowInvalid, datasets.exceptions.DatasetGenerationError) as error:
        # Reading a stream cut short raises pyarrow's OSError, with no errno (a full disk or a refused write has one).
        cause = error if isinstance(error, pa.ArrowInvalid) else error.__cause__
        if not isinstance(cause, pa.ArrowInvalid) and not (isinstance(cause, OSError) and cause.errno is None):
            raise
        raise ValueError(
            f"{path} cannot be read as a {extension} file ({one_line(cause)}): it is damaged, cut short (a copy or "
            "download stopped midway) or of another format. Fix: copy or export it again."
        ) from error
    finally:
        datasets.logging.set_verbosity(verbosity)


def _by_one_class_label(parts: list[datasets.Dataset]) -> list[datasets.Dataset]:
    """The files of one split whose `ClassLabel`s differ, which `datasets` cannot concatenate, relabelled by name with
    one: the first's classes, then the others' in alphabetical order."""
    columns = [c for c in parts[0].column_names if isinstance(parts[0].features[c], datasets.ClassLabel)]
    for column in columns:
        features = [part.features.get(column) for part in parts]
        if not all(isinstance(f, datasets.ClassLabel) for f in features) or all(f == features[0] for f in features):
            continue
        names = list(features[0].names)
        names += sorted({name for f in features for name in f.names} - set(names))
        feature = datasets.ClassLabel(names=names)
        relabelled = []
        for part, f in zip(parts, features):
            new_id = np.array([names.index(name) for name in f.names])  # this part's id -> the shared id
            ids = [i if i is None or i < 0 else int(new_id[i]) for i in _arrow_column(part, column).to_pylist()]
            relabelled.append(part.remove_columns(column).add_column(column, ids, feature=feature))
        parts = relabelled
    return parts


def _image_paths(
    dataset: datasets.Dataset, data_args: DataArguments, table: str, base: str | None = None
) -> tuple[datasets.Dataset, list]:
    """A table's relative image paths (path strings, or an `Image` without bytes, as `to_parquet` writes an image
    folder) made absolute from the table's folder (or `base`: a `save_to_disk` folder), unless the first one is found
    from the working directory only (where datasets reads them from), and the files the table names instead of holding
    their bytes: editing them must invalidate the decoded cache. Images held as bytes (a Hub download's, named by a
    bare file name) are left as they are, and read from the file without a copy."""
    try:
        column = find_columns(dataset, data_args, table)[0]
    except ValueError:
        return dataset, []  # reported with the columns of every split by `load_image_data`
    values = _arrow_column(dataset, column)
    paths = _paths(values)
    if paths is None:
        return dataset, []
    named = paths.to_pylist()  # the path strings alone
    with_bytes = isinstance(values.type, pa.StructType) and values.type.get_field_index("bytes") >= 0
    from_file = pc.is_null(pc.struct_field(values, "bytes")).to_pylist() if with_bytes else [True] * len(named)
    relative = [i for i, (path, read) in enumerate(zip(named, from_file)) if read and path and not os.path.isabs(path)]
    base = os.path.abspath(base) if base else os.path.dirname(os.path.abspath(table))
    if relative and (os.path.exists(os.path.join(base, named[relative[0]])) or not os.path.exists(named[relative[0]])):
        for i in relative:
            named[i] = os.path.join(base, named[i])
        new_paths = pa.array(named, pa.string())
        if isinstance(values.type, pa.StructType):  # an `Image`: its other fields as they are
            struct = values.combine_chunks()
            fields = [new_paths if f.name == "path" else struct.field(f.name) for f in values.type]
            new_paths = pa.StructArray.from_arrays(fields, fields=list(values.type), mask=struct.is_null())
        dataset = dataset.remove_columns(column).add_column(column, new_paths, feature=dataset.features[column])
    return dataset, [path for path, read in zip(named, from_file) if read and path]


def _read_csv(path: str, data_args: DataArguments) -> datasets.Dataset:
    """A csv of image paths (made absolute from the csv's folder) and labels; labels separated by `;` (`cat; dog`)
    make a multi-label list column (an empty cell: none)."""
    import pandas as pd

    frame = pd.read_csv(path)
    column = _pick_column(
        list(frame.columns), data_args.image_column_name, (*IMAGE_COLUMNS, FILE_NAME_COLUMN), "image", path
    )
    base = os.path.dirname(os.path.abspath(path))
    # A blank cell has no image: decoding names it missing (pandas reads it as NaN, which no path function takes).
    paths = [None if pd.isna(p) else str(p) for p in frame[column]]
    frame[column] = [p if p is None or os.path.isabs(p) else os.path.join(base, p) for p in paths]
    try:
        label = _pick_column(list(frame.columns), data_args.label_column_name, LABEL_COLUMNS, "label", path)
    except ValueError:  # e.g. a competition's test.csv: `load_image_data` names the split without labels
        return datasets.Dataset.from_pandas(frame, preserve_index=False)
    if pd.api.types.is_numeric_dtype(frame[label]):  # ids, unless written otherwise: `007` is a name, not 7
        written = pd.read_csv(path, usecols=[label], dtype=str)[label]
        if any(isinstance(w, str) and w.strip() != str(v) for w, v in zip(written, frame[label])):
            frame[label] = written.str.strip()
    several = frame[label].map(lambda v: isinstance(v, str) and ";" in v)
    if several.any():
        logger.info(
            f"{path}: the column {label!r} holds several labels per image separated by `;` (e.g. "
            f"{frame[label][several].iloc[0]!r}); read as multi-label data."
        )
        frame[label] = [
            [s.strip() for s in v.split(";") if s.strip()] if isinstance(v, str) else [] for v in frame[label]
        ]
    elif not pd.api.types.is_numeric_dtype(frame[label]):  # `cat ` beside `cat` was a class; a blank cell, none
        frame[label] = [v.strip() or None if isinstance(v, str) else v for v in frame[label]]
    return datasets.Dataset.from_pandas(frame, preserve_index=False)


def _open_cifar_batches(path: str) -> Source:
    """The original CIFAR-10 python pickles (load only a copy you trust: the official archive from cs.toronto.edu)."""

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
    return Source(path, _files_fingerprint([path]), decoded=splits, label_names=label_names)


def _named_splits(
    splits: dict[str, datasets.Dataset], where: str, need_train: bool = True
) -> dict[str, datasets.Dataset]:
    """Keep train/validation/test under their canonical names (`val` -> `validation`, ...)."""
    if len(splits) == 1 and str(next(iter(splits))).lower() not in SPLIT_ALIASES:
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
    if need_train and "train" not in named:
        raise ValueError(f"{where} has no train split; its splits are {list(splits)}.")
    return named


def _files_fingerprint(paths: Sequence[str]) -> str:
    """Hash of path, size and modification time of every file (folders walked), so any edit invalidates the cache; real
    paths, so a dataset reached through a symlink is the same dataset."""
    stats = []
    for path in map(os.path.realpath, paths):
        walked = [path] if os.path.isfile(path) else []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            walked += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
        for file in walked:
            try:
                stat = os.stat(file)
                stats.append((file, stat.st_size, stat.st_mtime_ns))
            except OSError:
                stats.append((file, None, None))  # a missing image: decoding will report it
    return content_hash(stats)


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def content_hash(value) -> str:
    """A short hash of a JSON-able value (the decoded cache's keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _pick_column(columns: list[str], explicit: str | None, candidates: tuple[str, ...], kind: str, where: str) -> str:
    argument = f"{kind}_column_name"
    if explicit is not None:
        if explicit not in columns:
            raise ValueError(f"`{argument}`={explicit!r} is not a column of {where}; its columns are {columns}.")
        return explicit
    for candidate in candidates:
        if candidate in columns:
            return candidate
    hint = ""
    if kind == "label" and columns == ["image"] and os.path.isdir(where):
        # `_label_by_class_folder` gives no label column to a folder of fewer than two class folders.
        stray = sorted(f for f in os.listdir(where) if _extension(f) in IMAGE_EXTENSIONS)
        hint = " An image folder needs one subfolder per class, at least two (e.g. cat/ and dog/)"
        hint += f", and no image beside them: move {', '.join(stray[:3])} into one." if stray else "."
    raise ValueError(
        f"Found no {kind} column in {where} (looked for {list(candidates)}); its columns are {columns}. "
        f"Set `{argument}` to the column holding the {kind}s.{hint}"
    )


def find_columns(dataset: datasets.Dataset, data_args: DataArguments, where: str) -> tuple[str, str]:
    """The `(image, label)` columns: the ones named in `data_args`, else the usual names, else the only column of the
    `Image` / `ClassLabel` feature type."""
    columns = list(dataset.column_names)
    features = dataset.features
    images = [c for c in columns if isinstance(features[c], datasets.Image)]
    labels = [c for c in columns if isinstance(features[c], datasets.ClassLabel)]
    image_candidates = IMAGE_COLUMNS + (tuple(images) if len(images) == 1 else ()) + (FILE_NAME_COLUMN,)
    label_candidates = LABEL_COLUMNS + (tuple(labels) if len(labels) == 1 else ())
    image_column = _pick_column(columns, data_args.image_column_name, image_candidates, "image", where)
    label_column = _pick_column(columns, data_args.label_column_name, label_candidates, "label", where)
    return image_column, label_column


def encode_labels(
    splits: dict[str, datasets.Dataset], label_column: str, include_labels: list[str] | None = None
) -> tuple[list[str], dict[str, np.ndarray]]:
    """Label names and each split's labels: int64 ids, or for a list column multi-hot float32 `(N, K)` rows (of
    `include_labels` only, where given). Splits saved separately are matched by class name."""
    features = {name: ds.features[label_column] for name, ds in splits.items()}
    feature = features["train"]
    # A csv split without `;` holds scalars: the data is multi-label when any split holds lists.
    if any(isinstance(f, LIST_FEATURES) for f in features.values()):
        item = feature.feature if isinstance(feature, LIST_FEATURES) else feature
        return _multi_label_encoding(splits, label_column, item, include_labels)
    values = {name: _arrow_column(ds, label_column).to_pylist() for name, ds in splits.items()}
    if all(isinstance(f, datasets.ClassLabel) and f.names == feature.names for f in features.values()):
        return list(feature.names), {name: np.asarray(v, dtype=np.int64) for name, v in values.items()}

    def numbered(labels: list) -> bool:
        return all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in labels)

    def kind(name: str) -> str | None:
        """How a split gives its labels: `names` (a ClassLabel, or strings) or `numbers`."""
        if isinstance(features[name], datasets.ClassLabel) or all(isinstance(x, str) for x in values[name]):
            return "names"
        return "numbers" if values[name] and numbered(values[name]) else None

    kinds = {name: kind(name) for name in values}
    if set(kinds.values()) == {"names", "numbers"}:  # numbers then read as names "0", "1": classes no image has
        named, numbers = ([n for n, k in kinds.items() if k == kind] for kind in ("names", "numbers"))
        raise ValueError(
            f"The {', '.join(named)} split(s) name their classes and the {', '.join(numbers)} split(s) number them "
            f"(label column {label_column!r}): which number is which class is not said. Save every split's labels "
            "the same way (class names, or the same ClassLabel)."
        )
    if any(isinstance(f, datasets.ClassLabel) for f in features.values()):  # read every split's labels as names
        values = {
            name: f.int2str(v) if isinstance(f, datasets.ClassLabel) else [x if x is None else str(x) for x in v]
            for (name, v), f in zip(values.items(), features.values())
        }
    if any(v is None for vs in values.values() for v in vs):
        raise ValueError(f"The label column {label_column!r} has missing values; every image needs a label.")
    if all(isinstance(v, str) for vs in values.values() for v in vs):
        keys = list(feature.names) if isinstance(feature, datasets.ClassLabel) else []  # training's order first
        keys += sorted({v for vs in values.values() for v in vs} - set(keys))
    elif all(numbered(vs) for vs in values.values()):
        keys = sorted({int(v) for vs in values.values() for v in vs})
        if keys and keys[0] < 0:  # `check_labels` names the split with ids out of range
            names = [str(i) for i in range(keys[-1] + 1)]
            return names, {name: np.asarray(vs, dtype=np.int64) for name, vs in values.items()}
        if keys != list(range(len(keys))):  # a 3,001-way head for ids 0, 1 and 3000 would learn 2,998 ghosts
            shown = ", ".join(map(str, keys[:5])) + (", ..." if len(keys) > 5 else "")
            logger.warning(
                f"The label ids are not consecutive: {len(keys)} distinct ids between {keys[0]} and {keys[-1]} "
                f"({shown}). They are renumbered 0..{len(keys) - 1} for training; each class keeps its original id "
                "as its name (id2label), which `include_labels`, predictions and results use."
            )
    else:
        raise ValueError(
            f"The label column {label_column!r} must hold class names (str), class ids (int) or a ClassLabel; "
            f"got {feature}. Set `label_column_name` if another column holds the labels."
        )
    index = {key: i for i, key in enumerate(keys)}
    return [str(k) for k in keys], {name: np.asarray([index[v] for v in vs], np.int64) for name, vs in values.items()}


def _multi_label_encoding(
    splits: dict[str, datasets.Dataset], column: str, item, include_labels: list[str] | None = None
) -> tuple[list[str], dict]:
    """The labels of a list column (ClassLabel, names or ids: the training images'), and each split's multi-hot rows.
    Labels outside `include_labels` are dropped first: one of the validation split alone is then no error."""
    keep = None if include_labels is None or isinstance(item, datasets.ClassLabel) else set(include_labels)

    def lists(values: list, scalars: bool) -> list:
        # A csv split without `;` has no lists: its blank cells are no label, where a missing list is refused below.
        blank = [] if scalars else None
        rows = [v if isinstance(v, list) else blank if v is None else [v] for v in values]
        return rows if keep is None else [row if row is None else [v for v in row if str(v) in keep] for row in rows]

    values = {
        name: lists(_arrow_column(ds, column).to_pylist(), not isinstance(ds.features[column], LIST_FEATURES))
        for name, ds in splits.items()
    }
    if isinstance(item, datasets.ClassLabel):
        keys, names = list(range(item.num_classes)), list(item.names)
    elif isinstance(item, datasets.Value) and (item.dtype in ("string", "large_string") or "int" in item.dtype):
        keys = sorted({v for row in values["train"] for v in row or []})
        names = [str(k) for k in keys]
    else:
        raise ValueError(
            f"The label column {column!r} is a list of {item}; a multi-label column must list class names (str), "
            "class ids (int) or ClassLabel ids."
        )
    # Keyed by text: a split's cells may be read as ints (`2`) where another split's are strings (`1;3`).
    index = {str(key): i for i, key in enumerate(keys)}
    for split, rows in values.items():
        empty = next((i for i, row in enumerate(rows) if row is None), None)
        if empty is not None:
            raise ValueError(
                f"Image {empty} of the {split} split has no labels ({column!r} is missing): give every image the "
                "list of its labels, an empty list for none."
            )
        unknown = sorted({str(v) for row in rows for v in row if str(v) not in index})
        if unknown:
            raise ValueError(
                f"The {split} split has the label(s) {unknown[:5]} that no training image has (training has "
                f"{names[:10]}): a model cannot learn them. Fix the {split} labels, or add training images with them."
            )

    def multi_hot(rows: list) -> np.ndarray:
        hot = np.zeros((len(rows), len(keys)), dtype=np.float32)  # (N, K)
        for i, labels in enumerate(rows):
            hot[i, [index[str(v)] for v in labels]] = 1.0
        return hot

    return names, {split: multi_hot(rows) for split, rows in values.items()}


def _arrow_column(dataset: datasets.Dataset, column: str) -> pa.ChunkedArray:
    """One column, read from the memory-mapped arrow table: no other column is read, no image decoded or copied."""
    return dataset.select_columns([column]).with_format("arrow")[:].column(column)


def _paths(values: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """The file paths of an image column (an `Image`'s `path` field, or path strings); None where it names none."""
    if isinstance(values.type, pa.StructType) and values.type.get_field_index("path") >= 0:
        return pc.struct_field(values, "path")
    return values if values.type in (pa.string(), pa.large_string()) else None


def image_files(source: Source, split: str, column: str, positions: np.ndarray) -> list[str | None] | None:
    """The file of each image at `positions` of a split, relative to the dataset's folder where in it; None where the
    source names no files."""
    paths = _paths(_arrow_column(source.encoded[split], column))
    if paths is None:
        return None
    paths = paths.take(pa.array(positions, pa.int64())).to_pylist()
    folder = source.description if os.path.isdir(source.description) else os.path.dirname(source.description)
    # datasets names an image folder's files by their real path; a csv's are joined to its folder as written.
    roots = {os.path.join(os.path.realpath(folder), ""), os.path.join(os.path.abspath(folder), "")}
    for root in roots if os.path.isdir(folder) else ():
        paths = [p[len(root) :] if p and p.startswith(root) else p for p in paths]
    return paths if any(paths) else None


def image_items(dataset: datasets.Dataset, column: str) -> Iterator[tuple[bytes | None, str | None]]:
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
