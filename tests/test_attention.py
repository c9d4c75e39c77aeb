"""Attention maps: rollout and per-layer maps against hand-computed values, real attentions from both kinds of model,
and the written PNGs."""

import numpy as np
import pytest
import torch
from helpers_runs import make_run_dir, run_trained_on_photos, tiny_scratch_model, tiny_vit_model
from PIL import Image
from transformers import BeitConfig, BeitForImageClassification, Dinov2Config, Dinov2ForImageClassification

from finetune.tools import attention, predict
from finetune.tools.predict import load_classifier


def random_attention(generator, *shape):
    """Row-stochastic attention probabilities of the given shape (..., T, T)."""
    return torch.rand(*shape, generator=generator).softmax(dim=-1)


def test_rollout_of_identity_attention_is_identity():
    attentions = [torch.eye(5).expand(3, 5, 5) for _ in range(4)]  # 4 layers, 3 heads, 5 tokens
    torch.testing.assert_close(attention.attention_rollout(attentions), torch.eye(5))


def test_rollout_of_uniform_attention_has_closed_form():
    # With U = uniform attention (U @ U = U), each layer is (U + I) / 2, and L layers give 2^-L I + (1 - 2^-L) U.
    tokens, layers = 6, 3
    uniform = torch.full((tokens, tokens), 1.0 / tokens)
    rollout = attention.attention_rollout([uniform.expand(2, tokens, tokens)] * layers)
    expected = 0.5**layers * torch.eye(tokens) + (1 - 0.5**layers) * uniform
    torch.testing.assert_close(rollout, expected)


def test_rollout_of_two_layers_is_the_manual_product():
    g = torch.Generator().manual_seed(0)
    first, second = random_attention(g, 1, 4, 7, 7), random_attention(g, 1, 4, 7, 7)  # (B, heads, T, T)
    a1 = first[0].double().numpy().mean(axis=0) + np.eye(7)
    a2 = second[0].double().numpy().mean(axis=0) + np.eye(7)
    a1 /= a1.sum(axis=1, keepdims=True)
    a2 /= a2.sum(axis=1, keepdims=True)
    rollout = attention.attention_rollout([first, second])
    assert rollout.shape == (1, 7, 7)
    np.testing.assert_allclose(rollout[0].numpy(), a2 @ a1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rollout.sum(dim=-1).numpy(), 1.0, rtol=1e-5)  # rows stay distributions
    # read at the CLS token and laid out on the 2x3 patch grid
    grid = attention.rollout_map([first[0], second[0]], (2, 3), num_prefix_tokens=1)
    np.testing.assert_allclose(grid.numpy(), (a2 @ a1)[0, 1:].reshape(2, 3), rtol=1e-5, atol=1e-6)


def test_cls_attention_maps_values_and_shape():
    g = torch.Generator().manual_seed(1)
    attentions = [random_attention(g, 3, 1 + 12, 1 + 12) for _ in range(4)]  # 4 layers, 3 heads, CLS + 3x4 grid
    maps = attention.cls_attention_maps(attentions, (3, 4), num_prefix_tokens=1)
    assert maps.shape == (4, 3, 4)
    for layer, a in enumerate(attentions):
        expected = a.mean(dim=0)[0, 1:].reshape(3, 4)
        torch.testing.assert_close(maps[layer], expected)


def test_mean_pooled_maps_average_all_queries():
    g = torch.Generator().manual_seed(2)
    attentions = [random_attention(g, 2, 9, 9) for _ in range(2)]  # no CLS: 3x3 patches only
    maps = attention.cls_attention_maps(attentions, (3, 3), num_prefix_tokens=0)
    torch.testing.assert_close(maps[1], attentions[1].mean(dim=0).mean(dim=0).reshape(3, 3))
    rollout = attention.rollout_map(attentions, (3, 3), num_prefix_tokens=0)
    torch.testing.assert_close(rollout, attention.attention_rollout(attentions).mean(dim=0).reshape(3, 3))


