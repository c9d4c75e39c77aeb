"""Load an image-classification dataset once as uint8 `(N, C, H, W)` splits, decoded into a memory-mapped cache.

    data = load_image_data(data_args, seed, target_size)  # ImageData: train / validation / test ImageSplits
    loader = DataLoader(data.train, batch_size=64, collate_fn=collate_batch)

Every image is decoded once, in parallel, into a `.npy` file that every process of the node maps: the dataset never
sits whole in a process's memory, and a batch copies only its own rows. Augmentation happens later, on whole batches
on the device (`finetune/augment.py`).

A split walks the modules in order: `sources.py` opens the source and reads its labels, `splits.py` chooses each
split's images from the labels, `cache.py` maps them from the decoded cache or has `decode.py` decode them, and
`dataset.py`'s `ImageSplit` serves them in batches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from finetune.data.dataset import ImageSplit, check_num_classes, collate_batch
from finetune.data.decode import center_fit, decode_image
from finetune.data.splits import Rows, check_labels, choose_rows, stratified_split


if TYPE_CHECKING:
    from finetune.arguments import DataArguments
    from finetune.data.sources import Source

logger = logging.getLogger(__name__)

__all__ = [
    "MULTI_LABEL",
    "ImageData",
    "ImageSplit",
    "center_fit",
    "check_separate_files",
    "collate_batch",
    "decode_image",
    "is_multi_label",
    "load_image_data",
    "stratified_split",
]


# The `problem_type` a multi-label model saves in its config.json, where the loss, metrics and predict read it.
MULTI_LABEL = "multi_label_classification"


def is_multi_label(config) -> bool:
    """Whether a model's config (a transformers config, or an exported folder's config.json) is multi-label's."""
    return getattr(config, "problem_type", None) == MULTI_LABEL


@dataclass
class ImageData:
    """The splits of one dataset, decoded, with its label names; `test` (None without one) is for the final
    evaluation only."""

    train: ImageSplit
    validation: ImageSplit
    test: ImageSplit | None
    label_names: list[str]
    num_channels: int
    source: str
    # Images held out of the whole train split (every class's, before `include_labels`) by `validation_size`, where
    # the source has no validation split; 0 where it has.
    validation_held_out: int = 0
    fingerprint: str | None = None  # of the source's files (paths, sizes, times), however its path was spelt
    all_label_names: list[str] | None = None  # the dataset's, before `include_labels`
    # Per evaluated split that has any, its images with the pixels of a training image (`warn_of_copies`).
    training_image_copies: dict[str, int] = field(default_factory=dict)

    @property
    def multi_label(self) -> bool:
        """Whether images have several labels each (a list column, or a csv with `;`): labels are multi-hot rows."""
        return self.train.labels.ndim == 2

    @property
    def validation_images(self) -> str:
        """Which images the validation split holds, hashed: their files (relative to the dataset's folder), else their
        places in the source split. Files added to a dataset (or removed) can hold out other images at the same
        `validation_size`: a resume then validated on images it had trained on (`ResumeCheck` refuses it)."""
        files = self.validation.files
        if files is not None and all(f is not None and os.path.isabs(f) for f in files):
            # Where no dataset folder was cut off (`train_file` and `validation_file`, a Hub folder's cache): the same
            # files elsewhere (another node's cache, a link) are named from the folder they share.
            common = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
            files = [os.path.relpath(f, common) for f in files]
        names = files if files is not None else self.validation.positions.tolist()
        return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16]

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}


def check_separate_files(data_args: DataArguments) -> None:
    """For training, `train_file`, `validation_file` and `test_file` are three places: the same file twice, or a
    folder that holds another split's file, would score the model on images it trained on."""
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    real = {split: Path(path).expanduser().resolve() for split, path in files.items() if path is not None}
    for split, path in real.items():
        for other, other_path in real.items():
            if split != other and (path == other_path or path in other_path.parents):
                how = "is" if path == other_path else "holds"
                raise ValueError(
                    f"`{split}_file` {files[split]} {how} `{other}_file` {files[other]}: the model would be scored on "
                    "images it trained on. Pass a separate file or folder for each split, or only `train_file` (a "
                    "validation split is then held out: `validation_size`)."
                )


