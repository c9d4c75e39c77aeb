"""The cost of one EMA update: `finetune.callbacks.ModelEMA` against `torch.optim.swa_utils.AveragedModel`.

Both average the same model with the same decay (ours without its warm-up, so both do the same arithmetic: one
`torch._foreach_lerp_` over the floating-point parameters and buffers). Each repeat times the two back to back, in
alternating order, and the table gives the median milliseconds per update, the memory the average holds, and, on a
CUDA device, the host-device synchronisations per update (counted by `torch.cuda.set_sync_debug_mode`).

    python benchmarks/ema_update.py --output benchmarks/results/ema_update/cpu.json
    python benchmarks/ema_update.py --device cuda --output benchmarks/results/gpu/ema_update.json
"""

import json
import statistics
import sys
import time
import warnings

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import ViTConfig, ViTForImageClassification

from finetune.callbacks import ModelEMA
from finetune.compile import synchronize
from finetune.errors import ArgumentParser, run_command
from finetune.locations import check_folder, make_folder
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification


DECAY = 0.9995


def build(name: str) -> torch.nn.Module:
    if name == "vit-b16":  # google/vit-base-patch16-224-in21k's shape, randomly initialised
        return ViTForImageClassification(ViTConfig(num_labels=10))
    # The notebooks' scratch CIFAR-10 ViT (patch 4, hidden 48, 4 layers, 4 heads).
    config = ScratchViTConfig(image_size=32, patch_size=4, hidden_size=48, num_hidden_layers=4, num_attention_heads=4)
    return ScratchViTForImageClassification(config)


def syncs_per_update(update, device: torch.device) -> float | None:
    """Host-device synchronisations of one `update()` call, on CUDA; None elsewhere (there is nothing to wait for)."""
    if device.type != "cuda":
        return None
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            update()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(name: str, device: torch.device, repeats: int) -> dict:
    model = build(name).to(device)
    ours = ModelEMA(model, DECAY, warmup=False)
    theirs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=True)
    updates = {"ModelEMA": lambda: ours.update(model), "AveragedModel": lambda: theirs.update_parameters(model)}
    for update in updates.values():  # warm-up (AveragedModel's first call copies instead of averaging)
        update()
        update()
    times = {key: [] for key in updates}
    for repeat in range(repeats):
        with torch.no_grad():  # new weights each repeat, as after an optimizer step
            for p in model.parameters():
                p.add_(1e-4)
        order = list(updates) if repeat % 2 == 0 else list(reversed(updates))
        for key in order:
            synchronize(device)
            start = time.perf_counter()
            updates[key]()
            synchronize(device)
            times[key].append((time.perf_counter() - start) * 1000)
    memory = {
        "ModelEMA": sum(t.numel() * t.element_size() for t in ours.shadow.values()),
        "AveragedModel": sum(
            t.numel() * t.element_size() for t in [*theirs.module.parameters(), *theirs.module.buffers()]
        ),
    }
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        **{
            key: {
                "median_ms": statistics.median(times[key]),
                "min_ms": min(times[key]),
                "max_ms": max(times[key]),
                "average_bytes": memory[key],
                "syncs_per_update": syncs_per_update(updates[key], device),
            }
            for key in updates
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit-b16", "scratch"], choices=["vit-b16", "scratch"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--output", help="Write the rows to this JSON file.")
    args = parser.parse_args(argv)
    if args.output:  # made now: found in the way only after the measurement, it lost the results
        make_folder(check_folder(args.output, is_file=True).parent)
    device = torch.device(args.device)
    rows = [measure(name, device, args.repeats) for name in args.models]
    print("| model | parameters | device | ModelEMA ms/update | AveragedModel ms/update | syncs (ours, theirs) |")
    print("| --- | ---: | --- | ---: | ---: | --- |")
    for row in rows:
        ours, theirs = row["ModelEMA"], row["AveragedModel"]
        print(
            f"| {row['model']} | {row['parameters']:,} | {row['device']} ({row['threads']} threads) | "
            f"{ours['median_ms']:.2f} ({ours['min_ms']:.2f}-{ours['max_ms']:.2f}) | "
            f"{theirs['median_ms']:.2f} ({theirs['min_ms']:.2f}-{theirs['max_ms']:.2f}) | "
            f"{ours['syncs_per_update']}, {theirs['syncs_per_update']} |"
        )
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    sys.exit(run_command(main))
