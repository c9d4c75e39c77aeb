"""The choice of each split's images before decoding (`choose_rows`): class filter, validation split and subsets
work on labels and positions only, so only the images a run uses are decoded."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from finetune.arguments import is_set


if TYPE_CHECKING:
    from finetune.arguments import DataArguments
    from finetune.data.dataset import ImageSplit

logger = logging.getLogger(__name__)


@dataclass
class Rows:
    """The images one output split takes from a source split, by position, chosen from labels before decoding."""

    source: str
    positions: np.ndarray  # int64 positions in the source split
    labels: np.ndarray  # int64 (N,), or multi-hot float32 (N, K) for a multi-label dataset

    def __len__(self) -> int:
        return len(self.positions)

    def select(self, index: np.ndarray) -> Rows:
        return Rows(self.source, self.positions[index], self.labels[index])


def choose_rows(
    labels: dict[str, np.ndarray], label_names: list[str], data_args: DataArguments, seed: int
) -> tuple[dict[str, Rows], list[str], str, int]:
    """The rows each output split takes from the source splits (labelled `labels`) after the validation split (the
    source's, or held out from train), `include_labels` and `max_*_samples`; the label names; how validation was
    made; how many images of the whole train split were held out (0: the source's own validation split)."""
    chosen = {name: Rows(name, np.arange(len(y)), y) for name, y in labels.items()}
    check_labels(chosen, label_names)
    keep = list(data_args.include_labels or [])  # `DataArguments` refuses a name given twice
    unknown = [name for name in keep if name not in label_names]
    if unknown:
        joined = [name for name in unknown if set(re.split(r"[,;]\s*", name)) <= set(label_names)]  # `--... 7,2`
        names = re.split(r"[,;]\s*", joined[0]) if joined else []
        fix = f" Fix: one name each, apart: `--include_labels {' '.join(names)}` (in a config `include_labels: "
        fix += f"[{', '.join(names)}]`)."
        raise ValueError(
            f"`include_labels` has unknown label(s) {unknown}; the dataset's labels are {label_names}."
            + (fix if joined else "")
        )
    kept_ids = [label_names.index(name) for name in keep]
    train, held_out = chosen["train"], 0
    if "validation" in chosen:
        how = "validation split of the source"
        if is_set(data_args, "validation_size"):
            logger.warning(
                f"`validation_size`={data_args.validation_size:g} is not used: the dataset has a validation split of "
                f"its own ({len(chosen['validation'])} images), which is used instead."
            )
    else:
        # Held out from every class's images, before `include_labels`: runs on other classes of the same data (a
        # model pretrained on some, fine-tuned on all) hold out the same images, and none validates on images another
        # trained on. Images with several labels have no one class to stratify by: a seeded random split.
        multi_label = train.labels.ndim == 2
        by = np.zeros(len(train), dtype=np.int64) if multi_label else train.labels
        size = data_args.validation_size
        if keep and not multi_label and size >= 1:  # about a number of the kept classes' images: that share of all
            kept = int(np.isin(train.labels, kept_ids).sum())
            if size >= kept:
                raise ValueError(
                    f"`validation_size`={size:g} would hold out all {kept} training images of the `include_labels` "
                    "classes; it must leave at least one image on each side."
                )
            size = size / kept
        train_index, validation_index = stratified_split(by, size, seed)
        chosen["train"], chosen["validation"] = train.select(train_index), train.select(validation_index)
        held_out = len(validation_index)
        if keep and not multi_label and not np.isin(chosen["validation"].labels, kept_ids).any():
            raise ValueError(
                f"`validation_size`={data_args.validation_size:g}, a share of every class's images, holds out none of "
                "the `include_labels` classes' images. Fix: a larger `validation_size`, or a validation split of its "
                "own (`validation_file`, or a validation/ folder)."
            )
        kind = "random" if multi_label else "stratified"
        how = f"held out from train: validation_size={data_args.validation_size:g}, {kind}, seed {seed}"
    if keep:
        chosen, label_names = _keep_classes(chosen, label_names, keep)
    train, validation, test = chosen["train"], chosen["validation"], chosen.get("test")
    chosen = {
        "train": _subsample(train, data_args.max_train_samples, seed, salt=1),
        "validation": _subsample(validation, data_args.max_eval_samples, seed, salt=2),
    }
    if test is not None:
        chosen["test"] = _subsample(test, data_args.max_eval_samples, seed, salt=3)
    return chosen, label_names, how, held_out


def _keep_classes(
    splits: dict[str, Rows], label_names: list[str], keep: list[str]
) -> tuple[dict[str, Rows], list[str]]:
    """The images of the classes `keep`, renumbered in its order (multi-label: every image, only those labels)."""
    old_ids = [label_names.index(name) for name in keep]
    new_id = np.full(len(label_names), -1, dtype=np.int64)
    new_id[old_ids] = np.arange(len(keep))
    kept = {}
    for name, split in splits.items():
        if split.labels.ndim == 2:
            kept[name] = Rows(split.source, split.positions, split.labels[:, old_ids])
        else:
            labels = new_id[split.labels]
            kept[name] = Rows(split.source, split.positions[labels >= 0], labels[labels >= 0])
            if len(kept[name]) == 0:
                has = [label_names[i] for i in np.unique(split.labels)]
                raise ValueError(
                    f"The {name} split has no images of the `include_labels` classes {keep}; it has {has[:10]}. Fix: "
                    f"name one of those in `include_labels` too."
                )
    logger.info(f"Kept the {len(keep)} classes of `include_labels` {keep}, renumbered in that order.")
    return kept, keep


def stratified_split(labels: np.ndarray, validation_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices `(train, validation)` that hold out `validation_size` (a fraction in (0, 1), or a number of images)
    of the int class ids `labels`, with class proportions kept and the same split for the same seed.

    Every class gets its share rounded down; the images left over go to the classes with the largest remainders
    (ties broken at random by the seed), so the validation split has exactly the requested size. A class's last
    image stays in train unless the size cannot be reached otherwise: a class of one image held out was never trained.
    """
    n = len(labels)
    n_validation = int(round(validation_size * n)) if validation_size < 1 else int(validation_size)
    if not 1 <= n_validation < n:
        raise ValueError(
            f"`validation_size`={validation_size:g} would hold out {n_validation} of the {n} training images; "
            "it must leave at least one image on each side."
        )
    rng = np.random.default_rng(seed)
    classes, class_of, counts = np.unique(labels, return_inverse=True, return_counts=True)
    share = counts * (n_validation / n)
    quota = np.floor(share).astype(np.int64)
    order = np.lexsort((rng.random(len(classes)), -(share - quota)))  # largest remainder first
    room = quota[order] < counts[order] - 1
    order = np.concatenate([order[room], order[~room]])
    quota[order[: n_validation - quota.sum()]] += 1
    validation = np.concatenate([rng.permutation(np.flatnonzero(class_of == k))[:q] for k, q in enumerate(quota)])
    return np.setdiff1d(np.arange(n), validation), np.sort(validation)


def _subsample(split: Rows, max_samples: int | None, seed: int, salt: int) -> Rows:
    """The first `max_samples` images after a seeded shuffle (kept in source order)."""
    if max_samples is None or max_samples >= len(split):  # `DataArguments` refuses values below 1
        return split
    # Each split gets its own stream, so limiting one split never changes which images another keeps.
    index = np.random.default_rng([seed, salt]).permutation(len(split))[:max_samples]
    return split.select(np.sort(index))


def check_labels(splits: dict[str, Rows | ImageSplit], label_names: list[str]) -> None:
    """Every split has images, and label ids within the classes (multi-hot rows have one column per label)."""
    for name, split in splits.items():
        if len(split) == 0:
            raise ValueError(f"The {name} split is empty (after dropping corrupt images).")
        labels = np.asarray(split.labels)
        if labels.ndim == 2:
            continue
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= len(label_names):
            # -1 is the Hub's "no label": a competition's test split, whose labels are kept secret.
            unlabelled = f" {int((labels < 0).sum()):,} of its {len(labels):,} images have no label (a negative id)"
            fix = ": label them, or pass only the labelled splits' files (`train_file`, `validation_file`)"
            raise ValueError(
                f"The {name} split has label ids in [{low}, {high}], outside the {len(label_names)} classes "
                f"{label_names[:10]}{'...' if len(label_names) > 10 else ''}."
                + (unlabelled + fix + "." if low < 0 else "")
            )
