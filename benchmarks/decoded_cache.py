"""Our decoded cache against `datasets`' own caching of decoded images (`Dataset.map` into its arrow cache).

Both ways decode the first `--num_images` images of a parquet file (CIFAR-10's copy by default) with the same
`decode_image`, in `--num_proc` processes, each into a fresh cache folder under `--work_dir` (deleted at the end):

- **ours**: `decoded_split` (finetune/data/cache.py) writes one uint8 `(N, C, H, W)` `pixel_values.npy` that readers
  memory-map; a batch is `ImageSplit.__getitems__` (one fancy index), as training reads it.
- **datasets** `array3d`: `Dataset.map(batched=True, num_proc=...)` into an `Array3D((C, H, W), "uint8")` feature;
  `flat`: into a fixed-length `List(Value("uint8"), length=C*H*W)`, reshaped on reading. A batch is `ds[indices]` in
  the `numpy` or `torch` format, asked for uint8 (both formats turn integers into int64 unless told a dtype), or, for
  `flat`, in the `arrow` format viewed as numpy.

Measured per way: the first build (decoding and writing the cache; the parquet file already open), the second run (a
fresh process from opening the parquet file to a readable dataset, the cache found, no decoding), reading (images/s of
`--batches` batches of `--batch_size` as one uint8 `(B, C, H, W)` array with their labels, after `--warmup` batches;
indices drawn like a shuffling sampler's epochs), the cache's size on disk, and the peak RSS of the reading process
(`ru_maxrss`: the pages of the mapped cache it touched included). Every reader must return ours' pixels and labels
for a sample of images, and the second run must find the first's cache, or the benchmark fails. Each build and each
reader runs in its own process. Prints a Markdown table; `--output` writes the JSON and the table beside it (`.md`).

    python benchmarks/decoded_cache.py --num_images 2000         # a quick check
    python benchmarks/decoded_cache.py --output benchmarks/results/decoded_cache/cifar10.json   # all 50,000 images
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from finetune.data import decode_image  # noqa: E402
from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.locations import check_folder, make_folder  # noqa: E402


LAYOUTS = ("array3d", "flat")
READERS = {
    "ours": ("ImageSplit.__getitems__",),
    "array3d": ("numpy", "torch"),
    "flat": ("numpy", "torch", "arrow"),
}
SAMPLE = 256  # images whose pixels every reader must return as ours does


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument("--num_images", "--num-images", type=int, default=None, help="The first N (default: all).")
    parser.add_argument("--num_proc", "--num-proc", type=int, default=2, help="Decoding processes, both ways.")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200, help="Timed batches per reader.")
    parser.add_argument("--warmup", type=int, default=10, help="Batches read before timing.")
    parser.add_argument(
        "--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS), help="datasets' layouts (default both)."
    )
    parser.add_argument("--work_dir", "--work-dir", default=None, help="Where the caches go (default: the system's).")
    parser.add_argument("--output", default=None, help="Also write the results as JSON here (and the table as .md).")
    parser.add_argument("--worker", choices=("build", "read"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=tuple(READERS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reader", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache_dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.output:  # made now: found in the way only after the measurement, it lost the results
        make_folder(check_folder(args.output, is_file=True).parent)
    return args


def decode_batch(batch: dict, column: str, flat: bool) -> dict:
    """`Dataset.map`'s function: the images of `column` decoded as ours decodes them, uint8 `(B, C, H, W)`."""
    images = [decode_image(item["bytes"] or item["path"], "RGB") for item in batch[column]]
    pixels = np.stack([np.asarray(image).transpose(2, 0, 1) for image in images])  # (B, H, W, C) -> (B, C, H, W)
    return {"pixel_values": pixels.reshape(len(pixels), -1) if flat else pixels}  # flat: (B, C*H*W)


def prepare_ours(args):
    """Open the source as `load_image_data` does; returns `build()` -> (read(indices), cache files)."""
    from finetune.arguments import DataArguments
    from finetune.data import ImageSplit
    from finetune.data.cache import decoded_split
    from finetune.data.sources import encode_labels, find_columns, open_source

    cache_root = os.path.join(args.cache_dir, "decoded")
    data_args = DataArguments(dataset_name=args.data, decoded_cache_dir=cache_root, decode_workers=args.num_proc)
    source = open_source(data_args)
    columns = find_columns(source.encoded["train"], data_args, source.description)
    _, labels = encode_labels(source.encoded, columns[1])
    needed = np.arange(min(args.num_images or len(labels["train"]), len(labels["train"])))

    def build():
        pixels, row_of = decoded_split(source, "train", needed, labels["train"], columns, data_args, None)
        split = ImageSplit(pixels, labels["train"][needed], row_of[needed])

        def read(indices):
            batch = split.__getitems__(indices)
            return batch["pixel_values"], batch["labels"]

        return read, sorted(str(path) for path in Path(cache_root).rglob("*") if path.is_file())

    return build, len(needed)


