"""ScratchViTModel / ScratchViTForImageClassification: outputs, losses, options, checkpointing and loading."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput

from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification, ScratchViTModel


BATCH = 3


def tiny_config(**overrides) -> ScratchViTConfig:
    """A 16 px, 2-layer, 2-head model: 16 patches, fast enough to build dozens of times."""
    fields = {
        "image_size": 16,
        "patch_size": 4,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "num_labels": 5,
    }
    fields.update(overrides)
    return ScratchViTConfig(**fields)


def images(size: int = 16, channels: int = 3, batch: int = BATCH, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


def build(model_class, config, seed: int = 0):
    torch.manual_seed(seed)
    return model_class(config).eval()


VARIANTS = [
    {"position_embedding_type": "learned", "pooling": "cls"},
    {"position_embedding_type": "sinusoidal", "pooling": "mean"},
    {"position_embedding_type": "learned", "pooling": "cls", "patch_embedding_type": "conv_stem"},
]
VARIANT_IDS = ["learned-cls", "sinusoidal-mean", "learned-cls-conv-stem"]


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_output_shapes_and_types(variant):
    config = tiny_config(**variant)
    num_tokens = 16 + (1 if config.pooling == "cls" else 0)
    model = build(ScratchViTModel, config)
    out = model(images())
    assert isinstance(out, BaseModelOutputWithPooling)
    assert out.last_hidden_state.shape == (BATCH, num_tokens, 16)
    assert out.pooler_output.shape == (BATCH, 16)
    assert out.hidden_states is None and out.attentions is None

    classifier = build(ScratchViTForImageClassification, config)
    out = classifier(images())
    assert isinstance(out, ImageClassifierOutput)
    assert out.logits.shape == (BATCH, 5)
    assert out.loss is None


def test_pooling_selects_cls_token_or_mean_of_patches():
    out = build(ScratchViTModel, tiny_config(pooling="cls"))(images())
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 0], rtol=0, atol=0)
    out = build(ScratchViTModel, tiny_config(pooling="mean"))(images())
    assert out.last_hidden_state.shape[1] == 16  # no CLS token among the tokens
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state.mean(dim=1))


def test_optional_parameters_are_absent_when_switched_off():
    names = dict(
        build(ScratchViTModel, tiny_config(pooling="cls", position_embedding_type="learned")).named_parameters()
    )
    assert names["embeddings.cls_token"].shape == (1, 1, 16)
    assert names["embeddings.position_embeddings.position_embeddings"].shape == (1, 17, 16)

    mean = build(ScratchViTModel, tiny_config(pooling="mean", position_embedding_type="learned"))
    assert not any("cls_token" in name for name in mean.state_dict())
    assert mean.embeddings.position_embeddings.position_embeddings.shape == (1, 16, 16)

    sinusoidal = build(ScratchViTModel, tiny_config(pooling="cls", position_embedding_type="sinusoidal"))
    assert not any("position" in name for name in sinusoidal.state_dict())


def test_single_label_loss_is_cross_entropy():
    model = build(ScratchViTForImageClassification, tiny_config())
    labels = torch.tensor([0, 4, 2])
    out = model(images(), labels=labels)
    assert model.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))


def test_one_label_is_mse_regression():
    model = build(ScratchViTForImageClassification, tiny_config(num_labels=1))
    targets = torch.tensor([0.5, -1.0, 2.0])
    out = model(images(), labels=targets)
    assert out.logits.shape == (BATCH, 1)
    assert model.config.problem_type == "regression"
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), targets))


def test_float_multi_hot_labels_are_multi_label_bce():
    model = build(ScratchViTForImageClassification, tiny_config())
    labels = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.float32)
    assert model.config.problem_type is None
    out = model(images(), labels=labels)
    assert model.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, labels))


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_attentions_and_hidden_states(variant):
    config = tiny_config(**variant)
    num_tokens = 16 + (1 if config.pooling == "cls" else 0)
    model = build(ScratchViTForImageClassification, config)
    fast = model(images())
    out = model(images(), output_attentions=True, output_hidden_states=True)

    assert len(out.attentions) == config.num_hidden_layers
    for probs in out.attentions:
        assert probs.shape == (BATCH, 2, num_tokens, num_tokens)
        assert (probs >= 0).all()
        torch.testing.assert_close(probs.sum(dim=-1), torch.ones(BATCH, 2, num_tokens))
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    assert all(h.shape == (BATCH, num_tokens, 16) for h in out.hidden_states)
    # The explicit-softmax path (taken for output_attentions) must compute what SDPA computes.
    torch.testing.assert_close(out.logits, fast.logits, rtol=0, atol=1e-6)


def test_attentions_from_config_flag():
    config = tiny_config(output_attentions=True, output_hidden_states=True)
    out = build(ScratchViTModel, config)(images())
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3


class RecordTorchCalls(TorchFunctionMode):
    """Records the name of every torch function called inside the `with` block."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_attn_implementation_eager_uses_explicit_softmax(tmp_path):
    sdpa = build(ScratchViTForImageClassification, tiny_config())
    assert sdpa.config._attn_implementation == "sdpa"
    sdpa.save_pretrained(tmp_path)
    eager = ScratchViTForImageClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert eager.config._attn_implementation == "eager"

    with RecordTorchCalls() as calls:
        sdpa_out = sdpa(images())
    assert "scaled_dot_product_attention" in calls.names
    with RecordTorchCalls() as calls:
        eager_out = eager(images())
    assert "scaled_dot_product_attention" not in calls.names
    assert "softmax" in calls.names
    assert eager_out.attentions is None  # computed, but only returned when asked
    torch.testing.assert_close(eager_out.logits, sdpa_out.logits, rtol=0, atol=1e-6)
    assert len(eager(images(), output_attentions=True).attentions) == 2


