"""ScratchViT: a Vision Transformer written from scratch as a real transformers model.

Importing the package registers the config and models with transformers' Auto classes, and marks them for
`save_pretrained` to write the code files and `auto_map`, so a saved folder loads anywhere with
`trust_remote_code=True`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from .configuration_scratch_vit import ScratchViTConfig
from .modeling_scratch_vit import ScratchViTForImageClassification, ScratchViTModel, ScratchViTPreTrainedModel


AutoConfig.register(ScratchViTConfig.model_type, ScratchViTConfig, exist_ok=True)
AutoModel.register(ScratchViTConfig, ScratchViTModel, exist_ok=True)
AutoModelForImageClassification.register(ScratchViTConfig, ScratchViTForImageClassification, exist_ok=True)
ScratchViTConfig.register_for_auto_class()
ScratchViTModel.register_for_auto_class("AutoModel")
ScratchViTForImageClassification.register_for_auto_class("AutoModelForImageClassification")

__all__ = ["ScratchViTConfig", "ScratchViTForImageClassification", "ScratchViTModel", "ScratchViTPreTrainedModel"]
