"""Classify image files with a saved classifier (any backbone `finetune/run.py` trains), or its ONNX export.

    python -m finetune.tools.predict OUTPUT_DIR photo.jpg images/ --top_k 3 --output predictions.csv

A file gets the probabilities an evaluation run gives it: decoded, framed and normalized as training's evaluation
does (`preprocess`). Folders are searched recursively; unreadable files are reported and skipped. torch and
transformers are imported when needed: `--help` answers at once.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from os.path import expanduser
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.errors import ArgumentParser, run_command
from finetune.locations import check_folder


if TYPE_CHECKING:
    import torch
    from PIL import Image

    from finetune.augment import Preprocessing
    from finetune.results import Results

logger = logging.getLogger(__name__)
ONNX_NAME = "model.onnx"  # what `vit-finetune export` writes
MAX_PATCHES = 128 * 128  # of an `--image_size` for a model with global attention (ViT-B/16: 2048 px)
# Files that mark a folder as a model's or a run's: `--output` may add files there, never replace one.
MODEL_FILES = ("config.json", "adapter_config.json", "results.json")


@dataclass
class Prediction:
    """The top-k classes of one image (a multi-label model: the labels above their thresholds), best first, and the
    probabilities of all classes."""

    path: str
    labels: list[str]
    scores: list[float]
    probabilities: list[float] = field(repr=False)

    def to_dict(self) -> dict:
        top_k = [{"label": label, "score": score} for label, score in zip(self.labels, self.scores)]
        best = (self.labels[0], self.scores[0]) if self.labels else (None, None)  # multi-label: maybe none
        return {"path": self.path, "label": best[0], "score": best[1], "top_k": top_k}


class OnnxClassifier:
    """A `vit-finetune export` folder run by onnxruntime on the CPU, with what this module reads of a transformers
    model. Neither transformers nor torchvision is imported: predicting starts seconds sooner."""

    device = "cpu"

    def __init__(self, folder: str | os.PathLike):
        try:
            import onnxruntime
        except ImportError as error:
            from finetune.tools.export import INSTALL

            raise RuntimeError(f"{folder} is an ONNX export; running it needs onnxruntime: {INSTALL}") from error

        config = json.loads((Path(folder) / "config.json").read_text())
        # A timm checkpoint's config.json names its classes in `label_names` instead of `id2label`.
        labels = config.get("id2label") or dict(enumerate(config["label_names"]))
        config["id2label"] = {int(i): name for i, name in labels.items()}
        self.config = argparse.Namespace(**{"num_labels": len(config["id2label"]), **config})
        self.session = onnxruntime.InferenceSession(str(Path(folder) / ONNX_NAME), providers=["CPUExecutionProvider"])
        self.input_size = tuple(self.session.get_inputs()[0].shape[2:])  # (H, W) it was exported at

    def __call__(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> argparse.Namespace:
        import torch

        if interpolate_pos_encoding or tuple(pixel_values.shape[2:]) != self.input_size:
            raise ValueError(
                f"An ONNX export runs at the resolution it was exported at ({'x'.join(map(str, self.input_size))}): "
                "drop `--image_size`."
            )
        [logits] = self.session.run(["logits"], {"pixel_values": pixel_values.numpy()})
        return argparse.Namespace(logits=torch.from_numpy(logits))


def load_classifier(model_dir, trust_remote_code: bool = False, attn_implementation: str | None = None, device=None):
    """`(model, processor)` of a saved image classifier, the model in eval mode on `device` (default: CUDA when
    available): a ScratchViT, a LoRA run's folder (its base with the adapters merged in) or an ONNX export."""
    if (Path(model_dir) / ONNX_NAME).is_file():
        if attn_implementation is not None:
            raise ValueError(
                f"{model_dir} is an ONNX export: this command needs the PyTorch weights; pass the run's output "
                "directory instead."
            )
        if device not in (None, "cpu"):
            logger.warning(f"{model_dir} is an ONNX export: it runs on the CPU (onnxruntime), not on {device}.")
        processor = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
        return OnnxClassifier(model_dir), argparse.Namespace(**processor)
    model_dir = str(model_dir)
    check_model_dir(model_dir)
    import torch
    from transformers import AutoImageProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" of a small model is noise

    import scratch_vit  # noqa: F401  (registers ScratchViT with the Auto classes)
    from finetune.models import (
        check_local_checkpoint,
        is_adapter_dir,
        load_adapter_model,
        load_saved_classifier,
        transformers_errors_only,
    )

    local = os.path.isdir(model_dir)
    if local:
        run_dir = os.path.dirname(os.path.abspath(model_dir))
        missing = not os.path.isfile(os.path.join(model_dir, "config.json"))
        # A LoRA run's checkpoint-* holds the adapters; `load_adapter_model` reads the config from the run folder.
        if not (missing and is_adapter_dir(model_dir) and os.path.isfile(os.path.join(run_dir, "config.json"))):
            check_local_checkpoint(model_dir, trust_remote_code)  # no config.json, no weights, ...: one line each
    kwargs = {"trust_remote_code": trust_remote_code, "attn_implementation": attn_implementation}
    try:
        if is_adapter_dir(model_dir):
            with transformers_errors_only():  # the base's head, replaced by the adapter's, is reported as MISMATCH
                model = load_adapter_model(model_dir, **kwargs)
        else:
            model = load_saved_classifier(model_dir, **kwargs)
        processor = AutoImageProcessor.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        if local and not os.path.isdir(model_dir):  # else read as a Hub id: "Repo id must be in the form ..."
            raise FileNotFoundError(
                f"{model_dir} was removed while it was read (a run still training removes its older checkpoint-* "
                "folders): pass a folder that stays, such as the run's own once it has finished."
            ) from None
        raise
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), processor