def test_grid_mismatch_is_an_error():
    with pytest.raises(ValueError, match="patch grid"):
        attention.cls_attention_maps([torch.eye(10).expand(1, 10, 10)], (3, 4), num_prefix_tokens=1)


def test_overlay_puts_the_hot_patch_where_it_is():
    image = Image.new("RGB", (80, 40), (128, 128, 128))
    heatmap = torch.zeros(2, 4)
    heatmap[0, 3] = 1.0  # top-right patch
    overlay = attention.overlay_heatmap(image, heatmap)
    assert overlay.shape == (40, 80, 3)
    # jet maps the hottest value to dark red: the red channel peaks in the top-right patch area
    red_minus_blue = overlay[..., 0].astype(int) - overlay[..., 2].astype(int)
    row, col = np.unravel_index(red_minus_blue.argmax(), red_minus_blue.shape)
    assert row < 20 and col >= 60


def tiny_beit_model(use_mean_pooling: bool):
    """BEiT keeps its CLS token when it pools the mean of the patch tokens (`use_mean_pooling`, its default)."""
    torch.manual_seed(0)
    config = BeitConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, num_labels=3, use_mean_pooling=use_mean_pooling)  # fmt: skip
    return BeitForImageClassification(config).eval()


@pytest.mark.parametrize(
    "kind, pooling",
    [("scratch", "cls"), ("scratch", "mean"), ("vit", "cls"), ("beit", "cls"), ("beit", "mean")],
)
def test_model_attentions_match_the_maps(kind, pooling):
    if kind == "beit":
        model = tiny_beit_model(use_mean_pooling=pooling == "mean")
    else:
        model = tiny_vit_model() if kind == "vit" else tiny_scratch_model(pooling=pooling)
    if kind != "scratch":
        model.set_attn_implementation("eager")
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    maps = attention.compute_attention_maps(model, processor, image)
    assert maps.layer_maps.shape == (2, 4, 4) and maps.rollout.shape == (4, 4)
    assert maps.reads == ("CLS token" if pooling == "cls" else "mean of the patch tokens")
    with torch.no_grad():
        pixel_values = predict.preprocess([image], model, processor)  # framed and resized as evaluation does
        outputs = model(pixel_values=pixel_values, output_attentions=True)
    first = outputs.attentions[0][0].mean(dim=0)  # (T, T)
    prefix = first.shape[-1] - 16  # CLS or none (a mean-pooled ScratchViT) before the 4x4 patches
    expected = first[0, prefix:] if pooling == "cls" else first[prefix:, prefix:].mean(dim=0)
    torch.testing.assert_close(maps.layer_maps[0].flatten(), expected, rtol=1e-4, atol=1e-5)
    heading = attention.attention_heading(maps)
    assert ("CLS token's attention" in heading) == (pooling == "cls")
    assert ("Mean attention of the patch tokens" in heading) == (pooling == "mean")
    assert maps.label == model.config.id2label[int(outputs.logits.argmax())]


def test_a_dinov2_heading_says_its_classifier_reads_the_cls_token_and_the_patch_mean():
    """Dinov2ForImageClassification classifies [CLS token, mean of the patch tokens]: the maps are the CLS token's,
    and the heading says the classifier reads both."""
    torch.manual_seed(0)
    config = Dinov2Config(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                          mlp_ratio=2, num_labels=3, attn_implementation="eager")  # fmt: skip
    model = Dinov2ForImageClassification(config).eval()
    assert model.classifier.in_features == 2 * config.hidden_size  # what the heading must account for
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    maps = attention.compute_attention_maps(model, processor, image)
    with torch.no_grad():
        outputs = model(pixel_values=predict.preprocess([image], model, processor), output_attentions=True)
    torch.testing.assert_close(maps.layer_maps[0].flatten(), outputs.attentions[0][0].mean(dim=0)[0, 1:])
    assert maps.reads == "CLS token and the mean of the patch tokens"
    assert attention.attention_heading(maps).startswith(
        "CLS token's attention to the patches, heads averaged; the classifier reads the CLS token and the mean of "
        "the patch tokens\n"
    )


