"""The decoded splits as torch datasets (`ImageSplit`) and their batches (`collate_batch`), with the checks of their
labels that only hold after decoding (corrupt images dropped)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence

import numpy as np
import torch


logger = logging.getLogger(__name__)


class ImageSplit(torch.utils.data.Dataset):
    """One split: the `rows` (default: all) of uint8 `(M, C, H, W)` `pixel_values` (a tensor, or the decoded cache's
    memory map), with an int64 class id or a float32 multi-hot row per image. `__getitems__` serves a batch with one
    index (pair it with `collate_batch`), so a batch copies only its own rows of a memory map; `select` copies none.
    `positions` (in the source split, as the corrupt-image warnings number them) and `files` name each image in the
    predictions CSVs."""

    def __init__(
        self,
        pixel_values: torch.Tensor | np.ndarray,
        labels: torch.Tensor | np.ndarray,
        rows: np.ndarray | None = None,
        positions: np.ndarray | None = None,
        files: list[str | None] | None = None,
    ):
        if pixel_values.dtype not in (torch.uint8, np.uint8) or pixel_values.ndim != 4:
            raise ValueError(
                f"`pixel_values` must be uint8 (N, C, H, W), got {pixel_values.dtype} {tuple(pixel_values.shape)}."
            )
        labels = torch.as_tensor(labels)
        rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        count = len(pixel_values) if rows is None else len(rows)
        if labels.ndim not in (1, 2) or len(labels) != count:
            raise ValueError(f"`labels` must be (N,) or (N, K), N the images ({count}), got {tuple(labels.shape)}.")
        self._images, self._rows, self.positions, self.files = pixel_values, rows, positions, files
        self.labels = labels.to(torch.int64 if labels.ndim == 1 else torch.float32)

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

    @functools.cached_property
    def image_keys(self) -> np.ndarray:
        """An int64 hash per image of its lines a quarter, half and three quarters down: the same for copies of an
        image, different for others but in rare cases (none among MNIST's or CIFAR-10's training images). Read from a
        memory map in file order (0.3 s for CIFAR-10's 50,000), without reading the rest of each image."""
        images = self._images.numpy() if isinstance(self._images, torch.Tensor) else self._images
        rows = np.arange(len(images)) if self._rows is None else self._rows
        height, channels = images.shape[2], range(images.shape[1])
        lines = [height // 4, height // 2, 3 * height // 4]
        order = np.argsort(rows, kind="stable")
        keys = np.empty(len(rows), dtype=np.int64)
        for start in range(0, len(rows), 4096):
            chunk = order[start : start + 4096]
            part = images[np.ix_(rows[chunk], channels, lines)]  # (n, C, 3, W)
            keys[chunk] = [hash(image.tobytes()) for image in part]
        return keys

    def copies_in(self, other: ImageSplit) -> list[tuple[int, int]]:
        """Pairs `(i, j)` of an image `i` of this split and an image `j` of `other` with the same pixels, each `i`
        paired with its first copy `j` (`j < i` where `other` is this split). Only the images whose `image_keys` meet
        are read whole and hashed, a few MB at a time: however many share a key (copies of one image, images alike on
        the sampled lines), each is compared with one image, its hash's first in `other`, pixel for pixel."""
        keys, counts = np.unique(other.image_keys, return_counts=True)
        met = keys[counts >= (2 if other is self else 1)]  # an image meets its own key
        mine = np.flatnonzero(np.isin(self.image_keys, met)).tolist()
        if not mine:
            return []
        first: dict[int, int] = {}  # the hash of all the pixels of an image of `other`: its first image with it
        for part, images in other._read(np.flatnonzero(np.isin(other.image_keys, met)).tolist()):
            for j, image in zip(part, images):
                first.setdefault(hash(image.tobytes()), j)
        pairs = []
        for part, images in self._read(mine):
            found = [(k, first.get(hash(image.tobytes()))) for k, image in enumerate(images)]
            found = [(k, j) for k, j in found if j is not None and (other is not self or j < part[k])]
            if found:
                same = images[[k for k, _ in found]] == other.take([j for _, j in found]).numpy()
                pairs += [(part[k], j) for (k, j), equal in zip(found, same.reshape(len(found), -1).all(1)) if equal]
        return pairs

    def _read(self, indices: list[int]):
        """The images at `indices` as `(indices, uint8 array)` parts of some 64 MB."""
        per_part = max(1, 2**26 // int(np.prod(self._images.shape[1:])))
        for start in range(0, len(indices), per_part):
            part = indices[start : start + per_part]
            yield part, self.take(part).numpy()

    def select(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> ImageSplit:
        """A new split with the images at `indices`, in that order; the images themselves are not copied."""
        index = np.asarray(indices, dtype=np.int64)
        rows = index if self._rows is None else self._rows[index]
        positions = None if self.positions is None else self.positions[index]
        files = None if self.files is None else [self.files[i] for i in index]
        return ImageSplit(self._images, self.labels[torch.from_numpy(index)], rows, positions, files)


def check_num_classes(train: ImageSplit, label_names: list[str]) -> None:
    """A classifier needs two classes or more, and training images of at least two of them; a multi-label one, a
    training image of every label, and two labels or more (scikit-learn's metrics read one column as binary)."""
    if train.labels.ndim == 2:
        if len(label_names) < 2:
            named, tag = (f" ({label_names[0]})", label_names[0]) if label_names else ("", "TAG")
            raise ValueError(
                f"Multi-label data needs at least 2 labels, got {len(label_names)}{named}: for one tag, label each "
                f"image `{tag}` or `none` (single-label)."
            )
        absent = [name for name, count in zip(label_names, train.labels.sum(0).tolist()) if count == 0]
        if absent:
            raise ValueError(
                f"No training image has the label(s) {absent[:5]}: each label is learnt from its training images. "
                "Hold out fewer images (`validation_size`), or keep the other labels (`include_labels`)."
            )
        return
    present = torch.unique(train.labels).tolist()
    if len(label_names) < 2 or len(present) < 2:
        names = [label_names[i] for i in present]
        raise ValueError(
            f"The training images are of {len(present)} class ({names}): a classifier needs at least 2. Use a "
            "dataset (or `include_labels`) with two or more classes."
        )
    absent = [name for i, name in enumerate(label_names) if i not in present]
    if absent:
        logger.warning(
            f"No training image is of the class(es) {absent[:5]}{' ...' if len(absent) > 5 else ''}: the model cannot "
            "learn them, and their validation and test images count as errors. Add training images of them, or keep "
            "the other classes (`include_labels`)."
        )


def collate_batch(batch) -> dict[str, torch.Tensor]:
    """Collate for `ImageSplit`: pass a batch from `__getitems__` through, or stack a list of per-image dicts."""
    return dict(batch) if isinstance(batch, Mapping) else torch.utils.data.default_collate(batch)
