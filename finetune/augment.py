"""Batch augmentation and preprocessing as tensor ops on the device that holds the batch.

uint8 batches from `ImageSplit` in, the model's float32 normalized `pixel_values` out. Every op works on the whole
batch with per-image randomness drawn as tensors (airbench style): no PIL, no Python loop over images. torchvision
v2's crop, flip and RandAugment draw one set of parameters per call, so every image of a batch would get the same
crop and op; ours draw them per image. Mixing (`MixUpCutMix`) is torchvision's, which mixes whole batches anyway.
Randomness comes from torch's global generator, so the Trainer's `seed` makes a run reproducible.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# ITU-R BT.601 luma weights for R, G, B: the grayscale conversion PIL's convert("L") uses too.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)


class RandomCrop(nn.Module):
    """Crop each image at a random offset from its zero-padded copy, keeping the size (one offset per image)."""

    def __init__(self, padding: int):
        super().__init__()
        if padding < 1:
            raise ValueError(f"`padding` must be >= 1 (use nn.Identity() for no crop), got {padding}.")
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.padding
        B, C, H, W = x.shape
        padded = F.pad(x, (p, p, p, p)).flatten(2)  # (B, C, H, W) -> (B, C, (H + 2p) * (W + 2p))
        padded_width = W + 2 * p
        top = torch.randint(0, 2 * p + 1, (B,), device=x.device)
        left = torch.randint(0, 2 * p + 1, (B,), device=x.device)
        # One gather along the flattened pixels: an HxW window shifted by each image's offset, expanded over channels.
        rows = torch.arange(H, device=x.device) * padded_width
        window = (rows[:, None] + torch.arange(W, device=x.device)).view(1, 1, H * W)  # (1, 1, H*W)
        index = (top * padded_width + left).view(B, 1, 1) + window  # (B, 1, H*W)
        return padded.gather(2, index.expand(B, C, H * W)).view(B, C, H, W)


class CenterShare(nn.Module):
    """The centre `share` (height, width) of each image: an image processor's resize then centre crop, framed at the
    images' own resolution."""

    def __init__(self, share: Sequence[float]):
        super().__init__()
        self.share = tuple(share)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (h, w), (sh, sw) = x.shape[-2:], self.share
        height, width = max(1, round(h * sh)), max(1, round(w * sw))
        top, left = (h - height) // 2, (w - width) // 2
        return x[..., top : top + height, left : left + width]


