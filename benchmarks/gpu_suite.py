"""The GPU suite: one command that proves the GPU path and writes its figures under `benchmarks/results/gpu/`.

    python benchmarks/gpu_suite.py --data PATH/TO/cifar10/train.parquet          # about 25 minutes on one H100
    python benchmarks/gpu_suite.py --tiny --data small.parquet --output OUT      # a CPU-sized run (the tests)

Three parts, each also runnable alone with `--parts`:

- **pipeline**: ViT-B/16 fine-tuning at 224 px on CIFAR-10 (google/vit-base-patch16-224-in21k's architecture; random
  weights where the Hub is unreachable, which take the same time): this project's input pipeline against the
  transformers example's (`set_transform` with torchvision transforms on PIL images, `DataLoader` with its default 0
  workers and with 8), same model, GPU, bf16 autocast and batch (32, the notebook's, and the largest that fits),
  with and without `torch.compile`: images/s, epoch time, peak GPU memory, data share of step time
  (`benchmarks/data_pipeline.py`). Goal: ours >= 2x the example at 0 workers and >= 1.3x its best worker count.
- **scratch_recipe**: `configs/cifar10_scratch_gpu.yaml` for its 10-minute budget on the CIFAR-10 training split
  (5,000 held out): validation accuracy over time and images/s (`benchmarks/train_budget.py`). Goal: >= 94%.
- **model_speed**: ScratchViT against transformers' ViT at the recipe's size and at ViT-B/16 224 px, bf16, eager and
  compiled (`benchmarks/model_speed.py`).
- **methods**: the fine-tuning methods at ViT-B/16 224 px, bf16 autocast, batch 32: trained parameters, AdamW state,
  time per training step and peak GPU memory (`benchmarks/finetune_methods.py`).

Writes `OUTPUT/suite.json` and `OUTPUT/suite.md` (each naming the device), plus the scratch recipe's report in
`OUTPUT/scratch_recipe/`. benchmarks/README.md, "GPU suite", says how to run it on a machine without `datasets` or
the data.
"""

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import data_pipeline  # noqa: E402
import finetune_methods  # noqa: E402
import model_speed  # noqa: E402
import torch  # noqa: E402
import train_budget  # noqa: E402

from finetune import hardware  # noqa: E402
from finetune.report import format_number, format_percent, markdown_table  # noqa: E402


PARTS = ("pipeline", "scratch_recipe", "model_speed", "methods")
# The example's DataLoader: its default (0 workers) and the usual tuned value.
EXAMPLE_WORKERS = (0, 8)
BATCH_CANDIDATES = (512, 384, 256, 192, 128, 96, 64, 32)
FULL = {
    "model": "vit-b16-224",
    "num_images": 10_000,
    "steps": 30,
    "data_batches": 15,
    "compile": (False, True),
    "recipe_minutes": 10,
    "recipe_overrides": [],
    "speed_presets": ["gpu", "vit-b16"],
    "speed_args": [],
    "methods_model": None,  # ViT-B/16 at 224 px
    "methods_steps": 10,
    "methods_batch": 32,
}
# A CPU-sized run with the same code paths, for the test suite.
TINY = {
    "model": "scratch",
    "num_images": 64,
    "steps": 2,
    "data_batches": 2,
    "compile": (False,),
    "recipe_minutes": 0.1,
    "recipe_overrides": [
        "--max_train_samples", "128", "--max_eval_samples", "64", "--validation_size", "64",
        "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2", "--intermediate_size", "64",
        "--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--torch_compile", "false",
        "--decoded_cache_dir", "none", "--report_to", "none", "--warmup_steps", "1",
    ],
    "speed_presets": ["cifar"],
    "speed_args": ["--steps", "1", "--repeats", "1", "--warmup", "0", "--batch_size", "8"],
    "methods_model": {
        "image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "num_labels": 10,
    },
    "methods_steps": 1,
    "methods_batch": 4,
}  # fmt: skip


def largest_batch(model_name: str, device: torch.device, candidates=BATCH_CANDIDATES) -> int:
    """The largest batch of `candidates` whose bf16 training step fits in the GPU's memory."""
    for batch_size in candidates:
        model = data_pipeline.build_model(model_name, num_labels=10)[0].to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        try:
            size = model.config.image_size
            pixels = torch.randn(batch_size, 3, size, size, device=device)
            labels = torch.randint(0, 10, (batch_size,), device=device)
            for _ in range(2):
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = model(pixel_values=pixels, labels=labels).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            return batch_size
        except torch.OutOfMemoryError:
            continue
        finally:
            del model, optimizer
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return candidates[-1]


