"""The GPU suite: one command that measures the GPU path and writes its figures under `benchmarks/results/gpu/`.

    python benchmarks/gpu_suite.py --data PATH/TO/cifar10/train.parquet          # about 25 minutes on one H100
    python benchmarks/gpu_suite.py --parts pipeline notebook_job ...             # some parts
    python benchmarks/gpu_suite.py --tiny --data small.parquet --output OUT      # a CPU-sized run (the tests)

Parts (`--parts`; `sweep` is not in the default set, `benchmarks/gpu_sweep.py` runs it alone too):

- **pipeline**: ViT-B/16 fine-tuning steps at 224 px on CIFAR-10 (google/vit-base-patch16-224-in21k's architecture,
  random weights, which take the same time): the transformers example's input pipeline (0 and 8 loader workers) and
  ours, eager and through the Trainer's compiler (`auto`, inductor `default`, `cudagraphs`), at batch 32 (the
  notebook's) and the largest that fits; then the scratch GPU recipe's encoder at batch 512, eager and `auto`
  (`benchmarks/data_pipeline.py`). Images/s with nothing waiting for the device between steps, data share.
- **notebook_job**: `configs/cifar10_vit_b16.yaml` as a user runs it (batch 32, 2 epochs of 45,000 images), and
  `configs/cifar10_vit_b16_large_batch.yaml` (batch 512), from a checkpoint in the in21k repository's layout with
  random weights (the Hub may be unreachable): training seconds, images/s, what `torch_compile: auto` kept.
- **scratch_recipe**: `configs/cifar10_scratch_gpu.yaml` for its 10-minute budget (`benchmarks/train_budget.py`).
- **model_speed**: ScratchViT against transformers' ViT at the recipe's size and at ViT-B/16 224 px, bf16, eager and
  compiled (`benchmarks/model_speed.py`).
- **methods**: the fine-tuning methods at ViT-B/16 224 px, bf16 autocast, batch 32 (`benchmarks/finetune_methods.py`).
- **sweep**: the scratch recipe's variants side by side (`benchmarks/gpu_sweep.py`), 6 minutes.

Every training row carries the hardware's limit: the model's training FLOPs per image (`benchmarks/flops.py`), the
achieved TFLOP/s and its share of the device's dense bf16 peak, both the spec sheet's and a measured large matrix
product's. Each part and each row runs on its own: a failure is recorded with its one-line error and the suite goes
on. `OUTPUT/suite.json` and `OUTPUT/suite.md` are rewritten after every row, so a suite cut short keeps what it did.
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
import flops  # noqa: E402
import gpu_sweep  # noqa: E402
import model_speed  # noqa: E402
import sweep  # noqa: E402
import torch  # noqa: E402
import train_budget  # noqa: E402

from finetune import hardware  # noqa: E402
from finetune.compile import one_line  # noqa: E402
from finetune.errors import ArgumentParser, run_command  # noqa: E402
from finetune.tools.report import MISSING, format_number, format_percent, markdown_table  # noqa: E402


PARTS = ("pipeline", "notebook_job", "scratch_recipe", "model_speed", "methods", "sweep")
DEFAULT_PARTS = PARTS[:-1]
# The example's DataLoader: its default (0 workers) and the usual tuned value.
EXAMPLE_WORKERS = (0, 8)
BATCH_CANDIDATES = (1024, 768, 512, 384, 256, 192, 128, 96, 64, 32)
NOTEBOOK_CONFIGS = ("configs/cifar10_vit_b16.yaml", "configs/cifar10_vit_b16_large_batch.yaml")
FULL = {
    "model": "vit-b16-224",
    "num_images": 10_000,
    "steps": 30,
    "data_batches": 15,
    "compile_modes": (None, "auto", "default", "cudagraphs"),
    "compile_backend": None,
    "recipe_model": "scratch-gpu",
    "recipe_batch": 512,
    "notebook_model": {},  # ViTConfig's defaults: ViT-B/16 at 224 px
    "notebook_overrides": [],
    "recipe_minutes": 10,
    "recipe_overrides": [],
    "speed_presets": ["gpu", "vit-b16"],
    "speed_args": [],
    "methods_model": None,  # ViT-B/16 at 224 px
    "methods_steps": 10,
    "methods_batch": 32,
    "sweep_args": ["--minutes", "6"],
    "peak_size": 8192,
}
# A CPU-sized run with the same code paths, for the test suite (aot_eager: dynamo and AOTAutograd without inductor).
TINY = {
    "model": "scratch",
    "num_images": 64,
    "steps": 2,
    "data_batches": 2,
    "compile_modes": (None, "auto"),
    "compile_backend": "aot_eager",
    "recipe_model": "scratch",
    "recipe_batch": 16,
    "notebook_model": {
        "image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64,
    },
    "notebook_overrides": [
        "--max_train_samples", "64", "--max_eval_samples", "32", "--validation_size", "32", "--num_train_epochs", "1",
        "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "32", "--decoded_cache_dir", "none",
    ],
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
    "sweep_args": ["--tiny", "--minutes", "1", "--variants", "as_shipped", "no_qk_norm"],
    "peak_size": 256,
}  # fmt: skip


class Suite:
    """The suite's results, written to `output` (suite.json, suite.md) after every row."""

    def __init__(self, output: Path, header: dict):
        self.output = output
        self.data = dict(header)
        self.parts: dict[str, list] = {}
        self.start = time.perf_counter()

    def add(self, part: str, row: dict) -> dict:
        self.parts.setdefault(part, []).append(row)
        self.write()
        return row

    def attempt(self, part: str, label: dict, measure, *args) -> dict:
        """`label` plus what `measure(*args)` returns; on a failure, `label` with the one-line error (and the suite
        goes on)."""
        start = time.perf_counter()
        try:
            row = {**label, **measure(*args)}
        except Exception as error:  # one row's failure must not cost the others
            print(f"[gpu_suite] {part} {label}: failed: {one_line(error)}", flush=True)
            row = {**label, "error": one_line(error)}
        row["seconds"] = time.perf_counter() - start
        return self.add(part, row)

    def write(self) -> None:
        self.data.update(self.parts)
        self.data["seconds"] = time.perf_counter() - self.start
        (self.output / "suite.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        (self.output / "suite.md").write_text(markdown(self.data) + "\n")


def error_rows(rows: list[dict], describe) -> list[str]:
    return [f"- {describe(r)}: **failed**, `{r['error']}`" for r in rows if "error" in r]


def peaks(suite: dict) -> tuple[float | None, float | None]:
    return suite.get("spec_peak_tflops"), suite.get("matmul_peak_tflops")


def flop_cells(row: dict, suite: dict) -> list[str]:
    """GFLOP per image, achieved TFLOP/s, share of the spec peak and of the measured matrix-product peak."""
    spec, measured = peaks(suite)
    images = row.get("train_images_per_s") or row.get("images_per_second")
    rate = flops.achieved(images, row.get("training_flops_per_image"), spec)
    measured_share = flops.achieved(images, row.get("training_flops_per_image"), measured)["peak_share"]
    gflops = row["training_flops_per_image"] / 1e9 if row.get("training_flops_per_image") else None
    return [
        format_number(gflops, 1),
        format_number(rate["tflops"], 1),
        format_percent(rate["peak_share"]),
        format_percent(measured_share),
    ]


FLOP_HEADERS = ["GFLOP/image", "TFLOP/s", "of spec peak", "of measured peak"]


def pipeline_table(suite: dict) -> str:
    rows = [r for r in suite["pipeline"] if "error" not in r]
    headers = ["model", "pipeline", "workers", "batch", "compile", "training img/s", "step", "data share",
               "peak GPU memory", "ours / best example", *FLOP_HEADERS]  # fmt: skip
    cells = [
        [
            r["model"], r["pipeline"], r["num_workers"], r["batch_size"], r["compile"],
            format_number(r["train_images_per_s"], 0), f"{r['step_ms']:.1f} ms", format_percent(r["data_share"]),
            f"{r['peak_gpu_memory_gb']:.1f} GiB" if r.get("peak_gpu_memory_gb") is not None else MISSING,
            format_number(r.get("speedup_vs_example_best"), 2), *flop_cells(r, suite),
        ]
        for r in rows
    ]  # fmt: skip
    outcomes = [
        f"- {r['model']}, batch {r['batch_size']}, compile {r['compile']}: {r['compile_outcome']} (first step "
        f"{r['first_step_s']:.1f} s)"
        for r in rows
        if r["compile"] != "no"
    ]
    return "\n\n".join([markdown_table(headers, cells), "\n".join(outcomes)])


def notebook_table(suite: dict) -> str:
    rows = [r for r in suite["notebook_job"] if "error" not in r]
    headers = ["config", "batch", "training", "images/s", "data share", "wall (with evaluation)", *FLOP_HEADERS]
    cells = [
        [
            f"`{r['config']}`", r["batch_size"], f"{r['train_seconds']:.1f} s",
            format_number(r["images_per_second"], 0), format_percent(r["data_share"]), f"{r['wall_seconds']:.1f} s",
            *flop_cells(r, suite),
        ]
        for r in rows
    ]  # fmt: skip
    compile_lines = [f"- `{r['config']}`: {r['torch_compile']}" for r in rows]
    return "\n\n".join([markdown_table(headers, cells), "\n".join(compile_lines)])


def speed_table(suite: dict) -> str:
    rows = [r for r in suite["model_speed"] if "error" not in r]
    headers = ["preset", "mode", "attention", "batch", "ScratchViT img/s", "transformers img/s", "ratio (range)"]
    cells = [
        [
            r["preset"], r["mode"], r["attention"], r["batch_size"], format_number(r["ours_images_per_s"], 0),
            format_number(r["transformers_images_per_s"], 0),
            f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})",
        ]
        for r in rows
    ]  # fmt: skip
    for row, cell in zip(rows, cells):
        cell += flop_cells({**row, "images_per_second": row["ours_images_per_s"]}, suite)
    return markdown_table([*headers, *FLOP_HEADERS], cells)


