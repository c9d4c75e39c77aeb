"""Export a trained classifier for serving, and check the export on real images.

    python -m finetune.tools.export OUTPUT_DIR --format onnx [--output DIR] [--images PATH ...] [--atol 1e-4]

Writes `model.onnx` (input `pixel_values`, float32 `(batch, C, H, W)`; output `logits`, `(batch, num_labels)`) into
`--output` (default `OUTPUT_DIR/onnx`; a checkpoint's beside it, `RUN/onnx-checkpoint-N`), with the run's `config.json`
(the labels), `preprocessor_config.json` (size, mean, std) and `results.json` beside it: `predict` runs that folder
with onnxruntime. Then onnxruntime's logits must equal PyTorch's within `--atol` on real images: the files given with
`--images`, else the first validation images of the run's dataset, preprocessed as `predict` preprocesses them. The
check prints one line with the largest difference; a mismatch fails the command.

Every architecture, ScratchViT included, goes through `torch.onnx.export` (the dynamo exporter). optimum's ONNX
exporter now lives in `optimum-onnx`, whose latest release (0.1.0) requires transformers < 4.58, so it cannot be
installed beside the transformers 5 this project needs.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from os.path import expanduser
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.errors import ArgumentParser, one_line, run_command
from finetune.locations import check_folder, partial_folder
from finetune.results import RESULTS_NAME, Results, TrainMetrics, dataset_location, results_of_model
from finetune.tools import predict
from finetune.tools.model_card import run_dir_of


if TYPE_CHECKING:
    import torch
    from PIL import Image


# torch, PIL and the model code are imported where used (as in predict), so that `--help` answers at once.

FORMATS = ("onnx",)
EXTRA_MODULES = ("onnx", "onnxruntime", "onnxscript")  # onnxscript: the dynamo exporter writes the graph with it
INSTALL = 'pip install -e ".[export]"'
DEFAULT_ATOL = 1e-4
CHECK_IMAGES = 8
# What an export writes, and what marks a folder as another model's or run's: exporting there would overwrite it.
WRITTEN = ("model.onnx", "model.onnx.data", "config.json", "preprocessor_config.json", "results.json")
# The figures of a run's results.json, which are its kept model's: left out of a checkpoint's export, which keeps the
# rest (labels, how the images were stored, a multi-label run's thresholds) for predict.
FIGURES = {"validation": None, "test": None, "wall_seconds": None, "confusion_matrix": [], "history": []}
FIGURES |= {f"per_class_{k}": {} for k in ("accuracy", "precision", "recall", "f1", "support", "average_precision")}
OTHER_MODEL = ("*.safetensors", "*.bin", "adapter_config.json", "trainer_state.json", "checkpoint-*")


@dataclass
class ExportResult:
    """Where the export went and how its check came out."""

    path: Path
    num_images: int
    max_abs_difference: float
    atol: float


def export_onnx(model: torch.nn.Module, example: torch.Tensor, path: str | Path) -> Path:
    """Write `model` as ONNX to `path` with a dynamic batch axis, traced on `example` pixel values `(B, C, H, W)`."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(example) < 2:
        example = example.repeat(2, 1, 1, 1)  # a batch of 1 would be fixed into the graph as a constant
    # The output dataclass flattens to its tensors that are not None: the logits, `(B, num_labels)`.
    torch.onnx.export(
        model.eval(),
        (),
        path,
        kwargs={"pixel_values": example},
        input_names=["pixel_values"],
        output_names=["logits"],
        dynamic_shapes={"pixel_values": {0: torch.export.Dim("batch")}},
        # One file; torch writes the weights of a model over 1.5 GB to `model.onnx.data` beside it, as protobuf caps
        # a single .onnx file at 2 GiB.
        external_data=False,
        dynamo=True,
        verbose=False,
    )
    return path


def check_onnx(path: str | Path, model: torch.nn.Module, pixel_values: torch.Tensor, atol: float) -> float:
    """The largest absolute difference between onnxruntime's and PyTorch's logits; `ValueError` above `atol`."""
    import numpy as np
    import torch

    # no_grad, not inference_mode: models cache tensors (BEiT's relative positions) that inference mode would make
    # unusable for a later training in the same process.
    with torch.no_grad():
        expected = model(pixel_values=pixel_values).logits.float().numpy()  # (B, num_labels)
    actual = predict.OnnxClassifier(Path(path).parent)(pixel_values).logits.numpy()  # as predict runs the folder
    difference = float(np.abs(actual - expected).max())
    if not difference <= atol:  # also a NaN
        raise ValueError(
            f"The ONNX export does not compute the model's logits: onnxruntime and PyTorch differ by up to "
            f"{difference:.3g} on {len(pixel_values)} image(s), more than atol {atol:g}. Raise `--atol` if that "
            "is acceptable for serving, or serve the PyTorch model."
        )
    return difference


