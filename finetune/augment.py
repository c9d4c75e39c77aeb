"""Batch augmentation and preprocessing as tensor ops on the device that holds the batch.

Images arrive as the uint8 batches `ImageSplit` serves and leave as the float32 normalized `pixel_values` the model
takes. Every step works on the whole batch at once, with per-image randomness drawn as tensors (airbench style): no
PIL and no Python loop over images, so the same code is fast on a GPU and still fine on a CPU.

Randomness comes from torch's global generator on the batch's device, so `torch.manual_seed` (which the Trainer calls
with `seed`) makes a run reproducible.

Training-time augmentations are the uint8 -> uint8 modules in `BatchTransform.augment` (random crop, flip, and the
TrivialAugment / RandAugment ops of `RandomAugmentOps`), each switched off as `nn.Identity()`; another augmentation is
one more module in that `nn.Sequential`.
"""

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import logging


logger = logging.get_logger(__name__)

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
        # Flat positions of an HxW window at the origin of the padded image, then shifted by each image's offset:
        # one gather along the flattened pixels, with an index that is only expanded (not copied) over channels.
        rows = torch.arange(H, device=x.device) * padded_width
        window = (rows[:, None] + torch.arange(W, device=x.device)).view(1, 1, H * W)  # (1, 1, H*W)
        index = (top * padded_width + left).view(B, 1, 1) + window  # (B, 1, H*W)
        return padded.gather(2, index.expand(B, C, H * W)).view(B, C, H, W)