def methods_table(suite: dict) -> str:
    rows = [r for r in suite["methods"] if "error" not in r]
    memory = "peak_gpu_memory_mib" if rows and "peak_gpu_memory_mib" in rows[0] else "peak_rss_mib"
    memory_header = "peak GPU memory (MiB)" if memory == "peak_gpu_memory_mib" else "peak RSS (MiB)"
    headers = ["method", "trained parameters", "AdamW state (MiB)", "s/step", "images/s", memory_header, *FLOP_HEADERS]
    cells = []
    for r in rows:
        images = r["batch_size"] / r["step_seconds"]
        cells.append(
            [
                r["method"], f"{r['trained_parameters']:,} of {r['parameters']:,}",
                format_number(r["adamw_state_mib"], 1), format_number(r["step_seconds"], 4),
                format_number(images, 0), format_number(r[memory], 0),
                *flop_cells({**r, "images_per_second": images}, suite),
            ]
        )  # fmt: skip
    return markdown_table(headers, cells)


def markdown(suite: dict) -> str:
    device = suite["device"]
    spec, measured = peaks(suite)
    sections = [
        f"# GPU suite on {device}",
        f"`{suite['command']}` ({suite['seconds'] / 60:.1f} minutes)",
        f"Dense bf16 peak: {format_number(spec, 0)} TFLOP/s on the spec sheet, {format_number(measured, 0)} TFLOP/s "
        f"measured ({suite.get('matmul_dtype')} {suite.get('peak_size')}x{suite.get('peak_size')} matrix products). "
        "FLOPs per image are a training step's forward and backward matrix products, convolutions and attention "
        "(`benchmarks/flops.py`).",
    ]
    if suite.get("pipeline"):
        sections += [
            f"## Training steps by input pipeline and compilation ({device})",
            "Same model, bf16 autocast and fused AdamW; the example is the transformers example's per-image PIL "
            "pipeline. Images/s over steps with nothing waiting for the device between them; data share from steps "
            "split by synchronisations.",
            pipeline_table(suite),
            *error_rows(suite["pipeline"], lambda r: f"{r['model']} {r['pipeline']} batch {r['batch_size']}"),
        ]
    if suite.get("notebook_job"):
        sections += [
            f"## The notebook's job as users run it ({device})",
            "`python -m finetune.run --config CONFIG` from a ViT-B/16 checkpoint in the in21k layout (random "
            "weights): 2 epochs of 45,000 CIFAR-10 images, then evaluation of 5,000.",
            notebook_table(suite),
            *error_rows(suite["notebook_job"], lambda r: f"`{r['config']}`"),
        ]
    for recipe in suite.get("scratch_recipe", []):
        if "error" in recipe:
            sections += ["## Scratch GPU recipe", f"**failed**: `{recipe['error']}`"]
            continue
        sections += [
            f"## Scratch GPU recipe, {recipe['budget_minutes']} minutes ({device})",
            f"Validation accuracy {format_percent(recipe['validation_accuracy'])} (goal >= 94%) after "
            f"{format_number(recipe['minutes'], 1)} minutes, {format_number(recipe['epochs'], 1)} epochs, "
            f"{format_number(recipe['images_per_second'], 0)} training images/s, data share "
            f"{format_percent(recipe['data_share'])}. Over time: "
            "[scratch_recipe/results.md](scratch_recipe/results.md).",
        ]
    if suite.get("model_speed"):
        sections += [
            f"## ScratchViT against transformers' ViT ({device})",
            speed_table(suite),
            *error_rows(suite["model_speed"], lambda r: f"{r['preset']} ({r['compile']})"),
        ]
    if suite.get("methods"):
        sections += [
            f"## Fine-tuning methods ({device})",
            methods_table(suite),
            *error_rows(suite["methods"], lambda r: r["method"]),
        ]
    for result in suite.get("sweep", []):
        sections += ["## Scratch recipe variants", result.get("error") or "[sweep/sweep.md](sweep/sweep.md)"]
    return "\n\n".join(sections)