def check_model_dir(model_dir: str) -> None:
    """Refuse a misspelt path or a file (model.safetensors), which transformers would answer with a message about the
    network or repo ids."""
    from finetune.tools.report import is_hub_id

    if os.path.isfile(os.path.expanduser(model_dir)):
        folder = os.path.dirname(model_dir) or "."
        raise NotADirectoryError(f"{model_dir} is a file: pass the folder that holds the model ({folder}).")
    if os.path.exists(os.path.expanduser(model_dir)):
        return
    parts = Path(model_dir).parts
    if not is_hub_id(model_dir) or (len(parts) > 1 and os.path.isdir(parts[0])):
        raise FileNotFoundError(
            f"{model_dir} does not exist: pass the output directory of a run (config.json, weights) or a Hub model id."
        )


def collect_image_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """A file as it is; a folder searched recursively (each folder once) for the files training reads of a folder:
    datasets' imagefolder extensions, no hidden files or folders, no `__*` folders."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            from finetune.data.sources import IMAGE_EXTENSIONS, UNREAD_PHOTO_EXTENSIONS

            walked, seen = [], set()
            for root, folders, names in os.walk(path, followlinks=True):
                if os.path.realpath(root) in seen:  # a link back up (a loop) or to a folder already searched
                    folders[:] = []
                    continue
                seen.add(os.path.realpath(root))
                folders[:] = [name for name in folders if not name.startswith((".", "__"))]  # as datasets skips them
                walked += [Path(root, name) for name in names if not name.startswith(".")]
            found.extend(sorted(p for p in walked if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS))
            unread = sorted(p for p in walked if p.suffix.lower() in UNREAD_PHOTO_EXTENSIONS)
            if unread:  # as training says of them
                logger.warning(
                    f"Leaving out {len(unread)} photo(s) of {path} in a format that training does not read either "
                    f"(e.g. {unread[0]}): convert them to JPEG or PNG to classify them."
                )
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"{path} does not exist. Pass image files or folders of images.")
    return found


def load_images(paths: Sequence[str | os.PathLike], mode: str | None, min_size: int | None = None):
    """Decode image files as training does: the images, their paths, and the unreadable files as `(path, reason)`,
    each logged."""
    from PIL import Image, UnidentifiedImageError

    from finetune.data import decode_image

    images, names, skipped = [], [], []
    for path in paths:
        try:
            images.append(decode_image(path, mode, min_size))
            names.append(str(path))
        # SyntaxError: Pillow's for a damaged PNG chunk ("broken PNG file"), as training skips it.
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            reason = f"{type(error).__name__}: {error}"
            logger.warning(f"Skipping {path}: cannot read it as an image ({reason}).")
            skipped.append((str(path), reason))
    return images, names, skipped


def model_preprocessing(model, processor, image_size: int | None = None) -> Preprocessing:
    """The model's `Preprocessing` as training reads it; with `image_size`, center-cropped from the same part of the
    image as evaluation's crop (a DeiT's 256 / 224: 439 / 384)."""
    from finetune.augment import preprocessing_from

    prep = preprocessing_from(processor, model.config)
    if image_size is None:
        return prep
    resize = prep.resize_size and tuple(round(image_size * r / i) for r, i in zip(prep.resize_size, prep.image_size))
    return replace(prep, image_size=(image_size, image_size), resize_size=resize)


def stored_size_at(stored_size: Sequence[int] | None, model, processor, image_size: int | None) -> list | None:
    """The run's stored image size for a prediction at `image_size`: scaled with it where the run stored photos at or
    above its input size (framed at that size, a photo lost the detail a larger input is for: shrunk, then enlarged);
    data of a lower resolution of its own (CIFAR-10's 32 px for a 224 px ViT) as the run stored it."""
    if image_size is None or not stored_size:
        return stored_size
    trained = model_preprocessing(model, processor).image_size
    if any(s < t for s, t in zip(stored_size, trained)):
        return list(stored_size)
    return [round(s * image_size / t) for s, t in zip(stored_size, trained)]


def frame_size(prep: Preprocessing, stored_size: Sequence[int] | None = None) -> int:
    """The side of the square a run stored its images at, else the size its processor resizes a photo to (as
    `pipeline()` frames it)."""
    from finetune.augment import photo_size

    return stored_size[0] if stored_size and stored_size[0] == stored_size[1] else photo_size(prep, margin=False)


def model_view(image: Image.Image, prep: Preprocessing, stored_size: Sequence[int] | None = None) -> Image.Image:
    """The part of a decoded image the model sees, framed as training stored its images: centre-fitted to the run's
    `stored_size` in one resize (a 32 px digit for a run of 8 px digits went through 9 px and lost 13 points); without
    it, an image not square or larger than `frame_size` becomes the centre square at that size."""
    from finetune.data import center_fit

    if stored_size and stored_size[0] != stored_size[1]:  # a run of images of one size that is not square
        height, width = stored_size
        return center_fit(image, (width, height)) if image.size != (width, height) else image
    size = frame_size(prep, stored_size)
    # At the run's stored size, it framed every other size there, smaller ones too.
    crop = image.size != (size, size) if stored_size else image.width != image.height or image.width > size
    return center_fit(image, (size, size)) if crop else image


def preprocess(
    images: Sequence[Image.Image],
    model,
    processor,
    image_size: int | None = None,
    stored_size: Sequence[int] | None = None,
) -> torch.Tensor:
    """Pixel values as training's evaluation makes them, `(B, C, H, W)` float32, through `BatchTransform`: an RGB
    image for a 1-channel model takes its luma in float there, not Pillow's rounded "L" (1.5e-3 apart)."""
    import numpy as np
    import torch

    from finetune.augment import BatchTransform

    prep = model_preprocessing(model, processor, image_size)
    transforms = {channels: BatchTransform.for_model(prep, channels) for channels in (1, 3)}  # by the image's
    mode = "L" if getattr(model.config, "num_channels", 3) == 1 else "RGB"  # the model's, for images in other modes
    batches = []
    for image in images:  # one at a time: framed images of different sizes do not stack
        image = image if image.mode in ("L", "RGB") else image.convert(mode)
        # np.array, not asarray: writable (torch warns about read-only arrays).
        array = np.array(model_view(image, prep, stored_size))
        array = array[None] if array.ndim == 2 else np.ascontiguousarray(array.transpose(2, 0, 1))  # (C, h, w)
        pixels = torch.from_numpy(array)[None]  # (1, C, h, w) -> (1, C_model, H, W)
        batches.append(transforms[array.shape[0]](pixels, train=False))
    return torch.cat(batches)


def check_image_size(model, image_size: int | None) -> None:
    """`image_size` must be a multiple of the patch size, or for a timm ViT (position embeddings fixed at creation)
    its own size."""
    if image_size is None:
        return
    patch_embed = getattr(getattr(model, "timm_model", None), "patch_embed", None)  # a timm model's
    if getattr(patch_embed, "strict_img_size", False) and tuple(patch_embed.img_size) != (image_size, image_size):
        size = "x".join(map(str, patch_embed.img_size))
        raise ValueError(f"This timm model runs only at the size it was trained at ({size}): drop `--image_size`.")
    patch_size = getattr(model.config, "patch_size", 1)
    patch_size = patch_size if isinstance(patch_size, int) else max(patch_size)
    if image_size < 1 or image_size % patch_size:
        raise ValueError(
            f"`image_size` must be a positive multiple of the model's patch size ({patch_size}), got {image_size}. "
            f"Try {max(patch_size, round(image_size / patch_size) * patch_size)}."
        )
    # Global attention costs the square of the patches: 4000 px in 2 px patches ran for hours, deaf to SIGTERM.
    global_attention = getattr(model.config, "num_attention_heads", None) and not getattr(
        model.config, "window_size", 0
    )
    if global_attention and (image_size // patch_size) ** 2 > MAX_PATCHES:
        largest = int(MAX_PATCHES**0.5) * patch_size
        raise ValueError(
            f"`--image_size {image_size}` cuts an image into {(image_size // patch_size) ** 2:,} patches of "
            f"{patch_size} px, and the model's attention, whose cost grows with their square, would not finish. Fix: "
            f"at most {MAX_PATCHES:,} patches: `--image_size {largest}` or less."
        )
    import torch

    from finetune.models import check_input_size

    if isinstance(model, torch.nn.Module):  # not an ONNX export, which says so itself
        forward = {"interpolate_pos_encoding": True} if needs_interpolation(model, image_size) else {}
        check_input_size(model, (image_size, image_size), "Fix: drop `--image_size`.", **forward)


def needs_interpolation(model, image_size: int | None) -> bool:
    return image_size is not None and image_size != getattr(model.config, "image_size", image_size)


def class_probabilities(
    model, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False, flip_tta: bool = False
) -> torch.Tensor:
    """`(B, num_labels)` probabilities, float32 on the CPU (a multi-label model's: sigmoid); with `flip_tta`, of the
    mean logits of each image and its mirror image."""
    import torch

    from finetune.data import is_multi_label

    kwargs = {"interpolate_pos_encoding": True} if interpolate_pos_encoding else {}
    if flip_tta:
        pixel_values = torch.cat([pixel_values, pixel_values.flip(-1)])  # (B, C, H, W) -> (2B, C, H, W)
    with torch.no_grad():  # not inference_mode: cached model tensors stay usable for training (see export.py)
        logits = model(pixel_values=pixel_values.to(model.device), **kwargs).logits  # (B, num_labels)
    if flip_tta:
        logits = (logits[: len(logits) // 2] + logits[len(logits) // 2 :]) / 2
    logits = logits.float()
    return (logits.sigmoid() if is_multi_label(model.config) else logits.softmax(dim=-1)).cpu()


def run_stored_size(results: Results | None) -> list[int] | None:
    return (results.stored_image_size or None) if results is not None else None


def run_flip_tta(results: Results | None) -> bool:
    """Whether the run's figures and thresholds are of flip-averaged logits (`flip_tta: true`)."""
    return bool(results is not None and results.hyperparameters.get("flip_tta"))


def label_thresholds(model, results: Results | None, model_dir) -> list[float] | None:
    """A multi-label model's threshold per label, as its run chose them (else 0.5); None for a single-label model."""
    from finetune.data import is_multi_label

    if not is_multi_label(model.config):
        return None
    thresholds = results.per_class_threshold if results is not None else {}
    if not thresholds:
        logger.warning(f"No per-label thresholds in or around {model_dir} (results.json): 0.5 for every label.")
    elif Path(model_dir).name.startswith("checkpoint-"):
        logger.warning(
            f"{model_dir}: the per-label thresholds are those its run chose on validation for the model it kept, "
            "which may be another checkpoint."
        )
    return [thresholds.get(str(model.config.id2label[i]), 0.5) for i in range(model.config.num_labels)]


def predict_files(
    model,
    processor,
    paths: Sequence[str | os.PathLike],
    top_k=5,
    batch_size=32,
    image_size=None,
    thresholds=None,
    stored_size: Sequence[int] | None = None,
    flip_tta: bool = False,
):
    """Classify image files in batches: the predictions and the unreadable files. With `thresholds`, a prediction's
    labels are those at or above their threshold instead of the top k."""
    import torch

    if top_k < 1:
        raise ValueError(f"`top_k` must be >= 1, got {top_k}.")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}.")
    check_image_size(model, image_size)
    stored_size = stored_size_at(stored_size, model, processor, image_size)
    id2label, top_k = model.config.id2label, min(top_k, model.config.num_labels)
    interpolate = needs_interpolation(model, image_size)
    cuts = torch.tensor(thresholds) if thresholds else None  # (K,) a multi-label model's thresholds
    size = frame_size(model_preprocessing(model, processor, image_size), stored_size)
    predictions: list[Prediction] = []
    skipped: list[tuple[str, str]] = []
    for start in range(0, len(paths), batch_size):
        images, names, unreadable = load_images(paths[start : start + batch_size], None, size)  # as stored
        skipped.extend(unreadable)
        if not images:
            continue
        pixel_values = preprocess(images, model, processor, image_size, stored_size)
        probabilities = class_probabilities(model, pixel_values, interpolate, flip_tta)
        for name, row in zip(names, probabilities):
            top_scores, top_indices = row.sort(descending=True)
            keep = top_scores >= cuts[top_indices] if cuts is not None else slice(top_k)
            labels = [str(id2label[int(i)]) for i in top_indices[keep]]
            predictions.append(Prediction(name, labels, top_scores[keep].tolist(), row.tolist()))
    return predictions, skipped


def is_predictions_file(path: Path) -> bool:
    """Whether `path` holds predictions as `write_predictions` writes them (and a rerun may replace)."""
    try:
        if path.suffix.lower() == ".json":
            return set(json.loads(path.read_text())) == {"predictions", "skipped"}
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])  # "path" alone where no image had a label above its threshold
            return header[:2] == ["path", "top1_label"] or header == ["path"]
    except (OSError, ValueError, TypeError):  # unreadable, not JSON, not a JSON object
        return False


def write_predictions(predictions: Sequence[Prediction], output, skipped: Sequence[tuple[str, str]] = ()) -> Path:
    """Write predictions as CSV or JSON (with the skipped files), by the file's extension."""
    output = Path(output)
    suffix = output.suffix.lower()
    if suffix not in (".csv", ".json"):
        raise ValueError(f"Cannot tell the format of {output}: use a .csv or .json file name.")
    output.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        payload = {
            "predictions": [p.to_dict() for p in predictions],
            "skipped": [{"path": path, "reason": reason} for path, reason in skipped],
        }
        output.write_text(json.dumps(payload, indent=2) + "\n")
        return output
    k = max((len(p.labels) for p in predictions), default=1)
    with open(output, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path"] + [f"top{r}_{what}" for r in range(1, k + 1) for what in ("label", "probability")])
        for p in predictions:
            writer.writerow(
                [p.path] + [v for label, score in zip(p.labels, p.scores) for v in (label, f"{score:.6f}")]
            )
    return output


def add_flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """A snake_case flag (`--repo_id`) that also answers to its kebab-case spelling (`--repo-id`)."""
    flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*flags, dest=name, **kwargs)


def add_model_arguments(parser: argparse.ArgumentParser, image_metavar: str = "PATH") -> None:
    """The arguments of every command that runs a saved classifier on image files (predict, attention)."""
    parser.add_argument(
        "model_dir", metavar="MODEL_DIR", type=expanduser, help="Output directory of a run (config.json, weights)."
    )
    paths_help = "Image files, or folders searched recursively."
    parser.add_argument("paths", nargs="+", metavar=image_metavar, type=expanduser, help=paths_help)
    size_help = "Resize images to N x N instead of the training resolution (position embeddings are interpolated)."
    add_flag(parser, "image_size", type=int, metavar="N", help=size_help)
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu).")
    add_flag(parser, "trust_remote_code", action="store_true", help="Use the code files saved next to the weights.")