def export_results(run_dir: Path) -> Results | None:
    """The results.json an export carries for predict: a checkpoint's is its run's less the kept model's figures."""
    results = results_of_model(run_dir)  # in it, or in the run folder around a checkpoint-* or merged/
    if results is None or (run_dir / RESULTS_NAME).is_file() or run_dir_of(run_dir) != run_dir:
        return results  # a LoRA run's merged/ is its kept model: the run's figures are its own
    return dataclasses.replace(results, **FIGURES, train=TrainMetrics(), run_name=f"{results.run_name}/{run_dir.name}")


def default_output(run_dir: Path) -> Path:
    """`RUN/onnx`, and a checkpoint's beside it, `RUN/onnx-checkpoint-N`: a resumed run deletes the checkpoints it
    rotates out (`save_total_limit`) with all they hold."""
    name = run_dir.resolve().name
    return (
        Path(os.path.normpath(run_dir / ".." / f"onnx-{name}")) if name.startswith("checkpoint-") else run_dir / "onnx"
    )


def check_output(output: Path, run_dir: Path, model, results: Results | None) -> None:
    """Refuse an `output` folder that holds another model or run (not an earlier export of this same model)."""
    check_folder(output)
    names = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    taken = [name for name in names if name in WRITTEN or any(fnmatch.fnmatch(name, p) for p in OTHER_MODEL)]
    if not taken:
        return
    config, written = output / "config.json", output / RESULTS_NAME

    def text(results: Results | None) -> str | None:  # as JSON: a diverged run's NaN loss equals itself
        return None if results is None else json.dumps(dataclasses.asdict(results))

    earlier = set(taken) <= set(WRITTEN) and predict.ONNX_NAME in taken
    earlier = earlier and text(Results.load(output) if written.is_file() else None) == text(results)
    earlier = earlier and config.is_file() and config.read_text() == model.config.to_json_string()
    if not earlier:
        raise FileExistsError(
            f"{output} already holds {', '.join(taken)} of another model or run, which the export would overwrite: "
            f"pass another folder as `--output` (default {default_output(run_dir)})."
        )


def write_export(
    output: Path, results: Results | None, model, processor, pixel_values: torch.Tensor, atol: float
) -> tuple[Path, float]:
    """Write model.onnx and the files predict reads into `output` by way of a folder beside it, where it is checked:
    an interrupted export leaves no half-written folder, which a rerun would refuse as another model's, and a failed
    check no export that predict would serve."""
    target = output.resolve()  # `--output .` has no name to put a folder beside
    partial = partial_folder(target, "export")  # a name of its own: a user's `tmp-NAME` folder was deleted
    try:
        export_onnx(model, pixel_values, partial / predict.ONNX_NAME)
        model.config.save_pretrained(partial)
        if getattr(processor, "data_config", None):  # timm's processor saves nothing: its settings, for predict
            data_config = json.dumps({"data_config": processor.data_config}, indent=2)
            (partial / "preprocessor_config.json").write_text(data_config)
        else:
            processor.save_pretrained(partial)
        if results is not None:
            results.save(partial)
        difference = check_onnx(partial / predict.ONNX_NAME, model, pixel_values, atol)
        if output.exists():  # an earlier export of this run, or an unrelated folder: the files move in
            for file in partial.iterdir():
                file.replace(output / file.name)
        else:
            partial.rename(output)  # the folder appears whole
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return output / predict.ONNX_NAME, difference


