"""Batch augmentation and preprocessing as tensor ops on the device that holds the batch.

Images arrive as the uint8 batches `ImageSplit` serves and leave as the float32 normalized `pixel_values` the model
takes. Every step works on the whole batch at once, with per-image randomness drawn as tensors (airbench style): no
PIL and no Python loop over images, so the same code is fast on a GPU and still fine on a CPU.

Randomness comes from torch's global generator on the batch's device, so `torch.manual_seed` (which the Trainer calls
with `seed`) makes a run reproducible.

Training-time augmentations are the uint8 -> uint8 modules in `BatchTransform.augment`; a new one (TrivialAugment-style
ops, ...) is one more module in that `nn.Sequential`, switched off as `nn.Identity()`.
"""

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

    def __init__(self):
        super().__init__()
        self.register_buffer("weights", torch.tensor(LUMA_WEIGHTS).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weights.to(x.device)).sum(dim=1, keepdim=True)  # (B, 3, H, W) -> (B, 1, H, W)


class Normalize(nn.Module):
    """`(x / 255 - mean) / std` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x / 255 - self.mean.to(x.device)) / self.std.to(x.device)


class BatchTransform(torch.nn.Module):
    """uint8 image batches -> the model's float32 normalized `pixel_values`, augmented when training.

    Args:
        image_size: the model's input size, `(H, W)` or one int for square images.
        mean, std: per output channel normalization, e.g. the image processor's `image_mean` / `image_std`.
        in_channels: channels of the stored images (1 grayscale, 3 RGB).
        out_channels: channels the model takes; 1 -> 3 repeats the gray channel, 3 -> 1 takes the luma.
        random_crop_padding: random crop with this much zero padding, in source pixels (before resizing); 0: off.
        horizontal_flip: mirror half of the training images at random.
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
        self.augment = nn.Sequential(
            RandomCrop(random_crop_padding) if random_crop_padding > 0 else nn.Identity(),
            RandomHorizontalFlip() if horizontal_flip else nn.Identity(),
        )
        self.resize = Resize(self.image_size)
        self.convert_channels = _channel_conversion(in_channels, out_channels)
        self.normalize = Normalize(mean, std)

    def forward(self, pixel_values: torch.Tensor, train: bool) -> torch.Tensor:
        """uint8 `(B, C_in, h, w)` -> float32 normalized `(B, C_out, H, W)`; `train` adds the random augmentations."""
        if pixel_values.dtype != torch.uint8 or pixel_values.ndim != 4 or pixel_values.shape[1] != self.in_channels:
            raise ValueError(
                f"Expected uint8 images of shape (B, {self.in_channels}, h, w), got {pixel_values.dtype} "
                f"{tuple(pixel_values.shape)}."
            )
        x = self.augment(pixel_values) if train else pixel_values
        x = self.resize(x.float())  # (B, C_in, h, w) -> (B, C_in, H, W)
        x = self.convert_channels(x)  # (B, C_in, H, W) -> (B, C_out, H, W)
        return self.normalize(x)


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