def largest_batch(model_name: str, device: torch.device, candidates=BATCH_CANDIDATES) -> int:
    """The largest batch of `candidates` whose bf16 training step fits in the GPU's memory."""
    for batch_size in candidates:
        model = data_pipeline.build_model(model_name, num_labels=10)[0].to(device)
        optimizer = torch.optim.AdamW(model.parameters(), fused=device.type == "cuda")
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


def measure_pipeline(argv: list[str], pipeline: str, training_flops_per_image: float) -> dict:
    return {"training_flops_per_image": training_flops_per_image, **data_pipeline.main(argv)[pipeline]}


def pipeline_part(suite: Suite, data: str, device: torch.device, sizes: dict, batch_sizes: list[int]) -> None:
    """Our pipeline (eager and each compile mode) and the example's (eager) at each batch size, then the scratch
    recipe's encoder. Our runs share one decoded cache: the file is decoded once for the suite."""
    with tempfile.TemporaryDirectory(prefix="decoded-") as cache:
        runs = [(sizes["model"], b, "example", w, None) for b in batch_sizes for w in EXAMPLE_WORKERS]
        runs += [(sizes["model"], b, "ours", 0, mode) for b in batch_sizes for mode in sizes["compile_modes"]]
        runs += [(sizes["recipe_model"], sizes["recipe_batch"], "ours", 0, m) for m in sizes["compile_modes"][:2]]
        model_flops = {}
        for model, batch_size, pipeline, workers, mode in runs:
            if model not in model_flops:
                built, image_size, _, _ = data_pipeline.build_model(model, num_labels=10)
                model_flops[model] = flops.training_flops_per_image(built, image_size)
            argv = [
                "--data", data, "--model", model, "--device", str(device), "--pipelines", pipeline,
                "--batch_size", str(batch_size), "--num_workers", str(workers), "--steps", str(sizes["steps"]),
                "--num_images", str(sizes["num_images"]), "--data_batches", str(sizes["data_batches"]),
                "--decoded_cache_dir", cache,
            ]  # fmt: skip
            argv += ["--bf16"] if device.type == "cuda" else []
            argv += ["--compile", mode] if mode else []
            argv += ["--compile_backend", sizes["compile_backend"]] if mode and sizes["compile_backend"] else []
            label = {"model": model, "pipeline": pipeline, "num_workers": workers, "batch_size": batch_size}
            suite.attempt(
                "pipeline", {**label, "compile": mode or "no"}, measure_pipeline, argv, pipeline, model_flops[model]
            )
    rows = [r for r in suite.parts.get("pipeline", []) if "error" not in r]
    for row in rows:
        same = [r for r in rows if (r["model"], r["batch_size"]) == (row["model"], row["batch_size"])]
        examples = [r["train_images_per_s"] for r in same if r["pipeline"] == "example"]
        if row["pipeline"] == "ours" and examples:
            row["speedup_vs_example_best"] = row["train_images_per_s"] / max(examples)
    suite.write()


