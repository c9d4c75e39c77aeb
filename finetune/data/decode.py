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

`_decode_images` decodes a whole split with it into one uint8 `(N, C, H, W)` array (one mode and size for all).
Images of one size (CIFAR-10's 32 px, MNIST's 28 px) are stored as they are. Images of mixed sizes (photos) are
stored as squares at the run's storage size (`finetune.models.storage_size`: the model's input plus a margin for
crops, 256 for a 224 model; `decode_size` overrides): the shorter side is resized to it and the centre square kept.
A center-cropped square, rather than padding to a common size with each image's extent recorded, because

- every row of the cache has the same shape, so a batch is one index into one array and the device ops (random
  resized crop, flip, resize) run on whole batches with no per-image sizes to carry;
- padding a 640x480 photo to 640x640 stores a third of empty pixels, and a set with a few panoramas would be mostly
  padding; a square at the storage size bounds the cache at `N * 3 * S * S` bytes whatever the photos;
- the edges it drops are what evaluation drops anyway: image processors that center-crop keep the middle, and
  RandomResizedCrop samples boxes of at most the whole square, which at the default scale (0.08, 1) rarely reach
  the edges of a photo.
"""

import io
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO

import datasets
import numpy as np
import pyarrow as pa
from PIL import Image, ImageOps
from transformers.utils import logging


logger = logging.get_logger(__name__)


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
MAX_LISTED_CORRUPT = 10  # corrupt images named in the warning of a split


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


# ---------------------------------------------------------------------------------------------------------------------
# Decoding a whole split


def _image_items(dataset: datasets.Dataset, column: str) -> Iterator[tuple[bytes | None, str | None]]:
    """`(bytes, path)` of every image, read from arrow in batches so the encoded images never all sit in Python."""
    for batch in dataset.select_columns([column]).with_format("arrow").iter(batch_size=1000):
        values = batch.column(column).combine_chunks()
        if isinstance(values.type, pa.StructType):
            data = values.field("bytes").to_pylist() if values.type.get_field_index("bytes") >= 0 else None
            paths = values.field("path").to_pylist() if values.type.get_field_index("path") >= 0 else None
            n = len(values)
            yield from zip(data or [None] * n, paths or [None] * n)
        elif values.type in (pa.string(), pa.large_string()):
            yield from ((None, path) for path in values.to_pylist())
        elif values.type in (pa.binary(), pa.large_binary()):
            yield from ((data, None) for data in values.to_pylist())
        else:
            raise ValueError(
                f"The image column {column!r} holds {values.type}; expected encoded images (an Image feature, bytes) "
                "or image file paths. Set `image_column_name` if another column holds the images."
            )


class _Restart(Exception):
    """Raised inside a decoding pass when a later image shows the pass started with the wrong mode or size."""

    def __init__(self, mode: str | None = None, size: tuple[int, int] | None = None):
        self.mode, self.size = mode, size


def _decode_images(
    read_items: Callable[[], Iterator[tuple[bytes | None, str | None]]],
    num_images: int,
    resize_to: int | None,
    fallback_size: int | None,
    corrupt_images: str,
    where: str,
) -> tuple[np.ndarray, np.ndarray, list[str], bool]:
    """Decode every image once to uint8 `(N, C, H, W)`.

    The first image decides the starting mode ("L" for grayscale, else "RGB") and size; a pass restarts in RGB when
    a colour image follows grayscale ones, and at `fallback_size` when sizes differ. Restarts are rare and happen at
    most once each, which keeps the common case to one pass into a preallocated array.

    Returns:
        `(pixels, kept, skipped, used_fallback)`: the decoded images, the indices of the images kept, descriptions of
        the skipped corrupt images, and whether the images were resized to `fallback_size` because their sizes differ.
    """
    mode = None
    size = (resize_to, resize_to) if resize_to is not None else None
    while True:
        try:
            pixels, kept, skipped = _decode_pass(read_items(), num_images, mode, size, corrupt_images, where)
        except _Restart as restart:
            if restart.mode is not None:
                mode = restart.mode
            if restart.size is not None:
                if fallback_size is None:
                    raise ValueError(
                        f"The images of {where} differ in size ({restart.size[0]}x{restart.size[1]} and others) "
                        "and no size to store them at is known: set `decode_size` (the model's size does this in "
                        "`finetune.run`)."
                    ) from None
                size = (fallback_size, fallback_size)
                logger.info(
                    f"The images of {where} differ in size: storing them as {fallback_size}x{fallback_size} squares "
                    "(shorter side resized, centre kept)."
                )
            continue
        if skipped:
            listed = ", ".join(skipped[:MAX_LISTED_CORRUPT]) + (", ..." if len(skipped) > MAX_LISTED_CORRUPT else "")
            logger.warning(f"Skipped {len(skipped)} corrupt image(s) of {where} that could not be decoded: {listed}.")
        used_fallback = resize_to is None and size is not None
        return pixels, np.asarray(kept, dtype=np.int64), skipped, used_fallback


def _decode_pass(items, num_images, mode, size, corrupt_images, where):
    pixels, kept, skipped = None, [], []
    first_size = None
    progress = logging.tqdm(total=num_images, desc="Decoding images", unit="img", leave=False)
    for i, (data, path) in enumerate(items):
        name = f"index {i}" + (f" ({path})" if path else "")
        try:
            if data is None and path is None:
                raise ValueError("the image is missing (no bytes, no path)")
            # Before the mode is known (or while it is "L"), an image decodes to its own kind; a colour image among
            # grayscale ones restarts the pass in RGB.
            image = decode_image(data if data is not None else path, "RGB" if mode == "RGB" else None)
            if mode is None:
                mode = image.mode
            elif image.mode != mode:
                raise _Restart(mode="RGB")
            if size is None:
                first_size = first_size or image.size
                if image.size != first_size:
                    raise _Restart(size=image.size)
            elif image.size != size:
                image = ImageOps.fit(image, size, Image.BILINEAR)  # shorter side to the size, centre square kept
            array = np.asarray(image)
        except _Restart:
            progress.close()
            raise
        except Exception as error:  # PIL raises many types (OSError, SyntaxError, ValueError...) for broken files
            if corrupt_images == "error":
                progress.close()
                raise ValueError(
                    f"Could not decode image {name} of {where}: {type(error).__name__}: {error}. "
                    "Set `corrupt_images=skip` to drop images that cannot be decoded."
                ) from error
            skipped.append(name)
            progress.update(1)
            continue
        if pixels is None:
            channels = 1 if mode == "L" else 3
            pixels = np.empty((num_images, channels, *array.shape[:2]), dtype=np.uint8)
        pixels[len(kept)] = array[None] if mode == "L" else array.transpose(2, 0, 1)  # (H, W, C) -> (C, H, W)
        kept.append(i)
        progress.update(1)
    progress.close()
    if pixels is None:
        raise ValueError(f"No image of {where} could be decoded ({len(skipped)} corrupt).")
    return pixels[: len(kept)], kept, skipped
