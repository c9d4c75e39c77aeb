"""One image decoding for training, predict and attention: the same odd files give the same pixels on every path.

The files are written with Pillow: RGBA and LA with transparent pixels, a palette with a transparent colour, CMYK
JPEG, 16-bit PNG and PGM, an EXIF-rotated JPEG and a 1-bit PNG. Each is read by training's loader
(`load_image_data` over a csv of the files), by `predict.load_images` (which `finetune.tools.attention` uses too), and
checked against the values the decoding documents.
"""

import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import torch
from PIL import Image

from finetune.arguments import DataArguments
from finetune.augment import LUMA_WEIGHTS, RGBToGrayscale
from finetune.data import load_image_data
from finetune.data.decode import decode_image
from finetune.data.sources import IMAGE_EXTENSIONS
from finetune.models import channel_statistics
from finetune.tools.predict import collect_image_paths, load_images


# Every file decodes to WIDTH x HEIGHT (the rotated JPEG once turned upright), so training stores them in one tensor.
WIDTH, HEIGHT = 16, 8
EXIF_ORIENTATION = 0x0112


def _rgba(tmp):
    pixels = np.zeros((HEIGHT, WIDTH, 4), dtype=np.uint8)
    pixels[...] = (200, 100, 0, 255)
    pixels[0, 0] = (10, 20, 30, 0)  # fully transparent over a dark colour
    pixels[0, 1] = (0, 0, 0, 128)  # half transparent black
    Image.fromarray(pixels, "RGBA").save(tmp / "rgba.png")
    return tmp / "rgba.png"


def _la(tmp):
    pixels = np.zeros((HEIGHT, WIDTH, 2), dtype=np.uint8)
    pixels[...] = (50, 255)
    pixels[0, 0] = (50, 0)
    Image.fromarray(pixels, "LA").save(tmp / "la.png")
    return tmp / "la.png"


def _palette(tmp):
    image = Image.new("P", (WIDTH, HEIGHT), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * (254 * 3))  # index 0 black, index 1 red
    image.putpixel((0, 0), 0)
    image.save(tmp / "palette.png", transparency=0)  # index 0 is transparent
    return tmp / "palette.png"


def _cmyk(tmp):
    Image.new("CMYK", (WIDTH, HEIGHT), (0, 255, 255, 0)).save(tmp / "cmyk.jpg", quality=100)  # red
    return tmp / "cmyk.jpg"


def _gray16(tmp, suffix):
    pixels = np.full((HEIGHT, WIDTH), 40000, dtype=np.uint16)
    pixels[0, 0], pixels[0, 1] = 65535, 255
    Image.fromarray(pixels).save(tmp / f"gray16{suffix}")
    return tmp / f"gray16{suffix}"


