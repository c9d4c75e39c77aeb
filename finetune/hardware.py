"""What a run ran on, recorded in `results.json` so that every figure names its machine."""

import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo` on Linux, else what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device | str | None = None) -> dict[str, Any]:
    """The device, its name, the CPU, threads and library versions, for `results.json` and the benchmarks."""
    device = torch.device(device) if device is not None else None
    info: dict[str, Any] = {
        "device": device.type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if info["device"] == "cuda" and torch.cuda.is_available():
        index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        info["accelerator"] = torch.cuda.get_device_name(index)
        info["cuda"] = torch.version.cuda
    elif info["device"] == "mps":
        info["accelerator"] = "Apple MPS"
    return info


def short_name(hardware: dict[str, Any] | None) -> str | None:
    """`1x NVIDIA H100 80GB HBM3` or `CPU AMD EPYC, 2 threads`, for tables."""
    if not hardware:
        return None
    if hardware.get("accelerator"):
        return f"1x {hardware['accelerator']}"
    return f"CPU {hardware.get('cpu', '?')}, {hardware.get('torch_threads', '?')} threads"
