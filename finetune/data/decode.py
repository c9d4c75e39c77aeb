"""One image decoding for training, predict and attention maps: a file or its bytes -> an upright 8-bit image.

    from finetune.data.decode import decode_image
    image = decode_image("photo.png", "RGB")  # a PIL image in mode "RGB", 8 bits per channel

Training (`finetune.data`), `finetune.predict` and `finetune.attention` read every image through `decode_image`, so a
file gives the same pixels whichever command reads it:

- EXIF orientation is applied (`PIL.ImageOps.exif_transpose`): a photo stored sideways with an orientation tag comes
  out upright, with its height and width swapped where the tag says so.
- Transparency (RGBA, LA, and palette images with a transparent colour) is composited onto white:
  `alpha * colour + (1 - alpha) * 255` per pixel. The colour stored under a fully transparent pixel is arbitrary
  (often black) and not part of the picture; dropping the alpha channel would show it. White is what image viewers,
  web pages and photo tools show behind a transparent logo, icon or product photo, so the model sees the image as
  people do.
- 16-bit grayscale (`I;16*` PNG or TIFF, and 16-bit PGM, which Pillow opens as mode `I`) keeps the high byte of each
  value (`value >> 8`: 40000 -> 156, 65535 -> 255). Pillow's own conversion clips every value above 255 to white.
- Palette (`P`), CMYK, YCbCr and other colour modes become RGB; 1-bit images become 0 / 255 grayscale; float (`F`)
  images are clipped to [0, 255] by Pillow.
- An RGB image asked for in mode `"L"` takes the ITU-R 601 luma, Pillow's conversion, with the weights of
  `finetune.augment.LUMA_WEIGHTS`.
"""

import io
import os
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps


# The file extensions read as images when a folder is searched (training image folders, predict's folders).
IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
# Modes whose values are 16-bit intensities (mode "I" holds 32-bit ints; 16-bit PGM files open as "I").
SIXTEEN_BIT_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})
# Alpha modes, premultiplied ones included, and the mode of their colour part.
ALPHA_MODES = {"RGBA": "RGB", "RGBa": "RGB", "LA": "L", "La": "L", "PA": "RGB"}
# The background transparent pixels are composited onto; see the module docstring for why white.
BACKGROUND = 255


def decode_image(source: bytes | str | os.PathLike | BinaryIO, mode: str | None = None) -> Image.Image:
    """Decode an image file (a path, its bytes, or an open binary file) to an upright 8-bit PIL image.

    Args:
        source: the encoded image.
        mode: `"L"` or `"RGB"`; `None` keeps the image's own kind: `"L"` for grayscale sources (L, LA, 1-bit,
            16-bit, float), `"RGB"` for everything else.

    Returns:
        A loaded image in `mode` with EXIF orientation applied and transparency composited onto white.

    Raises:
        Whatever Pillow raises for a file it cannot read (`UnidentifiedImageError`, `OSError`, ...), and
        `ValueError` for a `mode` other than `"L"`, `"RGB"` or `None`.
    """
    if mode not in (None, "L", "RGB"):
        raise ValueError(f"`mode` must be 'L', 'RGB' or None, got {mode!r}.")
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(source)
    with Image.open(source) as image:
        image.load()  # decode now, inside the caller's error handling, rather than lazily later
        ImageOps.exif_transpose(image, in_place=True)
        image = _to_8_bit(image)
    return image if mode is None or image.mode == mode else image.convert(mode)


def _to_8_bit(image: Image.Image) -> Image.Image:
    """The image as 8-bit `"L"` (grayscale sources) or `"RGB"` (all others), without alpha."""
    if image.mode in ("L", "RGB"):
        return image
    if image.mode in SIXTEEN_BIT_MODES:
        values = np.clip(np.asarray(image), 0, 65535).astype(np.uint16)  # (H, W)
        return Image.fromarray((values >> 8).astype(np.uint8))
    if image.mode in ("1", "F"):
        return image.convert("L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ALPHA_MODES:
        colour_mode = ALPHA_MODES[image.mode]
        image = image.convert(colour_mode + "A")  # un-premultiplies RGBa / La, expands PA
        background = Image.new(colour_mode, image.size, (BACKGROUND,) * len(colour_mode))
        background.paste(image.convert(colour_mode), mask=image.getchannel("A"))
        return background
    return image.convert("RGB")