def test_set_attn_implementation_switches_a_built_model():
    # transformers' `set_attn_implementation` only logs a warning and keeps the old implementation for a model whose
    # source it does not recognise as dispatching attention at call time; ScratchViT reads it at every call.
    model = build(ScratchViTForImageClassification, tiny_config())
    expected = model(images()).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    assert model.vit.config._attn_implementation == "eager"
    with RecordTorchCalls() as calls:
        eager_logits = model(images()).logits
    assert "scaled_dot_product_attention" not in calls.names
    torch.testing.assert_close(eager_logits, expected, rtol=0, atol=1e-6)
    model.set_attn_implementation("sdpa")
    with RecordTorchCalls() as calls:
        model(images())
    assert "scaled_dot_product_attention" in calls.names


def test_return_dict_false_gives_tuples_in_output_order():
    model = build(ScratchViTModel, tiny_config())
    kwargs = {"output_attentions": True, "output_hidden_states": True}
    as_dict = model(images(), **kwargs)
    as_tuple = model(images(), return_dict=False, **kwargs)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 4
    torch.testing.assert_close(as_tuple[0], as_dict.last_hidden_state)
    torch.testing.assert_close(as_tuple[1], as_dict.pooler_output)
    assert len(as_tuple[2]) == 3 and len(as_tuple[3]) == 2
    assert len(model(images(), return_dict=False)) == 2

    classifier = build(ScratchViTForImageClassification, tiny_config())
    labels = torch.tensor([1, 2, 3])
    as_dict = classifier(images(), labels=labels, output_hidden_states=True)
    as_tuple = classifier(images(), labels=labels, output_hidden_states=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 3
    torch.testing.assert_close(as_tuple[0], as_dict.loss)
    torch.testing.assert_close(as_tuple[1], as_dict.logits)
    assert len(as_tuple[2]) == 3
    logits_only = classifier(images(), return_dict=False)
    assert len(logits_only) == 1
    torch.testing.assert_close(logits_only[0], as_dict.logits)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("height, width", [(24, 24), (8, 8), (16, 24)])
def test_other_resolution_needs_interpolate_pos_encoding(variant, height, width):
    config = tiny_config(**variant)
    model = build(ScratchViTForImageClassification, config)
    pixels = torch.randn(2, 3, height, width)
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True") as error:
        model(pixels)
    assert f"{height // 4}x{width // 4}" in str(error.value)

    out = model(pixels, interpolate_pos_encoding=True, output_hidden_states=True)
    num_tokens = (height // 4) * (width // 4) + (1 if config.pooling == "cls" else 0)
    assert out.logits.shape == (2, 5)
    assert out.hidden_states[0].shape == (2, num_tokens, 16)
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_interpolate_pos_encoding_at_native_size_changes_nothing(variant):
    model = build(ScratchViTForImageClassification, tiny_config(**variant))
    torch.testing.assert_close(
        model(images(), interpolate_pos_encoding=True).logits, model(images()).logits, rtol=0, atol=0
    )


def test_learned_positions_are_interpolated_not_reset():
    """Upsampling the position grid keeps the trained values where the grids coincide in a smooth field."""
    model = build(ScratchViTModel, tiny_config())
    positions = model.embeddings.position_embeddings
    with torch.no_grad():
        # A constant grid must stay constant under bicubic resizing; the CLS position is kept as is.
        positions.position_embeddings[:, 1:] = 0.7
        positions.position_embeddings[:, 0] = -3.0
    resized = model.embeddings.interpolate_pos_encoding(positions.position_embeddings, 6, 6)
    assert resized.shape == (1, 37, 16)
    torch.testing.assert_close(resized[:, 0], torch.full((1, 16), -3.0))
    torch.testing.assert_close(resized[:, 1:], torch.full((1, 36, 16), 0.7))


def position_embeddings_at(model: ScratchViTModel, size: int) -> torch.Tensor:
    """The position embeddings the model adds at `size` px: its embeddings' output on black images with the patch
    projection's bias and the CLS token zeroed, so nothing but the positions is left."""
    with torch.no_grad():
        model.embeddings.patch_embeddings.projection.bias.zero_()
        model.embeddings.cls_token.zero_()
        return model(
            images(size, batch=1) * 0, interpolate_pos_encoding=True, output_hidden_states=True
        ).hidden_states[0]


@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal"])
def test_positions_at_twice_the_size_follow_the_training_grid(position_embedding_type):
    """Each patch of a 2x larger grid gets (nearly) the position of the training-grid patch it lies on, for learned
    and sinusoidal positions alike, not the 1-D index it has on the larger grid."""
    model = build(ScratchViTModel, tiny_config(position_embedding_type=position_embedding_type))  # 4x4 grid + CLS
    table, resized = position_embeddings_at(model, 16)[0], position_embeddings_at(model, 32)[0]  # 1 + 16, 1 + 64
    torch.testing.assert_close(resized[0], table[0], rtol=0, atol=0)  # the CLS position is kept as is
    nearest = torch.cdist(resized[1:], table[1:]).argmin(dim=1).reshape(8, 8)  # 8x8 grid -> 4x4 grid index
    rows, columns = torch.arange(8)[:, None] // 2, torch.arange(8)[None, :] // 2
    assert torch.equal(nearest, rows * 4 + columns)


def test_wrong_channel_count_raises():
    model = build(ScratchViTModel, tiny_config())
    with pytest.raises(ValueError, match=r"Expected 3 channel\(s\).*got 1. Pass RGB images.*num_channels=1"):
        model(images(channels=1))
    grayscale = build(ScratchViTModel, tiny_config(num_channels=1))
    assert grayscale(images(channels=1)).last_hidden_state.shape == (BATCH, 17, 16)
    # A grayscale model fed RGB (what pipeline() makes of every image) is told to convert to grayscale, not to RGB.
    with pytest.raises(ValueError, match=r"got 3. Pass grayscale images .*convert\('L'\).*pipeline\(\)") as error:
        grayscale(images(channels=3))
    assert "grayscale to RGB" not in str(error.value)


def test_image_size_not_multiple_of_patch_raises():
    model = build(ScratchViTModel, tiny_config())
    with pytest.raises(ValueError, match=r"\(18x18\) must be a multiple of `patch_size` \(4\)"):
        model(torch.randn(1, 3, 18, 18), interpolate_pos_encoding=True)


def test_missing_pixel_values_raises():
    with pytest.raises(ValueError, match="pixel_values"):
        build(ScratchViTModel, tiny_config())()


@pytest.mark.parametrize(
    "dropout",
    [
        {"hidden_dropout_prob": 0.2},
        {"attention_probs_dropout_prob": 0.3},
        {"head_dropout_prob": 0.5, "head_type": "mlp"},
        {"drop_path_rate": 0.5},
    ],
    ids=["hidden", "attention", "head", "drop-path"],
)
@pytest.mark.parametrize("output_attentions", [False, True], ids=["sdpa", "explicit"])
def test_dropout_only_in_train_mode(dropout, output_attentions):
    model = build(ScratchViTForImageClassification, tiny_config(**dropout))
    pixels = images()
    first = model(pixels, output_attentions=output_attentions).logits
    second = model(pixels, output_attentions=output_attentions).logits
    torch.testing.assert_close(first, second, rtol=0, atol=0)

    model.train()
    first = model(pixels, output_attentions=output_attentions).logits
    second = model(pixels, output_attentions=output_attentions).logits
    assert not torch.allclose(first, second)


def test_drop_path_rises_with_depth_and_drops_whole_samples():
    model = ScratchViTModel(tiny_config(drop_path_rate=0.3, num_hidden_layers=4))
    assert isinstance(model.encoder.layer[0].drop_path, torch.nn.Identity)  # the first block is never dropped
    assert [layer.drop_path.p for layer in model.encoder.layer[1:]] == pytest.approx([0.1, 0.2, 0.3])
    drop = model.encoder.layer[3].drop_path.train()
    torch.manual_seed(0)
    out = drop(torch.ones(2000, 5, 4))  # (B, T, C): each sample's branch is kept whole (scaled) or dropped whole
    kept = out[:, 0, 0] != 0
    assert torch.equal(out[kept], torch.full_like(out[kept], 1 / 0.7)) and torch.equal(out[~kept], out[~kept] * 0)
    assert abs(kept.float().mean().item() - 0.7) < 0.03
    with pytest.raises(ValueError, match="drop_path_rate"):
        tiny_config(drop_path_rate=1.0)


def test_no_dropout_train_equals_eval():
    model = build(ScratchViTForImageClassification, tiny_config())
    eval_logits = model(images()).logits
    torch.testing.assert_close(model.train()(images()).logits, eval_logits)


def _loss_and_grads(model, pixels, labels, seed):
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(pixels, labels=labels).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gradient_checkpointing_gives_same_loss_and_gradients(variant):
    # Dropout on: checkpointing must replay the same random masks when it recomputes a block.
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, **variant)
    model = build(ScratchViTForImageClassification, config).train()
    pixels, labels = images(), torch.tensor([0, 1, 4])

    # Count MLP calls: a checkpointed block runs its forward a second time during backward. A pre-hook, since
    # non-reentrant checkpointing stops the replay once every saved tensor is recomputed, before forward hooks run.
    calls = []
    for layer in model.vit.encoder.layer:
        layer.mlp.register_forward_pre_hook(lambda *_: calls.append(1))

    loss, grads = _loss_and_grads(model, pixels, labels, seed=123)
    assert len(calls) == config.num_hidden_layers
    calls.clear()

    renamed = hasattr(model, "activation_checkpointing_enable")  # transformers >= 5.24; the old names go in v6
    model.activation_checkpointing_enable() if renamed else model.gradient_checkpointing_enable()
    assert model.is_activation_checkpointing if renamed else model.is_gradient_checkpointing
    checkpointed_loss, checkpointed_grads = _loss_and_grads(model, pixels, labels, seed=123)
    assert len(calls) == 2 * config.num_hidden_layers

    torch.testing.assert_close(checkpointed_loss, loss)
    assert checkpointed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(checkpointed_grads[name], grad, msg=name)


def _perturb(model, seed: int = 1) -> None:
    """Give every parameter and buffer (BatchNorm statistics) values no initialiser would produce, as training does."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5 + 1.0)
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.copy_(torch.rand(buffer.shape, generator=generator) + 0.5)
            else:
                buffer.fill_(7)


LOAD_VARIANTS = [
    {},
    {"position_embedding_type": "sinusoidal", "pooling": "mean", "head_type": "mlp"},
    {"patch_embedding_type": "conv_stem"},
]


@pytest.mark.parametrize("variant", LOAD_VARIANTS, ids=["learned-cls-linear", "sinusoidal-mean-mlp", "conv-stem"])
@pytest.mark.parametrize("model_class", [ScratchViTModel, ScratchViTForImageClassification])
def test_from_pretrained_keeps_every_saved_tensor(tmp_path, model_class, variant):
    model = build(model_class, tiny_config(**variant))
    _perturb(model)
    model.save_pretrained(tmp_path)

    loaded = model_class.from_pretrained(tmp_path).eval()
    expected = model.state_dict()
    actual = loaded.state_dict()
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), f"{name} was re-initialised or changed on load"
    torch.testing.assert_close(loaded(images()).to_tuple(), model(images()).to_tuple(), rtol=0, atol=0)


def test_base_checkpoint_into_classifier_initialises_only_the_head(tmp_path):
    base = build(ScratchViTModel, tiny_config())
    _perturb(base)
    base.save_pretrained(tmp_path)

    id2label = {i: f"class_{i}" for i in range(7)}
    classifier = ScratchViTForImageClassification.from_pretrained(
        tmp_path, id2label=id2label, label2id={v: k for k, v in id2label.items()}
    )
    base_state = base.state_dict()
    for name, tensor in classifier.state_dict().items():
        if name.startswith("vit."):
            assert torch.equal(tensor, base_state[name.removeprefix("vit.")]), name
    assert len([name for name in classifier.state_dict() if name.startswith("vit.")]) == len(base_state)

    # The new head gets the config's initialisation (std `initializer_range`, zero bias), not the perturbed values.
    head = classifier.classifier[-1]
    assert head.weight.shape == (7, 16)
    assert torch.equal(head.bias, torch.zeros(7))
    std = classifier.config.initializer_range
    assert 0.5 * std < head.weight.std() < 1.5 * std


def test_fresh_model_initialisation():
    model = build(ScratchViTForImageClassification, tiny_config(initializer_range=0.02))
    std = model.config.initializer_range
    for name, param in model.named_parameters():
        if "layernorm" in name:
            expected = torch.ones_like(param) if name.endswith("weight") else torch.zeros_like(param)
            assert torch.equal(param, expected), name
        elif name.endswith("bias"):
            assert torch.equal(param, torch.zeros_like(param)), name
        else:
            # Truncated normal with std `initializer_range` (cut at +-2 absolute, as in transformers' ViT).
            assert 0.5 * std < param.std() < 1.5 * std, name


def test_conv_stem_layout_and_initialisation():
    config = tiny_config(hidden_size=32, patch_size=8, image_size=32, patch_embedding_type="conv_stem")
    stem = build(ScratchViTModel, config).embeddings.patch_embeddings.projection
    convs = [m for m in stem if isinstance(m, torch.nn.Conv2d)]
    # log2(8) = 3 stride-2 3x3 convolutions whose channels double up to hidden_size, then a 1x1 convolution.
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (3, 8, (3, 3), (2, 2)),
        (8, 16, (3, 3), (2, 2)),
        (16, 32, (3, 3), (2, 2)),
        (32, 32, (1, 1), (1, 1)),
    ]
    for conv in convs[:-1]:  # He initialisation (fan out, ReLU), as transformers' ResNet
        expected = (2 / (conv.out_channels * 9)) ** 0.5
        assert 0.8 * expected < conv.weight.std() < 1.2 * expected
    for norm in (m for m in stem if isinstance(m, torch.nn.BatchNorm2d)):
        assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and torch.equal(
            norm.bias, torch.zeros_like(norm.bias)
        )
        assert torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean))
        assert torch.equal(norm.running_var, torch.ones_like(norm.running_var))


@pytest.mark.parametrize("patch_embedding_type, changed_tokens", [("linear", 1), ("conv_stem", 4)])
def test_conv_stem_tokens_see_across_patch_borders(patch_embedding_type, changed_tokens):
    """A pixel at the corner of four patches reaches one token through the patch projection, four through the stem."""
    model = build(ScratchViTModel, tiny_config(patch_embedding_type=patch_embedding_type))
    pixels = images()
    moved = pixels.clone()
    moved[:, :, 3, 3] += 1.0  # last pixel of patch (0, 0), next to patches (0, 1), (1, 0) and (1, 1)
    with torch.no_grad():
        before = model.embeddings.patch_embeddings(pixels)  # (B, 16, D)
        after = model.embeddings.patch_embeddings(moved)
    changed = (after - before).abs().amax(dim=(0, 2)) > 1e-6  # (16,)
    assert changed.sum().item() == changed_tokens
    assert changed.view(4, 4)[0, 0]


def test_conv_stem_batchnorm_statistics_update_only_in_training():
    model = build(ScratchViTForImageClassification, tiny_config(patch_embedding_type="conv_stem"))
    norm = model.vit.embeddings.patch_embeddings.projection[1]
    with torch.no_grad():
        model(images())
    assert torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean)), "eval mode must not update statistics"
    model.train()
    with torch.no_grad():
        model(images())
    assert norm.running_mean.abs().sum() > 0 and norm.num_batches_tracked.item() == 1
