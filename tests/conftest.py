"""Shared test setup: the Hub is unreachable here, so every test runs offline; under pytest-xdist each worker
computes on one thread and keeps transformers' remote-code modules to itself."""

import atexit
import os
import shutil
import tempfile


# Set before any test module imports huggingface_hub, which reads it once at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core (`-n auto`): a worker whose torch used every core would fight the others for them (OpenMP
    # threads spin-wait), so each keeps to one, and so do the processes its tests start.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # transformers copies a checkpoint's remote code (ScratchViT) into HF_MODULES_CACHE without a lock, and imports it
    # from there: a cache per worker, so that no worker imports a file that another is still copying.
    modules = tempfile.mkdtemp(prefix=f"vit-finetune-tests-{worker}-modules-")
    os.environ.setdefault("HF_MODULES_CACHE", modules)
    atexit.register(shutil.rmtree, modules, ignore_errors=True)
