"""PyTorch ScratchViT: a Vision Transformer written from scratch as a transformers model.

Pre-norm encoder blocks, one fused QKV projection and `scaled_dot_product_attention`, as in timm's
`vision_transformer.py`; the layout, names and outputs follow transformers' `modeling_vit.py`. Options that are
switched off become `nn.Identity()` or a small module chosen in `__init__`, so `forward` has few branches.

This file imports nothing from `transformers.models.vit` and only `.configuration_scratch_vit` relatively, so the
Hub's remote-code loader can copy it next to a checkpoint.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import logging

from .configuration_scratch_vit import ScratchViTConfig


logger = logging.get_logger(__name__)


def sinusoidal_position_embeddings(num_positions: int, dim: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Fixed 1-D sine/cosine embeddings of "Attention Is All You Need": row `t` holds
    `sin(t / 10000^(2i/dim))` in column `2i` and `cos(t / 10000^(2i/dim))` in column `2i + 1`."""
    position = torch.arange(num_positions, dtype=torch.float32, device=device).unsqueeze(1)  # (T, 1)
    frequencies = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim)
    )  # (ceil(dim / 2),)
    angles = position * frequencies  # (T, ceil(dim / 2))
    embeddings = torch.zeros(num_positions, dim, device=device)
    embeddings[:, 0::2] = torch.sin(angles)
    embeddings[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return embeddings.to(dtype)


class ScratchViTStemConv(nn.Conv2d):
    """A 3x3 convolution of the convolutional stem (its own class so `_init_weights` gives it He initialisation)."""


class ScratchViTConvStem(nn.Sequential):
    """Xiao et al. 2021's convolutional stem: log2(patch_size) blocks of 3x3 convolution with stride 2, BatchNorm
    and ReLU, then a 1x1 convolution to `hidden_size`. The channels double from block to block and end at
    `hidden_size` (hidden 64, patch 4: 3 -> 32 -> 64 -> 1x1 -> 64). Output grid: (H / patch_size, W / patch_size).
    """

    def __init__(self, config: ScratchViTConfig):
        num_blocks = config.patch_size.bit_length() - 1  # patch_size = 2 ** num_blocks
        layers, channels = [], config.num_channels
        for i in range(num_blocks):
            out_channels = max(config.hidden_size >> (num_blocks - 1 - i), 8)
            layers += [
                ScratchViTStemConv(channels, out_channels, kernel_size=3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
            ]
            channels = out_channels
        layers.append(nn.Conv2d(channels, config.hidden_size, kernel_size=1))
        super().__init__(*layers)


class ScratchViTPatchEmbeddings(nn.Module):
    """Cuts images into non-overlapping `patch_size` squares and projects each to `hidden_size`.

    A convolution with kernel and stride `patch_size` is exactly "cut into patches, flatten in (channel, row,
    column) order, apply one linear layer", computed in one fused op. With `patch_embedding_type="conv_stem"`, a
    small convolutional stem (`ScratchViTConvStem`) makes the same grid of tokens instead.
    """

    def __init__(self, config: ScratchViTConfig):
        super().__init__()
        self.num_channels = config.num_channels
        self.patch_size = config.patch_size
        if config.patch_embedding_type == "conv_stem":
            self.projection = ScratchViTConvStem(config)
        else:
            self.projection = nn.Conv2d(
                config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
            )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        _, num_channels, height, width = pixel_values.shape
        if num_channels != self.num_channels:
            convert = "RGB images to the image processor (`image.convert('RGB')`)"
            if self.num_channels == 1:
                convert = (
                    "grayscale images to the image processor (`image.convert('L')`; pipeline() converts every image "
                    "to RGB, so it cannot feed this model)"
                )
            raise ValueError(
                f"Expected {self.num_channels} channel(s) in `pixel_values` as set in the config (`num_channels`), "
                f"got {num_channels}. Pass {convert}, or build a new model "
                f"with `num_channels={num_channels}`."
            )
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"Image size ({height}x{width}) must be a multiple of `patch_size` ({self.patch_size}). "
                "Resize the images to a multiple of the patch size."
            )
        embeddings = self.projection(pixel_values)  # (B, C, H, W) -> (B, D, H/p, W/p)
        return embeddings.flatten(2).transpose(1, 2)  # (B, D, H/p, W/p) -> (B, N, D)


class ScratchViTLearnedPositions(nn.Module):
    """A trained embedding per token position (CLS included) on the `image_size` grid."""

    def __init__(self, config: ScratchViTConfig, num_prefix_tokens: int):
        super().__init__()
        self.position_embeddings = nn.Parameter(
            torch.zeros(1, num_prefix_tokens + config.num_patches, config.hidden_size)
        )

    def forward(self, device: torch.device) -> torch.Tensor:
        return self.position_embeddings  # (1, P + g*g, D), on its device already


class ScratchViTSinusoidalPositions(nn.Module):
    """Fixed 1-D sinusoidal embeddings over the token index (CLS first) on the `image_size` grid.

    They are computed on the fly, not stored, so checkpoints carry no redundant tensor.
    """

    def __init__(self, config: ScratchViTConfig, num_prefix_tokens: int):
        super().__init__()
        self.num_positions = num_prefix_tokens + config.num_patches
        self.hidden_size = config.hidden_size

    def forward(self, device: torch.device) -> torch.Tensor:
        return sinusoidal_position_embeddings(self.num_positions, self.hidden_size, device=device).unsqueeze(0)


class ScratchViTEmbeddings(nn.Module):
    """Patch embeddings, an optional CLS token, position embeddings and dropout."""

    def __init__(self, config: ScratchViTConfig):
        super().__init__()
        self.num_prefix_tokens = 1 if config.pooling == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size)) if self.num_prefix_tokens else None
        self.patch_embeddings = ScratchViTPatchEmbeddings(config)
        positions = {"learned": ScratchViTLearnedPositions, "sinusoidal": ScratchViTSinusoidalPositions}
        self.position_embeddings = positions[config.position_embedding_type](config, self.num_prefix_tokens)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.patch_size = config.patch_size
        self.grid_size = config.image_size // config.patch_size

    def interpolate_pos_encoding(self, positions: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        """The training grid's position embeddings resized bicubically to another patch grid, the CLS position kept
        as is (transformers' ViT); learned and sinusoidal ones alike, so each patch keeps the position it covers."""
        if (grid_height, grid_width) == (self.grid_size, self.grid_size):
            return positions
        g, dim = self.grid_size, positions.shape[-1]
        prefix, grid = positions[:, : self.num_prefix_tokens], positions[:, self.num_prefix_tokens :]
        grid = grid.reshape(1, g, g, dim).permute(0, 3, 1, 2)  # (1, g*g, D) -> (1, D, g, g)
        grid = F.interpolate(grid.float(), size=(grid_height, grid_width), mode="bicubic", align_corners=False).to(
            grid.dtype
        )  # (1, D, g, g) -> (1, D, h, w)
        grid = grid.permute(0, 2, 3, 1).reshape(1, grid_height * grid_width, dim)  # (1, D, h, w) -> (1, h*w, D)
        return torch.cat([prefix, grid], dim=1)

    def resize_position_embeddings(self, grid_size: int) -> None:
        """Learned position embeddings resized once to another square patch grid (fine-tuning at another resolution),
        so the model takes that grid natively; the caller sets `config.image_size` to match."""
        if not isinstance(self.position_embeddings, ScratchViTLearnedPositions):
            raise ValueError(
                "Sinusoidal position embeddings are computed from the token index when the model is built, so a "
                "resized grid would not be kept: pass `interpolate_pos_encoding=True` at each call instead."
            )
        learned = self.position_embeddings
        with torch.no_grad():
            resized = self.interpolate_pos_encoding(learned.position_embeddings, grid_size, grid_size)
        learned.position_embeddings = nn.Parameter(resized.detach().clone())
        self.grid_size = grid_size

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        height, width = pixel_values.shape[-2:]
        grid_height, grid_width = height // self.patch_size, width // self.patch_size
        if (grid_height, grid_width) != (self.grid_size, self.grid_size) and not interpolate_pos_encoding:
            raise ValueError(
                f"The model was trained on a {self.grid_size}x{self.grid_size} patch grid but got "
                f"{grid_height}x{grid_width}. Resize the images to the model's `image_size`, or pass "
                "`interpolate_pos_encoding=True` to interpolate the position embeddings."
            )
        # The residual stream keeps the images' dtype, which `ScratchViTModel` sets to the weights' dtype: float32
        # under autocast, where only matmuls and convolutions run in bf16 and their outputs are added back in float32
        # (as in timm and transformers' ViT). A bf16 stream would round every block's update to 8 significant bits.
        dtype = pixel_values.dtype
        embeddings = self.patch_embeddings(pixel_values).to(dtype)  # (B, C, H, W) -> (B, N, D)
        if self.cls_token is not None:
            cls_tokens = self.cls_token.expand(embeddings.shape[0], -1, -1)  # (1, 1, D) -> (B, 1, D)
            embeddings = torch.cat([cls_tokens.to(dtype), embeddings], dim=1)  # (B, N, D) -> (B, 1 + N, D)
        positions = self.position_embeddings(embeddings.device)  # (1, P + g*g, D) on the training grid
        positions = self.interpolate_pos_encoding(positions, grid_height, grid_width)  # (1, P + h*w, D)
        embeddings = embeddings + positions.to(dtype)
        return self.dropout(embeddings)


class ScratchViTAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection.

    With `config.qk_norm`, the queries and keys of each head are layer-normalized before their dot product, which
    bounds the attention logits (timm's `qk_norm`).

    Runs `scaled_dot_product_attention` (flash / memory-efficient kernels where available). When the attention
    probabilities are requested, it computes softmax(QK^T / sqrt(d)) explicitly instead, since SDPA does not
    return them; both paths give the same output. The explicit path is also taken with `attn_implementation="eager"`
    (read from the config at every call, as transformers sets it after `__init__`): on CPU under bf16 autocast the
    SDPA kernel is several times slower than matmul + softmax at small head sizes.
    """

    def __init__(self, config: ScratchViTConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=config.layer_norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=config.layer_norm_eps) if config.qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(config.attention_probs_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.proj_drop = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, C = hidden_states.shape
        qkv = self.qkv(hidden_states).reshape(
            B, T, 3, self.num_heads, self.head_dim
        )  # (B, T, 3C) -> (B, T, 3, nh, hs)
        # Unbind the "3" axis in place, then move heads forward: backward then stacks the three gradients straight
        # into the (B, T, 3, nh, hs) layout the projection needs, instead of stacking and copying again (a few % of a
        # training step for small models on CPU).
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, T, 3, nh, hs) -> 3 x (B, nh, T, hs)
        q, k = self.q_norm(q), self.k_norm(k)  # per head, over hs (`qk_norm`; identities without it)
        if output_attentions or self.config._attn_implementation == "eager":
            probs = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)  # (B, nh, T, T)
            context = self.attn_drop(probs) @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
        else:
            probs = None
            dropout = self.attn_drop.p if self.training else 0.0
            context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)  # (B, nh, T, hs)
        context = context.transpose(1, 2).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        return self.proj_drop(self.out_proj(context)), probs if output_attentions else None


class ScratchViTMLP(nn.Module):
    """The block's feed-forward network: linear, activation, linear, dropout."""

    def __init__(self, config: ScratchViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.act(self.fc1(hidden_states))))


class ScratchViTDropPath(nn.Module):
    """Stochastic depth: in training, zeroes a residual branch for each sample with probability `p` and scales the kept
    ones by 1 / (1 - p), so the expected output is unchanged."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, branch: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return branch
        keep = torch.empty(branch.shape[:1] + (1,) * (branch.ndim - 1), device=branch.device, dtype=branch.dtype)
        return branch * keep.bernoulli_(1 - self.p) / (1 - self.p)  # (B, 1, 1) mask on (B, T, C)


class ScratchViTLayer(GradientCheckpointingLayer):
    """A pre-norm encoder block: x + attention(LN(x)), then x + MLP(LN(x)); with stochastic depth, each residual
    branch is dropped per sample with probability `drop_path`."""

    def __init__(self, config: ScratchViTConfig, drop_path: float = 0.0):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = ScratchViTAttention(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = ScratchViTMLP(config)
        self.drop_path = ScratchViTDropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attention_output, probs = self.attention(self.layernorm_before(hidden_states), output_attentions)
        hidden_states = hidden_states + self.drop_path(attention_output)
        hidden_states = hidden_states + self.drop_path(self.mlp(self.layernorm_after(hidden_states)))
        return hidden_states, probs


class ScratchViTEncoder(nn.Module):
    """The stack of encoder blocks; collects hidden states and attention probabilities when asked."""

    def __init__(self, config: ScratchViTConfig):
        super().__init__()
        # Stochastic depth rises linearly with depth, from 0 at the first block to `drop_path_rate` at the last.
        L = config.num_hidden_layers
        rates = [config.drop_path_rate * i / max(L - 1, 1) for i in range(L)]
        self.layer = nn.ModuleList([ScratchViTLayer(config, rate) for rate in rates])
        self.gradient_checkpointing = False

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool = False, output_hidden_states: bool = False
    ) -> BaseModelOutput:
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, output_attentions)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (probs,)
        return BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )


class ScratchViTCLSPooler(nn.Module):
    """Pools the sequence to the final state of the CLS token."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states[:, 0]  # (B, 1 + N, D) -> (B, D)


class ScratchViTMeanPooler(nn.Module):
    """Pools the sequence to the mean of the patch tokens (there is no CLS token with this pooling)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states.mean(dim=1)  # (B, N, D) -> (B, D)


class ScratchViTPreTrainedModel(PreTrainedModel):
    """Weight initialisation and the transformers plumbing shared by the ScratchViT models."""

    config_class = ScratchViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["ScratchViTEmbeddings", "ScratchViTLayer"]
    _supports_sdpa = True

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # transformers guesses from a model's source whether `set_attn_implementation` can switch its attention (it
        # looks for the AttentionInterface), and otherwise only warns and keeps the old one. ScratchViTAttention reads
        # `config._attn_implementation` at every call, so switching between "sdpa" and "eager" works.
        return True

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        # `register_for_auto_class` names only the saved class in config.json's `auto_map`; name both, so that remote
        # code loads the bare encoder from a classifier's folder (`AutoModel`, the image-feature-extraction pipeline)
        # and a classifier with a new head from an encoder's (as `AutoModelForImageClassification` does a ViTModel's).
        auto_map = getattr(self.config, "auto_map", None) or {}
        self.config.auto_map = {
            **auto_map,
            "AutoModel": "modeling_scratch_vit.ScratchViTModel",
            "AutoModelForImageClassification": "modeling_scratch_vit.ScratchViTForImageClassification",
        }
        super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Truncated-normal weights, zero biases, unit LayerNorms, as transformers' ViT; the convolutional stem's
        3x3 convolutions and BatchNorms as transformers' ResNet (He initialisation, unit BatchNorms).

        The `transformers.initialization` functions skip any tensor already loaded from a checkpoint, so
        `from_pretrained` never overwrites trained weights (transformers 5's rule).
        """
        std = self.config.initializer_range
        if isinstance(module, ScratchViTStemConv):
            init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            init.zeros_(module.running_mean)
            init.ones_(module.running_var)
            init.zeros_(module.num_batches_tracked)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ScratchViTLearnedPositions):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
        elif isinstance(module, ScratchViTEmbeddings) and module.cls_token is not None:
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)


