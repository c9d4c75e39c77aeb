"""BatchTransform: values against direct references, and each random op checked image by image."""

import importlib.util
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from finetune.augment import (
    BatchTransform,
    MixUpCutMix,
    RandomAugmentOps,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    describe_augmentation,
    preprocessing_from,
    resized_crop,
    use_random_resized_crop,
)
from finetune.models import check_channels


MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _images(batch=8, channels=3, size=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, channels, size, size), dtype=torch.uint8, generator=generator)


def _normalized(x, mean=MEAN, std=STD):
    mean = torch.tensor(mean).view(1, -1, 1, 1)
    std = torch.tensor(std).view(1, -1, 1, 1)
    return (x.float() / 255 - mean) / std


def test_eval_path_is_exact_normalization():
    x = torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8).view(1, 1, 2, 3).repeat(2, 3, 1, 1)
    transform = BatchTransform((2, 3), MEAN, STD, in_channels=3, out_channels=3)
    out = transform(x, train=False)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 2, 3)
    torch.testing.assert_close(out, _normalized(x), rtol=0, atol=0)
    # Spot check against numbers written out by hand: channel 0 at pixel value 255 and 0.
    assert out[0, 0, 1, 2].item() == pytest.approx((1.0 - 0.485) / 0.229, abs=1e-6)
    assert out[0, 0, 0, 0].item() == pytest.approx(-0.485 / 0.229, abs=1e-6)


def test_eval_path_is_deterministic_and_train_is_random():
    x = _images(batch=32)
    transform = BatchTransform(12, MEAN, STD, 3, 3)
    assert torch.equal(transform(x, train=False), transform(x, train=False))
    torch.manual_seed(0)
    first = transform(x, train=True)
    torch.manual_seed(0)
    assert torch.equal(first, transform(x, train=True)), "the global seed must make training batches reproducible"
    assert not torch.equal(first, transform(x, train=True))


def test_flip_with_probability_one_mirrors_every_image():
    x = _images()
    assert torch.equal(RandomHorizontalFlip(p=1.0)(x), x.flip(-1))
    assert torch.equal(RandomHorizontalFlip(p=0.0)(x), x)


def test_train_flip_leaves_each_image_whole_or_mirrored():
    x = _images(batch=64)
    transform = BatchTransform(12, MEAN, STD, 3, 3, random_crop_padding=0, horizontal_flip=True)
    torch.manual_seed(1)
    out = transform(x, train=True)
    same = (out == _normalized(x)).flatten(1).all(1)
    mirrored = (out == _normalized(x.flip(-1))).flatten(1).all(1)
    assert bool((same | mirrored).all())
    assert 10 < int(mirrored.sum()) < 54, "about half the images should be flipped"


def test_no_augmentation_when_both_are_off():
    x = _images()
    transform = BatchTransform(12, MEAN, STD, 3, 3, random_crop_padding=0, horizontal_flip=False)
    assert torch.equal(transform(x, train=True), transform(x, train=False))


def test_crop_is_a_shifted_window_of_the_zero_padded_image():
    padding = 3
    x = _images(batch=40, size=10)
    torch.manual_seed(2)
    out = RandomCrop(padding)(x)
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = F.pad(x, (padding,) * 4)
    offsets = set()
    for i in range(len(x)):
        # Reference: slide the window over every offset and keep those that reproduce the output exactly.
        matches = [
            (top, left)
            for top in range(2 * padding + 1)
            for left in range(2 * padding + 1)
            if torch.equal(out[i], padded[i, :, top : top + 10, left : left + 10])
        ]
        assert matches, f"image {i} is not a window of its padded input"
        offsets.update(matches)
    assert len(offsets) > 10, "offsets must differ between images"


def test_crop_uses_each_images_own_offset():
    # Constant images with distinct values: a crop that mixed images would show another image's value.
    x = torch.arange(1, 17, dtype=torch.uint8).view(16, 1, 1, 1).expand(16, 3, 8, 8).contiguous()
    out = RandomCrop(2)(x)
    for i in range(16):
        assert set(out[i].unique().tolist()) <= {0, i + 1}


def test_resize_to_224():
    x = _images(batch=2, size=32)
    out = BatchTransform(224, MEAN, STD, 3, 3)(x, train=True)
    assert out.shape == (2, 3, 224, 224) and out.dtype == torch.float32
    # Upscaling a constant image keeps it constant.
    flat = torch.full((1, 3, 32, 32), 200, dtype=torch.uint8)
    torch.testing.assert_close(
        BatchTransform(224, MEAN, STD, 3, 3)(flat, train=False), _normalized(torch.full((1, 3, 224, 224), 200))
    )