def _rotated(tmp, suffix=".jpg"):
    """Stored sideways (WIDTH and HEIGHT swapped), top half white, with orientation 6: turn 90 degrees clockwise. A
    TIFF's size Pillow already gives upright, where it gives a JPEG's as stored."""
    pixels = np.zeros((WIDTH, HEIGHT, 3), dtype=np.uint8)  # (H, W, C): stored HEIGHT x WIDTH swapped
    pixels[: WIDTH // 2] = 255
    image = Image.fromarray(pixels, "RGB")
    exif = image.getexif()
    exif[EXIF_ORIENTATION] = 6
    image.save(tmp / f"rotated{suffix}", exif=exif, **({"quality": 95} if suffix == ".jpg" else {}))
    return tmp / f"rotated{suffix}"


def _one_bit(tmp):
    pixels = np.zeros((HEIGHT, WIDTH), dtype=bool)
    pixels[:, ::2] = True
    Image.fromarray(pixels).save(tmp / "bits.png")
    return tmp / "bits.png"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("odd")
    paths = {
        "rgba": _rgba(tmp),
        "la": _la(tmp),
        "palette": _palette(tmp),
        "cmyk": _cmyk(tmp),
        "gray16_png": _gray16(tmp, ".png"),
        "gray16_pgm": _gray16(tmp, ".pgm"),
        "rotated": _rotated(tmp),
        "rotated_tiff": _rotated(tmp, ".tif"),
        "bits": _one_bit(tmp),
    }
    modes = {name: Image.open(path).mode for name, path in paths.items()}
    assert modes == {
        "rgba": "RGBA",
        "la": "LA",
        "palette": "P",
        "cmyk": "CMYK",
        "gray16_png": "I;16",
        "gray16_pgm": "I",
        "rotated": "RGB",
        "rotated_tiff": "RGB",
        "bits": "1",
    }, "the files must exercise these Pillow modes"
    return paths


def _training_pixels(tmp_path, paths) -> np.ndarray:
    """The files through training's loader, in order: uint8 `(N, C, H, W)`."""
    index = tmp_path / "index.csv"
    index.write_text("image,label\n" + "".join(f"{path},{i}\n" for i, path in enumerate(paths)))
    args = DataArguments(train_file=str(index), validation_file=str(index), decoded_cache_dir="none")
    data = load_image_data(args, seed=0)
    assert data.train.labels.tolist() == list(range(len(paths)))  # kept in file order, none skipped
    return data.train.pixel_values.numpy()


def _predict_pixels(paths, mode) -> np.ndarray:
    """The files through predict's reader (attention's too), as `(N, C, H, W)`."""
    images, _, skipped = load_images(paths, mode)
    assert not skipped
    arrays = [np.asarray(image) for image in images]
    return np.stack([a[None] if a.ndim == 2 else a.transpose(2, 0, 1) for a in arrays])  # (H, W, C) -> (C, H, W)


def test_training_and_predict_decode_every_file_alike(files, tmp_path):
    paths = list(files.values())
    training = _training_pixels(tmp_path, paths)  # colour files among them: the split is RGB
    assert training.shape == (len(paths), 3, HEIGHT, WIDTH)
    np.testing.assert_array_equal(training, _predict_pixels(paths, "RGB"))
    np.testing.assert_array_equal(
        training, np.stack([np.asarray(decode_image(p, "RGB")).transpose(2, 0, 1) for p in paths])
    )


def test_grayscale_files_stay_grayscale_alike(files, tmp_path):
    paths = [files[name] for name in ("la", "gray16_png", "gray16_pgm", "bits")]
    training = _training_pixels(tmp_path, paths)
    assert training.shape == (len(paths), 1, HEIGHT, WIDTH)
    np.testing.assert_array_equal(training, _predict_pixels(paths, "L"))
    assert [decode_image(p).mode for p in paths] == ["L"] * len(paths)


def test_documented_values(files):
    rgba = np.asarray(decode_image(files["rgba"]))
    assert rgba[0, 0].tolist() == [255, 255, 255]  # transparent: white, not the hidden dark colour
    assert rgba[0, 1].tolist() == [127, 127, 127]  # half transparent black over white
    assert rgba[1, 1].tolist() == [200, 100, 0]  # opaque: unchanged

    la = np.asarray(decode_image(files["la"]))
    assert la[0, 0] == 255 and la[1, 1] == 50

    palette = np.asarray(decode_image(files["palette"]))
    assert palette[0, 0].tolist() == [255, 255, 255] and palette[1, 1].tolist() == [255, 0, 0]

    cmyk = np.asarray(decode_image(files["cmyk"])).astype(int)
    assert np.abs(cmyk - [255, 0, 0]).max() <= 2  # red, within JPEG rounding

    for name in ("gray16_png", "gray16_pgm"):
        gray16 = np.asarray(decode_image(files[name]))
        assert gray16.dtype == np.uint8
        assert gray16[1, 1] == 156 and gray16[0, 0] == 255 and gray16[0, 1] == 0  # value >> 8: 40000 -> 156

    bits = np.asarray(decode_image(files["bits"]))
    assert set(np.unique(bits).tolist()) == {0, 255} and bits[0, 0] == 255 and bits[0, 1] == 0


def test_exif_orientation_is_applied(files):
    stored = Image.open(files["rotated"])
    assert stored.size == (HEIGHT, WIDTH)  # (width, height) as stored: sideways
    upright = np.asarray(decode_image(files["rotated"], "L")).astype(int)
    assert upright.shape == (HEIGHT, WIDTH)
    # Orientation 6 turns the image 90 degrees clockwise: the stored top half (white) becomes the right half.
    assert upright[:, WIDTH // 2 :].min() >= 240 and upright[:, : WIDTH // 2].max() <= 15


def test_rgb_to_gray_uses_the_luma_weights(files):
    rgb = np.asarray(decode_image(files["rgba"], "RGB")).astype(np.float64)
    gray = np.asarray(decode_image(files["rgba"], "L")).astype(np.float64)
    np.testing.assert_allclose(gray, rgb @ np.asarray(LUMA_WEIGHTS), atol=1)
    on_device = RGBToGrayscale()(torch.from_numpy(rgb.transpose(2, 0, 1)[None]).float())[0, 0]
    np.testing.assert_allclose(on_device.numpy(), gray, atol=1)


def test_channel_statistics_of_rgb_for_a_gray_model_use_the_luma():
    pixels = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    pixels[:, 0] = 255  # pure red
    mean, std = channel_statistics(pixels, num_channels=1)
    assert mean == [pytest.approx(LUMA_WEIGHTS[0], abs=1e-4)]  # the luma of red, not the channel mean 1/3
    assert std == [pytest.approx(1e-3)]


def test_unknown_mode_and_one_extension_list(files, tmp_path):
    with pytest.raises(ValueError, match="`mode` must be 'L', 'RGB' or None"):
        decode_image(files["rgba"], "RGBA")
    (tmp_path / "folder").mkdir()
    for extension in sorted(IMAGE_EXTENSIONS):
        (tmp_path / "folder" / f"x{extension}").write_bytes(b"")
    (tmp_path / "folder" / "notes.txt").write_text("skipped")
    assert {p.suffix for p in collect_image_paths([tmp_path / "folder"])} == set(IMAGE_EXTENSIONS)


def test_a_large_jpeg_decodes_at_a_reduced_scale_no_smaller_than_asked(tmp_path):
    path = tmp_path / "large.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (600, 800, 3), dtype=np.uint8)).save(path)
    assert decode_image(path, "RGB").size == (800, 600)
    assert decode_image(path, "RGB", min_size=256).size == (400, 300)  # 1/2: 1/4 would give 200 x 150
    assert decode_image(path, "RGB", min_size=70).size == (100, 75)  # 1/8, the decoder's smallest scale
    assert decode_image(path, "RGB", min_size=400).size == (800, 600)  # 1/2 would leave a side under 400
    png = tmp_path / "large.png"
    Image.open(path).save(png)
    assert decode_image(png, "RGB", min_size=70).size == (800, 600)  # other formats decode whole


# Kills itself (as `kill -9` would) once the decoding workers are started, printing their process ids first.
KILLED_WHILE_DECODING = """
import concurrent.futures, multiprocessing, os, signal, sys
from finetune.arguments import DataArguments
from finetune.data import load_image_data

submit, calls = concurrent.futures.ProcessPoolExecutor.submit, []
def submit_then_die(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the workers decode the first chunk
        print(*[child.pid for child in multiprocessing.active_children()], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return submit(self, *args, **kwargs)
concurrent.futures.ProcessPoolExecutor.submit = submit_then_die
load_image_data(DataArguments(dataset_name=sys.argv[1], decode_workers=2, decoded_cache_dir=sys.argv[2]), seed=0)
"""


def test_a_run_killed_while_decoding_leaves_no_worker_running_and_no_partial_cache(tmp_path, monkeypatch):
    """`kill -9` of a run while it decoded left its decoding workers running forever (each a copy of the run's memory)
    and the half-written cache folder in place."""
    folder, cache, printed = tmp_path / "images", tmp_path / "cache", tmp_path / "pids.txt"
    for i in range(300):  # three chunks of `DECODE_CHUNK`
        (folder / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), i % 256, dtype=np.uint8)).save(folder / f"class{i % 2}" / f"{i}.png")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    script = [sys.executable, "-c", KILLED_WHILE_DECODING, str(folder), str(cache)]
    with printed.open("w") as out:  # a file, not a pipe: the orphans would hold a pipe open
        proc = subprocess.run(script, stdout=out, timeout=300)
    workers = [psutil.Process(int(pid)) for pid in printed.read_text().split()]
    try:
        assert proc.returncode == -signal.SIGKILL and len(workers) == 2
        deadline = time.monotonic() + 10
        while any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers):
            assert time.monotonic() < deadline, "the workers of a killed run must exit"
            time.sleep(0.2)
    finally:
        for worker in workers:
            if worker.is_running():
                worker.kill()
    [partial] = cache.glob(".tmp-*")
    load_image_data(DataArguments(dataset_name=str(folder), decoded_cache_dir=str(cache)), seed=0)
    assert not partial.exists() and len(list(cache.iterdir())) == 1


