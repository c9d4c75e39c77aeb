"""ScratchViT against an independent, textbook ViT written here in plain torch with per-head loops.

The reference runs in float64 on weights copied out of the model's state dict (the fused QKV weight split into
per-head slices here), so any disagreement beyond float32 rounding is a bug in the model.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification
from scratch_vit.modeling_scratch_vit import sinusoidal_position_embeddings


ATOL = 1e-5


def patchify(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into patches, each flattened in (channel, row, column) order, patches in row-major order."""
    B, C, H, W = pixels.shape
    p = patch_size
    x = pixels.reshape(B, C, H // p, p, W // p, p)  # (B, C, gh, p, gw, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, C, gh, p, gw, p) -> (B, gh, gw, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)  # (B, gh, gw, C, p, p) -> (B, N, C*p*p)


def sinusoid_table(num_positions: int, dim: int) -> torch.Tensor:
    """PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(t / 10000^(2i/d)), straight from the formula."""
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    for t in range(num_positions):
        for even in range(0, dim, 2):
            angle = t / 10000 ** (even / dim)
            table[t, even] = math.sin(angle)
            if even + 1 < dim:
                table[t, even + 1] = math.cos(angle)
    return table


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU, x * Phi(x)."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def softmax(scores: torch.Tensor) -> torch.Tensor:
    exp = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return exp / exp.sum(dim=-1, keepdim=True)


def reference_forward(model: ScratchViTForImageClassification, pixels: torch.Tensor) -> dict:
    """The textbook ViT forward pass in float64 with the model's weights; returns every intermediate we compare."""
    config = model.config
    w = {name: tensor.detach().double() for name, tensor in model.state_dict().items()}
    D, p, eps = config.hidden_size, config.patch_size, config.layer_norm_eps
    nh = config.num_attention_heads
    hs = D // nh
    x = pixels.double()
    B, _, H, W = x.shape
    gh, gw = H // p, W // p

    # Patches, one linear projection (the conv kernel flattened in (channel, row, column) order).
    projection = w["vit.embeddings.patch_embeddings.projection.weight"].reshape(D, -1)  # (D, C*p*p)
    x = patchify(x, p) @ projection.T + w["vit.embeddings.patch_embeddings.projection.bias"]  # (B, N, D)
    if config.pooling == "cls":
        cls = w["vit.embeddings.cls_token"].expand(B, 1, D)
        x = torch.cat([cls, x], dim=1)  # (B, 1 + N, D)
    num_prefix = 1 if config.pooling == "cls" else 0

    g = config.image_size // p
    if config.position_embedding_type == "learned":
        table = w["vit.embeddings.position_embeddings.position_embeddings"][0]  # (num_prefix + g*g, D)
    else:
        table = sinusoid_table(num_prefix + g * g, D)
    if (gh, gw) != (g, g):
        # The training grid's table resized bicubically, as transformers' ViT does; the CLS position is kept as is.
        grid = table[num_prefix:].reshape(g, g, D).permute(2, 0, 1)[None]  # (1, D, g, g)
        grid = F.interpolate(grid.float(), size=(gh, gw), mode="bicubic", align_corners=False).double()
        table = torch.cat([table[:num_prefix], grid[0].permute(1, 2, 0).reshape(gh * gw, D)])
    x = x + table  # (B, T, D) + (T, D)

    hidden_states, attentions = [x], []
    for i in range(config.num_hidden_layers):
        prefix = f"vit.encoder.layer.{i}."
        h = layer_norm(x, w[prefix + "layernorm_before.weight"], w[prefix + "layernorm_before.bias"], eps)
        qkv_weight = w[prefix + "attention.qkv.weight"]  # (3D, D): the query, key and value rows stacked
        qkv_bias = w.get(prefix + "attention.qkv.bias", torch.zeros(3 * D, dtype=torch.float64))
        heads, probs = [], []
        for head in range(nh):
            q_rows = slice(head * hs, (head + 1) * hs)
            k_rows = slice(D + head * hs, D + (head + 1) * hs)
            v_rows = slice(2 * D + head * hs, 2 * D + (head + 1) * hs)
            q = h @ qkv_weight[q_rows].T + qkv_bias[q_rows]  # (B, T, hs)
            k = h @ qkv_weight[k_rows].T + qkv_bias[k_rows]  # (B, T, hs)
            v = h @ qkv_weight[v_rows].T + qkv_bias[v_rows]  # (B, T, hs)
            if config.qk_norm:  # one LayerNorm over each head's hs channels, shared by the heads
                q = layer_norm(q, w[prefix + "attention.q_norm.weight"], w[prefix + "attention.q_norm.bias"], eps)
                k = layer_norm(k, w[prefix + "attention.k_norm.weight"], w[prefix + "attention.k_norm.bias"], eps)
            a = softmax(q @ k.transpose(1, 2) / math.sqrt(hs))  # (B, T, T)
            heads.append(a @ v)  # (B, T, hs)
            probs.append(a)
        context = torch.cat(heads, dim=-1)  # nh x (B, T, hs) -> (B, T, D)
        x = x + context @ w[prefix + "attention.out_proj.weight"].T + w[prefix + "attention.out_proj.bias"]
        h = layer_norm(x, w[prefix + "layernorm_after.weight"], w[prefix + "layernorm_after.bias"], eps)
        h = gelu(h @ w[prefix + "mlp.fc1.weight"].T + w[prefix + "mlp.fc1.bias"])
        x = x + h @ w[prefix + "mlp.fc2.weight"].T + w[prefix + "mlp.fc2.bias"]
        hidden_states.append(x)
        attentions.append(torch.stack(probs, dim=1))  # (B, nh, T, T)

    sequence = layer_norm(x, w["vit.layernorm.weight"], w["vit.layernorm.bias"], eps)
    pooled = sequence[:, 0] if config.pooling == "cls" else sequence[:, num_prefix:].mean(dim=1)
    if config.head_type == "mlp":
        hidden = torch.tanh(pooled @ w["classifier.0.weight"].T + w["classifier.0.bias"])
        logits = hidden @ w["classifier.3.weight"].T + w["classifier.3.bias"]
    else:
        logits = pooled @ w["classifier.1.weight"].T + w["classifier.1.bias"]
    return {
        "hidden_states": hidden_states,
        "attentions": attentions,
        "last_hidden_state": sequence,
        "pooled": pooled,
        "logits": logits,
    }


def tiny_config(**overrides) -> ScratchViTConfig:
    fields = {
        "image_size": 16,
        "patch_size": 4,
        "hidden_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 3,
        "intermediate_size": 40,
        "num_labels": 4,
    }
    fields.update(overrides)
    return ScratchViTConfig(**fields)


def trained_like(config: ScratchViTConfig, seed: int = 0) -> ScratchViTForImageClassification:
    """A model with weights large enough that attention is far from uniform and every term matters."""
    torch.manual_seed(seed)
    model = ScratchViTForImageClassification(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "layernorm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif "_norm." in name and name.endswith("weight"):  # qk_norm's scales: peaked attention needs > 1
                param.copy_(1.5 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.2 * noise)
            elif param.dim() >= 2 and "embeddings.c" not in name and "position" not in name:
                fan_in = param[0].numel()
                param.copy_(1.5 * noise / math.sqrt(fan_in))
            else:  # CLS token and learned positions
                param.copy_(0.5 * noise)
    return model


def assert_matches_reference(model, pixels, interpolate_pos_encoding=False):
    expected = reference_forward(model, pixels)
    out = model(
        pixels, output_attentions=True, output_hidden_states=True, interpolate_pos_encoding=interpolate_pos_encoding
    )
    assert len(out.hidden_states) == len(expected["hidden_states"]) == model.config.num_hidden_layers + 1
    for i, (actual, reference) in enumerate(zip(out.hidden_states, expected["hidden_states"])):
        torch.testing.assert_close(actual, reference.float(), rtol=0, atol=ATOL, msg=f"hidden_states[{i}]")
    assert len(out.attentions) == len(expected["attentions"])
    for i, (actual, reference) in enumerate(zip(out.attentions, expected["attentions"])):
        torch.testing.assert_close(actual, reference.float(), rtol=0, atol=ATOL, msg=f"attentions[{i}]")
    torch.testing.assert_close(out.logits, expected["logits"].float(), rtol=0, atol=ATOL)

    # The SDPA path (no attentions requested) must agree with the reference too.
    fast = model.vit(pixels, interpolate_pos_encoding=interpolate_pos_encoding)
    torch.testing.assert_close(fast.last_hidden_state, expected["last_hidden_state"].float(), rtol=0, atol=ATOL)
    torch.testing.assert_close(fast.pooler_output, expected["pooled"].float(), rtol=0, atol=ATOL)
    fast_logits = model(pixels, interpolate_pos_encoding=interpolate_pos_encoding).logits
    torch.testing.assert_close(fast_logits, expected["logits"].float(), rtol=0, atol=ATOL)
    return out, expected


CASES = [
    {"position_embedding_type": "learned", "pooling": "cls"},
    {"position_embedding_type": "learned", "pooling": "mean"},
    {"position_embedding_type": "sinusoidal", "pooling": "cls"},
    {"position_embedding_type": "sinusoidal", "pooling": "mean"},
    {"position_embedding_type": "learned", "pooling": "cls", "head_type": "mlp", "head_hidden_size": 10},
    {"position_embedding_type": "sinusoidal", "pooling": "mean", "head_type": "mlp", "qkv_bias": False},
    {"position_embedding_type": "learned", "pooling": "cls", "qk_norm": True},
    {"position_embedding_type": "sinusoidal", "pooling": "mean", "qk_norm": True, "qkv_bias": False},
]
CASE_IDS = [
    "learned-cls",
    "learned-mean",
    "sinusoidal-cls",
    "sinusoidal-mean",
    "mlp-head",
    "mlp-head-no-qkv-bias",
    "qk-norm-cls",
    "qk-norm-mean-no-qkv-bias",
]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_reference(case):
    model = trained_like(tiny_config(**case))
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    out, expected = assert_matches_reference(model, pixels)

    # The weights make attention peaked, so the comparison exercises the softmax and not a uniform average.
    assert max(a.max().item() for a in out.attentions) > 0.5
    # transformers' convention: hidden_states[0] is the embeddings' output, hidden_states[i] block i's output
    # before the final LayerNorm, which only last_hidden_state has.
    embeddings = model.vit.embeddings(pixels)
    torch.testing.assert_close(out.hidden_states[0], embeddings, rtol=0, atol=0)
    block_1 = model.vit.encoder.layer[0](out.hidden_states[0], output_attentions=True)[0]
    torch.testing.assert_close(out.hidden_states[1], block_1, rtol=0, atol=1e-6)
    last_hidden_state = model.vit(pixels, output_attentions=True).last_hidden_state
    torch.testing.assert_close(last_hidden_state, model.vit.layernorm(out.hidden_states[-1]), rtol=0, atol=1e-6)
    assert not torch.allclose(last_hidden_state, out.hidden_states[-1], atol=1e-2)


@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_matches_reference_at_other_resolution(position_embedding_type, pooling):
    model = trained_like(tiny_config(position_embedding_type=position_embedding_type, pooling=pooling))
    pixels = torch.randn(2, 3, 24, 12, generator=torch.Generator().manual_seed(4))  # a 6x3 patch grid
    assert_matches_reference(model, pixels, interpolate_pos_encoding=True)


def test_sinusoidal_table_matches_formula():
    for num_positions, dim in [(17, 24), (65, 64), (10, 7)]:
        torch.testing.assert_close(
            sinusoidal_position_embeddings(num_positions, dim), sinusoid_table(num_positions, dim).float()
        )


@pytest.mark.parametrize("height, width, channels", [(16, 16, 3), (8, 12, 3), (12, 8, 1)])
def test_patch_embedding_is_unfold_then_one_linear(height, width, channels):
    config = tiny_config(num_channels=channels)
    patch_embeddings = trained_like(config).vit.embeddings.patch_embeddings
    conv = patch_embeddings.projection
    pixels = torch.randn(2, channels, height, width, generator=torch.Generator().manual_seed(5))

    # The reshape-based cut agrees with torch's own sliding-window unfold.
    patches = patchify(pixels, config.patch_size)
    torch.testing.assert_close(patches, F.unfold(pixels, config.patch_size, stride=config.patch_size).transpose(1, 2))

    linear = nn.Linear(channels * config.patch_size**2, config.hidden_size)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(config.hidden_size, -1))
        linear.bias.copy_(conv.bias)
    expected = linear(patches)  # (B, N, D)
    assert expected.shape == (2, (height // 4) * (width // 4), config.hidden_size)
    torch.testing.assert_close(patch_embeddings(pixels), expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qk_norm_makes_attention_independent_of_query_and_key_scale(qk_norm):
    """Attention-logit growth is the query and key projections growing; qk_norm removes their scale from the logits.

    Scaling the query and key rows of the fused projection by 30 leaves every attention map unchanged with qk_norm
    (LayerNorm is scale-invariant) and collapses attention onto single tokens without it."""
    model = trained_like(tiny_config(qk_norm=qk_norm))
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    before = model(pixels, output_attentions=True).attentions
    D = model.config.hidden_size
    with torch.no_grad():
        for layer in model.vit.encoder.layer:
            layer.attention.qkv.weight[: 2 * D] *= 30.0
            layer.attention.qkv.bias[: 2 * D] *= 30.0
    after = model(pixels, output_attentions=True).attentions
    if qk_norm:
        for a, b in zip(before, after):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    else:
        assert max(a.max().item() for a in after) > 0.999 > max(b.max().item() for b in before)