def test_downscale_is_antialiased():
    # A 1-pixel checkerboard averages to mid-gray when shrunk 4x; without antialiasing it would alias to 0 or 255.
    board = ((torch.arange(32).view(-1, 1) + torch.arange(32)) % 2 * 255).to(torch.uint8).view(1, 1, 32, 32)
    out = BatchTransform(8, (0.0,), (1.0,), 1, 1)(board, train=False) * 255
    torch.testing.assert_close(out, torch.full_like(out, 127.5), atol=1.0, rtol=0)


def test_grayscale_to_rgb_repeats_and_is_logged_once(caplog):
    x = _images(channels=1)
    with caplog.at_level(logging.INFO, logger="finetune"):
        check_channels(1, 3, convert=True)  # as building the model does, before its transform is made
        transform = BatchTransform(12, MEAN, STD, in_channels=1, out_channels=3)
    messages = [record.getMessage() for record in caplog.records if "channel" in record.getMessage()]
    assert messages == ["Converting 1-channel images to 3 channels by repeating the gray channel."]
    out = transform(x, train=False)
    assert out.shape == (8, 3, 12, 12)
    torch.testing.assert_close(out, _normalized(x.expand(-1, 3, -1, -1)), rtol=0, atol=0)


def test_rgb_to_grayscale_uses_luma_weights():
    x = torch.zeros(3, 3, 2, 2, dtype=torch.uint8)
    for c in range(3):
        x[c, c] = 255  # a pure red, a pure green and a pure blue image
    out = BatchTransform(2, (0.0,), (1.0,), in_channels=3, out_channels=1)(x, train=False)
    assert out.shape == (3, 1, 2, 2)
    torch.testing.assert_close(out[:, 0, 0, 0], torch.tensor([0.299, 0.587, 0.114]))
    rgb = _images(batch=4)
    expected = (0.299 * rgb[:, 0:1].float() + 0.587 * rgb[:, 1:2].float() + 0.114 * rgb[:, 2:3].float()) / 255
    out = BatchTransform(12, (0.0,), (1.0,), in_channels=3, out_channels=1)(rgb, train=False)
    torch.testing.assert_close(out, expected)


def test_device_and_dtype_are_preserved():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        x = _images().to(device)
        out = BatchTransform(16, MEAN, STD, 3, 3)(x, train=True)
        assert out.device.type == device and out.dtype == torch.float32 and out.shape == (8, 3, 16, 16)


def test_bad_input_is_rejected():
    transform = BatchTransform(12, MEAN, STD, 3, 3)
    with pytest.raises(ValueError, match="uint8"):
        transform(_images().float(), train=False)
    with pytest.raises(ValueError, match=r"\(B, 3, h, w\)"):
        transform(_images(channels=1), train=False)
    with pytest.raises(ValueError, match="out_channels"):
        BatchTransform(12, (0.5, 0.5), STD, 3, 3)


def _constant_images(batch=10, size=8):
    # Image i is filled with the value i: every output pixel then tells which source image it came from.
    return torch.arange(batch, dtype=torch.float32).view(batch, 1, 1, 1).expand(batch, 3, size, size).clone()


def test_mixup_is_a_convex_combination_with_labels_mixed_alike():
    x, labels = _constant_images(), torch.arange(10)
    torch.manual_seed(0)
    out, targets = MixUpCutMix(num_labels=10, mixup_alpha=0.8)(x, labels)
    assert targets.shape == (10, 10) and bool((targets >= 0).all())
    torch.testing.assert_close(targets.sum(1), torch.ones(10))
    # Pixel value = sum_k targets[i, k] * k, since image k holds k and has label k.
    expected = targets @ torch.arange(10, dtype=torch.float32)
    torch.testing.assert_close(out, expected.view(10, 1, 1, 1).expand_as(out))
    assert (targets > 0).sum(1).max() <= 2, "each image mixes with one partner"


def test_cutmix_pastes_a_box_whose_area_is_the_label_weight():
    x, labels = _constant_images(size=16), torch.arange(10)
    for seed in range(5):
        torch.manual_seed(seed)
        out, targets = MixUpCutMix(num_labels=10, cutmix_alpha=1.0)(x, labels)
        for i in range(10):
            partner = [k for k in range(10) if k != i and targets[i, k] > 0]
            pasted = (out[i] != i).float().mean()
            if partner:
                assert bool(((out[i] == i) | (out[i] == partner[0])).all())
                assert float(pasted) == pytest.approx(float(targets[i, partner[0]]), abs=1e-6)
            else:  # paired with itself, or an empty box
                assert float(pasted) == 0.0