def prepare_datasets(args, layout: str, reader: str | None):
    """Open the parquet file with `datasets`; returns `build()` -> (read(indices), cache files)."""
    import datasets
    import torch

    dataset = datasets.load_dataset("parquet", data_files=args.data, split="train")
    column = "img" if "img" in dataset.column_names else "image"
    dataset = dataset.select(range(min(args.num_images or len(dataset), len(dataset))))
    dataset = dataset.cast_column(column, datasets.Image(decode=False))  # the map decodes the bytes, as ours does
    shape = decode_batch(dataset[:1], column, flat=False)["pixel_values"].shape[1:]  # (C, H, W) of the first image
    pixel_feature = (
        datasets.Array3D(shape, "uint8")
        if layout == "array3d"
        else datasets.List(datasets.Value("uint8"), length=math.prod(shape))
    )
    features = datasets.Features({"pixel_values": pixel_feature, "label": dataset.features["label"]})

    def build():
        cached = dataset.map(
            decode_batch,
            batched=True,
            num_proc=args.num_proc,
            remove_columns=[column],
            features=features,
            fn_kwargs={"column": column, "flat": layout == "flat"},
        )
        files = sorted(f["filename"] for f in cached.cache_files)
        if reader is None:  # the build only writes the cache
            return None, files
        labels = torch.from_numpy(cached.with_format("numpy")["label"][:])  # in memory, as ours keeps them
        if reader == "arrow":
            view = cached.with_format("arrow", columns=["pixel_values"])

            def pixels(indices):  # the taken rows' buffer as numpy, no copy
                return view[indices].column("pixel_values").combine_chunks().flatten().to_numpy()
        else:
            dtype = {"numpy": np.uint8, "torch": torch.uint8}.get(reader)
            view = cached.with_format(reader, columns=["pixel_values"], dtype=dtype)

            def pixels(indices):
                return view[indices]["pixel_values"]

        def read(indices):
            return pixels(indices).reshape(len(indices), *shape), labels[indices]

        return read, files

    return build, len(dataset)


