"""The decoded cache: each decoded split as `.npy` files under a key of its source, columns and decoding, so a second
run with the same data skips decoding."""

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
CACHE_FORMAT_VERSION = 2


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