def test_mixing_both_ways_uses_each_and_is_seeded():
    x, labels = _constant_images(batch=16, size=16), torch.arange(16)
    mix = MixUpCutMix(num_labels=16, mixup_alpha=0.4, cutmix_alpha=1.0)
    torch.manual_seed(7)
    first = mix(x, labels)
    torch.manual_seed(7)
    again = mix(x, labels)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    kinds = set()
    for _ in range(20):  # MixUp leaves every pixel between two values; CutMix only the two values themselves
        out, _ = mix(x, labels)
        kinds.add(bool((out == out.round()).all()))
    assert kinds == {True, False}
    with pytest.raises(ValueError, match="at least one > 0"):
        MixUpCutMix(num_labels=16)


def test_random_erasing_zeroes_one_box_in_about_p_of_the_images():
    x = torch.rand(300, 3, 20, 24) + 1  # no zero anywhere
    torch.manual_seed(0)
    out = RandomErasing(0.5)(x)
    erased = (out == 0).all(1)  # (B, H, W): pixels erased in every channel
    assert torch.equal(out[~erased[:, None].expand_as(out)], x[~erased[:, None].expand_as(x)]), "the rest is kept"
    assert not bool(((out == 0) & ~erased[:, None]).any()), "a box covers every channel"
    boxes = []
    for mask in erased:
        if not mask.any():
            continue
        h, w = int(mask.any(1).sum()), int(mask.any(0).sum())
        boxes.append((int(mask.any(1).float().argmax()), int(mask.any(0).float().argmax()), h, w))
        assert int(mask.sum()) == h * w, "the erased pixels form one rectangle"
        assert 0.02 * 0.5 <= h * w / (20 * 24) <= 0.33 * 1.3 and 0.3 / 2 <= w / h <= 3.3 * 2  # up to rounding
    assert 110 < len(boxes) < 190, "about half the images are erased"
    assert len(set(boxes)) > 100, "each image draws its own box"
    assert torch.equal(RandomErasing(1.0, scale=(0.99, 1.0), ratio=(5.0, 6.0))(x), x), "no box fits: left whole"


def test_batch_transform_erases_only_in_training():
    x = _images(batch=16)
    plain = BatchTransform(12, MEAN, STD, 3, 3, random_crop_padding=0, horizontal_flip=False)
    erasing = BatchTransform(12, MEAN, STD, 3, 3, random_crop_padding=0, horizontal_flip=False, random_erasing=1.0)
    assert torch.equal(erasing(x, train=False), plain(x, train=False))
    out = erasing(x, train=True)
    assert bool(((out == 0).all(1).flatten(1).any(1)).all()) and bool((out == plain(x, train=True)).any())
    assert "random erasing (p=1.0)" in describe_augmentation(erasing)


def test_rand_augment_with_tiny_magnitude_is_the_identity():
    x = _images(batch=64, size=16)
    x[..., 0, 0], x[..., 0, 1] = 0, 255  # full range in every channel: autocontrast (no magnitude) changes nothing
    torch.manual_seed(0)
    out = RandomAugmentOps(num_ops=2, magnitude=1e-6)(x)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, x)


def test_rand_augment_changes_images_and_is_seeded():
    x = _images(batch=64, size=16)
    ops = RandomAugmentOps(num_ops=1)
    torch.manual_seed(3)
    first = ops(x)
    torch.manual_seed(3)
    assert torch.equal(first, ops(x))
    changed = (first != x).flatten(1).any(1)
    # 13 ops, identity among them: most images change, a few stay as they are.
    assert 40 < int(changed.sum()) < 64


def test_solarize_posterize_autocontrast_match_pil():
    from PIL import Image, ImageOps

    from finetune.augment import COLOR_OPS, _autocontrast, _posterize

    x = _images(batch=1, size=16)
    pil = Image.fromarray(x[0].permute(1, 2, 0).numpy())

    def to_tensor(image):
        return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)[None].float()

    m = torch.tensor(0.5).view(1, 1, 1, 1)
    torch.testing.assert_close(COLOR_OPS["solarize"](x.float(), m), to_tensor(ImageOps.solarize(pil, 128)))
    torch.testing.assert_close(_posterize(x.float(), m), to_tensor(ImageOps.posterize(pil, 6)))
    # PIL truncates the stretched values where we round: at most one level apart.
    assert (_autocontrast(x.float(), m).round() - to_tensor(ImageOps.autocontrast(pil))).abs().max() <= 1