def pipeline_part(data: str, device: torch.device, sizes: dict, batch_sizes: list[int]) -> list[dict]:
    """Our pipeline and the example's at each batch size, compiled or not; one row per run. Our runs share one
    decoded cache: the file is decoded once for the suite, not once per run."""
    with tempfile.TemporaryDirectory(prefix="decoded-") as cache:
        return _pipeline_rows(data, device, sizes, batch_sizes, cache)


def _pipeline_rows(data: str, device: torch.device, sizes: dict, batch_sizes: list[int], cache: str) -> list[dict]:
    rows = []
    bf16 = device.type == "cuda"
    for batch_size in batch_sizes:
        for compile_model in sizes["compile"]:
            runs = [("example", workers) for workers in EXAMPLE_WORKERS] + [("ours", 0)]
            for pipeline, workers in runs:
                argv = [
                    "--data", data, "--model", sizes["model"], "--device", str(device), "--pipelines", pipeline,
                    "--batch_size", str(batch_size), "--num_workers", str(workers), "--steps", str(sizes["steps"]),
                    "--num_images", str(sizes["num_images"]), "--data_batches", str(sizes["data_batches"]),
                    "--decoded_cache_dir", cache,
                ]  # fmt: skip
                argv += ["--bf16"] if bf16 else []
                argv += ["--compile"] if compile_model else []
                result = data_pipeline.main(argv)
                rows.append(
                    {
                        "pipeline": pipeline,
                        "num_workers": workers,
                        "batch_size": batch_size,
                        "compile": compile_model,
                        "bf16": bf16,
                        **result[pipeline],
                    }
                )
    for row in rows:
        same = [r for r in rows if (r["batch_size"], r["compile"]) == (row["batch_size"], row["compile"])]
        examples = {r["num_workers"]: r["train_images_per_s"] for r in same if r["pipeline"] == "example"}
        if row["pipeline"] == "ours" and examples:
            row["speedup_vs_example_default"] = row["train_images_per_s"] / examples[0]
            row["speedup_vs_example_best"] = row["train_images_per_s"] / max(examples.values())
    return rows


def pipeline_table(rows: list[dict]) -> str:
    headers = ["pipeline", "workers", "batch", "compile", "training img/s", "epoch of 50k", "data share",
               "peak GPU memory", "ours / example (0 workers)", "ours / best example"]  # fmt: skip
    cells = [
        [
            r["pipeline"],
            r["num_workers"],
            r["batch_size"],
            "yes" if r["compile"] else "no",
            format_number(r["train_images_per_s"], 0),
            f"{r['epoch_s']:,.1f} s",
            format_percent(r["data_share"]),
            f"{r['peak_gpu_memory_gb']:.1f} GiB" if r.get("peak_gpu_memory_gb") is not None else "—",
            format_number(r.get("speedup_vs_example_default"), 2),
            format_number(r.get("speedup_vs_example_best"), 2),
        ]
        for r in rows
    ]
    return markdown_table(headers, cells)


def recipe_part(data: str, output: Path, sizes: dict) -> dict:
    """The scratch GPU recipe for its budget, through `benchmarks/train_budget.py`."""
    recipe_dir = output / "scratch_recipe"
    argv = ["--config", "configs/cifar10_scratch_gpu.yaml", "--minutes", str(sizes["recipe_minutes"])]
    argv += ["--output", str(recipe_dir), "--dataset_name", data, "--validation_size", "5000"]
    argv += sizes["recipe_overrides"]
    train_budget.main(argv)
    return json.loads((recipe_dir / "summary.json").read_text())[0]


def speed_part(sizes: dict, device: torch.device) -> list[dict]:
    """`model_speed` at the recipe's size and ViT-B/16 224 px, bf16, eager and compiled."""
    rows = []
    for compile_model in sizes["compile"]:
        argv = ["--preset", *sizes["speed_presets"], "--device", str(device), *sizes["speed_args"]]
        argv += ["--bf16"] if device.type == "cuda" else []
        argv += ["--compile"] if compile_model else []
        rows += [{**vars(r), "compile": compile_model} for r in model_speed.main(argv)]
    return rows