def load_image_data(
    data_args: DataArguments, seed: int, target_size: int | None = None, check_classes: bool = True
) -> ImageData:
    """Load, decode (or map from the decoded cache) and split the dataset that `data_args` describes, as uint8
    `(N, C, H, W)` splits (grayscale keeps 1 channel). `seed` seeds the held-out validation split and the
    `max_*_samples` subsets; `target_size` (`finetune.models.storage_size`) is the square size images of mixed sizes,
    or of one larger size, are stored at without `decode_size`; `check_classes` refuses training images of too few
    classes (`check_num_classes`; off for export, which loads only a few)."""
    # `datasets` (0.6 s to import) is imported only here: predict and attention use `decode_image` without it.
    from finetune.data.sources import encode_labels, find_columns, open_source

    source = open_source(data_args)
    columns = None
    if source.encoded:
        if "train" not in source.encoded:  # a folder of `data.csv` and `test.csv`: datasets names no file train
            splits = ", ".join(map(str, source.encoded))
            raise ValueError(
                f"{source.description} has no train split (its splits: {splits}). Name the training file or folder "
                "`train` (datasets reads splits from the names), or pass `--train_file`."
            )
        columns = find_columns(source.encoded["train"], data_args, source.description)
        for name, dataset in source.encoded.items():
            missing = [c for c in columns if c not in dataset.column_names]
            if missing:
                fix = ""
                if columns[1] in missing:  # a competition's test split: its labels are kept secret
                    fix = " Label its images, or pass the labelled splits' files (`train_file`, `validation_file`)."
                raise ValueError(
                    f"The {name} split of {source.description} lacks column(s) {missing}; its columns are "
                    f"{dataset.column_names}.{fix}"
                )
        label_names, labels = encode_labels(source.encoded, columns[1], data_args.include_labels)
    else:
        label_names = source.label_names
        labels = {name: np.asarray(y, dtype=np.int64) for name, (_, y) in source.decoded.items()}
    all_label_names = list(label_names)
    chosen, label_names, how, held_out = choose_rows(labels, label_names, data_args, seed)

    # Train's images first: the other splits are stored as train's are (centre-fitted at its size, as predict frames
    # every image), else they would be evaluated on views that predict never gives.
    with_train = {name: rows for name, rows in chosen.items() if rows.source == chosen["train"].source}
    splits = _materialize(source, with_train, labels, columns, data_args, target_size)
    size = splits["train"].image_size
    others = {name: rows for name, rows in chosen.items() if name not in splits}
    if others:
        frame = size if source.encoded else None
        splits.update(_materialize(source, others, labels, columns, data_args, target_size, frame))
    encoded_only = ("decode_size", "image_column_name", "label_column_name")
    unused = [name for name in encoded_only if getattr(data_args, name) is not None]
    if unused and not source.encoded:
        logger.warning(
            f"{', '.join(f'`{n}`' for n in unused)} {'is' if len(unused) == 1 else 'are'} for tables and files of "
            f"encoded images; {source.description} holds {size[1]}x{size[0]} arrays and their labels, kept as they "
            "are. Drop the option(s)."
        )
    num_channels = max(split.num_channels for split in splits.values())
    for name, split in splits.items():
        if split.num_channels != num_channels:
            # A grayscale split next to RGB ones (e.g. a test set saved differently): store all splits alike.
            logger.info(f"Repeating the 1-channel {name} images to {num_channels} channels to match the other splits.")
            pixels = split.pixel_values.expand(-1, num_channels, -1, -1).contiguous()
            splits[name] = ImageSplit(pixels, split.labels, None, split.positions, split.files)
    check_labels(splits, label_names)
    if check_classes:
        check_num_classes(splits["train"], label_names)
    from_source = {name: rows.source for name, rows in chosen.items()}
    copies = warn_of_copies(splits, label_names, source, from_source, columns[0] if columns else None)
    train, validation, test = splits["train"], splits["validation"], splits.get("test")

    sizes = {name: s.image_size for name, s in splits.items()}
    size_text = ", ".join(f"{name} {w}x{h}" for name, (h, w) in sizes.items())  # width x height, as Pillow's
    if len(set(sizes.values())) == 1:
        size_text = "{1}x{0}".format(*train.image_size)
    logger.info(
        f"Data from {source.description}: {len(train):,} train, {len(validation):,} validation ({how}), "
        f"{len(test) if test is not None else 0:,} test images; image size {size_text}, {num_channels} channel(s), "
        f"{len(label_names)} classes."
    )
    return ImageData(
        train, validation, test, list(label_names), num_channels, source.description, held_out, source.fingerprint,
        all_label_names, copies,
    )  # fmt: skip


