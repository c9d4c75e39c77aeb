"""ScratchViTConfig: validation messages, model type and the save/load round trip."""

import json

import pytest

from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification


# (overrides, field, value as it appears in the message, a phrase of the suggested fix)
INVALID = [
    ({"hidden_size": 50, "num_attention_heads": 4}, "hidden_size", "50", "num_attention_heads` from [1, 2, 5, 10"),
    ({"image_size": 30, "patch_size": 4}, "image_size", "30", "Choose a `patch_size` that divides 30"),
    ({"position_embedding_type": "rope"}, "position_embedding_type", "'rope'", "['learned', 'sinusoidal']"),
    ({"pooling": "max"}, "pooling", "'max'", "['cls', 'mean']"),
    ({"head_type": "conv"}, "head_type", "'conv'", "['linear', 'mlp']"),
    ({"patch_embedding_type": "conv"}, "patch_embedding_type", "'conv'", "['linear', 'conv_stem']"),
    ({"patch_embedding_type": "conv_stem", "image_size": 36, "patch_size": 6}, "patch_size", "6", "power of 2"),
    ({"hidden_act": "gelu_fast_typo"}, "hidden_act", "'gelu_fast_typo'", "'quick_gelu'"),
    ({"head_hidden_act": "softplus"}, "head_hidden_act", "'softplus'", "'tanh'"),
    ({"hidden_size": 0}, "hidden_size", "0", "integer >= 1"),
    ({"patch_size": -4}, "patch_size", "-4", "integer >= 1"),
    ({"num_hidden_layers": 0}, "num_hidden_layers", "0", "integer >= 1"),
    ({"num_attention_heads": 0}, "num_attention_heads", "0", "integer >= 1"),
    ({"intermediate_size": 2.5}, "intermediate_size", "2.5", "integer >= 1"),
    ({"num_channels": True}, "num_channels", "True", "integer >= 1"),
    ({"head_hidden_size": 0}, "head_hidden_size", "0", "integer >= 1"),
    ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob", "1.0", "hidden_dropout_prob=0.1"),
    ({"attention_probs_dropout_prob": -0.1}, "attention_probs_dropout_prob", "-0.1", "in [0, 1)"),
    ({"head_dropout_prob": "0.1"}, "head_dropout_prob", "'0.1'", "head_dropout_prob=0.1"),
    ({"layer_norm_eps": 0.0}, "layer_norm_eps", "0.0", "positive number"),
    ({"initializer_range": -0.02}, "initializer_range", "-0.02", "positive number"),
    ({"qk_norm": "yes"}, "qk_norm", "'yes'", "true or false"),
]


@pytest.mark.parametrize("overrides, field, value, fix", INVALID, ids=[case[1] + "=" + case[2] for case in INVALID])
def test_invalid_value_raises_with_field_value_and_fix(overrides, field, value, fix):
    with pytest.raises(ValueError) as error:
        ScratchViTConfig(**overrides)
    message = str(error.value)
    assert f"`{field}`" in message
    assert value in message
    assert fix in message


def test_defaults_are_valid_and_model_type():
    config = ScratchViTConfig()
    assert config.model_type == ScratchViTConfig.model_type == "scratch_vit"
    assert config.to_dict()["model_type"] == "scratch_vit"
    assert config.num_patches == (32 // 4) ** 2
    # The MLP head's width follows `hidden_size` unless set.
    assert config.head_hidden_size == config.hidden_size
    assert ScratchViTConfig(hidden_size=64, head_hidden_size=20).head_hidden_size == 20


def test_round_trip_keeps_every_field(tmp_path):
    fields = {
        "image_size": 24,
        "patch_size": 8,
        "num_channels": 1,
        "hidden_size": 36,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "intermediate_size": 72,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.2,
        "qkv_bias": False,
        "qk_norm": True,
        "layer_norm_eps": 1e-6,
        "initializer_range": 0.05,
        "position_embedding_type": "sinusoidal",
        "patch_embedding_type": "conv_stem",
        "pooling": "mean",
        "head_type": "mlp",
        "head_hidden_size": 17,
        "head_hidden_act": "relu",
        "head_dropout_prob": 0.3,
    }
    id2label = {0: "airplane", 1: "automobile", 2: "bird"}
    config = ScratchViTConfig(**fields, id2label=id2label, label2id={v: k for k, v in id2label.items()})
    # Every field must differ from its default, or the round trip could pass by falling back to defaults.
    defaults = ScratchViTConfig()
    assert all(getattr(defaults, name) != value for name, value in fields.items())

    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "scratch_vit"
    loaded = ScratchViTConfig.from_pretrained(tmp_path)

    for name, value in fields.items():
        assert getattr(loaded, name) == value, name
    assert loaded.id2label == id2label
    assert loaded.label2id == {"airplane": 0, "automobile": 1, "bird": 2}
    assert loaded.num_labels == 3
    assert loaded.to_dict() == config.to_dict()


def test_invalid_saved_config_is_rejected_on_load(tmp_path):
    ScratchViTConfig().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    saved["num_attention_heads"] = 5  # 48 is not divisible by 5
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="`num_attention_heads` from"):
        ScratchViTConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"num_attention_heads": 5}, "`num_attention_heads` from"),
        ({"pooling": "max"}, "`pooling` must be one of ['cls', 'mean'], got 'max'"),
        ({"head_type": "MLP"}, "`head_type` must be one of ['linear', 'mlp'], got 'MLP'"),
        ({"image_size": 30}, "`image_size` (30) must be divisible by `patch_size` (4)"),
    ],
)
def test_a_config_changed_after_it_was_built_is_checked_before_a_model_is_built_or_saved(tmp_path, change, problem):
    """`from_pretrained`'s keyword arguments, and fields set by hand, change a config after `__init__` checked it: an
    unknown pooling had built a mean-pooled model, 5 heads over 48 channels a model that failed at its first batch."""
    ScratchViTForImageClassification(ScratchViTConfig(num_hidden_layers=1)).save_pretrained(tmp_path)
    config = ScratchViTConfig.from_pretrained(tmp_path, **change)  # transformers sets the keywords after __init__
    with pytest.raises(ValueError) as error:
        ScratchViTForImageClassification(config)
    assert problem in str(error.value)
    with pytest.raises(ValueError) as error:
        ScratchViTForImageClassification.from_pretrained(tmp_path, **change)
    assert problem in str(error.value)
    config = ScratchViTConfig()
    for name, value in change.items():
        setattr(config, name, value)
    with pytest.raises(ValueError) as error:
        config.save_pretrained(tmp_path / "changed")
    assert problem in str(error.value) and not (tmp_path / "changed" / "config.json").exists()
