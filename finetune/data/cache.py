"""The decoded cache: each decoded split as `.npy` files under a key of its source, columns, decoding and chosen
images, so a second run with the same data skips decoding.

An entry is a folder with `pixel_values.npy` (uint8 `(N, C, H, W)`), `labels.npy` and `meta.json`. Decoding writes
`pixel_values.npy` in place, chunk by chunk, inside a temporary folder that is renamed to the key when complete, and
every reader maps it (`np.load(mmap_mode="r")`): the decoded images are file pages shared by all processes of a node,
never a copy in each process. A crash leaves at most a temporary folder, never a half-written entry.
"""

import json
import os
import shutil
import tempfile
import time

import numpy as np
from huggingface_hub import constants as hub_constants
from transformers.utils import logging

from finetune.arguments import DataArguments


logger = logging.get_logger(__name__)

# Bump when the layout of cached files or the decoding itself changes, so old caches are not reused.
CACHE_FORMAT_VERSION = 3


def _cache_root(data_args: DataArguments) -> str | None:
    root = data_args.decoded_cache_dir
    if root is not None and root.lower() == "none":
        return None
    return os.path.expanduser(root) if root else os.path.join(hub_constants.HF_HOME, "vit-finetune", "decoded")


def _load_cache(path: str, where: str) -> tuple[np.ndarray, np.ndarray, dict] | None:
    """`(pixels, labels, meta)` of the entry at `path`, the pixels memory-mapped read-only; `None` if there is none."""
    meta_path = os.path.join(path, "meta.json")
    if not os.path.isfile(meta_path):
        return None
    start = time.perf_counter()
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        pixels = np.load(os.path.join(path, "pixel_values.npy"), mmap_mode="r")
        labels = np.load(os.path.join(path, "labels.npy"))
    except (OSError, ValueError) as error:
        logger.warning(f"Ignoring the unreadable decoded cache {path}: {error}")
        return None
    logger.info(
        f"Mapped {len(labels):,} decoded images of {where} from the cache {path} in "
        f"{time.perf_counter() - start:.1f}s; skipped decoding."
    )
    if meta.get("skipped"):
        logger.warning(f"{len(meta['skipped'])} corrupt image(s) of {where} were skipped when the cache was built.")
    return pixels, labels, meta


def _start_entry(path: str | None) -> str:
    """A new temporary folder to decode into: beside the entry `path`, or in the system's temporary folder when the
    cache is off (`path` None) or its folder cannot be created."""
    if path is not None:
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
            return tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(path)}-", dir=parent)
        except OSError as error:
            logger.warning(f"Could not create the decoded cache in {parent}: {error}. Continuing without it.")
    return tempfile.mkdtemp(prefix="vit-finetune-decoded-")


def _finish_entry(tmp: str, path: str | None, labels: np.ndarray, meta: dict) -> None:
    """Complete the entry decoded in `tmp` and rename it to `path`; without a cache (or on failure) remove `tmp`.

    The caller keeps `tmp`'s `pixel_values.npy` mapped: a removed file's pages stay readable until it is unmapped,
    so the run goes on from memory-mapped pixels even when the cache cannot be kept.
    """
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
