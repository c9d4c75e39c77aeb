"""Attention maps of a saved ViT classifier: what the CLS token attends to in each layer, and attention rollout.

    python -m finetune.tools.attention OUTPUT_DIR cat.jpg dog.png --output attention_maps/

For every image: `<name>_attention.png` (the input, the rollout, and each layer's CLS attention to the patches, heads
averaged, overlaid on the image as the model sees it: `finetune.tools.predict.model_view`, then the processor's center
crop) and `<name>_rollout.png`.
Attention rollout (Abnar & Zuidema, 2020): average the heads, add the identity for the residual connection,
renormalize the rows, multiply the layers' matrices, read the CLS row. A mean-pooled model's classifier reads the mean
of the patch tokens (a mean-pooled ScratchViT has no CLS token; BEiT's `use_mean_pooling` skips it), so its maps use
the mean over the patch tokens' rows; DINOv2's reads the CLS token and that mean side by side. The heading says which.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from os.path import expanduser
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.errors import ArgumentParser, run_command
from finetune.locations import check_folder, make_folder
from finetune.tools import predict


if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image

logger = logging.getLogger(__name__)


def attention_rollout(attentions: Sequence[torch.Tensor]) -> torch.Tensor:
    """`A_L @ ... @ A_1` with `A = normalize_rows(mean_heads(attention) + I)` of one `(..., heads, T, T)` tensor per
    layer, first layer first: `(..., T, T)`, row `i` how much output token `i` draws on each input token."""
    import torch

    if len(attentions) == 0:
        raise ValueError("`attentions` is empty: pass one attention tensor per layer (output_attentions=True).")
    rollout = None
    for attention in attentions:
        fused = attention.float().mean(dim=-3)  # (..., nh, T, T) -> (..., T, T)
        # The identity stands for the residual connection that carries each token past the attention.
        fused = fused + torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
        fused = fused / fused.sum(dim=-1, keepdim=True)
        rollout = fused if rollout is None else fused @ rollout  # (..., T, T)
    return rollout


def _patch_grid(
    matrix: torch.Tensor, grid_size: tuple[int, int], num_prefix_tokens: int, mean_pooled: bool = False
) -> torch.Tensor:
    """The weight the classifier's query (the CLS row, or a mean-pooled model's mean over the patch rows) puts on each
    patch of a `(..., T, T)` matrix, as a `(..., gh, gw)` grid."""
    if num_prefix_tokens > 0 and not mean_pooled:
        queries = matrix[..., 0, :]  # (..., T, T) -> (..., T)
    else:
        queries = matrix[..., num_prefix_tokens:, :].mean(dim=-2)  # (..., T, T) -> (..., T)
    scores = queries[..., num_prefix_tokens:]  # (..., T) -> (..., N)
    grid_height, grid_width = grid_size
    if scores.shape[-1] != grid_height * grid_width:
        raise ValueError(
            f"Got {scores.shape[-1]} patch tokens, which do not fill a {grid_height}x{grid_width} patch grid. Check "
            "`grid_size` (image height and width divided by the patch size) and `num_prefix_tokens`."
        )
    return scores.reshape(*scores.shape[:-1], grid_height, grid_width)  # (..., N) -> (..., gh, gw)


def cls_attention_maps(
    attentions: Sequence[torch.Tensor],
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 1,
    mean_pooled: bool = False,
) -> torch.Tensor:
    """Per-layer attention of the CLS token to the patches, heads averaged: `(layers, ..., gh, gw)`."""
    import torch

    layers = torch.stack([a.float().mean(dim=-3) for a in attentions])  # L x (..., nh, T, T) -> (L, ..., T, T)
    return _patch_grid(layers, grid_size, num_prefix_tokens, mean_pooled)


def rollout_map(
    attentions: Sequence[torch.Tensor],
    grid_size: tuple[int, int],
    num_prefix_tokens: int = 1,
    mean_pooled: bool = False,
) -> torch.Tensor:
    """The attention rollout read at the CLS token (or a mean-pooled model's patches): `(..., gh, gw)`."""
    return _patch_grid(attention_rollout(attentions), grid_size, num_prefix_tokens, mean_pooled)


def overlay_heatmap(image: Image.Image, heatmap: torch.Tensor, alpha: float = 0.5, cmap: str = "jet") -> np.ndarray:
    """The image blended with the `(gh, gw)` heatmap upsampled to it: `(H, W, 3)` uint8."""
    import matplotlib
    import numpy as np
    import torch.nn.functional as F
    from matplotlib.colors import Normalize

    base = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0  # (H, W, 3)
    size = base.shape[:2]
    upsampled = F.interpolate(heatmap[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]
    scaled = Normalize()(upsampled.numpy())  # (H, W) in [0, 1], its own min and max; a flat map is all 0
    colored = matplotlib.colormaps[cmap](scaled)[..., :3]  # (H, W) -> (H, W, 3)
    return (255 * ((1 - alpha) * base + alpha * colored)).round().astype(np.uint8)


def display_image(image: Image.Image, min_side: int = 224) -> Image.Image:
    """The image in RGB, enlarged to at least `min_side` (a 32x32 CIFAR image would show as a few blocks)."""
    from PIL import Image, ImageOps

    image = image.convert("RGB")
    scale = min_side / max(image.size)
    return ImageOps.scale(image, scale, Image.Resampling.BICUBIC) if scale > 1 else image


def center_crop_view(image: Image.Image, prep) -> Image.Image:
    """The part of a framed image (`predict.model_view`) that evaluation's center crop keeps, where the processor crops
    (`prep.resize_size`: a DeiT's resize to 256 and crop of 224 keeps the central 7/8), so the maps lie over it."""
    if prep.resize_size is None:
        return image
    (height, width), (resized_height, resized_width) = prep.image_size, prep.resize_size
    left = image.width * (1 - width / resized_width) / 2
    top = image.height * (1 - height / resized_height) / 2
    return image.crop((round(left), round(top), round(image.width - left), round(image.height - top)))


@dataclass
class AttentionMaps:
    """One image's per-layer maps `(layers, gh, gw)`, rollout `(gh, gw)` and top prediction."""

    layer_maps: torch.Tensor
    rollout: torch.Tensor
    reads: str  # what the classifier reads: "CLS token", "mean of the patch tokens", or both
    label: str
    score: float


def compute_attention_maps(
    model, processor, image: Image.Image, image_size: int | None = None, stored_size=None, flip_tta: bool = False
) -> AttentionMaps:
    """One image's attention maps and its prediction as predict gives it. Load transformers' ViT with
    `attn_implementation="eager"`: SDPA returns no attention probabilities."""
    import torch

    windowed = getattr(model.config, "window_size", None)  # Swin: no token attends to the whole image
    why = f"a {model.config.model_type} model"
    if model.config.model_type == "timm_wrapper":
        why = "transformers' TimmWrapper returns no attention weights of the timm model it wraps"
    elif windowed:
        why = "its attention is windowed: each token attends only within its window, none to the whole image"
    no_attention = ValueError(
        f"{type(model).__name__} has no attention to draw ({why}); attention maps need a transformers vision "
        "transformer with global attention: ScratchViT, ViT, DeiT, BEiT, DINOv2, ..."
    )
    if getattr(model.config, "patch_size", None) is None or windowed:
        raise no_attention
    predict.check_image_size(model, image_size)
    pixel_values = predict.preprocess([image], model, processor, image_size, stored_size)  # (1, C, H, W)
    kwargs = {"interpolate_pos_encoding": True} if predict.needs_interpolation(model, image_size) else {}
    with torch.no_grad():  # not inference_mode: cached model tensors stay usable for training (see export.py)
        outputs = model(pixel_values=pixel_values.to(model.device), output_attentions=True, **kwargs)
    if not hasattr(outputs, "attentions"):
        raise no_attention
    if not outputs.attentions:
        raise ValueError(
            "The model returned no attention probabilities. Load it with `attn_implementation='eager'` "
            "(SDPA and flash attention do not compute them)."
        )
    attentions = [a[0].cpu() for a in outputs.attentions]  # L x (nh, T, T)
    patch_size = model.config.patch_size
    patch_height, patch_width = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    grid_size = (pixel_values.shape[-2] // patch_height, pixel_values.shape[-1] // patch_width)
    num_prefix_tokens = attentions[0].shape[-1] - grid_size[0] * grid_size[1]
    # The classifier reads the CLS token, or the mean of the patch tokens: a ScratchViT without prefix tokens, or
    # BEiT (and Data2VecVision) with `use_mean_pooling`, which keep their CLS token but skip it.
    mean_pooled = num_prefix_tokens == 0 or bool(getattr(model.config, "use_mean_pooling", False))
    reads = "mean of the patch tokens" if mean_pooled else "CLS token"
    if model.config.model_type.startswith("dinov2"):  # Dinov2ForImageClassification: [CLS token, mean of patches]
        reads = "CLS token and the mean of the patch tokens"
    [probabilities] = predict.class_probabilities(model, pixel_values, bool(kwargs), flip_tta)  # (num_labels,)
    top = int(probabilities.argmax())
    return AttentionMaps(
        layer_maps=cls_attention_maps(attentions, grid_size, num_prefix_tokens, mean_pooled),
        rollout=rollout_map(attentions, grid_size, num_prefix_tokens, mean_pooled),
        reads=reads,
        label=str(model.config.id2label[top]),
        score=float(probabilities[top]),
    )


def attention_heading(maps: AttentionMaps) -> str:
    """The figure's heading: which query the maps read, what the classifier reads, and the prediction."""
    query = "CLS token's attention to the patches"
    if not maps.reads.startswith("CLS"):
        query = "Mean attention of the patch tokens"
    return (
        f"{query}, heads averaged; the classifier reads the {maps.reads}\n"
        f"Prediction: {maps.label} ({maps.score:.1%}); each map scaled to its own range, red = most attention"
    )


def plot_attention_figure(image: Image.Image, maps: AttentionMaps, path: str | os.PathLike, title: str) -> Path:
    """One PNG: the input, the rollout and each layer's map overlaid on the image, in a grid of equal panels."""
    import numpy as np
    from matplotlib.figure import Figure

    shown = display_image(image)
    panels = [("Input", np.asarray(shown)), ("Attention rollout", overlay_heatmap(shown, maps.rollout))]
    panels += [(f"Layer {i + 1}", overlay_heatmap(shown, m)) for i, m in enumerate(maps.layer_maps)]
    nrows = math.ceil(len(panels) / 5)
    ncols = math.ceil(len(panels) / nrows)  # balanced rows: 6 panels as 2 x 3, not 5 + 1
    panel_width = 2.6
    panel_height = panel_width * shown.height / shown.width
    fig = Figure(figsize=(ncols * panel_width, nrows * (panel_height + 0.35) + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (name, array) in zip(axes.flat, panels):
        ax.imshow(array)
        ax.set_title(name, fontsize=10)
    lines = [title, *attention_heading(maps).splitlines()]
    # Wrap to the figure's width (about 13 characters per inch at this size) so no line is cut off.
    width = int(ncols * panel_width * 13)
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in lines), fontsize=10)
    fig.savefig(path, dpi=100)
    return Path(path)


def write_attention_maps(
    model,
    processor,
    image_paths: Sequence,
    output_dir,
    image_size: int | None = None,
    stored_size=None,
    flip_tta: bool = False,
) -> list[Path]:
    """Write `<name>_attention.png` and `<name>_rollout.png` for every readable image into `output_dir`."""
    from PIL import Image

    output_dir = check_folder(output_dir)  # made with its first maps: a run that fails leaves no empty folder
    written, used_names = [], set()
    prep = predict.model_preprocessing(model, processor, image_size)
    stored_size = predict.stored_size_at(stored_size, model, processor, image_size)
    for image_path in map(Path, image_paths):
        images, _, _ = predict.load_images([image_path], "RGB", predict.frame_size(prep, stored_size))
        if not images:
            continue
        # The maps cover what the model sees: a photo that is not square is framed as its centre square.
        image = predict.model_view(images[0], prep, stored_size)
        name, n = image_path.stem, 1
        while name in used_names:
            n += 1
            name = f"{image_path.stem}_{n}"
        used_names.add(name)
        maps = compute_attention_maps(model, processor, image, image_size, stored_size, flip_tta)
        shown = center_crop_view(image, prep)
        title = f"{image_path.name}, {type(model).__name__}"
        make_folder(output_dir)
        written.append(plot_attention_figure(shown, maps, output_dir / f"{name}_attention.png", title))
        written.append(output_dir / f"{name}_rollout.png")
        Image.fromarray(overlay_heatmap(display_image(shown), maps.rollout)).save(written[-1])
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    parser = ArgumentParser(
        prog="python -m finetune.tools.attention",
        description="Plot per-layer CLS attention maps and attention rollout of a saved ViT classifier.",
    )
    predict.add_model_arguments(parser, image_metavar="IMAGE")
    parser.add_argument("--output", required=True, metavar="DIR", type=expanduser, help="Where to write the PNGs.")
    args = parser.parse_args(argv)
    from finetune.results import check_outside_training_data, results_of_model

    check_outside_training_data(args.output, [results_of_model(args.model_dir)], "the maps")
    model, processor, results, paths = predict.classifier_from_arguments(parser, args, attn_implementation="eager")
    stored_size, flip_tta = predict.run_stored_size(results), predict.run_flip_tta(results)
    written = write_attention_maps(model, processor, paths, args.output, args.image_size, stored_size, flip_tta)
    if not written:
        names = ", ".join(args.paths)
        raise ValueError(
            f"None of {names} could be read as an image; nothing was written. Pass PNG, JPEG, ... files or folders."
        )
    print("\n".join(map(str, written)))
    return written


if __name__ == "__main__":
    sys.exit(run_command(main))