class RandomResizedCrop(nn.Module):
    """Crop a random box of each image and resize it to `size`: torchvision's `RandomResizedCrop`, batched.

    Every image draws its own box as torchvision does: an area share from `scale` and a log-uniform aspect ratio
    from `ratio`, ten tries for a box that fits, else the whole image cropped to the nearest ratio in range. All boxes
    are then sampled in one `grid_sample` (bilinear) into a uint8 `(B, C, *size)` batch. The pixels equal
    `torchvision.transforms.v2.functional.resized_crop(image, top, left, h, w, size, antialias=False)` up to
    rounding: a box larger than `size` is not low-pass filtered first. Photos are stored with a small margin over
    the model's input (256 for 224), so boxes shrink by at most that ratio and aliasing stays small.
    """

    def __init__(
        self,
        size: tuple[int, int] | int,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        attempts: int = 10,
    ):
        super().__init__()
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"`scale` must be (low, high) with 0 < low <= high <= 1, got {tuple(scale)}.")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"`ratio` must be (low, high) with 0 < low <= high, got {tuple(ratio)}.")
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.scale, self.ratio, self.attempts = tuple(scale), tuple(ratio), attempts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        boxes = self.sample_boxes(x.shape[0], x.shape[-2], x.shape[-1], x.device)
        return resized_crop(x, boxes, self.size)

    def sample_boxes(self, B: int, H: int, W: int, device: torch.device) -> torch.Tensor:
        """`(B, 4)` int64 boxes `(top, left, height, width)`, drawn as `RandomResizedCrop.get_params` draws one."""
        area = H * W * torch.empty(B, self.attempts, device=device).uniform_(*self.scale)  # (B, tries)
        log_ratio = torch.empty(B, self.attempts, device=device).uniform_(
            math.log(self.ratio[0]), math.log(self.ratio[1])
        )
        aspect = torch.exp(log_ratio)
        w = torch.sqrt(area * aspect).round().long()
        h = torch.sqrt(area / aspect).round().long()
        fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)  # (B, tries)
        first = torch.where(fits.any(1), fits.float().argmax(1), -1)  # (B,) the first try that fits, or -1
        pick = first.clamp_min(0)[:, None]
        h, w = h.gather(1, pick)[:, 0], w.gather(1, pick)[:, 0]  # (B, tries) -> (B,)
        # No try fits: the whole image, cropped to the nearest aspect ratio in range (torchvision's fallback).
        in_ratio = W / H
        if in_ratio < self.ratio[0]:
            fallback = (round(W / self.ratio[0]), W)
        elif in_ratio > self.ratio[1]:
            fallback = (H, round(H * self.ratio[1]))
        else:
            fallback = (H, W)
        h = torch.where(first >= 0, h, fallback[0])
        w = torch.where(first >= 0, w, fallback[1])
        # A uniform offset in [0, H - h], as torch.randint(0, H - h + 1) draws it.
        top = (torch.rand(B, device=device) * (H - h + 1)).long().clamp(max=H - h)
        left = (torch.rand(B, device=device) * (W - w + 1)).long().clamp(max=W - w)
        top = torch.where(first >= 0, top, (H - h) // 2)
        left = torch.where(first >= 0, left, (W - w) // 2)
        return torch.stack([top, left, h, w], dim=1)


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Crop box `(top, left, height, width)` of each image and resize it bilinearly to `size`, in one `grid_sample`.

    uint8 `(B, C, H, W)` -> uint8 `(B, C, *size)`. Sample positions are those of `F.interpolate(crop, size,
    mode="bilinear", align_corners=False)` on each crop, clamped to the crop's own edge pixels as interpolation
    clamps them, so no pixel outside a box leaks in.
    """
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


class CenterCrop(nn.Module):
    """The central `size` window of each image, placed as torchvision's `center_crop` places it."""

    def __init__(self, size: tuple[int, int]):
        super().__init__()
        self.size = tuple(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = x.shape[-2:]
        h, w = self.size
        top, left = int(round((H - h) / 2.0)), int(round((W - w) / 2.0))
        return x[..., top : top + h, left : left + w]


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


class RepeatChannels(nn.Module):
    """Grayscale to `num_channels` identical channels, for models trained on RGB."""

    def __init__(self, num_channels: int):
        super().__init__()
        self.num_channels = num_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.expand(-1, self.num_channels, -1, -1)  # (B, 1, H, W) -> (B, C, H, W), a view


class RGBToGrayscale(nn.Module):
    """RGB to one luma channel with the ITU-R BT.601 weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return grayscale(x)


class Normalize(nn.Module):
    """`(x / 255 - mean) / std` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x / 255 - self.mean.to(x.device)) / self.std.to(x.device)


class RandomAugmentOps(nn.Module):
    """TrivialAugment / RandAugment-style photometric and geometric ops on a uint8 batch, vectorized.

    Each of `num_ops` rounds gives every image one op drawn uniformly from `OPS` (identity included) with a
    magnitude drawn uniformly from `[0, magnitude]` of the op's range (and a random sign for signed ops): one op per
    image is TrivialAugment, two or more in a row is RandAugment with random magnitudes. The ranges are RandAugment's
    (rotate 30 degrees, shear 0.3, translate 45% ... of the size, colour factors 1 +- 0.9). All images are processed
    at once: the geometric ops share one `grid_sample` with a per-image affine matrix, and every colour op is a
    per-image blend picked with `torch.where`, so the cost is a few passes over the batch, with no Python loop over
    images.
    """

    OPS = (
        "identity",
        "rotate",
        "shear_x",
        "shear_y",
        "translate_x",
        "translate_y",
        "brightness",
        "color",
        "contrast",
        "sharpness",
        "posterize",
        "solarize",
        "autocontrast",
    )

    def __init__(self, num_ops: int = 1, magnitude: float = 1.0):
        super().__init__()
        if num_ops < 1:
            raise ValueError(f"`num_ops` must be >= 1 (use nn.Identity() for none), got {num_ops}.")
        if not 0.0 < magnitude <= 1.0:
            raise ValueError(f"`magnitude` must be in (0, 1], got {magnitude}.")
        self.num_ops = num_ops
        self.magnitude = magnitude

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        for _ in range(self.num_ops):
            # Back to whole pixel values after each op, as with PIL: posterize's floor needs integers.
            out = self._one_round(out).round_()
        return out.clamp_(0, 255).to(torch.uint8)

    def _one_round(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        op = torch.randint(0, len(self.OPS), (B,), device=x.device)
        sign = torch.where(torch.rand(B, device=x.device) < 0.5, -1.0, 1.0)
        m = torch.rand(B, device=x.device) * self.magnitude * sign  # (B,) signed magnitude in [-mag, mag]
        x = _affine(x, op, m, self.OPS)
        out = x.clone()
        # Each colour op runs only on the images that drew it: one loop over ops, none over images.
        for name, fn in COLOR_OPS.items():
            index = (op == self.OPS.index(name)).nonzero().squeeze(1)
            if len(index):
                out[index] = fn(x[index], m[index].view(-1, 1, 1, 1)).clamp(0, 255)
        return out


def _brightness(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _blend(x, torch.zeros_like(x), 1.0 + 0.9 * m)


def _color(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _blend(x, grayscale(x), 1.0 + 0.9 * m)


def _contrast(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _blend(x, grayscale(x).mean(dim=(-2, -1), keepdim=True), 1.0 + 0.9 * m)


def _sharpness(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _blend(x, _smooth(x), 1.0 + 0.9 * m)


def _posterize(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    step = 2.0 ** (4 * m.abs()).round()  # keep 8..4 bits
    return torch.floor(x / step) * step


def _solarize(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 256 - 256 * m.abs(), 255 - x, x)  # invert pixels above 256..0


def _autocontrast(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    low = x.amin(dim=(-2, -1), keepdim=True)  # (b, C, 1, 1), per channel as PIL does
    high = x.amax(dim=(-2, -1), keepdim=True)
    return torch.where(high > low, (x - low) * (255 / (high - low).clamp_min(1)), x)


# Colour factors are 1 +- 0.9 as in RandAugment; a factor of 1 is the identity.
COLOR_OPS = {
    "brightness": _brightness,
    "color": _color,
    "contrast": _contrast,
    "sharpness": _sharpness,
    "posterize": _posterize,
    "solarize": _solarize,
    "autocontrast": _autocontrast,
}


def _affine(x: torch.Tensor, op: torch.Tensor, m: torch.Tensor, ops: tuple[str, ...]) -> torch.Tensor:
    """Rotate, shear or translate each image by its op and magnitude (others keep the identity), zero fill."""
    B = x.shape[0]
    theta = torch.zeros(B, 2, 3, device=x.device)  # (B, 2, 3) affine matrices in normalized coordinates
    angle = torch.where(op == ops.index("rotate"), m * math.radians(30.0), torch.zeros_like(m))
    theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle)
    theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle), torch.cos(angle)
    theta[:, 0, 1] += torch.where(op == ops.index("shear_x"), 0.3 * m, torch.zeros_like(m))
    theta[:, 1, 0] += torch.where(op == ops.index("shear_y"), 0.3 * m, torch.zeros_like(m))
    # Translations of up to 0.45 of the size: 0.9 in normalized coordinates, which span 2.
    theta[:, 0, 2] = torch.where(op == ops.index("translate_x"), 0.9 * m, torch.zeros_like(m))
    theta[:, 1, 2] = torch.where(op == ops.index("translate_y"), 0.9 * m, torch.zeros_like(m))
    geometric = torch.isin(op, torch.tensor([ops.index(n) for n in GEOMETRIC_OPS], device=x.device))
    if not bool(geometric.any()):
        return x
    grid = F.affine_grid(theta[geometric], list(x[geometric].shape), align_corners=False)
    warped = F.grid_sample(x[geometric], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    out = x.clone()
    out[geometric] = warped
    return out


GEOMETRIC_OPS = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Float `(B, 3, H, W)` RGB -> `(B, 1, H, W)` luma with `LUMA_WEIGHTS`; a 1-channel batch is returned as it is."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor(LUMA_WEIGHTS, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(dim=1, keepdim=True)  # (B, 3, H, W) -> (B, 1, H, W)


def _blend(x: torch.Tensor, base: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ImageEnhance: `base + factor * (x - base)`, clipped to [0, 255]."""
    return (base + factor * (x - base)).clamp(0, 255)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH filter (centre 5, neighbours 1, over 13), border pixels kept, as ImageEnhance.Sharpness uses."""
    C = x.shape[1]
    kernel = torch.ones(C, 1, 3, 3, device=x.device, dtype=x.dtype)
    kernel[:, :, 1, 1] = 5.0
    smooth = F.conv2d(x, kernel / 13.0, padding=1, groups=C)
    border = torch.ones_like(x, dtype=torch.bool)
    border[..., 1:-1, 1:-1] = False
    return torch.where(border, x, smooth)


class MixUpCutMix(nn.Module):
    """MixUp and/or CutMix of a float batch with its labels, as one-hot targets mixed in the same proportion.

    Each image is paired with the image at the same index of a random permutation of the batch and mixed with one
    ratio `lam ~ Beta(alpha, alpha)` per batch (timm's batch mode): MixUp blends whole images,
    `lam * x + (1 - lam) * x[perm]`; CutMix pastes a box covering `1 - lam` of the area from `x[perm]` (lam is then
    the exact share of kept pixels). With both alphas > 0, each batch uses one of the two, at random.

    Returns `(images, targets)` with `targets = lam * onehot(y) + (1 - lam) * onehot(y[perm])`, `(B, num_labels)`.
    """

    def __init__(self, num_labels: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0):
        super().__init__()
        if mixup_alpha < 0 or cutmix_alpha < 0 or mixup_alpha == cutmix_alpha == 0:
            raise ValueError(
                f"`mixup_alpha` and `cutmix_alpha` must be >= 0 with at least one > 0, got {mixup_alpha} and "
                f"{cutmix_alpha}."
            )
        self.num_labels = num_labels
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, _, H, W = x.shape
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or torch.rand(()).item() < 0.5)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        lam = float(torch.distributions.Beta(alpha, alpha).sample())
        perm = torch.randperm(B, device=x.device)
        if use_cutmix:
            cut_h, cut_w = int(H * math.sqrt(1 - lam)), int(W * math.sqrt(1 - lam))
            cy, cx = int(torch.randint(0, H, ())), int(torch.randint(0, W, ()))
            top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2 + cut_h % 2, H)
            left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2 + cut_w % 2, W)
            x = x.clone()
            x[:, :, top:bottom, left:right] = x[perm, :, top:bottom, left:right]
            lam = 1.0 - (bottom - top) * (right - left) / (H * W)
        else:
            x = lam * x + (1 - lam) * x[perm]
        onehot = F.one_hot(labels, self.num_labels).to(x.dtype)  # (B,) -> (B, num_labels)
        return x, lam * onehot + (1 - lam) * onehot[perm]


class BatchTransform(torch.nn.Module):
    """uint8 image batches -> the model's float32 normalized `pixel_values`, augmented when training.

    Args:
        image_size: the model's input size, `(H, W)` or one int for square images.
        mean, std: per output channel normalization, e.g. the image processor's `image_mean` / `image_std`.
        in_channels: channels of the stored images (1 grayscale, 3 RGB).
        out_channels: channels the model takes; 1 -> 3 repeats the gray channel, 3 -> 1 takes the luma.
        random_crop_padding: random crop with this much zero padding, in source pixels (before resizing); 0: off.
        horizontal_flip: mirror half of the training images at random.
        rand_augment_ops: 0: off; 1: TrivialAugment (one random op per image); N > 1: N random ops in a row
            (RandAugment with random magnitudes). See `RandomAugmentOps`.
        rand_augment_magnitude: the largest magnitude drawn, as a share of each op's range.
        random_resized_crop: crop a random box of each training image and resize it to `image_size`
            (`RandomResizedCrop`) instead of the padded random crop; for photos stored larger than the model input.
        crop_scale, crop_ratio: the area share and aspect ratio ranges of `random_resized_crop`.
        eval_resize_size: evaluation resizes to this size and then center-crops `image_size`, as image processors
            that crop do (`Preprocessing.resize_size`); `None`: evaluation resizes straight to `image_size`.
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
        eval_resize_size: tuple[int, int] | None = None,
    ):
        super().__init__()
        self.image_size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        if len(mean) not in (1, out_channels) or len(std) not in (1, out_channels):
            raise ValueError(
                f"`mean` and `std` need 1 or {out_channels} (out_channels) values, got {len(mean)} and {len(std)}."
            )
        if random_crop_padding < 0:
            raise ValueError(f"`random_crop_padding` must be >= 0, got {random_crop_padding}.")
        # Training-only steps, uint8 -> uint8 at the source resolution: cheap, and exact for crops and flips.
        if random_resized_crop:
            crop = RandomResizedCrop(self.image_size, crop_scale, crop_ratio)
        else:
            crop = RandomCrop(random_crop_padding) if random_crop_padding > 0 else nn.Identity()
        self.augment = nn.Sequential(
            crop,
            RandomHorizontalFlip() if horizontal_flip else nn.Identity(),
            RandomAugmentOps(rand_augment_ops, rand_augment_magnitude) if rand_augment_ops > 0 else nn.Identity(),
        )
        self.resize = Resize(self.image_size)
        if eval_resize_size is not None and tuple(eval_resize_size) != self.image_size:
            self.eval_resize = nn.Sequential(Resize(tuple(eval_resize_size)), CenterCrop(self.image_size))
        else:
            self.eval_resize = self.resize
        self.convert_channels = _channel_conversion(in_channels, out_channels)
        self.normalize = Normalize(mean, std)

    @classmethod
    def for_model(cls, prep, in_channels: int, **augmentation) -> "BatchTransform":
        """The transform that feeds a model as its `finetune.models.Preprocessing` says (resolution, channels,
        normalisation, and evaluation's resize and center crop) from images of `in_channels` channels; training
        (`finetune.run`) adds its `augmentation` options, predict and attention use the evaluation path alone."""
        return cls(
            image_size=prep.image_size,
            mean=prep.image_mean,
            std=prep.image_std,
            in_channels=in_channels,
            out_channels=prep.num_channels,
            eval_resize_size=prep.resize_size,
            **augmentation,
        )

    def forward(self, pixel_values: torch.Tensor, train: bool) -> torch.Tensor:
        """uint8 `(B, C_in, h, w)` -> float32 normalized `(B, C_out, H, W)`; `train` adds the random augmentations."""
        if pixel_values.dtype != torch.uint8 or pixel_values.ndim != 4 or pixel_values.shape[1] != self.in_channels:
            raise ValueError(
                f"Expected uint8 images of shape (B, {self.in_channels}, h, w), got {pixel_values.dtype} "
                f"{tuple(pixel_values.shape)}."
            )
        if train:
            x = self.resize(self.augment(pixel_values).float())  # (B, C_in, h, w) -> (B, C_in, H, W)
        else:
            x = self.eval_resize(pixel_values.float())  # (B, C_in, h, w) -> (B, C_in, H, W)
        x = self.convert_channels(x)  # (B, C_in, H, W) -> (B, C_out, H, W)
        return self.normalize(x)


def use_random_resized_crop(choice: str, stored_size: tuple[int, int], image_size: tuple[int, int]) -> bool:
    """Whether training crops with `RandomResizedCrop` (`choice` "true") or pads and crops (`"false"`); `"auto"`
    picks RandomResizedCrop for photos, images stored larger than the model's input, and the padded crop for small
    native images (CIFAR-10, MNIST, digits) that are resized up to the model."""
    if choice == "auto":
        return stored_size[0] > image_size[0] and stored_size[1] > image_size[1]
    return choice == "true"


def describe_augmentation(transform: "BatchTransform") -> str:
    """One line naming the training crop, flip and ops of `transform`, and evaluation's resize, for the log."""
    crop, flip, ops = transform.augment
    if isinstance(crop, RandomResizedCrop):
        parts = [f"RandomResizedCrop(scale={crop.scale}, ratio=({crop.ratio[0]:.3g}, {crop.ratio[1]:.3g}))"]
    elif isinstance(crop, RandomCrop):
        parts = [f"random crop with {crop.padding} px padding"]
    else:
        parts = ["no crop"]
    parts.append("horizontal flip" if isinstance(flip, RandomHorizontalFlip) else "no flip")
    if isinstance(ops, RandomAugmentOps):
        parts.append(f"{ops.num_ops} random op(s) per image (magnitude {ops.magnitude})")
    size = "x".join(map(str, transform.image_size))
    if isinstance(transform.eval_resize, nn.Sequential):
        evaluation = "resize to {}x{}, center crop {}".format(*transform.eval_resize[0].size, size)
    else:
        evaluation = f"resize to {size}"
    return f"Training augmentation: {', '.join(parts)}; evaluation: {evaluation}."


def _channel_conversion(in_channels: int, out_channels: int) -> nn.Module:
    if in_channels == out_channels:
        return nn.Identity()
    if in_channels == 1:
        logger.info(f"Converting 1-channel (grayscale) images to {out_channels} channels by repeating.")
        return RepeatChannels(out_channels)
    if in_channels == 3 and out_channels == 1:
        logger.info("Converting 3-channel (RGB) images to 1 channel with the ITU-R 601 luma weights.")
        return RGBToGrayscale()
    raise ValueError(
        f"Cannot convert {in_channels}-channel images to {out_channels} channels: supported are 1 -> N and 3 -> 1."
    )