def test_batch_transform_rand_augment_option_is_off_by_default():
    assert isinstance(BatchTransform(12, MEAN, STD, 3, 3).augment[2], torch.nn.Identity)
    assert isinstance(BatchTransform(12, MEAN, STD, 3, 3, rand_augment_ops=1).augment[2], RandomAugmentOps)


# ---------------------------------------------------------------------------------------------------------------------
# Photos: RandomResizedCrop and the image processor's evaluation resize + center crop, against torchvision


def _photo_batch(batch=6, height=40, width=52, seed=0):
    return torch.randint(
        0, 256, (batch, 3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def test_resized_crop_matches_torchvision_box_by_box():
    from torchvision.transforms.v2 import functional as TF

    x = _photo_batch()
    # Boxes that enlarge, shrink, change the aspect ratio, touch the image's edges and cover all of it.
    boxes = torch.tensor(
        [[0, 0, 40, 52], [5, 7, 10, 20], [30, 40, 10, 12], [0, 10, 33, 17], [12, 0, 28, 52], [3, 3, 3, 3]]
    )
    size = (24, 24)
    ours = resized_crop(x, boxes, size)
    for image, box, out in zip(x, boxes.tolist(), ours):
        reference = TF.resized_crop(image, *box, size=list(size), antialias=False)
        # Same sample positions and bilinear weights; float rounding may move a value across .5: at most 1 level.
        assert (out.int() - reference.int()).abs().max() <= 1, box


def test_random_resized_crop_draws_boxes_as_torchvision_does():
    from torchvision.transforms import v2

    crop = RandomResizedCrop(16, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    torch.manual_seed(0)
    boxes = crop.sample_boxes(4000, 40, 52, torch.device("cpu")).double()
    torch.manual_seed(0)
    reference = torch.tensor(
        [v2.RandomResizedCrop.get_params(torch.empty(3, 40, 52), [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)]
    ).double()
    assert ((boxes[:, :2] >= 0) & (boxes[:, :2] + boxes[:, 2:] <= torch.tensor([40, 52]))).all()
    # The same distribution: area share, aspect ratio and box centre agree in mean and spread within 3%.
    for stats in (boxes, reference):
        stats[:, 0] += stats[:, 2] / 2
        stats[:, 1] += stats[:, 3] / 2
    for ours, theirs in ((boxes[:, 2] * boxes[:, 3], reference[:, 2] * reference[:, 3]),
                         (boxes[:, 3] / boxes[:, 2], reference[:, 3] / reference[:, 2]),
                         (boxes[:, 0], reference[:, 0]), (boxes[:, 1], reference[:, 1])):  # fmt: skip
        assert ours.mean().item() == pytest.approx(theirs.mean().item(), rel=0.03)
        assert ours.std().item() == pytest.approx(theirs.std().item(), rel=0.05)
    # No box fits with a ratio range far from the image's: the centre crop at the nearest ratio, as torchvision.
    fallback = RandomResizedCrop(8, scale=(0.99, 1.0), ratio=(3.0, 4.0)).sample_boxes(2, 40, 52, torch.device("cpu"))
    expected = v2.RandomResizedCrop.get_params(torch.empty(3, 40, 52), [0.99, 1.0], [3.0, 4.0])
    assert fallback.tolist() == [list(expected)] * 2 == [[11, 0, 17, 52]] * 2


def test_eval_resize_and_center_crop_match_torchvision():
    from torchvision.transforms.v2 import functional as TF

    x = _photo_batch(height=36, width=36)
    transform = BatchTransform(24, (0.0,) * 3, (1.0,) * 3, 3, 3, eval_resize_size=(28, 28))
    ours = transform(x, train=False) * 255
    reference = TF.center_crop(TF.resize(x.float(), [28, 28], antialias=True), [24, 24])
    # The same antialiased bilinear resize in float and the same crop window: equal up to float error.
    assert (ours - reference).abs().max().item() < 1e-3


@pytest.mark.parametrize(
    "name, kwargs, resize_size, image_size",
    [
        ("ConvNextImageProcessor", {"size": {"shortest_edge": 28}}, (32, 32), (28, 28)),  # int(28 / 0.875), crop 28
        ("ConvNextImageProcessorPil", {"size": {"shortest_edge": 28}}, (32, 32), (28, 28)),
        ("ConvNextImageProcessor", {}, None, (384, 384)),  # the defaults: from 384 px warped to the size, no crop
        ("PoolFormerImageProcessor", {"size": {"shortest_edge": 28}, "crop_pct": 0.875, "crop_size": 28}, (32, 32),
         (28, 28)),
        ("LevitImageProcessor", {"size": {"shortest_edge": 28}, "crop_size": 28}, (32, 32), (28, 28)),  # 256/224
        ("LevitImageProcessorPil", {"size": {"shortest_edge": 28}, "crop_size": 28}, (32, 32), (28, 28)),
    ],
)  # fmt: skip
def test_evaluation_resizes_and_crops_as_a_processor_that_resizes_beyond_its_crop_does(
    name, kwargs, resize_size, image_size
):
    import transformers

    processor = getattr(transformers, name)(**kwargs)
    prep = preprocessing_from(processor, transformers.ConvNextConfig())
    assert (prep.resize_size, prep.image_size) == (resize_size, image_size)
    # Smooth ramps (across, down, diagonal): our bilinear and the processor's bicubic resize agree on them to about a
    # level, while a crop window off by a few pixels, or none, moves the values by ten levels and more.
    ramp = torch.linspace(0, 255, 40)
    x = torch.stack([ramp.expand(40, 40), ramp[:, None].expand(40, 40), (ramp + ramp[:, None]) / 2])[None]
    x = x.round().to(torch.uint8)  # (1, 3, 40, 40)
    ours = BatchTransform.for_model(prep, 3)(x, train=False)
    theirs = processor(images=[x[0].numpy() if name.endswith("Pil") else x[0]], return_tensors="pt").pixel_values
    assert ours.shape == theirs.shape == (1, 3, *image_size)
    levels = (ours - theirs) * torch.tensor(prep.image_std).view(1, 3, 1, 1) * 255
    assert levels.abs().max().item() < 2.0


@pytest.mark.skipif(not importlib.util.find_spec("timm"), reason='timm is an optional extra: pip install -e ".[timm]"')
@pytest.mark.parametrize("size, crop_pct", [(16, 0.9), (224, 0.95), (224, 0.875)])
def test_evaluation_resizes_a_timm_model_before_its_crop_as_timm_does(size, crop_pct):
    """timm resizes to floor(size / crop_pct), then crops: evaluation resized to round() (18 px, not 17, for 16 px at
    0.9; 236, not 235, for 224 at 0.95), and the saved processor (timm's), pipeline() and ONNX serving, which resize as
    timm does, scored other pixels than evaluation and predict."""
    from PIL import Image
    from transformers import TimmWrapperConfig, TimmWrapperImageProcessor

    cfg = {"input_size": [3, size, size], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": crop_pct,
           "interpolation": "bilinear"}  # fmt: skip
    processor = TimmWrapperImageProcessor(pretrained_cfg=cfg, architecture="resnet10t")
    prep = preprocessing_from(processor, TimmWrapperConfig(architecture="resnet10t", pretrained_cfg=cfg))
    [resize] = [t.size for t in processor.val_transforms.transforms if type(t).__name__ == "Resize"]
    assert prep.resize_size == (resize, resize) and prep.image_size == (size, size)
    if size == 16:  # smooth ramps, as above: a resize off by a pixel moves them by ten levels and more
        ramp = torch.linspace(0, 255, 40)
        x = torch.stack([ramp.expand(40, 40), ramp[:, None].expand(40, 40), (ramp + ramp[:, None]) / 2])[None]
        x = x.round().to(torch.uint8)  # (1, 3, 40, 40)
        ours = BatchTransform.for_model(prep, 3)(x, train=False)
        theirs = processor(Image.fromarray(x[0].permute(1, 2, 0).numpy()), return_tensors="pt").pixel_values
        assert ((ours - theirs) * 0.5 * 255).abs().max().item() < 2.0


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("MobileViTImageProcessor", {"size": {"shortest_edge": 16}, "crop_size": {"height": 16, "width": 16}}),  # BGR
        ("MobileViTImageProcessorPil", {"size": {"shortest_edge": 16}, "crop_size": {"height": 16, "width": 16}}),
        ("EfficientNetImageProcessor", {"size": {"height": 16, "width": 16}}),  # divides by image_std twice
        ("EfficientNetImageProcessor",  # [-1, 1]: rescaled by 1/127.5, less 1
         {"size": {"height": 16, "width": 16}, "rescale_factor": 1 / 127.5, "rescale_offset": True,
          "do_normalize": False, "include_top": False}),
        ("ViTImageProcessor", {"size": {"height": 16, "width": 16}, "rescale_factor": 1 / 127.5}),
        ("EfficientNetImageProcessor",  # no rescale: no offset either
         {"size": {"height": 16, "width": 16}, "do_rescale": False, "rescale_offset": True, "include_top": False}),
    ],
)  # fmt: skip
def test_evaluation_and_the_saved_processor_make_the_pixels_of_the_models_own_processor(name, kwargs):
    """MobileViT's processor feeds BGR, EfficientNet's rescales to [-1, 1] or divides by the std twice: evaluation
    took RGB in [0, 1], normalised once (pipeline() agreed with it on 10 of 18 images of a MobileViT); the processor
    saved with the model (`_framing_processor`) makes the same pixels."""
    import transformers

    from finetune.models import _framing_processor

    processor = getattr(transformers, name)(**kwargs)
    prep = preprocessing_from(processor, transformers.MobileViTConfig(image_size=16))
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 16, 16), dtype=np.uint8))
    theirs = processor(images=[image.numpy() if name.endswith("Pil") else image], return_tensors="pt").pixel_values
    ours = BatchTransform.for_model(prep, 3)(image[None], train=False)
    saved = _framing_processor(processor, prep, whole=False)(images=[image], return_tensors="pt").pixel_values
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-6)  # pixels up to 255 without a rescale
    torch.testing.assert_close(saved, theirs, atol=1e-5, rtol=1e-6)


