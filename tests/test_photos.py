"""Photos of mixed sizes: the storage size read from the model, a folder of mixed-size JPEGs stored as center-cropped
squares, and both model paths trained on it."""

import numpy as np
from PIL import Image
from transformers import BitImageProcessor, ViTConfig, ViTForImageClassification, ViTImageProcessor

from finetune.arguments import DataArguments, ModelArguments, ScratchViTArguments
from finetune.data import load_image_data
from finetune.models import storage_size


CLASSES = ["beans", "leaves", "pods"]
# (width, height) of the photos, landscape, portrait and square; no two classes share a size pattern.
SIZES = [(40, 30), (24, 36), (32, 32), (50, 20)]


def write_photo_folder(root, per_class: int = 4, seed: int = 0):
    """JPEGs of mixed sizes in one subfolder per class; each class has its own dominant colour channel."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            width, height = SIZES[(i + k) % len(SIZES)]
            image = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
            image[..., k] += 180
            Image.fromarray(image).save(root / name / f"{i}.jpg", quality=95)
    return root


def tiny_vit_checkpoint(path, processor) -> str:
    config = ViTConfig(
        image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    ViTForImageClassification(config).save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)


def test_storage_size_comes_from_the_model_with_a_crop_margin(tmp_path):
    scratch = ScratchViTArguments(image_size=224)
    assert storage_size("scratch", ModelArguments(model_type="scratch"), scratch) == 256
    vit = tiny_vit_checkpoint(tmp_path / "vit", ViTImageProcessor(size={"height": 112, "width": 112}))
    assert storage_size("pretrained", ModelArguments(model_name_or_path=vit), scratch) == 128
    # A processor that resizes then center-crops (ConvNeXt, BiT): its resize size when that is the larger.
    cropping = BitImageProcessor(size={"shortest_edge": 160}, crop_size={"height": 112, "width": 112})
    bit = tiny_vit_checkpoint(tmp_path / "bit", cropping)
    assert storage_size("pretrained", ModelArguments(model_name_or_path=bit), scratch) == 160
    assert storage_size("both", ModelArguments(model_type="both", model_name_or_path=vit), scratch) == 256


def test_mixed_size_photos_are_stored_as_center_cropped_squares(tmp_path):
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    wide = np.zeros((20, 60, 3), np.uint8)  # left third red, middle green, right third blue
    wide[:, :20, 0], wide[:, 20:40, 1], wide[:, 40:, 2] = 255, 255, 255
    Image.fromarray(wide).save(root / "a" / "wide.png")
    Image.fromarray(np.full((30, 10, 3), 128, np.uint8)).save(root / "b" / "tall.png")
    args = DataArguments(dataset_name=str(root), validation_size=1, decoded_cache_dir="none")
    data = load_image_data(args, seed=0, target_size=20)  # the wide photo needs no resize, only the crop
    assert data.train.image_size == (20, 20) and data.validation.image_size == (20, 20)
    images = {int(split.labels[0]): split.pixel_values[0] for split in (data.train, data.validation)}
    # The wide photo keeps its green middle only, with its aspect ratio (no squeeze).
    assert images[0][1].min() == 255 and images[0][0].max() == 0 and images[0][2].max() == 0
    assert int(images[1].float().mean().round()) == 128


def test_a_folder_of_mixed_size_photos_loads_without_options(tmp_path):
    root = write_photo_folder(tmp_path / "photos")
    data = load_image_data(DataArguments(dataset_name=str(root), decoded_cache_dir="none"), seed=0, target_size=18)
    assert data.train.image_size == (18, 18) and len(data.train) + len(data.validation) == 12
    # Each class's own colour channel dominates after decoding and cropping.
    for split in (data.train, data.validation):
        means = split.pixel_values.float().mean(dim=(2, 3))  # (N, C, H, W) -> (N, C)
        assert means.argmax(dim=1).tolist() == split.labels.tolist()
