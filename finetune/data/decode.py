"""One image decoding for training, predict and attention maps: a file or its bytes -> an upright 8-bit image.

`decode_image` is how every command reads an image, so a file gives the same pixels whichever reads it: EXIF
orientation applied; transparency composited onto white, as viewers show it (the colour under it is arbitrary, often
black); 16-bit grayscale keeps the high byte (Pillow's conversion clips above 255 to white); other modes become RGB,
1-bit and float images grayscale; RGB asked for as `"L"` takes Pillow's luma (`finetune.augment.LUMA_WEIGHTS`).

`decode_images` decodes a whole split, in parallel, into one uint8 `(N, C, H, W)` `.npy` file: images of one size no
larger than the run's storage size (`finetune.models.storage_size`) as they are, others as centre squares at that size
(`decode_size` overrides). Squares rather than padding: a batch is one index into one array, padding would store empty
pixels, and the edges dropped are what center-crop evaluation and RandomResizedCrop rarely reach anyway.
"""

import collections
import concurrent.futures
import io
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps


logger = logging.getLogger(__name__)


# Modes whose values are 16-bit intensities (mode "I" holds 32-bit ints; 16-bit PGM files open as "I").
SIXTEEN_BIT_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})
# Alpha modes, premultiplied ones included, and the mode of their colour part.
ALPHA_MODES = {"RGBA": "RGB", "RGBa": "RGB", "LA": "L", "La": "L", "PA": "RGB"}
MAX_LISTED_CORRUPT = 10  # corrupt images named in the warning of a split
# Phone cameras take 200 MP photos, past Pillow's decompression-bomb limit (an error above 179 MP), which would skip
# them as "corrupt": four times Pillow's default (an error above 716 MP); a JPEG decodes at 1/8 scale (`draft`).
if Image.MAX_IMAGE_PIXELS == 89_478_485:  # Pillow's default: a limit set by the caller (or None) is kept
    Image.MAX_IMAGE_PIXELS = 4 * 89_478_485


def decode_image(
    source: bytes | str | os.PathLike | BinaryIO, mode: str | None = None, min_size: int | None = None
) -> Image.Image:
    """Decode an image file (a path, its bytes, or an open binary file) to an upright 8-bit PIL image in `mode`
    (`"L"`, `"RGB"`, or `None`: `"L"` for grayscale sources, else `"RGB"`). With `min_size`, the size the image is
    about to be reduced to, a large JPEG decodes at 1/2, 1/4 or 1/8 scale (Pillow's `draft`): a 4000 x 3000 photo
    stored at 256 px decodes about 10x faster. Raises what Pillow raises for a file it cannot read."""
    if mode not in (None, "L", "RGB"):
        raise ValueError(f"`mode` must be 'L', 'RGB' or None, got {mode!r}.")
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(source)
    with Image.open(source) as image:
        if min_size is not None:
            image.draft(None, (min_size, min_size))  # JPEG only; other formats ignore it
        image.load()  # decode now, inside the caller's error handling, rather than lazily later
        ImageOps.exif_transpose(image, in_place=True)
        image = _to_8_bit(image)
    return image if mode is None or image.mode == mode else image.convert(mode)


