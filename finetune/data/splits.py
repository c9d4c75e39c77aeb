"""The splits: the choice of their images before decoding (`choose_rows`: class filter, validation split, subsets, on
labels and positions only, so only the images a run uses are decoded), then the decoded splits (`ImageSplit`) and
their batches (`collate_batch`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers.utils import logging


if TYPE_CHECKING:
    from finetune.arguments import DataArguments

logger = logging.get_logger(__name__)


@dataclass
class Rows:
    """The images one output split takes from a source split, by position, chosen from labels before decoding."""

    source: str
    positions: np.ndarray  # int64 positions in the source split
    labels: np.ndarray  # int64, one per position

    def __len__(self) -> int:
        return len(self.positions)

    def select(self, index: np.ndarray) -> Rows:
        return Rows(self.source, self.positions[index], self.labels[index])


def choose_rows(
    labels: dict[str, np.ndarray], label_names: list[str], data_args: DataArguments, seed: int
) -> tuple[dict[str, Rows], list[str], str]:
    """The images each output split takes from the source splits (whose int64 labels are `labels`): the
    `include_labels` classes, the validation split (the source's, or held out from train, stratified) and the
    `max_*_samples` subsets. Returns the rows per split, the label names, and how the validation split was made."""
    chosen = {name: Rows(name, np.arange(len(y)), y) for name, y in labels.items()}
    check_labels(chosen, label_names)
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
    return chosen, label_names, how


def _keep_classes(
    splits: dict[str, Rows], label_names: list[str], keep: list[str]
) -> tuple[dict[str, Rows], list[str]]:
    """Only the images of the classes in `keep`, renumbered in the order of `keep`."""
    unknown = [name for name in keep if name not in label_names]
    if unknown or len(set(keep)) != len(keep):
        problem = f"unknown label(s) {unknown}" if unknown else f"repeated labels in {keep}"
        raise ValueError(f"`include_labels` has {problem}; the dataset's labels are {label_names}.")
    new_id = np.full(len(label_names), -1, dtype=np.int64)
    new_id[[label_names.index(name) for name in keep]] = np.arange(len(keep))
    kept = {}
    for name, split in splits.items():
        labels = new_id[split.labels]
        index = np.flatnonzero(labels >= 0)
        kept[name] = Rows(split.source, split.positions[index], labels[index])
    logger.info(f"Kept the {len(keep)} classes of `include_labels` {keep}, renumbered in that order.")
    return kept, keep


def stratified_split(labels: np.ndarray, validation_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices `(train, validation)` that hold out `validation_size` (a fraction in (0, 1), or a number of images)
    of the int class ids `labels`, with class proportions kept and the same split for the same seed.

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


def _subsample(split: Rows, max_samples: int | None, seed: int, salt: int) -> Rows:
    """The first `max_samples` images after a seeded shuffle (kept in source order)."""
    if max_samples is None or max_samples >= len(split):
        return split
    if max_samples < 1:
        raise ValueError(f"`max_*_samples` must be >= 1, got {max_samples}.")
    # Each split gets its own stream, so limiting one split never changes which images another keeps.
    index = np.random.default_rng([seed, salt]).permutation(len(split))[:max_samples]
    return split.select(np.sort(index))


def check_labels(splits: dict[str, Rows | ImageSplit], label_names: list[str]) -> None:
    """Every split has images, and label ids within the classes."""
    for name, split in splits.items():
        if len(split) == 0:
            raise ValueError(f"The {name} split is empty (after dropping corrupt images).")
        labels = np.asarray(split.labels)
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= len(label_names):
            raise ValueError(
                f"The {name} split has label ids in [{low}, {high}], outside the {len(label_names)} classes "
                f"{label_names[:10]}{'...' if len(label_names) > 10 else ''}."
            )


class ImageSplit(torch.utils.data.Dataset):
    """One split: the `rows` (default: all) of uint8 `(M, C, H, W)` `pixel_values` (a tensor, or the decoded cache's
    memory map) with one label per image, read lazily.

    A batch copies only its own rows: `__getitems__` serves a whole batch with one index (torch's `DataLoader` calls
    it instead of `__getitem__` per image; pair it with `collate_batch`), so a split over a memory-mapped cache never
    reads the rest of the file into the process. `select` makes a subset without copying images.
    """

    def __init__(
        self,
        pixel_values: torch.Tensor | np.ndarray,
        labels: torch.Tensor | np.ndarray,
        rows: np.ndarray | None = None,
    ):
        if pixel_values.dtype not in (torch.uint8, np.uint8) or pixel_values.ndim != 4:
            raise ValueError(
                f"`pixel_values` must be uint8 (N, C, H, W), got {pixel_values.dtype} {tuple(pixel_values.shape)}."
            )
        labels = torch.as_tensor(labels)
        rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        count = len(pixel_values) if rows is None else len(rows)
        if labels.ndim != 1 or len(labels) != count:
            raise ValueError(f"`labels` must be 1-D with one label per image ({count}), got {tuple(labels.shape)}.")
        self._images, self._rows = pixel_values, rows
        self.labels = labels.to(torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.take([i])[0], "labels": self.labels[i]}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        return {"pixel_values": self.take(index), "labels": self.labels[index]}

    def take(self, indices) -> torch.Tensor:
        """uint8 `(len(indices), C, H, W)`: a copy of the images at `indices` of the split (only those rows)."""
        index = np.asarray(indices, dtype=np.int64)
        rows = index if self._rows is None else self._rows[index]
        if isinstance(self._images, torch.Tensor):
            return self._images[torch.from_numpy(rows)]
        return torch.from_numpy(np.ascontiguousarray(self._images[rows]))  # a memory map copies the rows it reads

    def with_labels(self, labels: torch.Tensor) -> ImageSplit:
        """The same images (the same array or memory map, nothing copied) with other labels."""
        return ImageSplit(self._images, labels, self._rows)

    @property
    def pixel_values(self) -> torch.Tensor:
        """All images of the split as one tensor; copies a memory-mapped split whole, so meant for small splits."""
        if isinstance(self._images, torch.Tensor) and self._rows is None:
            return self._images
        return self.take(np.arange(len(self)))

    @property
    def num_channels(self) -> int:
        return self._images.shape[1]

    @property
    def image_size(self) -> tuple[int, int]:
        """`(H, W)` of the stored images."""
        return tuple(self._images.shape[2:])

    def select(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> ImageSplit:
        """A new split with the images at `indices`, in that order; the images themselves are not copied."""
        index = np.asarray(indices, dtype=np.int64)
        rows = index if self._rows is None else self._rows[index]
        return ImageSplit(self._images, self.labels[torch.from_numpy(index)], rows)


def renumber_sparse_ids(
    splits: dict[str, ImageSplit], label_names: list[str]
) -> tuple[dict[str, ImageSplit], list[str]]:
    """Integer label ids with gaps (0, 1 and 3000: a 3,001-way head of which 2,998 classes never occur) renumbered
    to consecutive ids, each class keeping its original id as its name. Only a label column of plain integers is
    renumbered; named classes (a `ClassLabel`, strings) keep their ids, even a class that has no images."""
    if label_names != [str(i) for i in range(len(label_names))]:
        return splits, label_names
    present = torch.unique(torch.cat([split.labels for split in splits.values()]))
    if len(present) == len(label_names) or len(present) == 0 or present.min() < 0:
        return splits, label_names
    new_id = torch.full((len(label_names),), -1, dtype=torch.int64)
    new_id[present] = torch.arange(len(present))
    names = [label_names[i] for i in present.tolist()]
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    logger.warning(
        f"The label ids are not consecutive: {len(names)} distinct ids between {names[0]} and {names[-1]} ({shown}). "
        f"They are renumbered 0..{len(names) - 1} for training; each class keeps its original id as its name "
        "(id2label), which predictions and results report."
    )
    return {name: split.with_labels(new_id[split.labels]) for name, split in splits.items()}, names


def check_num_classes(train: ImageSplit, label_names: list[str]) -> None:
    """A classifier needs two classes or more, and training images of at least two of them."""
    present = torch.unique(train.labels).tolist()
    if len(label_names) < 2 or len(present) < 2:
        names = [label_names[i] for i in present]
        raise ValueError(
            f"The training images are of {len(present)} class ({names}): a classifier needs at least 2. Use a "
            "dataset (or `include_labels`) with two or more classes."
        )


def collate_batch(batch) -> dict[str, torch.Tensor]:
    """Collate for `ImageSplit`: pass a batch from `__getitems__` through, or stack a list of per-image dicts."""
    if isinstance(batch, Mapping):
        return dict(batch)
    return {key: torch.stack([item[key] for item in batch]) for key in batch[0]}