def test_a_200_megapixel_phone_photo_is_read_not_skipped_as_a_decompression_bomb(tmp_path):
    """16320 x 12240 (a 200 MP phone camera) is past Pillow's default limit: training and predict skipped such photos
    as corrupt, and a folder of them failed with "repair or re-export the files"."""
    path = tmp_path / "phone.jpg"
    Image.new("L", (16320, 12240), 128).save(path, quality=50)
    image = decode_image(path, "RGB", min_size=64)  # at 1/8 scale (`draft`)
    assert image.size == (2040, 1530) and image.getpixel((0, 0)) == (128, 128, 128)
    images, names, skipped = load_images([path], None, 64)
    assert names == [str(path)] and not skipped


def test_a_damaged_png_chunk_is_skipped_by_predict_as_by_training(tmp_path):
    """Pillow raises SyntaxError ("broken PNG file") for a damaged chunk: predict, attention and export stopped on it
    with an error naming no file, where training skips the file and names it."""
    good, broken = tmp_path / "good.png", tmp_path / "broken.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (400, 400, 3), dtype=np.uint8)).save(good)
    data = bytearray(good.read_bytes())
    second = data.index(b"IDAT", data.index(b"IDAT") + 4) - 4  # the second IDAT chunk's length and type: zeroed
    data[second : second + 8] = bytes(8)
    broken.write_bytes(bytes(data))
    images, names, skipped = load_images([good, broken], None)
    assert names == [str(good)] and [path for path, _ in skipped] == [str(broken)], skipped
    assert skipped[0][1].startswith("SyntaxError: broken PNG file"), skipped