def notebook_checkpoint(path: Path, model: dict) -> Path:
    """A ViT checkpoint in google/vit-base-patch16-224-in21k's layout (ViT-B/16 unless `model` says otherwise), with
    random weights, and its image processor."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(**model, num_labels=21843)
    ViTForImageClassification(config).save_pretrained(path)
    size = config.image_size
    ViTImageProcessor(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        path
    )
    return path


def notebook_part(suite: Suite, data: str, output: Path, sizes: dict) -> None:
    """Each notebook config as a user runs it, in its own process, from a local checkpoint."""
    from transformers import ViTConfig, ViTForImageClassification

    with tempfile.TemporaryDirectory(prefix="vit-in21k-") as checkpoint:
        notebook_checkpoint(Path(checkpoint), sizes["notebook_model"])
        config = ViTConfig(**sizes["notebook_model"], num_labels=10)
        model_flops = flops.training_flops_per_image(ViTForImageClassification(config), config.image_size)
        for config_path in NOTEBOOK_CONFIGS:
            run_dir = output / "notebook_job" / "runs" / Path(config_path).stem
            argv = ["--config", sweep.from_here(config_path), "--model_name_or_path", checkpoint]
            argv += ["--dataset_name", data, *sizes["notebook_overrides"]]
            suite.attempt("notebook_job", {"config": config_path}, measure_run, argv, run_dir, model_flops)


def measure_run(argv: list[str], run_dir: Path, training_flops_per_image: float) -> dict:
    """`python -m finetune.run ARGV` into `run_dir`, in its own process; its results.json's training figures."""
    command = [sys.executable, sweep.from_here("benchmarks/timed_run.py"), *argv, "--output_dir", str(run_dir)]
    command += ["--overwrite_output_dir", "true", "--report_to", "none"]
    log = run_dir.parent / f"{run_dir.name}.log"
    status = sweep.train(command, log)
    if status:
        raise RuntimeError(sweep.error_line(log) or f"exit status {status}; see {log}")
    results = json.loads((run_dir / "results.json").read_text())
    train = results["train"]
    return {
        "batch_size": results["hyperparameters"]["total_train_batch_size"],
        "train_seconds": train["seconds"],
        "images_per_second": train["images_per_second"],
        "data_share": train["data_seconds"] / train["seconds"] if train["seconds"] else None,
        "wall_seconds": results["wall_seconds"],
        "torch_compile": results["hyperparameters"].get("torch_compile"),
        "training_flops_per_image": training_flops_per_image,
    }