def warn_of_copies(
    splits: dict[str, ImageSplit],
    label_names: list[str],
    source: Source,
    from_source: dict[str, str],
    column: str | None,
) -> dict[str, int]:
    """Warn where one image is stored twice (a photo saved into two folders, scraped twice): a validation or test image
    that is also a training image scores the model on what it trained on; a training image under two labels teaches it
    both. Returns the count of each evaluated split that has copies. `from_source` names the source split each split's
    images are taken from (a held-out validation split's: train), where the training images' files are looked up
    (`column`), and an image without a file is named by its place."""
    from finetune.data.sources import image_files

    train = splits["train"]

    def named(split: ImageSplit, i: int, name: str) -> str:
        position = int(split.positions[i])
        if split is train and source.encoded:  # train's files are not listed (it may hold millions): look it up
            files = image_files(source, from_source[name], column, np.array([position]))
        else:
            files = split.files
        file = files[0 if split is train else i] if files else None
        text = file or f"{from_source[name]} image {position:,} of the source"
        return text + (f" ({label_names[int(split.labels[i])]})" if split.labels.ndim == 1 else "")

    copies = {}
    for name, split in splits.items():
        pairs = split.copies_in(train)
        if split is train:  # copies of one image under one label weigh it more, nothing worse
            pairs = [(i, j) for i, j in pairs if not torch.equal(train.labels[i], train.labels[j])]
        if not pairs:
            continue
        i, j = pairs[0]
        example = f"e.g. {named(split, i, name)} and {named(train, j, 'train')}"
        if split is train:
            logger.warning(
                f"{len(pairs):,} training image(s) have the same pixels as another training image with other labels "
                f"({example}): the model is taught both. Keep one copy of each image, under its right labels."
            )
        else:
            copies[name] = len(pairs)
            # Held out from the training images, the split is drawn anew by each run: the copies go from the dataset.
            held_out = from_source[name] == from_source["train"]
            fix = (
                "Keep one copy of each image in the dataset"
                if held_out
                else "Remove the copies from one of the splits"
            )
            logger.warning(
                f"{len(pairs):,} of the {len(split):,} {name} images {'has' if len(pairs) == 1 else 'have'} the same "
                "pixels as training images "
                f"({example}): the model is scored on images it trained on, so its {name} figures read high. {fix}."
            )
    return copies


def _materialize(
    source: Source,
    chosen: dict[str, Rows],
    labels: dict[str, np.ndarray],
    columns: tuple[str, str] | None,
    data_args: DataArguments,
    target_size: int | None,
    frame: tuple[int, int] | None = None,
) -> dict[str, ImageSplit]:
    """The chosen images of every split: decoded (only the images some split takes; at `frame`, a `(height, width)`,
    where given) or taken from the arrays."""
    from finetune.data.cache import decoded_split
    from finetune.data.sources import image_files

    splits = {}
    for source_split in dict.fromkeys(rows.source for rows in chosen.values()):
        parts = {name: rows for name, rows in chosen.items() if rows.source == source_split}
        needed = np.unique(np.concatenate([rows.positions for rows in parts.values()]))
        if source.encoded:
            pixels, row_of = decoded_split(
                source, source_split, needed, labels[source_split], columns, data_args, target_size, frame
            )
        else:
            pixels = torch.from_numpy(source.decoded[source_split][0])
            row_of = np.arange(len(pixels))
        for name, rows in parts.items():
            row = row_of[rows.positions]
            ok = row >= 0  # corrupt images, skipped when decoding, drop out here
            positions = rows.positions[ok]
            # Only the evaluated splits name their files (in the predictions CSVs): train may hold millions.
            evaluated = source.encoded and name != "train"
            files = image_files(source, source_split, columns[0], positions) if evaluated else None
            splits[name] = ImageSplit(pixels, rows.labels[ok], row[ok], positions, files)
    return splits
