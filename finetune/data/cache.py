"""The decoded cache: each decoded split under a key of its source, columns, decoding and chosen images, so a second
run with the same data skips decoding. An entry is a folder with `pixel_values.npy` (uint8 `(N, C, H, W)`, mapped by
every reader), `labels.npy` and `meta.json`, decoded in a temporary folder renamed to the key when complete.

Not `datasets`' own cache: training gathers random batches from the memory map at 2.4 M images/s, against 0.56 M from
its fastest layout and 20 k from `Array3D` (`benchmarks/decoded_cache.py`, CIFAR-10), for the same size on disk."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from typing import TYPE_CHECKING

import numpy as np
import psutil
from huggingface_hub import constants as hub_constants

from finetune.data.decode import DECODE_CHUNK, decode_images
from finetune.data.sources import Source, content_hash, image_items
from finetune.hardware import usable_cpus


if TYPE_CHECKING:
    from finetune.arguments import DataArguments

logger = logging.getLogger(__name__)

# Bump when the layout of cached files or the decoding itself changes, so old caches are not reused.
CACHE_FORMAT_VERSION = 4


def decoded_split(
    source: Source,
    name: str,
    needed: np.ndarray,
    labels: np.ndarray,
    columns: tuple[str, str],
    data_args: DataArguments,
    target_size: int | None,
    frame: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The images at positions `needed` of the source split `name`, mapped from the cache or decoded and cached: the
    memory-mapped pixels and, for every position of the split, its row in them (-1: not decoded). `frame`, a
    `(height, width)`, stores every image centre-fitted at that size (`decode_size` is a square one)."""
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
        "images": content_hash(needed.tolist()) if subset else "all",
    }
    # Without decode_size, same-size images no larger than target_size are stored at their native size, so the cache
    # is shared between models; sources of mixed or larger sizes depend on target_size ("fallback").
    if frame is None and data_args.decode_size is not None:
        frame = (data_args.decode_size, data_args.decode_size)
    if frame is not None:
        decode_modes = [f"resize:{frame[0]}" if frame[0] == frame[1] else "resize:{}x{}".format(*frame)]
    else:
        decode_modes = ["native"] + ([f"fallback:{target_size}"] if target_size is not None else [])
    root = data_args.decoded_cache_dir or os.path.join(hub_constants.HF_HOME, "vit-finetune", "decoded")
    root = None if root.lower() == "none" else os.path.expanduser(root)
    paths = [
        os.path.join(root, content_hash({**key_fields, "decode": mode})) if root else None for mode in decode_modes
    ]
    row_of = np.full(len(dataset), -1, dtype=np.int64)
    for mode, path in zip(decode_modes, paths):
        # A native entry of images larger than `target_size` is not what this run would decode (at `target_size`).
        cached = _load_entry(path, where, target_size if mode == "native" else None)
        if cached is not None:
            pixels, meta = cached
            row_of[meta["positions"]] = meta["rows"]
            return pixels, row_of

    selected = dataset.select(needed) if subset else dataset
    workers = data_args.decode_workers or usable_cpus()
    tmp = _start_entry(paths[0])
    start = time.perf_counter()
    try:
        pixels, kept, rows, skipped, used_fallback = decode_images(
            lambda: image_items(selected, columns[0]),
            len(needed),
            resize_to=frame,
            fallback_size=target_size,
            corrupt_images=data_args.corrupt_images,
            where=where,
            out_path=os.path.join(tmp, "pixel_values.npy"),
            workers=workers,
            positions=needed,
        )
    except BaseException:  # an error or a signal (`run.stage`): no half-decoded folder left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    seconds = time.perf_counter() - start
    logger.info(
        f"Decoded {len(kept):,} images of {where} in {seconds:.1f}s ({len(needed) / max(seconds, 1e-9):,.0f} "
        f"images/s, {min(workers, max(1, -(-len(needed) // DECODE_CHUNK)))} process(es))."
    )
    positions = needed[kept]
    row_of[positions] = rows
    meta = {
        "num_channels": pixels.shape[1],
        "skipped": skipped,
        "positions": positions.tolist(),
        "rows": rows.tolist(),
    }
    _finish_entry(tmp, paths[-1] if used_fallback else paths[0], labels[positions], meta)
    return pixels, row_of


def _load_entry(path: str | None, where: str, largest: int | None) -> tuple[np.ndarray, dict] | None:
    """The entry at `path`, or None: no cache or entry, an unreadable one, or its shorter side over `largest`."""
    if path is None or not os.path.isfile(os.path.join(path, "meta.json")):
        return None
    start = time.perf_counter()
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        pixels = np.load(os.path.join(path, "pixel_values.npy"), mmap_mode="r")
    except (OSError, ValueError) as error:
        logger.warning(f"Ignoring the unreadable decoded cache {path}: {error}")
        return None
    if largest is not None and min(pixels.shape[2:]) > largest:  # (N, C, H, W)
        return None
    logger.info(
        f"Mapped {len(pixels):,} decoded images of {where} from the cache {path} in "
        f"{time.perf_counter() - start:.1f}s; skipped decoding."
    )
    if meta.get("skipped"):
        logger.warning(f"{len(meta['skipped'])} corrupt image(s) of {where} were skipped when the cache was built.")
    return pixels, meta


def _start_entry(path: str | None) -> str:
    """A new temporary folder to decode into: beside the entry `path`, else (no cache) in the system's. Its name holds
    this host and process: a later run removes those of processes that died decoding (`kill -9` runs no cleanup)."""
    owner = f"{socket.gethostname()}-{os.getpid()}-"
    if path is not None:
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
            _remove_orphans(parent)
            return tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(path)}-{owner}", dir=parent)
        except OSError as error:
            logger.warning(f"Could not create the decoded cache in {parent}: {error}. Continuing without it.")
    _remove_orphans(tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"vit-finetune-decoded-{owner}")


def _remove_orphans(parent: str) -> None:
    """Remove the temporary folders in `parent` of this host's processes that are gone."""
    owned = re.compile(rf"(\.tmp-\w+|vit-finetune-decoded)-{re.escape(socket.gethostname())}-(\d+)-")
    for name in os.listdir(parent):
        match = owned.match(name)
        if match and not psutil.pid_exists(int(match[2])):  # another user's too
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _finish_entry(tmp: str, path: str | None, labels: np.ndarray, meta: dict) -> None:
    """Complete the entry decoded in `tmp` and rename it to `path`; without a cache (or on failure) remove `tmp`: the
    caller's memory map of its pixels stays readable until it is unmapped, so the run goes on without the cache."""
    if path is None or not os.path.basename(tmp).startswith(".tmp-"):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
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
