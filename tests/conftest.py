"""Shared test setup: the Hub is unreachable here, so every test runs offline; under pytest-xdist each worker
computes on one thread and keeps transformers' remote-code modules to itself."""

import atexit
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path


# Set before any test module imports huggingface_hub, which reads it once at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MARK = re.compile(r"\bmark\.([A-Za-z_]\w*)")

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core (`-n auto`): a worker whose torch used every core would fight the others for them (OpenMP
    # threads spin-wait), so each keeps to one, and so do the processes its tests start.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # transformers copies a checkpoint's remote code (ScratchViT) into HF_MODULES_CACHE without a lock, and imports it
    # from there: a cache per worker, so that no worker imports a file that another is still copying.
    modules = tempfile.mkdtemp(prefix=f"vit-finetune-tests-{worker}-modules-")
    os.environ.setdefault("HF_MODULES_CACHE", modules)
    atexit.register(shutil.rmtree, modules, ignore_errors=True)


def pytest_configure(config):
    # transformers' common tests (test_scratch_vit_common.py) carry markers that transformers' own conftest registers;
    # its sdist does not ship that conftest, and --strict-markers refuses unregistered ones at import time. Register
    # every marker their sources and transformers' testing_utils name.
    root = os.environ.get("TRANSFORMERS_TESTS_DIR")
    spec = importlib.util.find_spec("transformers")
    if not root or spec is None or spec.origin is None:
        return
    sources = [*Path(root, "tests").glob("*.py"), Path(spec.origin).parent / "testing_utils.py"]
    names = {name for path in sources if path.is_file() for name in MARK.findall(path.read_text(encoding="utf-8"))}
    known = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for name in sorted(names - known):
        config.addinivalue_line("markers", f"{name}: a marker of transformers' own tests")
