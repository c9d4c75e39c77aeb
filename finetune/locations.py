"""Where a dataset or model name points: a local path or a Hub id, and whether the Hub is switched off.

Both `finetune.data` (`dataset_name`) and `finetune.models` (`model_name_or_path`) accept either a local path or a Hub
id, and explain a failed Hub download by the offline switches; these helpers decide both the same way.
"""

import hashlib
import itertools
import os
import re
import shutil
import socket
from pathlib import Path

import psutil
from huggingface_hub import constants as hub_constants


ADAPTER_CONFIG_NAME = "adapter_config.json"  # peft's: a folder with one holds a LoRA run's adapters
# The last line of a Markdown file written here (a model card, a comparison report): one edited since is kept.
WRITTEN_MARK = "<!-- Written by {}; sha256 of the text above: {} -->\n"
WRITTEN_MARK_PATTERN = re.compile(r"(.*)<!-- Written by [\w.]+; sha256 of the text above: (\w+) -->\n?", re.S)


def partial_folder(path: Path, kind: str) -> Path:
    """A folder beside `path` to write it in before it is renamed into place, named by this host and process
    (`.NAME.KIND-HOST-PID`). Those a process of this host left that no longer runs (killed outright: SIGKILL, power)
    are removed; another machine's, on a shared folder, are its own to remove."""
    mine = f".{path.name}.{kind}-{socket.gethostname()}-"
    for left in path.parent.glob(f"{mine}*"):
        pid = left.name.removeprefix(mine)
        if pid.isdigit() and (int(pid) == os.getpid() or not psutil.pid_exists(int(pid))):
            shutil.rmtree(left, ignore_errors=True)
    return path.with_name(f"{mine}{os.getpid()}")


def write_whole(path: Path, text: str) -> Path:
    """Write `text` to `path` by way of a file beside it, renamed over it: a stop or a full disk mid-write leaves the
    earlier file (or none), never a cut one (a cut report or card read as one edited by hand, and was kept). The new
    file replaces a link at `path` rather than writing through it, and needs its folder writable."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def is_onnx_export(folder: str | os.PathLike) -> bool:
    """Whether `folder` is an ONNX export, not a run's PyTorch model: its results.json's figures are its run's."""
    folder = Path(folder)
    return (folder / "model.onnx").is_file() and not any(folder.glob("*.safetensors"))


def looks_like_local_path(name: str) -> bool:
    """Whether `name` is written as a local path rather than a Hub id (`name` or `owner/name`)."""
    return name.startswith((".", "/", "~", "\\")) or os.path.isabs(name) or name.count("/") > 1


def offline_switch(datasets: bool = False) -> str | None:
    """The environment variable that switches the Hub off, or None. Read at every call, besides the value
    huggingface_hub read at import, so that a switch set after the import (a test, a notebook cell) counts too."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if datasets else ("HF_HUB_OFFLINE",)
    for name in names:
        if os.environ.get(name, "").strip().upper() in hub_constants.ENV_VARS_TRUE_VALUES:
            return name
    return "HF_HUB_OFFLINE" if hub_constants.HF_HUB_OFFLINE else None


def upload_switch() -> str | None:
    """The environment variable that blocks uploads to the Hub, or None: huggingface_hub's uploads obey the switch it
    read at import (`HF_HUB_OFFLINE`, or `TRANSFORMERS_OFFLINE`, which it reads too)."""
    if not hub_constants.HF_HUB_OFFLINE:
        return None
    by_transformers = os.environ.get("TRANSFORMERS_OFFLINE") and not os.environ.get("HF_HUB_OFFLINE")
    return "TRANSFORMERS_OFFLINE" if by_transformers else "HF_HUB_OFFLINE"


def check_folder(path: str | os.PathLike, option: str = "--output", is_file: bool = False) -> Path:
    """`path` as a folder that exists or can be made (with `is_file`, a file in such a folder)."""
    path = Path(path)
    on_the_way = path.parents if is_file else (path, *path.parents)
    file = next((p for p in on_the_way if p.is_file()), None)
    if file is not None:
        raise ValueError(
            f"{option} {str(path)!r}: {file} is a file, not a folder. Fix: another path (missing folders are created)."
        )
    if is_file and path.is_dir():  # found only once the work was done, as "[Errno 21] Is a directory"
        raise ValueError(f"{option} {str(path)!r} is a folder, not a file. Fix: a file name in it, or another path.")
    return path


def make_folder(path: str | os.PathLike, option: str = "--output") -> Path:
    path = check_folder(path, option)
    path.mkdir(parents=True, exist_ok=True)
    return path


def marked(text: str, writer: str) -> str:
    """`text` with the mark that `edited_file` recognises as written by `writer` and unchanged."""
    return text + WRITTEN_MARK.format(writer, hashlib.sha256(text.encode()).hexdigest())


def edited_file(path: str | os.PathLike) -> Path | None:
    """`path` where it exists and is not a file written here (`marked`) and left unchanged: the user's work."""
    path = Path(path)
    if not path.exists():
        return None
    written = path.is_file() and WRITTEN_MARK_PATTERN.fullmatch(path.read_text(encoding="utf-8", errors="replace"))
    unchanged = written and hashlib.sha256(written[1].encode()).hexdigest() == written[2]
    return None if unchanged else path


def free_name(path: Path, tag: str) -> Path:
    """`path` with `.tag` before its suffix (`report.edited.md`), numbered (`report.edited-2.md`) where that exists."""
    for n in itertools.count(1):
        candidate = path.with_name(f"{path.stem}.{tag}{f'-{n}' if n > 1 else ''}{path.suffix}")
        if not candidate.exists():
            return candidate
