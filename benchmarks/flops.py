"""The hardware's limit beside every GPU figure: model FLOPs per image, achieved TFLOP/s and the share of the peak.

    python benchmarks/flops.py                       # FLOPs per image of the suite's models, and this device's peak

- `training_flops_per_image(model, ...)`: the floating-point operations of one training step (forward and backward)
  per image, as torch's `FlopCounterMode` counts them (matrix products, convolutions and attention; elementwise work
  is not counted, as is usual), on the meta device, so a ViT-B/16 costs no memory or time to count.
- `matmul_peak_tflops(device, dtype)`: the measured rate of a large square matrix product (bf16 on a GPU), the
  practical ceiling a training step can approach.
- `SPEC_PEAK_TFLOPS`: the spec sheets' dense bf16 rates of common GPUs, where the device's name is known.

`achieved(images_per_second, flops_per_image, peak)` turns a throughput into TFLOP/s and a share of a peak.
"""

import copy
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from finetune.compile import synchronize  # noqa: E402
from finetune.errors import ArgumentParser, run_command  # noqa: E402


# Dense (no sparsity) bf16 tensor-core TFLOP/s from NVIDIA's data sheets, matched against the device name.
SPEC_PEAK_TFLOPS = {
    "H200": 989.4,
    "H100 80GB HBM3": 989.4,  # SXM
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
}


def spec_peak_tflops(device_name: str | None) -> float | None:
    """The spec sheet's dense bf16 TFLOP/s of a GPU named `device_name` (e.g. `NVIDIA H100 80GB HBM3`), if known."""
    if not device_name:
        return None
    for name, peak in SPEC_PEAK_TFLOPS.items():
        if name in device_name:
            return peak
    return None


def training_flops_per_image(model: torch.nn.Module, image_size: int, num_channels: int = 3) -> float:
    """FLOPs of one training step's forward and backward pass, per image, counted on a meta-device copy."""
    meta = copy.deepcopy(model).to("meta").train()
    pixels = torch.randn(2, num_channels, image_size, image_size, device="meta")
    labels = torch.zeros(2, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        meta(pixel_values=pixels, labels=labels).loss.backward()
    return counter.get_total_flops() / 2


def forward_flops_per_image(model: torch.nn.Module, image_size: int, num_channels: int = 3) -> float:
    """FLOPs of a forward pass per image (inference), counted as `training_flops_per_image`."""
    meta = copy.deepcopy(model).to("meta").eval()
    pixels = torch.randn(2, num_channels, image_size, image_size, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        meta(pixel_values=pixels)
    return counter.get_total_flops() / 2


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype = torch.bfloat16, size: int = 8192) -> float:
    """Measured TFLOP/s of `size` x `size` matrix products in `dtype` on `device` (median of 5 timings)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    repeats = 20 if device.type == "cuda" else 2
    rates = []
    for attempt in range(6):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        if attempt:  # the first run pays for kernel selection
            rates.append(2 * size**3 * repeats / (time.perf_counter() - start) / 1e12)
    return sorted(rates)[len(rates) // 2]


def achieved(images_per_second: float | None, flops_per_image: float | None, peak_tflops: float | None) -> dict:
    """`{"tflops": ..., "peak_share": ...}` of a training throughput (None where a figure is missing)."""
    if not images_per_second or not flops_per_image:
        return {"tflops": None, "peak_share": None}
    tflops = images_per_second * flops_per_image / 1e12
    return {"tflops": tflops, "peak_share": tflops / peak_tflops if peak_tflops else None}


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=int, default=8192, help="Matrix size of the peak measurement.")
    args = parser.parse_args(argv)
    import data_pipeline

    device = torch.device(args.device)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    report["spec_peak_tflops"] = spec_peak_tflops(report["device"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    report["matmul_peak_tflops"] = matmul_peak_tflops(device, dtype, args.size)
    report["matmul_dtype"] = str(dtype)
    report["models"] = {}
    for name in data_pipeline.MODELS:
        model, image_size, _, _ = data_pipeline.build_model(name, num_labels=10)
        report["models"][name] = {
            "image_size": image_size,
            "forward_gflops_per_image": forward_flops_per_image(model, image_size) / 1e9,
            "training_gflops_per_image": training_flops_per_image(model, image_size) / 1e9,
        }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.exit(run_command(main))