def test_training_without_random_resized_crop_frames_images_as_evaluation_crops_them():
    """A processor that resizes to 10 and crops 8: training's padded crop had the whole image, evaluation its centre
    (82% instead of 97% on digits). Stored at 20 px: the centre 16 px resized by 2, as evaluation's 10 px crop is."""
    x = _photo_batch(height=20, width=20)
    transform = BatchTransform(
        8, MEAN, STD, 3, 3, random_crop_padding=0, horizontal_flip=False, eval_resize_size=(10, 10)
    )
    assert "no crop of the centre 80% x 80%, as evaluation crops" in describe_augmentation(transform)
    trained, evaluated = transform(x, train=True), transform(x, train=False)
    assert trained.shape == evaluated.shape == (6, 3, 8, 8)
    # Equal but at the border, where evaluation's antialiasing filter reaches pixels outside the crop.
    torch.testing.assert_close(trained[..., 1:-1, 1:-1], evaluated[..., 1:-1, 1:-1], rtol=0, atol=1e-5)
    whole = BatchTransform(8, MEAN, STD, 3, 3, random_crop_padding=0, horizontal_flip=False)(x, train=True)
    assert (whole - evaluated).abs().mean() > 0.1
    with_crop = BatchTransform(8, MEAN, STD, 3, 3, random_resized_crop=True, eval_resize_size=(10, 10))
    assert "centre" not in describe_augmentation(with_crop)  # RandomResizedCrop draws its own boxes