class ScratchViTModel(ScratchViTPreTrainedModel):
    """The bare ScratchViT encoder: embeddings, encoder blocks, a final LayerNorm and the pooler.

    `pooler_output` is the CLS token's final state or the mean of the patch tokens, per `config.pooling`.
    """

    def __init__(self, config: ScratchViTConfig):
        # Checked again here: `from_pretrained(path, pooling="max")` and fields set by hand change a config after its
        # `__init__` checked it, and an unknown value would build another model than the one named.
        config.validate_fields()
        super().__init__(config)
        self.config = config
        self.embeddings = ScratchViTEmbeddings(config)
        self.encoder = ScratchViTEncoder(config)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pooler = ScratchViTCLSPooler() if config.pooling == "cls" else ScratchViTMeanPooler()
        self.post_init()

    def get_input_embeddings(self) -> ScratchViTPatchEmbeddings:
        return self.embeddings.patch_embeddings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling | tuple:
        """
        Args:
            pixel_values (`torch.Tensor` of shape `(batch_size, num_channels, height, width)`):
                Normalised images, as an image processor prepares them.
            output_attentions (`bool`, *optional*):
                Return the attention probabilities of every layer, `(batch_size, heads, tokens, tokens)` each.
            output_hidden_states (`bool`, *optional*):
                Return the embeddings' output and every layer's output, `(batch_size, tokens, hidden_size)` each.
            interpolate_pos_encoding (`bool`, *optional*):
                Accept images of another resolution than `config.image_size` by interpolating the position
                embeddings of its patch grid.
            return_dict (`bool`, *optional*):
                Return a `BaseModelOutputWithPooling` instead of a plain tuple.
        """
        if pixel_values is None:
            raise ValueError(
                "You have to specify `pixel_values` (a float tensor of shape (batch, channels, height, width))."
            )
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict

        # Match the weights' dtype (e.g. float32 images into a bf16 model), as transformers' ViT does.
        expected_dtype = next(self.embeddings.patch_embeddings.parameters()).dtype
        if pixel_values.dtype != expected_dtype:
            pixel_values = pixel_values.to(expected_dtype)

        embedding_output = self.embeddings(pixel_values, interpolate_pos_encoding=bool(interpolate_pos_encoding))
        encoder_outputs = self.encoder(
            embedding_output, output_attentions=output_attentions, output_hidden_states=output_hidden_states
        )
        sequence_output = self.layernorm(encoder_outputs.last_hidden_state)
        pooled_output = self.pooler(sequence_output)

        if not return_dict:
            extra = tuple(v for v in (encoder_outputs.hidden_states, encoder_outputs.attentions) if v is not None)
            return (sequence_output, pooled_output) + extra
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=pooled_output,
            hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions,
        )