def recipe_part(suite: Suite, data: str, output: Path, sizes: dict) -> None:
    """The scratch GPU recipe for its budget, through `benchmarks/train_budget.py`."""
    argv = ["--config", sweep.from_here("configs/cifar10_scratch_gpu.yaml"), "--minutes", str(sizes["recipe_minutes"])]
    argv += ["--output", str(output / "scratch_recipe"), "--dataset_name", data, "--validation_size", "5000"]
    label = {"budget_minutes": sizes["recipe_minutes"]}
    suite.attempt("scratch_recipe", label, measure_recipe, argv + sizes["recipe_overrides"])


def measure_recipe(argv: list[str]) -> dict:
    train_budget.main(argv)
    return json.loads((Path(argv[argv.index("--output") + 1]) / "summary.json").read_text())[0]


def speed_part(suite: Suite, sizes: dict, device: torch.device) -> None:
    """`model_speed` per preset, eager and compiled, one row each."""
    for compile_model in (False, True) if device.type == "cuda" else (False,):
        for preset in sizes["speed_presets"]:
            argv = ["--preset", preset, "--device", str(device), *sizes["speed_args"], "--attention", "sdpa"]
            argv += ["--bf16"] if device.type == "cuda" else []
            argv += ["--compile"] if compile_model else []
            suite.attempt("model_speed", {"preset": preset, "compile": compile_model}, measure_speed, argv, preset)