def center_fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` scaled to cover `size` (width, height), then its centre window of that size: how photos of mixed sizes
    are stored, and how predict and attention frame a photo before evaluation's resize."""
    return ImageOps.fit(image, size, Image.BILINEAR)


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
        background = Image.new(colour_mode, image.size, (255,) * len(colour_mode))  # white: see the module docstring
        background.paste(image.convert(colour_mode), mask=image.getchannel("A"))
        return background
    return image.convert("RGB")


# Images per task of the decoding pool: large enough to amortize the hand-over, small enough to spread a split.
DECODE_CHUNK = 128


def _probe(data: bytes | None, path: str | None) -> tuple[str, tuple[int, int]]:
    """The mode and upright `(width, height)` of an image from its header, without decoding its pixels."""
    if data is None and path is None:
        raise ValueError("the image is missing (no bytes, no path)")
    with Image.open(io.BytesIO(data) if data is not None else path) as image:
        width, height = image.size
        # EXIF orientations that turn the image by 90 degrees; Pillow gives a TIFF's size upright already (where its
        # size is not the stored one, tags 256 and 257), a JPEG's, PNG's or WebP's as stored.
        stored = (image.tag_v2.get(256), image.tag_v2.get(257)) if hasattr(image, "tag_v2") else image.size
        if image.getexif().get(0x0112) in (5, 6, 7, 8) and image.size == stored:
            width, height = height, width
        mode = image.mode
    grayscale = mode in ("L", "1", "F") or mode in SIXTEEN_BIT_MODES or ALPHA_MODES.get(mode) == "L"
    return "L" if grayscale else "RGB", (width, height)


def _decode_chunk(path: str, first_row: int, items: list, mode: str, size: tuple[int, int]) -> list[tuple[int, str]]:
    """Decode `items` into rows `first_row...` of the `.npy` file at `path`; returns `(index, error)` of the failures.
    Runs in the decoding pool's worker processes (or inline for small splits)."""
    pixels = np.load(path, mmap_mode="r+")
    failures = []
    for j, (data, image_path) in enumerate(items):
        try:
            image = decode_image(data if data is not None else image_path, mode, min(size))
            if image.size != size:
                image = center_fit(image, size)
            array = np.asarray(image)
            pixels[first_row + j] = array[None] if mode == "L" else array.transpose(2, 0, 1)  # (H, W, C) -> (C, H, W)
        except Exception as error:  # PIL raises many types (OSError, SyntaxError, ValueError...) for broken files
            failures.append((j, f"{type(error).__name__}: {error}"))
    pixels.flush()
    return failures


def decode_images(
    read_items: Callable[[], Iterator[tuple[bytes | None, str | None]]],
    num_images: int,
    resize_to: tuple[int, int] | None,
    fallback_size: int | None,
    corrupt_images: str,
    where: str,
    out_path: str,
    workers: int,
    positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], bool]:
    """Decode every image once into a uint8 `(N, C, H, W)` `.npy` file at `out_path`: a first pass reads the headers
    (mode, sizes), a second decodes chunks in `workers` processes that write their rows into the file. `positions`
    name corrupt images. Returns the file's read-only memory map, the indices of the images that decoded, the row of
    each, the skipped images, and whether `fallback_size` was used."""

    def corrupt(i: int, path: str | None, error: str) -> None:
        name = f"index {int(positions[i])}" + (f" ({path})" if path else "")
        if corrupt_images == "error":
            raise ValueError(
                f"Could not decode image {name} of {where}: {error}. "
                "Set `corrupt_images=skip` to drop images that cannot be decoded."
            )
        skipped.append(name)
        errors.append(error)

    skipped, errors, modes, sizes = [], [], set(), set()

    def none_decoded() -> ValueError:  # the first error says why: a missing file (a csv's wrong paths) or a broken one
        more = f", and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        return ValueError(f"No image of {where} could be decoded: {skipped[0]}: {errors[0]}{more}.")

    readable = np.zeros(num_images, dtype=bool)
    for i, (data, path) in enumerate(read_items()):
        try:
            mode, size = _probe(data, path)
        except Exception as error:
            corrupt(i, path, f"{type(error).__name__}: {error}")
            continue
        readable[i] = True
        modes.add(mode)
        sizes.add(size)
    if not readable.any():
        raise none_decoded()
    mode = "RGB" if "RGB" in modes else "L"
    used_fallback = False
    if resize_to is not None:
        size = (resize_to[1], resize_to[0])  # (height, width) -> Pillow's (width, height)
        if sizes != {size}:
            logger.info(f"Storing the images of {where} at {size[0]}x{size[1]} (resized to cover it, centre kept).")
    elif len(sizes) == 1 and (fallback_size is None or min(next(iter(sizes))) <= fallback_size):
        size = next(iter(sizes))
    elif fallback_size is None:
        (width, height), *_ = sorted(sizes)
        raise ValueError(
            f"The images of {where} differ in size ({width}x{height} and others) and no size to store them at is "
            "known: set `decode_size` (the model's size does this in `finetune.run`)."
        )
    else:
        size, used_fallback = (fallback_size, fallback_size), True
        why = "differ in size" if len(sizes) > 1 else "are {}x{}, larger than the model needs".format(*sizes.pop())
        logger.info(
            f"The images of {where} {why}: storing them as {fallback_size}x{fallback_size} squares "
            "(shorter side resized, centre kept)."
        )

    rows = np.cumsum(readable) - 1  # (num_images,) the row of each readable image
    shape = (int(readable.sum()), 1 if mode == "L" else 3, size[1], size[0])  # (N, C, H, W)
    np.lib.format.open_memmap(out_path, "w+", np.uint8, shape)  # the file at full size: workers map it, write rows
    failed = np.zeros(num_images, dtype=bool)
    from transformers.utils import logging as hf_logging  # its bar follows transformers' progress-bar switch

    progress = hf_logging.tqdm(total=num_images, desc="Decoding images", unit="img", leave=False)

    def collect(indices: list[int], paths: list[str | None], failures: list[tuple[int, str]]) -> None:
        for j, error in failures:
            failed[indices[j]] = True
            corrupt(indices[j], paths[j], error)
        progress.update(len(indices))

    def chunks() -> Iterator[tuple[list[int], list]]:
        readable_items = ((i, item) for i, item in enumerate(read_items()) if readable[i])
        while chunk := list(itertools.islice(readable_items, DECODE_CHUNK)):
            yield [i for i, _ in chunk], [item for _, item in chunk]

    try:
        if workers <= 1 or num_images <= DECODE_CHUNK:
            for indices, items in chunks():
                collect(indices, [p for _, p in items], _decode_chunk(out_path, rows[indices[0]], items, mode, size))
        else:
            _decode_in_pool(chunks(), out_path, rows, mode, size, workers, collect)
    finally:
        progress.close()
    if skipped:
        listed = ", ".join(skipped[:MAX_LISTED_CORRUPT]) + (", ..." if len(skipped) > MAX_LISTED_CORRUPT else "")
        missing = sum(error.startswith("FileNotFoundError") for error in errors)  # a table's paths to no file
        what = {0: "corrupt image(s)", len(skipped): "missing image file(s)"}.get(
            missing, f"images ({missing} missing files, {len(skipped) - missing} corrupt)"
        )
        logger.warning(f"Skipped {len(skipped)} {what} of {where} ({errors[0]} for the first): {listed}.")
    kept = np.flatnonzero(readable & ~failed)
    if len(kept) == 0:
        raise none_decoded()
    if len(skipped) > num_images / 2:  # a run on what is left would say little, and exit 0
        raise ValueError(
            f"{len(skipped)} of the {num_images} images of {where} could not be decoded ({errors[0]} for the first): "
            "`corrupt_images: skip` leaves out a few broken files, not most of a split. Fix: repair or re-export the "
            "files (a table's image paths are read relative to the table)."
        )
    return np.load(out_path, mmap_mode="r"), kept, rows[kept], skipped, used_fallback


def _decode_in_pool(chunks, out_path, rows, mode, size, workers, collect) -> None:
    """Decode `chunks` in a pool of `workers` processes, with at most two chunks per worker in flight (memory)."""
    # fork starts workers at once (they only need PIL and numpy, already imported); elsewhere the default method.
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    pending = collections.deque()
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_exit_with_parent, initargs=(os.getpid(),)
    ) as pool:
        try:
            for indices, items in chunks:
                future = pool.submit(_decode_chunk, out_path, int(rows[indices[0]]), items, mode, size)
                pending.append((indices, [p for _, p in items], future))
                if len(pending) == 2 * workers:
                    indices, paths, future = pending.popleft()
                    collect(indices, paths, future.result())
            for indices, paths, future in pending:
                collect(indices, paths, future.result())
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _exit_with_parent(parent: int) -> None:
    """A pool worker's start: it exits once its parent is gone (`kill -9` shuts no pool down), instead of waiting
    forever, with a copy of the run's memory, for chunks that no one will send."""

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