def methods_part(sizes: dict, device: torch.device) -> list[dict]:
    """Each fine-tuning method's trained parameters, AdamW state, step time and peak memory (bf16 on CUDA)."""
    import gc

    from transformers import ViTConfig

    rows = []
    for method in finetune_methods.METHODS:
        config = ViTConfig(**sizes["methods_model"]) if sizes["methods_model"] else None
        rows.append(
            finetune_methods.method_figures(
                method, sizes["methods_steps"], sizes["methods_batch"], str(device), device.type == "cuda", config
            )
        )
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def methods_table(rows: list[dict]) -> str:
    memory = "peak_gpu_memory_mib" if "peak_gpu_memory_mib" in rows[0] else "peak_rss_mib"
    return markdown_table(
        ["method", "trained parameters", "AdamW state (MiB)", "s/step", "images/s", "peak GPU memory (MiB)"
         if memory == "peak_gpu_memory_mib" else "peak RSS (MiB)"],
        [
            [
                r["method"], f"{r['trained_parameters']:,} of {r['parameters']:,}",
                format_number(r["adamw_state_mib"], 1), format_number(r["step_seconds"], 4),
                format_number(r["batch_size"] / r["step_seconds"], 0), format_number(r[memory], 0),
            ]
            for r in rows
        ],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/gpu"))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--tiny", action="store_true", help="CPU-sized models and steps (what the tests run).")
    parser.add_argument("--batch_sizes", "--batch-sizes", type=int, nargs="+", help="Default: 32 and the largest.")
    args = parser.parse_args(argv)
    sizes = TINY if args.tiny else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    suite = {
        "device": hardware.short_name(hardware.describe(device)),
        "hardware": hardware.describe(device),
        "command": shlex.join(["python", "benchmarks/gpu_suite.py", *(argv if argv is not None else sys.argv[1:])]),
        "tiny": args.tiny,
    }
    sections = [f"# GPU suite on {suite['device']}", f"`{suite['command']}`"]
    if "pipeline" in args.parts:
        batch_sizes = args.batch_sizes or ([8] if args.tiny else [32, largest_batch(sizes["model"], device)])
        suite["pipeline"] = pipeline_part(args.data, device, sizes, sorted(set(batch_sizes)))
        sections += [
            f"## ViT-B/16 fine-tuning at 224 px: input pipelines ({suite['device']})",
            "Same model, GPU, bf16 autocast and batch; the example is the transformers example's per-image PIL "
            "pipeline. Goal: ours >= 2x the example at 0 workers and >= 1.3x its best worker count.",
            pipeline_table(suite["pipeline"]),
        ]
    if "scratch_recipe" in args.parts:
        recipe = suite["scratch_recipe"] = recipe_part(args.data, output, sizes)
        sections += [
            f"## Scratch GPU recipe, {sizes['recipe_minutes']} minutes ({suite['device']})",
            f"Validation accuracy {format_percent(recipe['validation_accuracy'])} (goal >= 94%) after "
            f"{format_number(recipe['minutes'], 1)} minutes, {format_number(recipe['epochs'], 1)} epochs, "
            f"{format_number(recipe['images_per_second'], 0)} training images/s. Over time: "
            "[scratch_recipe/results.md](scratch_recipe/results.md).",
        ]
    if "model_speed" in args.parts:
        suite["model_speed"] = speed_part(sizes, device)
        sections += [
            f"## ScratchViT against transformers' ViT ({suite['device']})",
            markdown_table(
                ["preset", "mode", "attention", "batch", "ScratchViT img/s", "transformers img/s", "ratio (range)"],
                [
                    [
                        r["preset"],
                        r["mode"],
                        r["attention"],
                        r["batch_size"],
                        format_number(r["ours_images_per_s"], 0),
                        format_number(r["transformers_images_per_s"], 0),
                        f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})",
                    ]
                    for r in suite["model_speed"]
                ],
            ),  # fmt: skip
        ]
    if "methods" in args.parts:
        suite["methods"] = methods_part(sizes, device)
        sections += [
            f"## Fine-tuning methods at {'a tiny ViT' if sizes['methods_model'] else 'ViT-B/16 224 px'}, batch "
            f"{sizes['methods_batch']}{', bf16 autocast' if device.type == 'cuda' else ''} ({suite['device']})",
            methods_table(suite["methods"]),
        ]
    suite["seconds"] = time.perf_counter() - start
    sections.append(f"Whole suite: {suite['seconds'] / 60:.1f} minutes.")
    (output / "suite.json").write_text(json.dumps(suite, indent=2, default=str) + "\n")
    (output / "suite.md").write_text("\n\n".join(sections) + "\n")
    print((output / "suite.md").read_text())
    return suite


if __name__ == "__main__":
    main()