@pytest.mark.parametrize("kind", ["scratch", "scratch-mean", "vit"])
def test_cli_writes_pngs_of_what_the_model_sees(tmp_path, kind):
    model = {
        "scratch": lambda: tiny_scratch_model(),
        "scratch-mean": lambda: tiny_scratch_model(pooling="mean", position_embedding_type="sinusoidal"),
        "vit": lambda: tiny_vit_model(),
    }[kind]()
    run = make_run_dir(tmp_path / "run", "pretrained" if kind == "vit" else "scratch", model=model, extras=False)
    image_path = tmp_path / "wide.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 150, 3), dtype=np.uint8)).save(image_path)
    gray_path = tmp_path / "gray.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (33, 21), dtype=np.uint8), "L").save(gray_path)

    written = attention.main([str(run), str(image_path), str(gray_path), "--output", str(tmp_path / "maps")])
    names = sorted(p.name for p in written)
    assert names == ["gray_attention.png", "gray_rollout.png", "wide_attention.png", "wide_rollout.png"]
    for path in ("wide_rollout.png", "gray_rollout.png"):
        with Image.open(tmp_path / "maps" / path) as png:
            # 150x60 and 21x33 photos: the centre square the model sees, as evaluation frames them
            assert png.width / png.height == pytest.approx(1.0, rel=0.02)
            assert max(png.size) >= 224  # small images are enlarged to stay visible
    with Image.open(tmp_path / "maps" / "wide_attention.png") as png:
        png.load()
        assert png.width > png.height  # 4 panels in a row


def test_a_folder_gives_the_maps_of_its_images_as_predict_reads_them(tmp_path):
    run = make_run_dir(tmp_path / "run", model=tiny_scratch_model(), extras=False)
    (tmp_path / "photos" / "dogs").mkdir(parents=True)
    Image.new("RGB", (20, 30), (200, 10, 10)).save(tmp_path / "photos" / "cat.png")
    Image.new("RGB", (30, 20), (10, 10, 200)).save(tmp_path / "photos" / "dogs" / "dog.jpg")
    written = attention.main([str(run), str(tmp_path / "photos"), "--output", str(tmp_path / "maps")])
    assert [p.name for p in written] == [
        "cat_attention.png",
        "cat_rollout.png",
        "dog_attention.png",
        "dog_rollout.png",
    ]
    with pytest.raises(ValueError, match=r"missing does not exist. Pass image files or folders of images.$"):
        attention.main([str(run), str(tmp_path / "missing"), "--output", str(tmp_path / "maps")])
    # Nothing to draw: no empty --output folder is left behind.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not an image")
    with pytest.raises(ValueError, match=r"could be read as an image; nothing was written"):
        attention.main([str(run), str(tmp_path / "notes"), "--output", str(tmp_path / "none")])
    assert not (tmp_path / "none").exists()


def test_maps_are_never_written_into_the_images_the_model_trained_on(tmp_path):
    run = run_trained_on_photos(tmp_path, model=tiny_scratch_model())
    for output in (tmp_path / "photos", tmp_path / "photos" / "maps"):
        with pytest.raises(
            ValueError, match=r"inside photos, the images the model was trained on.*Nothing was written"
        ):
            attention.main([str(run), str(tmp_path / "photos"), "--output", str(output)])
    assert sorted(p.name for p in (tmp_path / "photos").rglob("*")) == ["cat.png", "cats"]
    written = attention.main([str(run), str(tmp_path / "photos"), "--output", str(tmp_path / "maps")])
    assert [p.name for p in written] == ["cat_attention.png", "cat_rollout.png"]