def check_device(device: str | None) -> None:
    """Refuse a `--device` this machine does not have: torch's own errors name every device type, not the fix."""
    if device is None:
        return
    import torch

    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise ValueError(f"`--device {device}` is not a torch device: use cpu, cuda, cuda:N or mps.") from None
    count = {"cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available())}.get(chosen.type)
    if count is not None and (chosen.index or 0) >= count:
        have = f"{count} {chosen.type.upper()} device(s)" if count else f"no {chosen.type.upper()} device"
        raise ValueError(f"`--device {device}`: this machine has {have}. Use `--device cpu`, or leave it out.")


def classifier_from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, attn_implementation=None):
    """`(model, processor, results, paths)` as `add_model_arguments`' arguments say; a missing path or an
    `--image_size` that does not fit the model is a usage error."""
    try:
        paths = collect_image_paths(args.paths)
        check_device(args.device)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    model, processor = load_classifier(args.model_dir, args.trust_remote_code, attn_implementation, args.device)
    try:
        check_image_size(model, args.image_size)
    except ValueError as error:
        parser.error(str(error))
    from finetune.results import results_of_model

    return model, processor, results_of_model(args.model_dir), paths


def main(argv: list[str] | None = None) -> list[Prediction]:
    parser = ArgumentParser(
        prog="python -m finetune.tools.predict",
        description="Classify image files (any size or format) with a saved classifier (ScratchViT, ViT, ConvNeXt, "
        "timm, ...: any backbone a run trains), a LoRA run's folder or an ONNX export.",
    )
    add_model_arguments(parser)
    top_k_help = "How many classes to report per image (default 5); a multi-label model reports those above threshold."
    add_flag(parser, "top_k", type=int, default=5, help=top_k_help)
    parser.add_argument(
        "--output", metavar="FILE", type=expanduser, help="Also write the predictions to a .csv or .json file."
    )
    add_flag(parser, "batch_size", type=int, default=32, help="Images per forward pass (default 32).")
    args = parser.parse_args(argv)
    output = Path(args.output) if args.output else None
    if output and output.suffix.lower() not in (".csv", ".json"):
        parser.error(f"--output must end in .csv or .json, got {output}.")
    if output and output.is_file() and not is_predictions_file(output):  # a comparison.json, a dataset's labels.csv
        if any((output.parent / name).is_file() for name in MODEL_FILES):
            parser.error(
                f"--output {output} already exists in the model or run folder {output.parent}, whose files predict "
                "never replaces: pass a new name, or a path outside it."
            )
        parser.error(
            f"--output {output} already exists and holds no predictions of this command, which never replaces other "
            "files: pass a new name, or remove it first."
        )
    if output:
        from finetune.results import check_outside_training_data, results_of_model

        check_folder(output, is_file=True)
        # A csv there made the next run read the folder as a table of images, which it is not.
        check_outside_training_data(output, [results_of_model(args.model_dir)], "the predictions")
    model, processor, results, paths = classifier_from_arguments(parser, args)
    thresholds = label_thresholds(model, results, args.model_dir)
    predictions, skipped = predict_files(
        model, processor, paths, args.top_k, args.batch_size, args.image_size, thresholds, run_stored_size(results),
        run_flip_tta(results),
    )  # fmt: skip
    for p in predictions:
        labels = ", ".join(f"{label} {score:.4f}" for label, score in zip(p.labels, p.scores))
        print(f"{p.path}: {labels or 'no label above its threshold'}")
    if output:
        print(f"Wrote {len(predictions)} prediction(s) to {write_predictions(predictions, output, skipped)}")
    if skipped:
        print(f"Skipped {len(skipped)} unreadable file(s): " + ", ".join(path for path, _ in skipped), file=sys.stderr)
    if not predictions:  # a command that classified nothing has failed, whatever the reason
        if skipped:
            raise ValueError(
                f"None of the {len(skipped)} file(s) could be read as an image; pass PNG, JPEG, ... files."
            )
        raise FileNotFoundError(
            f"No image files in {', '.join(args.paths)} (folders are searched for the images training reads: .jpg, "
            ".png, .webp, ..., hidden files left out). Pass image files, or folders that hold them."
        )
    return predictions


if __name__ == "__main__":
    sys.exit(run_command(main))