def measure_speed(argv: list[str], preset: str) -> dict:
    (result,) = model_speed.main(argv)
    dims = {k: v for k, v in model_speed.PRESETS[preset].items() if k != "batch_size"}
    ours = model_speed.build_models({**dims, "batch_size": 1}, ["sdpa"])["ours", "sdpa"]
    return {**vars(result), "training_flops_per_image": flops.training_flops_per_image(ours, dims["image_size"])}


def methods_part(suite: Suite, sizes: dict, device: torch.device) -> None:
    """Each fine-tuning method's trained parameters, AdamW state, step time and peak memory (bf16 on CUDA)."""
    import gc

    from transformers import ViTConfig

    for method in finetune_methods.METHODS:
        config = ViTConfig(**sizes["methods_model"]) if sizes["methods_model"] else None
        figures_args = (method, sizes["methods_steps"], sizes["methods_batch"], str(device), device.type == "cuda")
        suite.attempt("methods", {"method": method}, finetune_methods.method_figures, *figures_args, config)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def sweep_part(suite: Suite, data: str, output: Path, sizes: dict) -> None:
    argv = ["--data", data, "--output", str(output / "sweep"), *sizes["sweep_args"]]
    suite.attempt("sweep", {}, measure_sweep, argv)


def measure_sweep(argv: list[str]) -> dict:
    return {"variants": {r["name"]: r["status"] for r in gpu_sweep.main(argv)}}


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10-jpeg/train.parquet"))
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/gpu"))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS))
    parser.add_argument("--tiny", action="store_true", help="CPU-sized models and steps (what the tests run).")
    parser.add_argument("--batch_sizes", "--batch-sizes", type=int, nargs="+", help="Default: 32 and the largest.")
    args = parser.parse_args(argv)
    if not Path(args.data).is_file() and set(args.parts) & {"pipeline", "notebook_job", "scratch_recipe", "sweep"}:
        # found only by each part, after the peak measurement: minutes of device time for a table of failures
        raise FileNotFoundError(f"--data {args.data} is not a file. Fix: a parquet file of images (CIFAR-10's copy).")
    sizes = TINY if args.tiny else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    described = hardware.describe(device)
    name = described.get("accelerator")
    matmul_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    suite = Suite(
        output,
        {
            "device": hardware.short_name(described),
            "hardware": described,
            "command": shlex.join(
                ["python", "benchmarks/gpu_suite.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "tiny": args.tiny,
            "spec_peak_tflops": flops.spec_peak_tflops(name),
            "matmul_peak_tflops": flops.matmul_peak_tflops(device, matmul_dtype, sizes["peak_size"]),
            "matmul_dtype": str(matmul_dtype).removeprefix("torch."),
            "peak_size": sizes["peak_size"],
        },
    )
    suite.write()
    if "pipeline" in args.parts:
        try:
            batch_sizes = args.batch_sizes or ([8] if args.tiny else [32, largest_batch(sizes["model"], device)])
        except Exception as error:
            batch_sizes = [32]
            print(f"[gpu_suite] largest batch: failed ({one_line(error)}); batch 32 only", flush=True)
        pipeline_part(suite, args.data, device, sizes, sorted(set(batch_sizes)))
    if "notebook_job" in args.parts:
        notebook_part(suite, args.data, output, sizes)
    if "scratch_recipe" in args.parts:
        recipe_part(suite, args.data, output, sizes)
    if "model_speed" in args.parts:
        speed_part(suite, sizes, device)
    if "methods" in args.parts:
        methods_part(suite, sizes, device)
    if "sweep" in args.parts:
        sweep_part(suite, args.data, output, sizes)
    suite.write()
    print((output / "suite.md").read_text())
    return suite.data


if __name__ == "__main__":
    sys.exit(run_command(main))