class RandomResizedCrop(nn.Module):
    """torchvision's `RandomResizedCrop`, batched: each image draws its own box (area share from `scale`,
    log-uniform aspect ratio from `ratio`, ten tries, else the whole image at the nearest ratio in range), and all
    boxes are resized in one bilinear `grid_sample`. Unlike torchvision a box larger than `size` is not low-pass
    filtered first; photos are stored at most 256/224 larger than the model's input, so aliasing stays small."""

    ATTEMPTS = 10

    def __init__(
        self,
        size: tuple[int, int] | int,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
    ):
        super().__init__()
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"`scale` must be (low, high) with 0 < low <= high <= 1, got {tuple(scale)}.")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"`ratio` must be (low, high) with 0 < low <= high, got {tuple(ratio)}.")
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.scale, self.ratio = tuple(scale), tuple(ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return resized_crop(x, self.sample_boxes(x.shape[0], x.shape[-2], x.shape[-1], x.device), self.size)

    def sample_boxes(self, B: int, H: int, W: int, device: torch.device, fallback: bool = True) -> torch.Tensor:
        """`(B, 4)` int64 boxes `(top, left, height, width)`, drawn as `RandomResizedCrop.get_params` draws one.
        Where no try fits, torchvision's fallback box, or with `fallback=False` an empty one."""
        area = H * W * torch.empty(B, self.ATTEMPTS, device=device).uniform_(*self.scale)  # (B, tries)
        aspect = torch.exp(torch.empty(B, self.ATTEMPTS, device=device).uniform_(*map(math.log, self.ratio)))
        w = torch.sqrt(area * aspect).round().long()
        h = torch.sqrt(area / aspect).round().long()
        fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)  # (B, tries)
        found = fits.any(1)
        pick = fits.float().argmax(1, keepdim=True)  # (B, 1) the first try that fits
        h, w = h.gather(1, pick)[:, 0], w.gather(1, pick)[:, 0]  # (B, tries) -> (B,)
        # No try fits: torchvision's fallback, the whole image cropped to the nearest aspect ratio in range.
        default = (min(H, round(W / self.ratio[0])), min(W, round(H * self.ratio[1]))) if fallback else (0, 0)
        h, w = torch.where(found, h, default[0]), torch.where(found, w, default[1])
        # A uniform offset in [0, H - h], as torch.randint(0, H - h + 1) draws it; the fallback is centred.
        top = (torch.rand(B, device=device) * (H - h + 1)).long().clamp(max=H - h)
        left = (torch.rand(B, device=device) * (W - w + 1)).long().clamp(max=W - w)
        top, left = torch.where(found, top, (H - h) // 2), torch.where(found, left, (W - w) // 2)
        return torch.stack([top, left, h, w], dim=1)


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 `(B, C, H, W)` -> uint8 `(B, C, *size)`: box `(top, left, height, width)` of each image resized
    bilinearly, in one `grid_sample`. Sample positions are `F.interpolate(crop, size, mode="bilinear")`'s on each
    crop, clamped to the crop's edge pixels, so no pixel outside a box leaks in."""
    B, _, H, W = x.shape
    out_h, out_w = size
    top, left, h, w = (boxes[:, i].to(torch.float32)[:, None] for i in range(4))  # each (B, 1)
    # Source pixel coordinates of the output pixel centres, clamped to the crop; then grid_sample's [-1, 1] units.
    ys = (torch.arange(out_h, device=x.device) + 0.5) * (h / out_h) - 0.5  # (B, out_h)
    xs = (torch.arange(out_w, device=x.device) + 0.5) * (w / out_w) - 0.5  # (B, out_w)
    ys = (ys.clamp(min=0).minimum(h - 1) + top + 0.5) * (2 / H) - 1
    xs = (xs.clamp(min=0).minimum(w - 1) + left + 0.5) * (2 / W) - 1
    grid = torch.stack(torch.broadcast_tensors(xs[:, None, :], ys[:, :, None]), dim=-1)  # (B, out_h, out_w, 2)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


class RandomHorizontalFlip(nn.Module):
    """Mirror each image left-right with probability `p`, decided per image."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"`p` must be a probability in [0, 1], got {p}.")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flip = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < self.p  # (B, 1, 1, 1)
        return torch.where(flip, x.flip(-1), x)


class RandomErasing(nn.Module):
    """torchvision's `RandomErasing` per image: with probability `p` a box of area share `scale` and aspect ratio
    `ratio` is set to 0, which after normalisation is the channel mean (timm's `const` mode). Ten tries, as
    torchvision; an image where none fits is left whole."""

    def __init__(self, p: float, scale: Sequence[float] = (0.02, 0.33), ratio: Sequence[float] = (0.3, 3.3)):
        super().__init__()
        if not 0.0 < p <= 1.0:
            raise ValueError(f"`p` must be a probability in (0, 1] (use nn.Identity() for none), got {p}.")
        self.p, self.boxes = p, RandomResizedCrop(1, scale, ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        top, left, h, w = self.boxes.sample_boxes(B, H, W, x.device, fallback=False)[:, :, None].unbind(1)  # (B, 1)
        rows, cols = torch.arange(H, device=x.device), torch.arange(W, device=x.device)
        in_rows = (rows >= top) & (rows < top + h)  # (B, H)
        in_cols = (cols >= left) & (cols < left + w)  # (B, W)
        erase = (torch.rand(B, 1, 1, device=x.device) < self.p) & in_rows[:, :, None] & in_cols[:, None, :]
        return x.masked_fill(erase[:, None], 0.0)  # mask (B, H, W) -> (B, 1, H, W) over channels


class Resize(nn.Module):
    """Bilinear resize of a float batch to `size`, antialiased when shrinking; a no-op at that size already."""

    def __init__(self, size: tuple[int, int]):
        super().__init__()
        self.size = tuple(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) == self.size:
            return x
        shrinking = x.shape[-2] > self.size[0] or x.shape[-1] > self.size[1]
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=shrinking)


class RGBToGrayscale(nn.Module):
    """Grayscale as `num_channels` identical channels: RGB by its luma (`grayscale`), a gray channel as it is, so
    that 1 -> N repeats it for models trained on RGB."""

    def __init__(self, num_channels: int = 1):
        super().__init__()
        self.num_channels = num_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return grayscale(x).expand(-1, self.num_channels, -1, -1)  # (B, 1, H, W) -> (B, C, H, W), a view


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Float `(B, 3, H, W)` RGB -> `(B, 1, H, W)` luma with `LUMA_WEIGHTS`; a 1-channel batch is returned as it is."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor(LUMA_WEIGHTS, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(dim=1, keepdim=True)  # (B, 3, H, W) -> (B, 1, H, W)


class Normalize(nn.Module):
    """`(x / 255 - mean) / std` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x / 255 - self.mean.to(x.device)) / self.std.to(x.device)


class RandomAugmentOps(nn.Module):
    """TrivialAugment / RandAugment on a uint8 batch: each of `num_ops` rounds gives every image one op of `OPS` at a
    magnitude uniform in `[0, magnitude]` of RandAugment's range, random sign (one round is TrivialAugment). The
    geometric ops share one `grid_sample`; each colour op runs once on the images that drew it."""

    OPS = (
        "identity",
        *("rotate", "shear_x", "shear_y", "translate_x", "translate_y"),  # geometric: `_affine`
        *("brightness", "color", "contrast", "sharpness", "posterize", "solarize", "autocontrast"),  # `COLOR_OPS`
    )

    def __init__(self, num_ops: int = 1, magnitude: float = 1.0):
        super().__init__()
        if num_ops < 1:
            raise ValueError(f"`num_ops` must be >= 1 (use nn.Identity() for none), got {num_ops}.")
        if not 0.0 < magnitude <= 1.0:
            raise ValueError(f"`magnitude` must be in (0, 1], got {magnitude}.")
        self.num_ops, self.magnitude = num_ops, magnitude

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        out = x.to(torch.float32, copy=True)  # the colour ops write into it
        for _ in range(self.num_ops):
            op = torch.randint(0, len(self.OPS), (B,), device=x.device)
            sign = torch.where(torch.rand(B, device=x.device) < 0.5, -1.0, 1.0)
            m = torch.rand(B, device=x.device) * self.magnitude * sign  # (B,) signed magnitude in [-mag, mag]
            out = _affine(out, op, m, self.OPS)
            for name, fn in COLOR_OPS.items():  # one loop over ops, none over images; each image has one op
                index = (op == self.OPS.index(name)).nonzero().squeeze(1)
                if len(index):
                    out[index] = fn(out[index], m[index].view(-1, 1, 1, 1)).clamp(0, 255)
            # Back to whole pixel values after each op, as with PIL: posterize's floor needs integers.
            out.round_()
        return out.clamp_(0, 255).to(torch.uint8)


def _affine(x: torch.Tensor, op: torch.Tensor, m: torch.Tensor, ops: tuple[str, ...]) -> torch.Tensor:
    """Rotate, shear or translate each image by its op and magnitude (others keep the identity), zero fill."""
    geometric = (op >= ops.index("rotate")) & (op <= ops.index("translate_y"))  # (B,)
    if not bool(geometric.any()):
        return x

    def where(name: str, value: torch.Tensor) -> torch.Tensor:
        return torch.where(op == ops.index(name), value, torch.zeros_like(m))

    angle = where("rotate", m * math.radians(30.0))
    theta = torch.zeros(x.shape[0], 2, 3, device=x.device)  # (B, 2, 3) affine matrices in normalized coordinates
    theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle) + where("shear_x", 0.3 * m)
    theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle) + where("shear_y", 0.3 * m), torch.cos(angle)
    # Translations of up to 0.45 of the size: 0.9 in normalized coordinates, which span 2.
    theta[:, 0, 2], theta[:, 1, 2] = where("translate_x", 0.9 * m), where("translate_y", 0.9 * m)
    grid = F.affine_grid(theta[geometric], list(x[geometric].shape), align_corners=False)
    # In place: `forward` owns `x`, and `x[geometric]` is read (a copy) before it is written.
    x[geometric] = F.grid_sample(x[geometric], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return x


def _blend(x: torch.Tensor, base: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance: `base + factor * (x - base)`, clipped to [0, 255]."""
    return (base + factor * (x - base)).clamp(0, 255)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (centre 5, neighbours 1, over 13), border pixels kept, as ImageEnhance.Sharpness uses."""
    C = x.shape[1]
    kernel = torch.ones(C, 1, 3, 3, device=x.device, dtype=x.dtype)
    kernel[:, :, 1, 1] = 5.0
    smooth = x.clone()
    smooth[..., 1:-1, 1:-1] = F.conv2d(x, kernel / 13.0, groups=C)  # inside the border
    return smooth


def _posterize(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    step = 2.0 ** (4 * m.abs()).round()  # keep 8..4 bits
    return torch.floor(x / step) * step


def _autocontrast(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    low = x.amin(dim=(-2, -1), keepdim=True)  # (b, C, 1, 1), per channel as PIL does
    high = x.amax(dim=(-2, -1), keepdim=True)
    return torch.where(high > low, (x - low) * (255 / (high - low).clamp_min(1)), x)


# Colour factors are 1 +- 0.9 as in RandAugment; a factor of 1 is the identity.
COLOR_OPS = {
    "brightness": lambda x, m: _blend(x, torch.zeros_like(x), 1.0 + 0.9 * m),
    "color": lambda x, m: _blend(x, grayscale(x), 1.0 + 0.9 * m),
    "contrast": lambda x, m: _blend(x, grayscale(x).mean(dim=(-2, -1), keepdim=True), 1.0 + 0.9 * m),
    "sharpness": lambda x, m: _blend(x, _smooth(x), 1.0 + 0.9 * m),
    "posterize": _posterize,
    "solarize": lambda x, m: torch.where(x >= 256 - 256 * m.abs(), 255 - x, x),  # invert pixels above 256..0
    "autocontrast": _autocontrast,
}


class MixUpCutMix(nn.Module):
    """torchvision's `v2.MixUp` and/or `v2.CutMix` of a float batch: `(images, labels (B,) or multi-hot (B, K))` ->
    `(mixed images, soft targets (B, K))`; with both alphas > 0 each batch uses one of the two at random."""

    def __init__(self, num_labels: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0):
        super().__init__()
        if mixup_alpha < 0 or cutmix_alpha < 0 or mixup_alpha == cutmix_alpha == 0:
            raise ValueError(
                f"`mixup_alpha` and `cutmix_alpha` must be >= 0 with at least one > 0, got {mixup_alpha} and "
                f"{cutmix_alpha}."
            )
        from torchvision.transforms import v2  # imported here: torchvision's import costs seconds that predict skips

        mixes = [v2.MixUp(alpha=mixup_alpha, num_classes=num_labels)] if mixup_alpha > 0 else []
        mixes += [v2.CutMix(alpha=cutmix_alpha, num_classes=num_labels)] if cutmix_alpha > 0 else []
        self.mix = v2.RandomChoice(mixes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mix(x, labels)


@dataclass
class Preprocessing:
    """What the device-side batch transform needs to feed the model: resolution, channels and normalisation."""

    image_size: tuple[int, int]
    num_channels: int
    image_mean: list[float]
    image_std: list[float]
    # The size evaluation resizes to before a center crop to `image_size`; `None` when the processor does not crop.
    resize_size: tuple[int, int] | None = None
    flip_channels: bool = False  # BGR input, as MobileViT's processor makes it (`do_flip_channel_order`)


# Photos trained with `RandomResizedCrop` are stored with this margin over the model's input (timm's `crop_pct` 0.875).
CROP_MARGIN = 256 / 224


def photo_size(prep: Preprocessing, margin: bool = True) -> int:
    """The square size photos are stored at for a model fed as `prep` says: its input times `CROP_MARGIN` (with
    `margin`), or the processor's resize size when larger. Without `margin` evaluation resizes each photo once, as
    `pipeline()` does (a 32 px digit stored at 9 px for an 8 px model scored 95% in evaluation, 83% there)."""
    return max(round(max(prep.image_size) * (CROP_MARGIN if margin else 1)), max(prep.resize_size or (0,)))


def preprocessing_from(processor, config) -> Preprocessing:
    """Resolution and normalisation of an image processor (transformers' or timm's): the sizes its evaluation resizes
    to and crops."""
    num_channels = int(getattr(config, "num_channels", 3))
    data_config = getattr(processor, "data_config", None)
    if data_config:  # timm's preprocessing (TimmWrapperImageProcessor): input size, crop_pct, mean, std
        _, height, width = data_config["input_size"]
        crop = data_config.get("crop_pct") or 1.0
        image_size, resize_size = (height, width), (math.floor(height / crop), math.floor(width / crop))  # timm's
        mean, std = data_config["mean"], data_config["std"]
    else:
        image_size = resize_size = _height_width(processor.size) or (int(config.image_size),) * 2
        name = type(processor).__name__.removesuffix("Pil")  # the PIL-backed processors do as the torch ones
        crop_pct = getattr(processor, "crop_pct", None)
        if crop_pct:  # ConvNeXt's and PoolFormer's processors resize to size / crop_pct
            scaled = (int(resize_size[0] / crop_pct), int(resize_size[1] / crop_pct))
            if name != "ConvNextImageProcessor":
                image_size = resize_size = scaled  # PoolFormer: `crop_size` crops it (below)
            elif image_size[0] < 384:  # ConvNeXt center-crops `size` back; from 384 px it warps to `size`, uncropped
                resize_size = scaled
        elif name == "LevitImageProcessor" and processor.size.get("shortest_edge"):
            resize_size = (int(256 / 224 * resize_size[0]),) * 2  # LeViT's: 256/224 of `size`, then a center crop
        if getattr(processor, "do_center_crop", False) and _height_width(getattr(processor, "crop_size", None)):
            image_size = _height_width(processor.crop_size)
        mean, std = _normalization(processor, num_channels)
    mean, std = list(mean), list(std)
    if len(mean) != num_channels:
        mean, std = [sum(mean) / len(mean)] * num_channels, [sum(std) / len(std)] * num_channels
    flip = bool(getattr(processor, "do_flip_channel_order", False))
    return Preprocessing(image_size, num_channels, mean, std, resize_size if resize_size != image_size else None, flip)


def _normalization(processor, num_channels: int) -> tuple[list[float], list[float]]:
    """The `image_mean` and `image_std` in [0, 1] units that give what an image processor makes of a pixel `v` in
    [0, 255], written as `(v / 255 - mean) / std`: its rescale (`rescale_factor`; EfficientNet's `rescale_offset`
    subtracts 1 after it, its `include_top` divides by `image_std` once more) then its normalisation."""
    rescale = getattr(processor, "do_rescale", True)
    factor = processor.rescale_factor if rescale else 1.0
    offset = 1.0 if rescale and getattr(processor, "rescale_offset", False) else 0.0  # part of EfficientNet's rescale
    if getattr(processor, "do_normalize", True) and processor.image_mean is not None:
        mean, std = list(processor.image_mean), list(processor.image_std)
    else:
        mean, std = [0.0] * num_channels, [1.0] * num_channels
    top = list(processor.image_std) if getattr(processor, "include_top", False) else [1.0] * len(std)
    # (v * factor - offset - m) / s / t = (v / 255 - M) / S: S = s t / (255 factor), M = (offset + m) / (255 factor)
    scale = 255 * factor
    return [(offset + m) / scale for m in mean], [s * t / scale for s, t in zip(std, top)]


def _height_width(size) -> tuple[int, int] | None:
    """`(height, width)` of an image processor's `size` (int, dict or `SizeDict`), or None where it names none."""
    if isinstance(size, int):
        return (size, size)
    if size and size.get("height") and size.get("width"):
        return (int(size["height"]), int(size["width"]))
    return (int(size["shortest_edge"]),) * 2 if size and size.get("shortest_edge") else None


class BatchTransform(nn.Module):
    """uint8 image batches -> the model's float32 normalized `pixel_values`, augmented when training.

    `mean`, `std` normalise each output channel; `in_channels` are the stored images' (1 or 3), `out_channels` the
    model's (1 -> 3 repeats the gray channel, 3 -> 1 takes the luma). `random_crop_padding` ... `random_erasing` are
    training's augmentation, as the `DataArguments` of those names (`random_resized_crop` a bool). The `Preprocessing`
    fields of the same meaning: `eval_resize_size` (`resize_size`; None: straight to `image_size`), `flip_channels`.
    `crop_size`: RandomResizedCrop's output (default `image_size`; a larger teacher's, which `finish` resizes down).
    """

    def __init__(
        self,
        image_size: tuple[int, int] | int,
        mean: Sequence[float],
        std: Sequence[float],
        in_channels: int,
        out_channels: int,
        random_crop_padding: int = 4,
        horizontal_flip: bool = True,
        rand_augment_ops: int = 0,
        rand_augment_magnitude: float = 1.0,
        random_resized_crop: bool = False,
        crop_scale: Sequence[float] = (0.08, 1.0),
        crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
        random_erasing: float = 0.0,
        eval_resize_size: tuple[int, int] | None = None,
        flip_channels: bool = False,
        crop_size: tuple[int, int] | None = None,
    ):
        super().__init__()
        self.image_size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.in_channels = in_channels
        if len(mean) not in (1, out_channels) or len(std) not in (1, out_channels):
            raise ValueError(
                f"`mean` and `std` need 1 or {out_channels} (out_channels) values, got {len(mean)} and {len(std)}."
            )
        if random_crop_padding < 0:
            raise ValueError(f"`random_crop_padding` must be >= 0, got {random_crop_padding}.")
        # Training-only steps, uint8 -> uint8 at the source resolution: cheap, and exact for crops and flips.
        if random_resized_crop:
            crop = RandomResizedCrop(crop_size or self.image_size, crop_scale, crop_ratio)
        else:
            crop = RandomCrop(random_crop_padding) if random_crop_padding > 0 else nn.Identity()
        self.augment = nn.Sequential(
            crop,
            RandomHorizontalFlip() if horizontal_flip else nn.Identity(),
            RandomAugmentOps(rand_augment_ops, rand_augment_magnitude) if rand_augment_ops > 0 else nn.Identity(),
        )
        self.erase = RandomErasing(random_erasing) if random_erasing > 0 else nn.Identity()
        self.resize = Resize(self.image_size)
        # Training's padded crop frames each image as evaluation does (its processor's resize then centre crop): it had
        # the whole image where evaluation's resize 10, crop 8 saw the centre, and scored 82% instead of 97%.
        self.frame = nn.Identity()
        if eval_resize_size is not None and tuple(eval_resize_size) != self.image_size:
            from torchvision.transforms import v2

            self.eval_resize = nn.Sequential(Resize(eval_resize_size), v2.CenterCrop(self.image_size))
            if not random_resized_crop:  # which draws its own boxes
                self.frame = CenterShare([i / r for i, r in zip(self.image_size, eval_resize_size)])
        else:
            self.eval_resize = self.resize
        if in_channels not in (1, out_channels) and (in_channels, out_channels) != (3, 1):
            raise ValueError(
                f"Cannot convert {in_channels}-channel images to {out_channels} channels: supported are 1 -> N and "
                "3 -> 1."
            )
        # `models.check_channels` logs the conversion.
        self.convert_channels = nn.Identity() if in_channels == out_channels else RGBToGrayscale(out_channels)
        self.normalize = Normalize(mean, std)
        self.flip_channels = flip_channels

    @classmethod
    def for_model(cls, prep: Preprocessing, in_channels: int, **augmentation) -> "BatchTransform":
        """The transform that feeds a model as `prep` says, from images of `in_channels` channels; training adds its
        `augmentation` options, predict and attention use evaluation's."""
        return cls(
            prep.image_size,
            prep.image_mean,
            prep.image_std,
            in_channels,
            prep.num_channels,
            eval_resize_size=prep.resize_size,
            flip_channels=prep.flip_channels,
            **augmentation,
        )

    def forward(self, pixel_values: torch.Tensor, train: bool) -> torch.Tensor:
        """uint8 `(B, C_in, h, w)` -> float32 normalized `(B, C_out, H, W)`; `train` adds the random augmentations."""
        x = self.augmented(pixel_values) if train else self.checked(pixel_values).float()
        return self.finish(x, train)

    def augmented(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The part of training's transform that models taught together share: uint8 `(B, C_in, h, w)` -> float
        `(B, C_in, h', w')` in [0, 255], cropped, flipped and augmented at the stored resolution (at `crop_size` with
        `random_resized_crop`). MixUp/CutMix mix them before `finish`, whose resize, channel conversion and
        normalisation are affine (mixing weights sum to 1): a teacher sees the student's images (before erasing)."""
        return self.augment(self.frame(self.checked(pixel_values))).float()

    def finish(self, x: torch.Tensor, train: bool) -> torch.Tensor:
        """Float pixel values `(B, C_in, h, w)` -> this model's normalized `(B, C_out, H, W)`, then random erasing
        where `train` (a teacher's transform has none: it sees the student's images unerased)."""
        x = self.resize(x) if train else self.eval_resize(x)  # (B, C_in, h, w) -> (B, C_in, H, W)
        x = self.normalize(self.convert_channels(x))  # (B, C_in, H, W) -> (B, C_out, H, W)
        x = x.flip(1) if self.flip_channels else x  # RGB -> BGR
        return self.erase(x) if train else x

    def checked(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`pixel_values` as they came, if they are uint8 images with this transform's input channels."""
        if pixel_values.dtype != torch.uint8 or pixel_values.ndim != 4 or pixel_values.shape[1] != self.in_channels:
            raise ValueError(
                f"Expected uint8 images of shape (B, {self.in_channels}, h, w), got {pixel_values.dtype} "
                f"{tuple(pixel_values.shape)}."
            )
        return pixel_values


def use_random_resized_crop(choice: str, stored_size: tuple[int, int], image_size: tuple[int, int]) -> bool:
    """Whether training uses `RandomResizedCrop` (`choice` "true") or the padded crop ("false"); "auto": the former
    for images stored larger than the model's input (photos), the latter for small ones (CIFAR-10, digits)."""
    if choice == "auto":
        return stored_size[0] > image_size[0] and stored_size[1] > image_size[1]
    return choice == "true"


def describe_augmentation(
    transform: BatchTransform, training: bool = True, mixup_alpha=0.0, cutmix_alpha=0.0, flip_tta=False
) -> str:
    """One line naming `transform`'s training augmentation (where the run trains), the batches' MixUp/CutMix, and
    evaluation's resize (and mirror-image average)."""
    size = "x".join(map(str, transform.image_size))
    if isinstance(transform.eval_resize, nn.Sequential):
        evaluation = "resize to {}x{}, center crop {}".format(*transform.eval_resize[0].size, size)
    else:
        evaluation = f"resize to {size}"
    evaluation += ", logits averaged with the mirror image's (flip_tta)" if flip_tta else ""
    if not training:
        return f"Evaluation: {evaluation}."
    return f"Training augmentation: {training_recipe(transform, mixup_alpha, cutmix_alpha)}; evaluation: {evaluation}."


def training_recipe(transform: BatchTransform, mixup_alpha=0.0, cutmix_alpha=0.0) -> str:
    """The augmentation `transform` and MixUp/CutMix apply in training, as applied (a crop `auto` chose, say)."""
    crop, flip, ops = transform.augment
    if isinstance(crop, RandomResizedCrop):
        parts = [f"RandomResizedCrop(scale={crop.scale}, ratio=({crop.ratio[0]:.3g}, {crop.ratio[1]:.3g}))"]
    else:
        parts = [f"random crop with {crop.padding} px padding" if isinstance(crop, RandomCrop) else "no crop"]
        if isinstance(transform.frame, CenterShare):
            parts[0] += " of the centre {:.0%} x {:.0%}, as evaluation crops".format(*transform.frame.share)
    parts.append("horizontal flip" if isinstance(flip, RandomHorizontalFlip) else "no flip")
    if isinstance(ops, RandomAugmentOps):
        parts.append(f"{ops.num_ops} random op(s) per image (magnitude {ops.magnitude})")
    if isinstance(transform.erase, RandomErasing):
        parts.append(f"random erasing (p={transform.erase.p})")
    mixes = [
        f"{name} (alpha {alpha:g})" for name, alpha in (("MixUp", mixup_alpha), ("CutMix", cutmix_alpha)) if alpha
    ]
    if mixes:
        parts.append(" or ".join(mixes) + (" per batch" if len(mixes) == 2 else " of each batch"))
    return ", ".join(parts)