def test_random_resized_crop_in_the_batch_transform_outputs_the_model_size():
    transform = BatchTransform(16, MEAN, STD, 3, 3, random_resized_crop=True, crop_scale=(0.5, 1.0))
    out = transform(_photo_batch(), train=True)
    assert out.shape == (6, 3, 16, 16)
    assert "RandomResizedCrop(scale=(0.5, 1.0)" in describe_augmentation(transform)
    pad_crop = BatchTransform(16, MEAN, STD, 3, 3)
    assert "random crop with 4 px padding" in describe_augmentation(pad_crop)
    mixed = describe_augmentation(pad_crop, mixup_alpha=0.8, flip_tta=True)
    assert "padding, horizontal flip, MixUp (alpha 0.8) of each batch; evaluation: resize to 16x16, logits " in mixed


def test_random_resized_crop_is_chosen_for_photos_only():
    assert use_random_resized_crop("auto", (256, 256), (224, 224))  # photos stored with the crop margin
    assert not use_random_resized_crop("auto", (32, 32), (224, 224))  # CIFAR-10 resized up to a pretrained ViT
    assert not use_random_resized_crop("auto", (32, 32), (32, 32))  # CIFAR-10 at its own size
    assert use_random_resized_crop("true", (32, 32), (224, 224)) and not use_random_resized_crop(
        "false", (256, 256), (224, 224)
    )