class ScratchViTForImageClassification(ScratchViTPreTrainedModel):
    """ScratchViT with a classification head (one linear layer or a two-layer MLP) on the pooled output.

    With `labels`, the loss follows transformers' `problem_type` rules: regression (`num_labels == 1`),
    single-label classification (integer labels) or multi-label classification (float labels).
    """

    def __init__(self, config: ScratchViTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = ScratchViTModel(config)
        if config.head_type == "mlp":
            self.classifier = nn.Sequential(
                nn.Linear(config.hidden_size, config.head_hidden_size),
                ACT2FN[config.head_hidden_act],
                nn.Dropout(config.head_dropout_prob),
                nn.Linear(config.head_hidden_size, config.num_labels),
            )
        else:
            self.classifier = nn.Sequential(
                nn.Dropout(config.head_dropout_prob), nn.Linear(config.hidden_size, config.num_labels)
            )
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ImageClassifierOutput | tuple:
        """
        Args:
            labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
                Class indices in `[0, config.num_labels)` for the classification loss (or floats for regression and
                multi-label problems, per `config.problem_type`).

        The other arguments are those of [`ScratchViTModel.forward`].
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.vit(
            pixel_values,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            interpolate_pos_encoding=interpolate_pos_encoding,
            return_dict=True,
        )
        logits = self.classifier(outputs.pooler_output)  # (B, D) -> (B, num_labels)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels, logits, self.config, **kwargs)

        if not return_dict:
            output = (logits,) + tuple(v for v in (outputs.hidden_states, outputs.attentions) if v is not None)
            return ((loss,) + output) if loss is not None else output
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = ["ScratchViTForImageClassification", "ScratchViTModel", "ScratchViTPreTrainedModel"]
