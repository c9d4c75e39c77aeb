"""Memory and speed of the memory-mapped decoded cache on a generated folder of mixed-size JPEG photos, two processes.

Generates `--num_images` JPEGs of random sizes (200-640 px a side) in `--num_classes` class folders, then launches two
processes (`torch.distributed.run --nproc_per_node 2`) twice:

- **mmap**: `load_image_data` as the run calls it (the first process decodes, in parallel over the cores, into the
  cache; the other waits and maps the file), then `--steps` training steps of a tiny ViT at 224 px with
  RandomResizedCrop + flip on the batches, under DistributedDataParallel;
- **in-memory**: the same, but each process copies its splits into its own memory first (the layout before the
  memory-mapped cache: one uint8 tensor per process).

Per process it reports the peak private memory (`RssAnon` of `/proc/self/status`, sampled every 20 ms; the cache's
file pages are page cache, shared, and counted once for the node), the time from start to the first finished step,
and the training images/s; for the decoding process, the decode images/s. Prints a Markdown table; `--output`
writes it and the JSON.

    python benchmarks/photo_cache.py --num_images 2000                 # small: checks it works
    python benchmarks/photo_cache.py --num_images 40000 --data_dir DIR --modes mmap  # about 7.9 GB decoded
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.hardware import usable_cpus  # noqa: E402
from finetune.locations import check_folder, make_folder  # noqa: E402


MODES = ("mmap", "in-memory")


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])  # its errors: one line
    parser.add_argument("--num_images", "--num-images", type=int, default=2000)
    parser.add_argument("--num_classes", "--num-classes", type=int, default=10)
    parser.add_argument(
        "--data_dir", "--data-dir", default=None, help="Where the photos are generated (default: a temporary folder)."
    )
    parser.add_argument("--cache_dir", "--cache-dir", default=None, help="The decoded cache (default: temporary).")
    parser.add_argument("--image_size", "--image-size", type=int, default=224, help="The model's input size.")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=32, help="Per process.")
    parser.add_argument("--steps", type=int, default=20, help="Training steps per process after 2 warm-up steps.")
    parser.add_argument("--decode_workers", "--decode-workers", type=int, default=None)
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="Which paths to run (default both); the in-memory path needs two copies of the split in memory.",
    )
    parser.add_argument("--output", default=None, help="Also write the results as JSON here.")
    parser.add_argument("--worker", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Refused now: a batch of 0 images made a table of 0 images/s, and no image, class or step failed only once
    # the photos were generated.
    for name in ("num_images", "num_classes", "batch_size", "steps", "decode_workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.image_size < 32 or args.image_size % 32:
        parser.error(f"--image_size must be a multiple of 32 (the model's patch size), got {args.image_size}")
    if args.output:  # made now: found in the way only after the measurement, it lost the results
        make_folder(check_folder(args.output, is_file=True).parent)
    return args


def generate_photos(root: Path, num_images: int, num_classes: int, seed: int = 0) -> None:
    """Random-size JPEGs with smooth content (so they compress like photos), one folder per class, written by a
    process per core; image `i` depends only on `(seed, i)`."""
    import concurrent.futures

    for k in range(num_classes):
        (root / f"class_{k:02d}").mkdir(parents=True, exist_ok=True)
    chunks = [range(start, min(start + 500, num_images)) for start in range(0, num_images, 500)]
    with concurrent.futures.ProcessPoolExecutor(usable_cpus()) as pool:
        list(pool.map(_write_photos, [root] * len(chunks), chunks, [num_classes] * len(chunks), [seed] * len(chunks)))


def _write_photos(root: Path, indices: range, num_classes: int, seed: int) -> None:
    from PIL import Image

    for i in indices:
        rng = np.random.default_rng([seed, i])
        width, height = rng.integers(200, 641, 2)
        small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((int(width), int(height)), Image.BICUBIC).save(
            root / f"class_{i % num_classes:02d}" / f"{i:06d}.jpg", quality=85
        )


class PeakRssAnon:
    """The largest `RssAnon` of this process seen by a sampling thread, in bytes."""

    def __init__(self, interval: float = 0.02):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


def worker(args: argparse.Namespace) -> None:
    """One of the two processes: load (decode or map), optionally copy into memory, train `--steps` steps."""
    start = time.perf_counter()
    memory = PeakRssAnon()
    import torch
    import torch.distributed as dist
    from transformers.utils import logging as transformers_logging

    from finetune.arguments import DataArguments
    from finetune.augment import CROP_MARGIN, BatchTransform, use_random_resized_crop
    from finetune.data import ImageSplit, load_image_data
    from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification

    transformers_logging.set_verbosity_error()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data_args = DataArguments(
        dataset_name=args.data_dir, decoded_cache_dir=args.cache_dir, decode_workers=args.decode_workers
    )
    decode_seconds = None
    # As `training_args.main_process_first`: the first process decodes, the other maps the file it wrote.
    if rank != 0:
        dist.barrier()
    load_start = time.perf_counter()
    data = load_image_data(data_args, seed=0, target_size=round(args.image_size * CROP_MARGIN))
    if rank == 0:
        decode_seconds = time.perf_counter() - load_start
        dist.barrier()
    train = data.train
    if args.worker == "in-memory":
        train = ImageSplit(train.pixel_values.clone(), train.labels)  # the whole split in this process's memory

    config = ScratchViTConfig(
        image_size=args.image_size, patch_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, num_labels=len(data.label_names),
    )  # fmt: skip
    model = torch.nn.parallel.DistributedDataParallel(ScratchViTForImageClassification(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    size = (args.image_size, args.image_size)
    transform = BatchTransform(
        size, [0.5] * 3, [0.5] * 3, 3, 3, random_resized_crop=use_random_resized_crop("auto", train.image_size, size)
    )
    generator = torch.Generator().manual_seed(rank)
    times = []
    first_step = None
    for step in range(args.steps + 2):
        step_start = time.perf_counter()
        index = torch.randint(0, len(train), (args.batch_size,), generator=generator)
        batch = train.__getitems__(index.tolist())
        loss = model(pixel_values=transform(batch["pixel_values"], train=True), labels=batch["labels"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if first_step is None:
            first_step = time.perf_counter() - start
        if step >= 2:
            times.append(time.perf_counter() - step_start)
    row = {
        "rank": rank,
        "peak_rss_anon_mb": memory.stop() / 2**20,
        "time_to_first_step_s": first_step,
        "train_images_per_s": args.batch_size * len(times) / sum(times),
        "decode_images_per_s": len(data.train) / decode_seconds if decode_seconds else None,
        "decode_seconds": decode_seconds,
        "num_train_images": len(data.train),
        "stored_size": list(data.train.image_size),
    }
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        cache_bytes = sum(f.stat().st_size for f in Path(args.cache_dir).rglob("pixel_values.npy"))
        print("RESULT " + json.dumps({"world_size": world, "cache_mb": cache_bytes / 2**20, "processes": rows}))
    dist.destroy_process_group()


def launch(mode: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
        "--worker", mode, "--data_dir", args.data_dir, "--cache_dir", args.cache_dir,
        "--image_size", str(args.image_size), "--batch_size", str(args.batch_size), "--steps", str(args.steps),
    ] + (["--decode_workers", str(args.decode_workers)] if args.decode_workers else [])  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        # A worker's own `error: ...` line; torchrun's report of the failed worker follows it.
        said = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        last = said[-1].removeprefix("error: ") if said else (proc.stderr.strip().splitlines() or ["no result"])[-1]
        raise RuntimeError(f"The {mode} run ended with exit status {proc.returncode}: {last}")
    return json.loads(lines[-1][len("RESULT ") :])


def markdown(results: dict) -> str:
    lines = [
        "| path | process | peak RssAnon (MB) | node total (MB) | decode images/s | time to first step (s) "
        "| training images/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, result in results.items():
        # The cache's pages are page cache shared by both processes: counted once for the node.
        node = sum(p["peak_rss_anon_mb"] for p in result["processes"]) + result["cache_mb"]
        for p in result["processes"]:
            decode = f"{p['decode_images_per_s']:,.0f}" if p["decode_images_per_s"] else "mapped"
            lines.append(
                f"| {mode} | {p['rank']} | {p['peak_rss_anon_mb']:,.0f} | {node:,.0f} | {decode} | "
                f"{p['time_to_first_step_s']:.1f} | {p['train_images_per_s']:,.1f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.data_dir is None:
            args.data_dir = str(Path(tmp) / "photos")
        if not Path(args.data_dir).is_dir():
            start = time.perf_counter()
            generate_photos(Path(args.data_dir), args.num_images, args.num_classes)
            print(f"Generated {args.num_images:,} JPEGs in {args.data_dir} in {time.perf_counter() - start:.0f}s.")
        cache_dir = args.cache_dir
        results = {}
        for mode in args.modes:
            # Each path decodes into a fresh cache, so both include decoding in their time to first step.
            args.cache_dir = cache_dir or tempfile.mkdtemp(dir=tmp, prefix=f"cache-{mode}-")
            results[mode] = launch(mode, args)
    assert all(r["world_size"] == 2 for r in results.values())
    print(markdown(results))
    if args.output:  # RESULTS.json, and the table beside it as RESULTS.md
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
        Path(args.output).with_suffix(".md").write_text(markdown(results) + "\n")
    return results


if __name__ == "__main__":
    sys.exit(run_command(main))