def worker(args: argparse.Namespace) -> None:
    """One process: build the cache (`build`), or open it again and read batches from it (`read`)."""
    # Everything either way imports, imported before the clock starts: the second run times opening, not imports.
    # transformers too: a run has it loaded before its data; ours' decoding imports it (0.6 s) for its progress bar.
    import datasets
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import finetune.arguments  # noqa: F401
    import finetune.data.cache  # noqa: F401

    datasets.disable_progress_bars()
    start = time.perf_counter()
    if args.way == "ours":
        build, num_images = prepare_ours(args)
    else:
        build, num_images = prepare_datasets(args, args.way, args.reader)
    if args.worker == "build":
        start = time.perf_counter()  # the build is decoding and writing, the source already open
    read, cache_files = build()
    result = {"seconds": time.perf_counter() - start, "num_images": num_images, "cache_files": cache_files}
    if args.worker == "build":
        result["cache_bytes"] = sum(os.path.getsize(f) for f in cache_files)
    else:
        rng = np.random.default_rng(0)
        total = (args.warmup + args.batches) * args.batch_size
        order = np.concatenate([rng.permutation(num_images) for _ in range(-(-total // num_images))])[:total]
        batches = order.reshape(-1, args.batch_size).tolist()  # (warmup + batches, batch_size)
        # The high-water mark before reading: imports (torch, transformers, datasets) and opening, the same both ways.
        result["rss_before_reading_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        for indices in batches[: args.warmup]:
            read(indices)
        start = time.perf_counter()
        for indices in batches[args.warmup :]:
            read(indices)
        result["images_per_s"] = args.batches * args.batch_size / (time.perf_counter() - start)
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts KiB
        sample = np.sort(rng.choice(num_images, min(SAMPLE, num_images), replace=False)).tolist()
        pixels, labels = read(sample)
        np.savez(Path(args.cache_dir) / f"sample-{args.reader}.npz", index=sample, pixels=pixels, labels=labels)
        result["pixel_shape"] = list(np.asarray(pixels).shape)
        result["pixel_dtype"] = str(np.asarray(pixels).dtype)
    print("RESULT " + json.dumps(result))


def launch(args: argparse.Namespace, job: str, way: str, cache_dir: str, reader: str | None = None) -> dict:
    command = [sys.executable, __file__, "--worker", job, "--way", way, "--data", args.data,
               "--num_proc", str(args.num_proc), "--batch_size", str(args.batch_size), "--batches", str(args.batches),
               "--warmup", str(args.warmup), "--cache_dir", cache_dir]  # fmt: skip
    if args.num_images:
        command += ["--num_images", str(args.num_images)]
    if reader:
        command += ["--reader", reader]
    # Each way's `datasets` cache (its arrow copy of the parquet file, and datasets' decoded cache) in its own folder.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_CACHE": os.path.join(cache_dir, "hf-datasets")}
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no result printed"])[-1].removeprefix("error: ")
        raise RuntimeError(
            f"The {job} of {way}{' ' + reader if reader else ''} ended with exit status {proc.returncode}: {last}"
        )
    return json.loads(lines[-1][len("RESULT ") :])


def check_same(reference: Path, other: Path, name: str) -> None:
    """Fail loudly unless `other` holds ours' pixels and labels for the same sampled images."""
    ours, theirs = np.load(reference), np.load(other)
    if not np.array_equal(ours["index"], theirs["index"]):
        raise AssertionError(f"{name} read another sample of images than ours.")
    if ours["pixels"].shape != theirs["pixels"].shape or ours["pixels"].dtype != theirs["pixels"].dtype:
        raise AssertionError(
            f"{name} gives pixels {theirs['pixels'].dtype} {theirs['pixels'].shape}, ours "
            f"{ours['pixels'].dtype} {ours['pixels'].shape}."
        )
    differ = np.flatnonzero((ours["pixels"] != theirs["pixels"]).reshape(len(ours["index"]), -1).any(1))
    if len(differ) or not np.array_equal(ours["labels"], theirs["labels"]):
        raise AssertionError(
            f"{name} and ours disagree: pixels of images {ours['index'][differ][:10].tolist()} "
            f"({len(differ)} of {len(ours['index'])} sampled), labels equal: "
            f"{np.array_equal(ours['labels'], theirs['labels'])}."
        )


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if not os.path.isfile(args.data):
        raise FileNotFoundError(f"--data {args.data} is not a file. Fix: a parquet file of images (CIFAR-10's copy).")
    results = {
        "data": os.path.relpath(args.data),
        "num_proc": args.num_proc,
        "batch_size": args.batch_size,
        "batches": args.batches,
    }
    results["load_average_before"] = os.getloadavg()
    rows = []
    if args.work_dir:
        make_folder(args.work_dir, "--work_dir")  # a new folder, as --output is
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="decoded-cache-") as tmp:
        for way in ("ours", *args.layouts):
            cache_dir = os.path.join(tmp, way)  # a fresh cache per way
            built = launch(args, "build", way, cache_dir)
            for reader in READERS[way]:
                opened = launch(args, "read", way, cache_dir, reader)
                if opened["cache_files"] != built["cache_files"]:
                    raise AssertionError(
                        f"The second run of {way} did not reuse the first's cache: {built['cache_files']} then "
                        f"{opened['cache_files']}."
                    )
                name = "ours" if way == "ours" else f"datasets {way} ({reader})"
                sample = Path(cache_dir) / f"sample-{reader}.npz"
                check_same(Path(tmp) / "ours" / f"sample-{READERS['ours'][0]}.npz", sample, name)
                rows.append({
                    "cache": "ours (.npy memory map)" if way == "ours" else f"datasets {way}",
                    "read_by": reader if way == "ours" else f"ds[indices], {reader} format",
                    "build_s": built["seconds"],
                    "second_run_s": opened["seconds"],
                    "images_per_s": opened["images_per_s"],
                    "cache_mib": built["cache_bytes"] / 2**20,
                    "rss_before_reading_mib": opened["rss_before_reading_bytes"] / 2**20,
                    "peak_rss_mib": opened["peak_rss_bytes"] / 2**20,
                    "pixel_shape": opened["pixel_shape"],
                })  # fmt: skip
    results.update(num_images=built["num_images"], rows=rows, load_average_after=os.getloadavg())
    print(markdown(results))
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
        Path(args.output).with_suffix(".md").write_text(markdown(results) + "\n")
    return results


def markdown(results: dict) -> str:
    lines = [
        f"{results['num_images']:,} images of {results['data']}, {results['num_proc']} decoding processes, "
        f"{results['batches']} random batches of {results['batch_size']}; pixels of {SAMPLE} sampled images identical "
        f"in every row. Load average before/after: {' '.join(f'{x:.2f}' for x in results['load_average_before'])} / "
        f"{' '.join(f'{x:.2f}' for x in results['load_average_after'])}.",
        "",
        "| cache | batch read by | first build (s) | second run (s) | reading (images/s) | on disk (MiB) "
        "| peak RSS before / after reading (MiB) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['cache']} | {r['read_by']} | {r['build_s']:.2f} | {r['second_run_s']:.2f} | "
            f"{r['images_per_s']:,.0f} | {r['cache_mib']:,.1f} | "
            f"{r['rss_before_reading_mib']:,.0f} / {r['peak_rss_mib']:,.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_command(main))
