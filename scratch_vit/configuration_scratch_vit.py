"""ScratchViT model configuration."""

from transformers import PretrainedConfig


PATCH_EMBEDDING_TYPES = ("linear", "conv_stem")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")
POOLING_TYPES = ("cls", "mean")
HEAD_TYPES = ("linear", "mlp")
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh", "quick_gelu")


class ScratchViTConfig(PretrainedConfig):
    r"""
    Configuration of a [`ScratchViTModel`]: a Vision Transformer written from scratch, named as transformers'
    `ViTConfig` names its fields, plus the variants of the teaching notebooks (sinusoidal positions, mean pooling,
    an MLP head). The defaults give a small CIFAR-10 model (32 px, patch 4, hidden 48, 4 layers, 4 heads).

    Args:
        image_size (`int`, *optional*, defaults to 32):
            Height and width of the (square) input images, in pixels.
        patch_size (`int`, *optional*, defaults to 4):
            Height and width of each patch; `image_size` must be a multiple of it.
        num_channels (`int`, *optional*, defaults to 3):
            Number of input channels (3 for RGB, 1 for grayscale).
        hidden_size (`int`, *optional*, defaults to 48):
            Width of the token embeddings and of every encoder layer.
        num_hidden_layers (`int`, *optional*, defaults to 4):
            Number of pre-norm encoder blocks.
        num_attention_heads (`int`, *optional*, defaults to 4):
            Attention heads per block; must divide `hidden_size`.
        intermediate_size (`int`, *optional*, defaults to 192):
            Width of the hidden layer of each block's MLP.
        hidden_act (`str`, *optional*, defaults to `"gelu"`):
            Activation of the blocks' MLP; one of `gelu`, `gelu_new`, `gelu_pytorch_tanh`, `relu`, `silu`,
            `swish`, `tanh`, `quick_gelu`.
        hidden_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout on the embeddings, the attention output projection and the MLP output.
        attention_probs_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout on the attention probabilities.
        drop_path_rate (`float`, *optional*, defaults to 0.0):
            Stochastic depth: the largest probability of dropping a block's residual branch for a sample in training,
            rising linearly from 0 at the first block to this at the last (as in timm and DeiT).
        qkv_bias (`bool`, *optional*, defaults to `True`):
            Whether the fused query/key/value projection has a bias.
        qk_norm (`bool`, *optional*, defaults to `False`):
            Apply a LayerNorm (over each head's `hidden_size / num_attention_heads` channels, with its own scale and
            bias) to the queries and the keys before their dot product, as timm's `qk_norm` (Dehghani et al. 2023,
            "Scaling Vision Transformers to 22 Billion Parameters"). It bounds the attention logits, whose growth at
            high learning rates makes attention collapse onto single tokens and training diverge, most readily under
            bf16 (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities").
        layer_norm_eps (`float`, *optional*, defaults to 1e-12):
            Epsilon of every LayerNorm (transformers' ViT uses 1e-12).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the truncated-normal initialisation of linear, convolution and embedding weights.
        patch_embedding_type (`str`, *optional*, defaults to `"linear"`):
            `"linear"`: each non-overlapping `patch_size` square is flattened and projected by one linear layer (a
            strided convolution), as in ViT. `"conv_stem"`: a small convolutional stem, as in Xiao et al. 2021, "Early
            Convolutions Help Transformers See Better": log2(`patch_size`) 3x3 convolutions of stride 2, each with
            BatchNorm and ReLU (channels doubling up to `hidden_size`), then a 1x1 convolution to `hidden_size`. Same
            tokens, overlapping receptive fields; it trains faster from scratch on small datasets. `patch_size`
            must be a power of 2.
        position_embedding_type (`str`, *optional*, defaults to `"learned"`):
            `"learned"`: a trained position embedding per token (CLS included). `"sinusoidal"`: fixed 1-D sine/cosine
            embeddings over the token index, as in "Attention Is All You Need". Both are interpolated bicubically
            over the patch grid for other resolutions.
        pooling (`str`, *optional*, defaults to `"cls"`):
            `"cls"`: a learned CLS token is prepended and its final state feeds the head. `"mean"`: no CLS token;
            the head sees the mean of the patch tokens.
        head_type (`str`, *optional*, defaults to `"linear"`):
            `"linear"`: one linear layer. `"mlp"`: linear, activation, dropout, linear.
        head_hidden_size (`int`, *optional*):
            Hidden width of the MLP head; defaults to `hidden_size`. Only used with `head_type="mlp"`.
        head_hidden_act (`str`, *optional*, defaults to `"tanh"`):
            Activation of the MLP head (the original ViT's pre-logits layer used tanh).
        head_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout before the classification layer.

    Example:

    ```python
    >>> from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification

    >>> config = ScratchViTConfig(position_embedding_type="sinusoidal", pooling="mean", num_labels=10)
    >>> model = ScratchViTForImageClassification(config)
    ```
    """

    model_type = "scratch_vit"

    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 4,
        num_channels: int = 3,
        hidden_size: int = 48,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        intermediate_size: int = 192,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        drop_path_rate: float = 0.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        position_embedding_type: str = "learned",
        patch_embedding_type: str = "linear",
        pooling: str = "cls",
        head_type: str = "linear",
        head_hidden_size: int | None = None,
        head_hidden_act: str = "tanh",
        head_dropout_prob: float = 0.0,
        **kwargs,
    ):
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.drop_path_rate = drop_path_rate
        self.qkv_bias = qkv_bias
        self.qk_norm = qk_norm
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.position_embedding_type = position_embedding_type
        self.patch_embedding_type = patch_embedding_type
        self.pooling = pooling
        self.head_type = head_type
        self.head_hidden_size = head_hidden_size if head_hidden_size is not None else hidden_size
        self.head_hidden_act = head_hidden_act
        self.head_dropout_prob = head_dropout_prob
        super().__init__(**kwargs)
        self.validate_fields()

    def validate_fields(self) -> None:
        """Raise `ValueError` naming the field, the value and the fix for any value the model cannot be built with."""
        for name in (
            "image_size",
            "patch_size",
            "num_channels",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "head_hidden_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"`{name}` must be a positive integer, got {value!r}. Set `{name}` to an integer >= 1."
                )
        for name in ("qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be true or false, got {getattr(self, name)!r}.")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "head_dropout_prob", "drop_path_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1), got {value!r}. Use e.g. `{name}=0.1`.")
        for name in ("layer_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if self.hidden_size % self.num_attention_heads != 0:
            divisors = [h for h in range(1, self.hidden_size + 1) if self.hidden_size % h == 0]
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads}). Choose `num_attention_heads` from {divisors} or change `hidden_size`."
            )
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"`image_size` ({self.image_size}) must be divisible by `patch_size` ({self.patch_size}). "
                f"Choose a `patch_size` that divides {self.image_size}, or resize the images."
            )
        options = {
            "patch_embedding_type": PATCH_EMBEDDING_TYPES,
            "position_embedding_type": POSITION_EMBEDDING_TYPES,
            "pooling": POOLING_TYPES,
            "head_type": HEAD_TYPES,
            "hidden_act": HIDDEN_ACTS,
            "head_hidden_act": HIDDEN_ACTS,
        }
        for name, allowed in options.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"`{name}` must be one of {list(allowed)}, got {value!r}.")
        if self.patch_embedding_type == "conv_stem" and (
            self.patch_size < 2 or self.patch_size & (self.patch_size - 1)
        ):
            raise ValueError(
                f"`patch_embedding_type='conv_stem'` halves the resolution once per stride-2 convolution, so "
                f"`patch_size` must be a power of 2 (2, 4, 8, 16, ...), got {self.patch_size}. Choose such a "
                "`patch_size` or use `patch_embedding_type='linear'`."
            )

    def validate(self) -> None:
        """transformers' own checks, then `validate_fields`: `save_pretrained` calls it, so no config the model cannot
        be built with is saved."""
        super().validate()
        self.validate_fields()

    @property
    def num_patches(self) -> int:
        """Number of patch tokens at the configured `image_size`."""
        return (self.image_size // self.patch_size) ** 2


__all__ = ["ScratchViTConfig"]