def test_other_resolution_gives_a_finer_grid(tmp_path):
    run = make_run_dir(tmp_path / "run", "pretrained", model=tiny_vit_model(), extras=False)
    model, processor = load_classifier(run, attn_implementation="eager")
    image = Image.new("RGB", (40, 40), (10, 200, 30))
    maps = attention.compute_attention_maps(model, processor, image, image_size=24)
    assert maps.layer_maps.shape == (2, 6, 6)


def test_a_multi_label_models_prediction_is_its_sigmoid_as_predict_gives_it():
    model = tiny_vit_model(seed=4)
    model.set_attn_implementation("eager")
    model.config.problem_type = "multi_label_classification"
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    maps = attention.compute_attention_maps(model, processor, image)
    [probabilities] = predict.class_probabilities(model, predict.preprocess([image], model, processor))
    with torch.no_grad():
        logits = model(pixel_values=predict.preprocess([image], model, processor)).logits[0]
    torch.testing.assert_close(probabilities, logits.sigmoid())  # each label's own probability, not a softmax
    assert maps.label == model.config.id2label[int(probabilities.argmax())]
    assert maps.score == pytest.approx(float(probabilities.max()))


def test_the_maps_lie_over_what_a_cropping_processors_model_sees(tmp_path):
    """A processor that resizes to 32 and center-crops 16 (as a DeiT's 256 and 224): the maps cover the central half
    of the framed image, and the figures show that half, not the ring around it the model never saw."""
    run = make_run_dir(tmp_path / "run", "pretrained", model=tiny_vit_model(), extras=False)
    from transformers import ViTImageProcessor

    processor = ViTImageProcessor(
        size={"shortest_edge": 32}, do_center_crop=True, crop_size={"height": 16, "width": 16}
    )
    processor.save_pretrained(run)
    pixels = np.zeros((32, 32, 3), dtype=np.uint8)
    pixels[..., 0] = 255  # a red ring, cut away by the crop
    pixels[8:24, 8:24] = (0, 255, 0)  # the green centre the model sees
    Image.fromarray(pixels).save(tmp_path / "ring.png")
    attention.main([str(run), str(tmp_path / "ring.png"), "--output", str(tmp_path / "maps")])

    model, processor = load_classifier(run, attn_implementation="eager")
    maps = attention.compute_attention_maps(model, processor, Image.fromarray(pixels))
    seen = attention.display_image(Image.new("RGB", (16, 16), (0, 255, 0)))
    with Image.open(tmp_path / "maps" / "ring_rollout.png") as png:
        np.testing.assert_array_equal(np.asarray(png), attention.overlay_heatmap(seen, maps.rollout))


def test_the_heading_gives_the_prediction_of_a_flip_tta_run_as_predict_does(tmp_path, monkeypatch):
    """A run evaluated with `flip_tta: true`: its figures, and predict, average the logits with the mirror image's;
    the heading's prediction is the same, not that of the image alone."""
    import json

    model = tiny_scratch_model(seed=3)
    with torch.no_grad():  # weights under which the mirror image changes the probabilities (92.3% alone, 95.3%)
        for param in model.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())))
    run = make_run_dir(tmp_path / "run", model=model, extras=False)
    results = json.loads((run / "results.json").read_text())
    results["hyperparameters"]["flip_tta"] = True
    (run / "results.json").write_text(json.dumps(results))
    image_path = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(image_path)

    headings = []
    heading = attention.attention_heading
    monkeypatch.setattr(attention, "attention_heading", lambda maps: headings.append(heading(maps)) or headings[-1])
    attention.main([str(run), str(image_path), "--output", str(tmp_path / "maps")])
    [prediction] = predict.main([str(run), str(image_path)])
    assert f"Prediction: {prediction.labels[0]} ({prediction.scores[0]:.1%})" in headings[0]
    alone = attention.compute_attention_maps(*load_classifier(run), Image.open(image_path))
    assert (alone.label, f"{alone.score:.1%}") != (prediction.labels[0], f"{prediction.scores[0]:.1%}")
