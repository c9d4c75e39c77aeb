"""The offline quickstart: `python -m finetune.tools.quickstart [--key value ...]`.

1. Writes a randomly initialised small transformers `ViTForImageClassification` (8 px, patch 2) and its image
   processor, the starting point of a "pretraining" (no Hub checkpoint is reachable offline).
2. Pretrains it on the digits 0-4 of the training split (`configs/quickstart_source.yaml`).
3. Runs `configs/quickstart.yaml`: that checkpoint fine-tuned on all ten digits (a new 10-class head) next to a
   ScratchViT trained from scratch on the same split, then the comparison report in `outputs/quickstart/comparison`.
4. Writes 30 digits of each class as PNG files into `outputs/quickstart/digits/<class>/`, an image folder to try
   `predict`, `attention` and a run on your own images with.

Steps whose output already exists are skipped (a model of step 2 or 3 stopped midway resumes from its checkpoint);
extra `--key value` arguments go to step 3, which then refuses to replace models it trained earlier unless also given
`--overwrite_output_dir true`.
"""

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from finetune.errors import ArgumentParser, run_command
from finetune.locations import partial_folder


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SOURCE_INIT_FILES = ("config.json", "model.safetensors", "preprocessor_config.json")


def ensure_source_init(path: Path, make: Callable[[Path], None] | None = None) -> None:
    """`make` (`make_source_init`) at `path`, written beside it and renamed into place: a stop midway left a folder
    without weights (or with an empty config.json) that every later quickstart refused. One left so is made again."""
    if all((path / name).is_file() for name in SOURCE_INIT_FILES):
        return
    partial = partial_folder(path, "quickstart")
    try:
        (make or make_source_init)(partial)
        shutil.rmtree(path, ignore_errors=True)  # an incomplete one of ours: made again
        partial.rename(path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def make_source_init(path: Path) -> None:
    """A randomly initialised ViT for 8x8 grayscale digits, with an image processor (values in [0, 1], 0.5 std);
    seeded, so that every quickstart starts from the same weights and reproduces the README's figures."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor, set_seed
    from transformers.utils import logging

    logging.disable_progress_bar()  # "Writing model shards" in a log file, as `finetune.run` switches it off
    set_seed(0)
    config = ViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=128, num_labels=5,
    )  # fmt: skip
    ViTForImageClassification(config).save_pretrained(path)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5]).save_pretrained(path)


def write_sample_images(folder: Path, per_class: int = 30) -> None:
    """`per_class` of scikit-learn's digits of each class (the last ones, most of them training images) as grayscale
    PNG files in `folder/<class>/`, at their 8x8 pixels as `sklearn:digits` holds them: `predict` reads the pixels the
    run read (written 4x larger, they went through a blurring resize back to 8 px)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for label in range(10):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        for n, image in enumerate(digits.images[digits.target == label][-per_class:]):
            pixels = np.round(image * (255.0 / 16.0)).astype(np.uint8)  # (8, 8) in 0-16 -> 0-255, as the source
            Image.fromarray(pixels, "L").save(folder / str(label) / f"{n:02d}.png")


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(
        prog="python -m finetune.tools.quickstart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # every other argument goes to `finetune.run` as it is
    )
    _, argv = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    from finetune import run

    root = Path("outputs/quickstart")
    source_results = root / "source_model" / "results.json"
    if source_results.exists() and "held_out_images" not in source_results.read_text():
        raise ValueError(
            f"{root} was made by an earlier version, whose source model trained on images the fine-tuned model was "
            f"then validated on (its split drawn from the digits 0-4 alone). Fix: remove {root} and run the "
            "quickstart again."
        )
    ensure_source_init(root / "source_init")
    if not source_results.exists():  # stopped midway: it goes on from its checkpoint
        source = ["--resume_from_checkpoint", "auto", "--overwrite_output_dir", "true"]
        run.main(["--config", str(CONFIGS / "quickstart_source.yaml"), *source])
    # Without arguments, `auto` keeps each finished model (a rerun used to retrain them silently), resumes a stopped
    # one and starts one not begun; other options make another run, which `finetune.run` guards as any.
    keep = [] if argv else ["--resume_from_checkpoint", "auto"]
    results = run.main(["--config", str(CONFIGS / "quickstart.yaml"), *keep, *argv])
    write_sample_images(root / "digits")
    print(f"  sample digits: {root / 'digits'}/ (an image folder of 300 PNG files, to try predict and attention on)")
    return results


if __name__ == "__main__":
    sys.exit(run_command(main))