def check_images(
    run_dir: Path, results: Results | None, paths: list[str] | None, model, processor
) -> tuple[list[Image.Image], str]:
    """Up to `CHECK_IMAGES` images to check the export on (the given files, else validation images of the run's
    dataset), and where they came from."""
    import numpy as np
    from PIL import Image

    from finetune.arguments import DataArguments
    from finetune.augment import photo_size
    from finetune.data import load_image_data

    size = photo_size(predict.model_preprocessing(model, processor))
    if paths:
        images, _, _ = predict.load_images(predict.collect_image_paths(paths)[:CHECK_IMAGES], None, size)
        if not images:
            raise ValueError(f"None of {', '.join(paths)} could be read as an image to check the export on.")
        return images, "the given files"
    dataset = results.dataset if results else None
    if not dataset:
        raise FileNotFoundError(
            f"{run_dir} has no results.json naming the dataset it trained on, to check the export with. Pass "
            "images to check it on: `--images FILE_OR_FOLDER ...`."
        )
    if results.dataset_location is not None and dataset_location(dataset) != results.dataset_location:
        # A local dataset named relative to where the run ran, or moved since: not a Hub dataset of that name.
        raise FileNotFoundError(
            f"The run trained on the local dataset {dataset!r}, which is not at that path from here. Pass images to "
            "check the export on: `--images FILE_OR_FOLDER ...`."
        )
    # Only the images taken are decoded: a few of train besides the validation ones, which need not have every class
    # (the model is trained), so the classes are not checked.
    data_args = DataArguments(
        dataset_name=dataset, max_train_samples=CHECK_IMAGES, max_eval_samples=CHECK_IMAGES, decoded_cache_dir="none"
    )
    try:
        split = load_image_data(data_args, seed=0, target_size=size, check_classes=False).validation
    except (OSError, ValueError) as error:
        raise OSError(
            f"Could not load the run's dataset {dataset!r} to check the export ({one_line(error)}). Pass images to "
            "check it on: `--images FILE_OR_FOLDER ...`."
        ) from error
    pixels = split.take(np.arange(min(CHECK_IMAGES, len(split)))).numpy()  # (N, C, H, W) uint8
    images = [Image.fromarray(p[0] if p.shape[0] == 1 else p.transpose(1, 2, 0)) for p in pixels]
    return images, "the run's dataset"  # predict.preprocess converts them to the model's mode


def main(argv: list[str] | None = None) -> ExportResult:
    parser = ArgumentParser(
        prog="python -m finetune.tools.export",
        description="Export a trained classifier for serving (ONNX) and check it against PyTorch on real images.",
    )
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", type=expanduser, help="Output directory of a run (config.json, weights)."
    )
    parser.add_argument("--format", required=True, choices=FORMATS, help="Export format.")
    output_help = "Where to write the export (default RUN_DIR/onnx; RUN/onnx-checkpoint-N for RUN/checkpoint-N)."
    parser.add_argument("--output", metavar="DIR", type=expanduser, help=output_help)
    images_help = "Image files or folders to check the export on (default: validation images of the run's dataset)."
    parser.add_argument("--images", nargs="+", metavar="PATH", type=expanduser, help=images_help)
    atol_help = f"Largest difference allowed between ONNX and PyTorch logits (default {DEFAULT_ATOL:g})."
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=atol_help)
    predict.add_flag(
        parser, "trust_remote_code", action="store_true", help="Use the code files saved next to the weights."
    )
    args = parser.parse_args(argv)
    if not 0 <= args.atol < float("inf"):  # also a NaN, which no difference is within
        parser.error(f"--atol must be a finite number >= 0 (e.g. {DEFAULT_ATOL:g}), got {args.atol:g}.")
    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise RuntimeError(f"Exporting needs {', '.join(missing)} (the `export` extra): {INSTALL}")
    run_dir = Path(args.run_dir)
    # Eager attention exports for every architecture (SDPA's graph does not decompose for BEiT); onnxruntime fuses
    # the attention pattern itself.
    model, processor = predict.load_classifier(
        args.run_dir, args.trust_remote_code, attn_implementation="eager", device="cpu"
    )
    output = Path(args.output) if args.output else default_output(run_dir)
    results = export_results(run_dir)
    check_output(output, run_dir, model, results)
    images, source = check_images(run_dir, results, args.images, model, processor)
    pixel_values = predict.preprocess(images, model, processor)  # (N, C, H, W), as predict feeds the model

    path, difference = write_export(output, results, model, processor, pixel_values, args.atol)
    print(f"Wrote {path} (input pixel_values (batch, {', '.join(map(str, pixel_values.shape[1:]))}), output logits)")
    print(
        f"Checked on {len(images)} image(s) of {source}: onnxruntime's logits equal PyTorch's, max abs difference "
        f"{difference:.3g} <= atol {args.atol:g}"
    )
    return ExportResult(path, len(images), difference, args.atol)


if __name__ == "__main__":
    sys.exit(run_command(main))
