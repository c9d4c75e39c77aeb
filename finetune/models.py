"""The two model paths of the pipeline and their image processors.

`pretrained`: any image-classification checkpoint (a Hub id or a local directory) through
`AutoModelForImageClassification`, given the dataset's labels and a new head where sizes differ; its image processor
supplies resolution and normalisation. `scratch`: a `ScratchViTForImageClassification` built from the run's
`ScratchViTConfig` fields, with a `ViTImageProcessor` whose mean and std are measured on the training images.
"""

import contextlib
import hashlib
import inspect
import json
import os
import re
import tempfile
from dataclasses import fields as fields_of
from dataclasses import is_dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import (
    MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING,
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageClassification,
    PretrainedConfig,
    PreTrainedModel,
    ViTImageProcessor,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES as CLASSIFIER_NAMES
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, logging

from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification

from .arguments import ModelArguments, scratch_config_kwargs
from .augment import CROP_MARGIN, LUMA_WEIGHTS, Preprocessing, RGBToGrayscale, photo_size, preprocessing_from
from .checkpoints import read_weights
from .data import MULTI_LABEL, ImageData, is_multi_label
from .errors import one_line
from .locations import ADAPTER_CONFIG_NAME, looks_like_local_path, offline_switch


logger = logging.get_logger(__name__)


# Query and value projections, where LoRA's authors put the adapters: transformers' ViT (5.x, then 4.x names) and
# ScratchViT's fused query-key-value projection.
LORA_DEFAULT_TARGETS = ("q_proj", "v_proj", "query", "value", "qkv")
# Where transformers' classifiers keep their heads: `classifier`, and the two of DeiT's and LeViT's "with teacher".
HEAD_NAMES = ("classifier", "cls_classifier", "distillation_classifier", "classifier_distill")
WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


def storage_size(model_type: str, model_args: ModelArguments, scratch_args, margin: bool = True) -> int:
    """The square size images of mixed sizes are stored at for `model_type` (`pretrained`, `scratch` or `both`),
    read from the config and image processor without the weights; `margin` for `RandomResizedCrop` (`photo_size`)."""
    sizes = []
    if model_type in ("pretrained", "both"):
        config = _load_config(model_args)
        sizes.append(photo_size(preprocessing_from(_load_processor(model_args), config), margin))
    if model_type in ("scratch", "both"):
        size = ScratchViTConfig(**scratch_config_kwargs(scratch_args)).image_size
        sizes.append(round(size * CROP_MARGIN) if margin else size)
    return max(sizes)


def attention_head_size(model_type: str, model_args: ModelArguments, scratch_args) -> int | None:
    """The attention head size of the model to build, from its config alone (no weights are read)."""
    if model_type == "scratch":
        config = ScratchViTConfig(**scratch_config_kwargs(scratch_args))
    else:
        try:
            config = _load_config(model_args)
        except (OSError, ValueError):
            return None  # building the model reports the problem
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if isinstance(heads, list):  # Swin: heads per stage, the width doubling with them
        hidden, heads = getattr(config, "embed_dim", None), heads[0]
    return hidden // heads if hidden and heads else None


def build_model(
    model_type: str, model_args: ModelArguments, scratch_args, data: ImageData
) -> tuple[PreTrainedModel, ViTImageProcessor, Preprocessing]:
    """The model of `model_type` (`pretrained` or `scratch`) for `data`'s labels, its image processor (saved with the
    model so `pipeline()` works) and the preprocessing the batch transform applies."""
    if model_type == "pretrained":
        model, processor = _load_pretrained(model_args, data, getattr(scratch_args, "drop_path_rate", None))
        image_size = preprocessing_from(processor, model.config).image_size
        resize_position_embeddings(model, image_size)
        check_input_size(model, image_size, "Fix: an image processor of the checkpoint's size, or none.")
        model = apply_finetune_method(model, model_args)
    elif model_type == "scratch":
        model, processor = _build_scratch(scratch_args, data, model_args.attn_implementation)
    else:
        raise ValueError(f"`model_type` must be `pretrained` or `scratch` here, got {model_type!r}.")
    # The data's, not a checkpoint's: a multi-label one fine-tuned on single labels would keep BCE.
    model.config.problem_type = MULTI_LABEL if data.multi_label else None
    prep = preprocessing_from(processor, model.config)
    check_channels(data.num_channels, prep.num_channels, model_args.convert_channels)
    whole = data.train.image_size[0] != data.train.image_size[1]
    processor = _framing_processor(processor, prep, whole, model.config)
    logger.info(
        f"Model {type(model).__name__}: {count_parameters(model):,} parameters "
        f"({count_parameters(model, trainable=True):,} trained), input "
        f"{prep.num_channels}x{prep.image_size[0]}x{prep.image_size[1]}."
    )
    return model, processor, prep


# Model types with learned position embeddings of one square patch grid after the prefix tokens (a ScratchViT only
# with `position_embedding_type: learned`).
RESIZABLE_POSITION_EMBEDDINGS = ("vit", "deit", "vit_msn", "scratch_vit")


def _size_pair(size) -> tuple[int, int]:
    """A config's or an embedding's `image_size` (one number, or height and width) as `(height, width)`."""
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def check_input_size(model: PreTrainedModel, image_size: tuple[int, int], fix: str, **forward) -> None:
    """A model fed another size than its config's classifies one blank image first: one that cannot take it (timm's
    ViT; LeViT's attention biases) failed deep in its forward, after the data had loaded. `forward`: the keyword
    arguments it will be called with (`interpolate_pos_encoding`)."""
    if _size_pair(getattr(model.config, "image_size", None)) == tuple(image_size):
        return
    channels = int(getattr(model.config, "num_channels", 3))
    parameter = next(model.parameters())
    blank = torch.zeros(1, channels, *image_size, device=parameter.device, dtype=parameter.dtype)
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(pixel_values=blank, **forward)
    except Exception as error:  # whatever the model's forward raises for a size it cannot take
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{type(model).__name__} cannot classify {image_size[0]}x{image_size[1]} images ({reason}). {fix}"
        ) from error
    finally:
        model.train(training)


def resize_position_embeddings(model: PreTrainedModel, image_size: tuple[int, int]) -> None:
    """Fine-tuning at another resolution than the checkpoint's: a ViT, DeiT, ViT-MSN or ScratchViT gets its position
    embeddings resized once, by its own `interpolate_pos_encoding` (a ScratchViT by its embeddings'
    `resize_position_embeddings`; one with sinusoidal positions is refused), as timm does on loading, so its config,
    `pipeline()`, ONNX export and the Hub take the new size natively."""
    if getattr(model.config, "model_type", None) not in RESIZABLE_POSITION_EMBEDDINGS:
        return  # e.g. Hiera (list sizes, unrolled token order) and Swin: other geometry, left as they are
    embeddings = model.base_model.embeddings
    height, width = image_size
    old = _size_pair(getattr(embeddings, "image_size", None) or model.config.image_size)
    if (height, width) == old:
        return
    patch = model.config.patch_size
    if height != width or height % patch:
        raise ValueError(
            f"The image processor gives {height}x{width} images; the model ({model.config.model_type}, "
            f"{old[0]}x{old[1]}) takes square ones in multiples of its {patch}-pixel patches. Fix: an image processor "
            "of such a size, or none (`image_processor_name`), for the checkpoint's own."
        )
    if model.config.model_type == "scratch_vit":
        if model.config.position_embedding_type != "learned":
            raise ValueError(
                f"The image processor gives {height}x{width} images; this ScratchViT takes {old[0]}x{old[1]}, and its "
                "sinusoidal position embeddings, computed from the token index when it loads, cannot be resized and "
                f"saved. Fix: an image processor of {old[0]}x{old[1]}, or none (`image_processor_name`)."
            )
        embeddings.resize_position_embeddings(height // patch)
    else:
        positions = embeddings.position_embeddings
        tokens = positions.shape[1] - (old[0] // patch) * (old[1] // patch)  # the CLS (and distillation) tokens
        with torch.no_grad():
            grid = positions.new_zeros(1, tokens + (height // patch) ** 2, positions.shape[2])
            resized = embeddings.interpolate_pos_encoding(grid, height, width)
        embeddings.position_embeddings = torch.nn.Parameter(resized.detach().clone())
        embeddings.image_size = (height, width)
        embeddings.patch_embeddings.image_size = (height, width)
        embeddings.patch_embeddings.num_patches = (height // patch) ** 2
    model.config.image_size = height
    logger.info(f"Position embeddings resized from {old[0]}x{old[1]} to {height}x{width} (bicubic).")


def _framing_processor(processor, prep: Preprocessing, whole: bool, config=None):
    """The processor saved with the model (`pipeline()`, the model card, ONNX serving), framing a photo as training
    stored it and evaluation resized it: the centre square, or with `whole` (one non-square size) the whole image.
    timm's is kept with training's bilinear resize for its bicubic one (5 of 12 digits were classified otherwise), and
    its `crop_mode` framing as training: `squash` (the whole image) with `whole`, else `center`."""
    if getattr(processor, "data_config", None):
        framing = {"interpolation": "bilinear", "crop_mode": "squash" if whole else "center"}
        if config is None or all(processor.data_config.get(key) == value for key, value in framing.items()):
            return processor
        config.pretrained_cfg = {**config.pretrained_cfg, **framing}
        return type(processor)(pretrained_cfg=config.pretrained_cfg, architecture=config.architecture)
    height, width = prep.resize_size or prep.image_size
    # A non-square resize of the centre square has no image processor setting: the whole photo is squeezed there.
    size = {"height": height, "width": width} if whole or height != width else {"shortest_edge": height}
    crop = {"height": prep.image_size[0], "width": prep.image_size[1]}
    std = set(prep.image_std)
    if prep.flip_channels and not any(prep.image_mean) and len(std) == 1:  # MobileViT's: rescaled, BGR
        from transformers import MobileViTImageProcessor

        framing = {"do_center_crop": True, "crop_size": crop, "do_flip_channel_order": True}
        return MobileViTImageProcessor(size=size, rescale_factor=1 / (255 * std.pop()), **framing)
    if prep.flip_channels:
        logger.warning(
            "The saved image processor feeds the model RGB where training fed it BGR (`do_flip_channel_order` with a "
            "normalisation no processor of transformers has): pipeline() and the Auto classes will score other pixels."
        )
    return ViTImageProcessor(
        size=size, do_center_crop=True, crop_size=crop, image_mean=prep.image_mean, image_std=prep.image_std
    )


def load_trained_model(
    model_args: ModelArguments, data: ImageData
) -> tuple[PreTrainedModel, ViTImageProcessor, Preprocessing]:
    """Load a trained classifier as it was saved (a run's output directory, a checkpoint-* folder or a Hub id), for
    an evaluation-only run. Its head must classify the dataset's labels: nothing is replaced."""
    path = model_args.model_name_or_path
    check_model_path(path)
    attention = {"attn_implementation": model_args.attn_implementation}
    if is_adapter_dir(path):  # its own message names the base it could not load
        model = load_adapter_model(path, trust_remote_code=model_args.trust_remote_code, **attention)
    else:
        with hub_errors("model", path):
            model = load_saved_classifier(path, **_load_kwargs(model_args), **attention)
    processor = _load_processor(model_args)
    # The head's classes must be the dataset's, in the same order (generic `LABEL_i` names match any).
    names, label_names = config_label_names(model.config), data.label_names
    if len(names) != len(label_names):
        raise ValueError(
            f"The model at {path!r} classifies {len(names)} classes but the dataset has {len(label_names)} "
            f"({label_names[:5]}...). Evaluate it on the dataset it was trained for (`include_labels` selects "
            "classes)."
        )
    if _names_other_classes(names, label_names):
        raise ValueError(
            f"The model at {path!r} was trained on the labels {names} but the dataset's are {list(label_names)}. "
            "Evaluate it on the dataset it was trained for, with `include_labels` in the model's order if needed."
        )
    if is_multi_label(model.config) != data.multi_label:
        raise ValueError(
            f"The dataset has {'several labels' if data.multi_label else 'one label'} per image, but the model at "
            f"{path!r} was trained for {'one' if data.multi_label else 'several'} (`problem_type` "
            f"{model.config.problem_type}). Evaluate it, or teach with it, on data labelled as its training data was."
        )
    prep = preprocessing_from(processor, model.config)
    resize_position_embeddings(model, prep.image_size)  # an `image_processor_name` of another size, as training does
    check_channels(data.num_channels, prep.num_channels, model_args.convert_channels)
    logger.info(f"Loaded {type(model).__name__} from {path}: {count_parameters(model):,} parameters.")
    return model.eval(), processor, prep


def load_saved_classifier(path: str | os.PathLike, **kwargs) -> PreTrainedModel:
    """A trained classifier as it was saved, every weight from its files: transformers starts missing ones at random,
    and the model would score, predict and teach with them. `kwargs` go to `from_pretrained`."""
    config = AutoConfig.from_pretrained(path, **{k: v for k, v in kwargs.items() if k != "attn_implementation"})
    if getattr(config, "model_args", None):
        config.model_args = timm_create_args(config)
    with transformers_errors_only():  # its load report, a table of warnings: the error below says it in one line
        model, info = AutoModelForImageClassification.from_pretrained(
            path, config=config, output_loading_info=True, **kwargs
        )
    check_gives_logits(type(model), str(path))
    check_label_ids(model.config, str(path))
    # A batch norm's `num_batches_tracked` counts steps, learns nothing: converted weight files often leave it out.
    missing = [str(k) for k in info.get("missing_keys", []) if not str(k).endswith("num_batches_tracked")]
    heads = tuple(f"{name}." for name in classification_heads(model))
    if missing and heads and all(name.startswith(heads) for name in missing):  # a backbone saved without a head
        saved = first_three(getattr(model.config, "architectures", None) or [model.config.model_type])
        raise ValueError(
            f"{path} is a {saved} without a classification head: it has no classes to score or predict. Fix: "
            f"fine-tune it (`python -m finetune.run --model_name_or_path {path} ...`), then pass the run's folder."
        )
    check_no_missing_weights(
        missing, f"The weight files of {path}", f"the {type(model).__name__} its config.json describes",
        "the config.json saved with these weights",
    )  # fmt: skip
    return model


def check_no_missing_weights(missing: list[str], files: str, described: str, fix: str) -> None:
    """Refuse weights that the saved files lack (`missing`): loaded, they would be random."""
    if missing:
        raise ValueError(
            f"{files} lack {first_three(sorted(missing), ', ')}, of {described}: those would be random. Fix: {fix} "
            "(a run's folder and its checkpoint-N folders hold both)."
        )


def first_three(items: list[str], separator: str = "; ") -> str:
    """The first three of `items` joined, and how many more there are."""
    return separator.join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def count_parameters(model: torch.nn.Module, trainable: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the first values of every tensor of `model`: the same saved weights give the same on any
    machine, and another training of the same architecture (a teacher retrained in place) another."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode() + tensor.detach().flatten()[:64].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def apply_finetune_method(model: PreTrainedModel, model_args: ModelArguments) -> torch.nn.Module:
    """The pretrained classifier for `finetune_method`: `full` as it is, `linear_probe` with all but the head frozen,
    `lora` a peft `PeftModel` (adapters on `lora_target_modules`, the head trained in full)."""
    method = model_args.finetune_method
    if method == "full":
        return model
    heads = list(classification_heads(model))
    if not heads:
        raise ValueError(
            f"`finetune_method: {method}` trains the classification head `{HEAD_NAMES[0]}`, which "
            f"{type(model).__name__} does not have. Use `finetune_method: full` for this model."
        )
    if method == "linear_probe":
        for name, parameter in model.named_parameters():
            parameter.requires_grad = name.startswith(tuple(f"{head}." for head in heads))
        return keep_frozen_statistics(model)
    from peft import LoraConfig, get_peft_model

    # peft adapts the modules outside the head (`modules_to_save`) whose names are a target or end in "." + target,
    # and refuses a target that names a module of a kind it cannot adapt (ResNet's `1` names convolution blocks).
    in_head = tuple(f"{head}." for head in heads)
    modules = [(n, m) for n, m in model.named_modules() if n and not f"{n}.".startswith(in_head)]
    adaptable_kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Embedding)

    def unfit(target: str) -> str | None:
        """Why peft would not adapt `target`, or None."""
        named = [(n, m) for n, m in modules if n == target or n.endswith(f".{target}")]
        other = next(((n, m) for n, m in named if not isinstance(m, adaptable_kinds)), None)
        if other:
            return f"`{target}` also names `{other[0]}` ({type(other[1]).__name__}), which LoRA cannot adapt"
        return None if named else f"`{target}` names no layer outside the head"

    linear_names = sorted({n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, torch.nn.Linear)})
    linear_names = [name for name in linear_names if not unfit(name)]
    if not linear_names and not model_args.lora_target_modules:
        raise ValueError(
            f"`finetune_method: lora` adapts linear layers outside the classification head, and "
            f"{type(model).__name__} has none. Use `finetune_method: linear_probe` or `full` for this model."
        )
    targets = model_args.lora_target_modules or [n for n in LORA_DEFAULT_TARGETS if n in linear_names]
    problems = [problem for problem in map(unfit, targets) if problem]
    if not targets or problems:
        why = "; ".join(problems) if problems else f"none of {list(LORA_DEFAULT_TARGETS)} names one"
        raise ValueError(
            f"`lora_target_modules`: {why}. The linear layers of {type(model).__name__} outside its head are "
            f"{linear_names}; set `lora_target_modules` to some of them (a longer name, `attn.proj`, picks fewer)."
        )
    config = LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=targets,
        modules_to_save=heads,
    )
    named = ("the head " if len(heads) == 1 else "the heads ") + ", ".join(f"`{head}`" for head in heads)
    logger.info(f"LoRA r={config.r}, alpha={config.lora_alpha} on {targets}; {named} train(s) fully.")
    lora_model = get_peft_model(model, config)
    # A local base as its full path: the adapter loads from any folder (a relative one did not).
    base = os.path.expanduser(model.name_or_path or "")
    if os.path.isdir(base):
        lora_model.peft_config["default"].base_model_name_or_path = os.path.abspath(base)
    return keep_frozen_statistics(lora_model)


BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)


def keep_frozen_statistics(model: torch.nn.Module) -> torch.nn.Module:
    """The frozen batch norms of `model` (a backbone's, under `linear_probe` or LoRA) normalise with their running
    statistics in training too, and keep them, as a frozen backbone is evaluated: in train mode they re-estimated them
    on the new data, which a LoRA adapter does not save (its folder scored 20% where the run reported 25%)."""
    for module in model.modules():
        frozen = [not p.requires_grad for p in module.parameters()] if isinstance(module, BATCH_NORMS) else []
        if frozen and all(frozen):  # an affine-free one (no parameters) is left as it is
            module.register_forward_pre_hook(_in_eval_mode)
    return model


def _in_eval_mode(module: torch.nn.Module, args) -> None:
    module.eval()  # the Trainer sets the whole model to train mode at every step


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether `path` holds a peft adapter (a `finetune_method: lora` run's output)."""
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG_NAME))


def load_adapter_model(path: str | os.PathLike, merge: bool = True, **kwargs) -> torch.nn.Module:
    """A LoRA run's output: the base its `adapter_config.json` names, with the run's labels (a checkpoint-* has no
    config.json: the run folder's), then the adapters and head; merged with `merge`; `kwargs` to `from_pretrained`."""
    from peft import PeftConfig, PeftModel, get_peft_model_state_dict, load_peft_weights

    path = str(path)
    base = PeftConfig.from_pretrained(path).base_model_name_or_path
    config_dir = path if os.path.isfile(os.path.join(path, "config.json")) else os.path.dirname(os.path.abspath(path))
    trust_remote_code = kwargs.get("trust_remote_code", False)
    config = AutoConfig.from_pretrained(config_dir, trust_remote_code=trust_remote_code)
    size = base_size = getattr(config, "image_size", None)
    try:
        # A run at another resolution than its base's saved no (frozen) position embeddings: the base loads at its own
        # size and they are resized again, as in training; at the run's size they would start anew, silently.
        if config.model_type in RESIZABLE_POSITION_EMBEDDINGS:
            base_size = AutoConfig.from_pretrained(base, trust_remote_code=trust_remote_code).image_size
        if base_size != size:
            config.image_size = base_size
        with transformers_errors_only():  # the base's head, replaced by the adapter's, is reported as MISMATCH
            model = AutoModelForImageClassification.from_pretrained(
                base, config=config, ignore_mismatched_sizes=True, **kwargs
            )
        if base_size != size:
            resize_position_embeddings(model, _size_pair(size))
    except OSError as error:
        raise OSError(
            f"The adapter in {path} was trained on the base model {base!r}, which could not be loaded "
            f"({one_line(error)}). Fix: make it reachable (download it, or edit "
            f"`base_model_name_or_path` in {ADAPTER_CONFIG_NAME} to its local folder), or load the merged model "
            "(`merge_lora: true` saves it to OUTPUT/merged)."
        ) from error
    model = PeftModel.from_pretrained(model, path)  # peft only warns of adapter weights the file lacks
    check_no_missing_weights(
        list(set(get_peft_model_state_dict(model)) - set(load_peft_weights(path))), f"The adapter weights in {path}",
        f"the adapters its {ADAPTER_CONFIG_NAME} describes", f"the adapter_model.safetensors saved with this "
        f"{ADAPTER_CONFIG_NAME}",
    )  # fmt: skip
    return model.merge_and_unload() if merge else model


@contextlib.contextmanager
def _plain_model_folder(path: str, trust_remote_code: bool = False):
    """`path`, or for a LoRA run's folder a temporary one with its adapters merged into its base: a plain model."""
    if not is_adapter_dir(path):
        yield path
        return
    with tempfile.TemporaryDirectory() as folder:
        load_adapter_model(path, trust_remote_code=trust_remote_code).save_pretrained(folder)
        logger.info(f"{path} is a LoRA run: fine-tuning its base with the adapters merged in.")
        yield folder


def _load_kwargs(model_args: ModelArguments) -> dict:
    """Where `from_pretrained` finds the model, its processor and config."""
    return {
        "revision": model_args.model_revision,
        "cache_dir": model_args.cache_dir,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }


def _load_config(model_args: ModelArguments):
    check_model_path(model_args.model_name_or_path)
    with hub_errors("model", model_args.model_name_or_path):
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, **_load_kwargs(model_args))
    name = CLASSIFIER_NAMES.get(config.model_type)
    if isinstance(name, str) and hasattr(transformers, name):  # before the data loads
        check_gives_logits(getattr(transformers, name), model_args.model_name_or_path)
    check_label_ids(config, model_args.model_name_or_path)
    return config


def check_gives_logits(model_class: type, path: str) -> None:
    """Refuse a classifier whose forward returns no `logits` (PP-LCNet's): training failed at its first step."""
    output = inspect.signature(model_class.forward).return_annotation
    fields = {f.name for t in getattr(output, "__args__", (output,)) if is_dataclass(t) for f in fields_of(t)}
    if fields and "logits" not in fields:
        raise ValueError(
            f"{path} is a {model_class.__name__}, whose output ({getattr(output, '__name__', output)}) holds no "
            "classification `logits`: it cannot be fine-tuned, scored or served here. Fix: another image "
            "classification checkpoint."
        )


def timm_create_args(config) -> dict:
    """The `create_model` arguments of a TimmWrapper config ({} for other models), less `num_classes`: timm's own
    save_for_hf records it, and the wrapper passes `num_labels` as it too ("got multiple values")."""
    return {key: value for key, value in (getattr(config, "model_args", None) or {}).items() if key != "num_classes"}


def check_label_ids(config, path: str) -> None:
    """Refuse an `id2label` whose ids are not the head's rows 0 to num_labels - 1 (0, 2, 5 for 3 rows): fine-tuning,
    evaluation, predict and `pipeline()` failed with `KeyError: 1`."""
    ids = sorted(config.id2label)
    if ids != list(range(config.num_labels)):
        raise ValueError(
            f"The config.json of {path} numbers its classes {_shorten(list(map(str, ids)))} (`id2label`), but its "
            f"head's {config.num_labels} outputs are 0 to {config.num_labels - 1}. Fix: renumber `id2label` and "
            "`label2id` there from 0, in the order of the head's outputs."
        )


@contextlib.contextmanager
def transformers_errors_only():
    """transformers' own warnings silenced (its load report lists a new head as MISMATCH / Reinit); errors raise."""
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


def check_stochastic_depth(model_args: ModelArguments, drop_path_rate: float, config=None) -> None:
    """Refuse a `drop_path_rate` the pretrained model cannot take, by its `config` (None: read it)."""
    path, config = model_args.model_name_or_path, config if config is not None else _load_config(model_args)
    if not 0 <= drop_path_rate < 1:  # `from_dict` sets it after the config's own checks (a ScratchViT's) have run
        raise ValueError(f"`drop_path_rate` must be a probability in [0, 1), got {drop_path_rate}.")
    if not hasattr(config, "drop_path_rate") and config.model_type != "timm_wrapper":
        raise ValueError(
            f"`drop_path_rate`: {path} ({config.model_type}) has no stochastic depth. Drop the option, or fine-tune a "
            "model that has it (BEiT, Swin, ConvNeXt, DINOv2, timm's, ScratchViT)."
        )


def _load_pretrained(model_args: ModelArguments, data: ImageData, drop_path_rate: float | None = None):
    path = model_args.model_name_or_path
    if os.path.isdir(os.path.expanduser(path)):
        check_local_checkpoint(os.path.expanduser(path), model_args.trust_remote_code)
    original = _load_config(model_args)
    checkpoint_labels, label_names = config_label_names(original), data.label_names
    # A head of the dataset's size trained for other classes starts anew (`reset_head`), or, trained for the same
    # classes in another order, has its rows reordered (`reorder_head`).
    other_classes = _names_other_classes(checkpoint_labels, label_names)
    same = sorted(checkpoint_labels) == sorted(label_names)  # the dataset's names are distinct: so are these
    order = [checkpoint_labels.index(name) for name in label_names] if same else None
    new_classes = len(checkpoint_labels) != len(label_names) or (other_classes and order is None)
    if not model_args.ignore_mismatched_sizes and new_classes:  # transformers' own error names a report not shown
        raise ValueError(
            f"{path} has a {original.num_labels}-class head ({_shorten(checkpoint_labels)}) and the dataset "
            f"{len(label_names)} classes ({_shorten(label_names)}), but `ignore_mismatched_sizes: false` keeps the "
            "checkpoint's head. Fix: `ignore_mismatched_sizes: true` (a new head, the default), or data of the "
            "checkpoint's classes (`include_labels`)."
        )
    # Relabelled as `from_pretrained(path, num_labels=..., id2label=...)` would do it, without reading it again.
    overrides = {"num_labels": len(data.label_names), "id2label": data.id2label, "label2id": data.label2id}
    timm_args = timm_create_args(original)
    if getattr(original, "model_args", None):
        overrides["model_args"] = timm_args
    if drop_path_rate is not None:
        check_stochastic_depth(model_args, drop_path_rate, original)
        if original.model_type == "timm_wrapper":  # `create_model`'s argument, which the wrapper passes on
            overrides["model_args"] = {**timm_args, "drop_path_rate": drop_path_rate}
        else:
            overrides["drop_path_rate"] = drop_path_rate
    # The old labels go (timm's config saves its class names as `label_names`): with the old `id2label` left in,
    # transformers warned "You passed `num_labels=10` which is incompatible to the `id2label` map of length 3".
    saved = {k: v for k, v in original.to_dict().items() if k not in ("label_names", "id2label", "label2id")}
    config = type(original).from_dict(saved, **overrides)
    if timm_args.get("in_chans", 3) != 3:  # a grayscale timm model: its channels where transformers' configs say them
        config.num_channels = timm_args["in_chans"]
    with _plain_model_folder(path, model_args.trust_remote_code) as weights, hub_errors("model", path):
        with transformers_errors_only():
            model, info = AutoModelForImageClassification.from_pretrained(
                weights,
                config=config,
                ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
                output_loading_info=True,
                attn_implementation=model_args.attn_implementation,
                **_load_kwargs(model_args),
            )
    # Per kind, the parameter names (a mismatched key may come as (name, saved shape, model shape)).
    kinds = ("missing_keys", "unexpected_keys", "mismatched_keys")
    keys = {kind: [k[0] if isinstance(k, tuple) else str(k) for k in info.get(kind, [])] for kind in kinds}
    heads = tuple(f"{head}." for head in classification_heads(model))
    new_head = any(k.startswith(heads) for k in keys["mismatched_keys"])
    others = {kind: [k for k in names if not k.startswith(heads)] for kind, names in keys.items()}
    backbone = [name for name in model.state_dict() if not name.startswith(heads)]
    if backbone and set(backbone) <= {*others["missing_keys"], *others["mismatched_keys"]}:
        raise ValueError(
            f"None of the weights of {path} fit the {type(model).__name__} its config.json describes: fine-tuning it "
            "would train a random model, recorded as pretrained. Fix: the config.json saved with these weights, or "
            "`model_type: scratch` to train from scratch."
        )
    if others["missing_keys"] or others["mismatched_keys"]:  # unexpected keys (an unused pooler) change nothing
        found = "; ".join(
            f"{kind.replace('_', ' ')}: {', '.join(names[:5])}" for kind, names in others.items() if names
        )
        logger.warning(f"{path} does not fit the model everywhere ({found}); those weights start anew.")
    if new_head:
        logger.info(f"{path} has a {original.num_labels}-class head: a new {len(data.label_names)}-class head starts.")
    if other_classes and order is not None and reorder_head(model, order):
        logger.info(f"{path} classifies the dataset's classes in another order: its head's rows follow the dataset's.")
    elif other_classes:
        if not model_args.ignore_mismatched_sizes:
            raise ValueError(
                f"{path} classifies the dataset's classes in another order, in a head whose rows cannot be reordered, "
                "and `ignore_mismatched_sizes: false` keeps it. Fix: `ignore_mismatched_sizes: true` (a new head)."
            )
        logger.warning(
            f"{path} classifies {_shorten(checkpoint_labels)}, the dataset has {_shorten(label_names)}: the "
            "classification head starts anew (random, as for a checkpoint with another number of classes)."
        )
        reset_head(model)
    return model, _load_processor(model_args)


def config_label_names(config) -> list[str]:
    """A classifier config's class names, in the order of its head's rows."""
    return [str(config.id2label[i]) for i in range(config.num_labels)]


def _names_other_classes(checkpoint_labels: list[str], dataset_labels: list[str]) -> bool:
    """Whether a head of the dataset's size was trained for other classes: named (not `LABEL_0`, ...) otherwise, or
    in another order. A head of another size is replaced on loading."""
    placeholders = [f"LABEL_{i}" for i in range(len(checkpoint_labels))]
    same_size = len(checkpoint_labels) == len(dataset_labels)
    return same_size and checkpoint_labels != placeholders and checkpoint_labels != list(dataset_labels)


def _shorten(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} classes)" if len(names) > limit else "")


def classification_heads(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The classification heads of `model` by name (`HEAD_NAMES`; a TimmWrapper's, as timm's `get_classifier` names
    it); empty where there is none."""
    timm_model = getattr(model, "timm_model", None)
    if timm_model is not None and hasattr(timm_model, "get_classifier"):
        head = timm_model.get_classifier()
        return {next((f"timm_model.{n}" for n, m in timm_model.named_modules() if m is head), HEAD_NAMES[0]): head}
    heads = {name: getattr(model, name, None) for name in HEAD_NAMES}
    return {name: head for name, head in heads.items() if isinstance(head, torch.nn.Module)}


def reorder_head(model: PreTrainedModel, order: list[int]) -> bool:
    """Put each head's output rows (weights and bias) in `order`, the checkpoint's row of each of the dataset's
    classes; False, with nothing changed, where a head's output is not one linear (or 1x1 convolution) layer."""
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)  # timm's BiT head is a 1x1 convolution
    outputs = [
        [m for m in head.modules() if isinstance(m, kinds) and m.weight.shape[0] == len(order)]
        for head in classification_heads(model).values()
    ]
    if not outputs or any(len(layers) != 1 for layers in outputs):
        return False
    with torch.no_grad():
        for (layer,) in outputs:
            for tensor in (t for t in (layer.weight, layer.bias) if t is not None):
                tensor.copy_(tensor[order])
    return True


def reset_head(model: PreTrainedModel) -> None:
    """Re-initialise the heads with the model's `_init_weights`; loading marked their tensors initialised, which the
    init functions skip: the marks go first."""
    heads = classification_heads(model)
    if not heads:
        raise ValueError(
            f"{type(model).__name__} has no classification head `{HEAD_NAMES[0]}` to start anew; fine-tune it on data "
            "with the checkpoint's classes, or from a checkpoint without a head."
        )
    for module in (m for head in heads.values() for m in head.modules()):
        module._is_hf_initialized = False
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            tensor._is_hf_initialized = False
        model._init_weights(module)


def check_model_path(path: str, option: str = "model_name_or_path") -> None:
    """Refuse a file, or a path that looks local (`./x`, `~/x`) but is no folder: transformers reads a file as an
    invalid config.json, and a missing folder as a malformed Hub id."""
    if os.path.isfile(os.path.expanduser(path)):
        raise FileNotFoundError(
            f"`{option}` {path!r} is a file. Pass the folder that holds the model (config.json and the weights): "
            f"`{os.path.dirname(path) or '.'}`, or a Hub model id such as `google/vit-base-patch16-224-in21k`."
        )
    if looks_like_local_path(path) and not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(
            f"`{option}` {path!r} is not a directory. Pass a local checkpoint folder (with config.json and the "
            "weights) or a Hub model id such as `google/vit-base-patch16-224-in21k`."
        )


def _load_processor(model_args: ModelArguments):
    """The pretrained model's image processor: a small json file, read without the weights."""
    processor_path = model_args.image_processor_name or model_args.model_name_or_path
    local_fix = (
        f"No image processor in {processor_path!r} (preprocessor_config.json is missing). Save one next to the "
        "model, e.g. `ViTImageProcessor(size={'height': 224, 'width': 224}).save_pretrained(dir)`, or set "
        "`image_processor_name`."
    )
    with hub_errors("image processor", processor_path, local_fix):
        return AutoImageProcessor.from_pretrained(processor_path, **_load_kwargs(model_args))


def _evaluation_results(path: str) -> bool:
    """Whether `path` holds the results.json of an evaluation (`do_train: false`)."""
    try:
        return bool(json.loads(Path(path, "results.json").read_text())["hyperparameters"].get("evaluation_only"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def check_local_checkpoint(path: str | os.PathLike, trust_remote_code: bool = False) -> None:
    """Refuse a local folder that cannot give an image classifier, naming what is wrong where `from_pretrained` would
    not (an ONNX export, no config.json or weights, a damaged `model.safetensors`, no classification head)."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, "model.onnx")):
        raise ValueError(
            f"{path} is an ONNX export, which only `vit-finetune predict` runs: training, evaluating and teaching "
            "need the PyTorch weights. Pass the run's output directory it was exported from."
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        if is_adapter_dir(path):
            raise FileNotFoundError(
                f"{path} is a LoRA checkpoint: an adapter without the model's config.json, which the run writes at "
                "its end. Pass the run's output directory, or its merged model (OUTPUT/merged, `merge_lora: true`)."
            )
        if _evaluation_results(path):  # `do_train: false` saves results, no model
            raise FileNotFoundError(
                f"{path} holds the results of an evaluation (`do_train: false`), which saves no model: pass the "
                "folder of the model it evaluated (its results.json names it as `model_name_or_path`)."
            )
        raise FileNotFoundError(
            f"{path} has no config.json: it is not a saved model. Pass the output directory of a run (for "
            "`model_type: both`, OUTPUT/pretrained or OUTPUT/scratch), a checkpoint-* folder, or a Hub model id."
        )
    if is_adapter_dir(path):  # a LoRA run's folder: `load_adapter_model` loads the base it names
        if not os.path.isfile(os.path.join(path, "adapter_model.safetensors")):
            raise FileNotFoundError(
                f"{path} holds an {ADAPTER_CONFIG_NAME} but no adapter_model.safetensors: the save was incomplete."
            )
        return
    present = [name for name in WEIGHT_FILES if os.path.isfile(os.path.join(path, name))]
    if not present:
        raise FileNotFoundError(
            f"{path} holds a config.json but no weights ({' or '.join(WEIGHT_FILES[::2])}): the save was incomplete. "
            "Pass a complete model folder (a finished run's output directory or a checkpoint-* folder)."
        )
    if present[0] == SAFE_WEIGHTS_NAME:
        weights = os.path.join(path, SAFE_WEIGHTS_NAME)
        try:
            read_weights(Path(weights))
        except Exception as error:
            raise OSError(
                f"{weights} is damaged or incomplete ({one_line(error)}). Save the model again, copy it again, or "
                "use another checkpoint-* folder of the run."
            ) from None
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ValueError:  # transformers' "invalid literal for int() with base 10: 'cat'" names no file, no field
        named = [
            key for key in json.loads(Path(path, "config.json").read_text()).get("id2label") or {} if not key.isdigit()
        ]
        if named:
            raise ValueError(
                f"The config.json of {path} keys `id2label` by names ({_shorten(named)}), not by the head's outputs. "
                'Fix: number its keys "0", "1", ... in the order of the head\'s outputs (and `label2id` to match).'
            ) from None
        raise
    remote = "AutoModelForImageClassification" in (getattr(config, "auto_map", None) or {})
    if not (remote or config.model_type in CLASSIFIER_NAMES or type(config) in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING):
        raise ValueError(
            f"{path} holds a {config.model_type!r} model, which has no image-classification head. Pass an image "
            f"classifier: a ScratchViT, or a model of a type transformers classifies images with (vit, deit, beit, "
            f"swin, convnext, resnet and {len(CLASSIFIER_NAMES) - 6} more)."
        )


@contextlib.contextmanager
def hub_errors(what: str, path: str, local_fix: str | None = None, option: str = "model_name_or_path"):
    """An `OSError` of loading the `what` at `path` (given as `option`) re-raised with the fix: `local_fix` where given
    and `path` is a local folder, else the Hub's (switched off, or unreachable)."""
    try:
        yield
    except OSError as error:
        if local_fix is not None and os.path.isdir(path):
            raise OSError(local_fix) from error
        offline = offline_switch()
        reason = f"the Hub is switched off ({offline}=1)" if offline else "the Hub could not be reached or refused"
        raise OSError(
            f"Could not load the {what} {path!r}: {reason} ({one_line(error)}). Fix: connect to the Hub (and "
            f"`hf auth login` for gated or private repos), or download it once and pass the local directory as "
            f"`{option}`."
        ) from error


def _build_scratch(scratch_args, data: ImageData, attn_implementation: str | None = None):
    kwargs = scratch_config_kwargs(scratch_args)
    kwargs.setdefault("num_channels", data.num_channels)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    config = ScratchViTConfig(
        **kwargs, num_labels=len(data.label_names), id2label=data.id2label, label2id=data.label2id
    )
    # At most 10,000 images and 2**27 values (512 MB as float): a memory-mapped set of photos is never read whole.
    channels, height, width = data.train.num_channels, *data.train.image_size
    sample = min(len(data.train), 10_000, max(1, 2**27 // (channels * height * width)))
    mean, std = channel_statistics(data.train.take(np.arange(sample)), config.num_channels)
    size = {"height": config.image_size, "width": config.image_size}
    return ScratchViTForImageClassification(config), ViTImageProcessor(size=size, image_mean=mean, image_std=std)


def channel_statistics(pixel_values: torch.Tensor, num_channels: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std in [0, 1] of uint8 images `(N, C, H, W)`, after conversion to `num_channels`."""
    sample = pixel_values.float().div(255)
    if sample.shape[1] != num_channels:
        # As the batch transform converts them: RGB -> gray by luma, gray -> RGB by repeating.
        sample = RGBToGrayscale(num_channels)(sample)  # (N, C, H, W) -> (N, num_channels, H, W)
    mean = sample.mean(dim=(0, 2, 3))
    std = sample.std(dim=(0, 2, 3)).clamp_min(1e-3)  # a constant channel must not divide by zero
    return [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in std.tolist()]


def check_channels(data_channels: int, model_channels: int, convert: bool) -> None:
    """Grayscale data may feed an RGB model (repeat) and RGB data a grayscale model (luma); nothing else."""
    if data_channels == model_channels:
        return
    if {data_channels, model_channels} != {1, 3}:
        fix = f"use a model with `num_channels: {data_channels}` or convert the images"
    elif not convert:
        fix = f"set `convert_channels: true` to convert {data_channels}->{model_channels} channels on the fly"
    else:
        luma = "taking the luma ({} R + {} G + {} B)".format(*LUMA_WEIGHTS)
        how = "repeating the gray channel" if data_channels == 1 else luma
        logger.warning(f"Converting {data_channels}-channel images to {model_channels} channels by {how}.")
        return
    raise ValueError(
        f"The model expects {model_channels}-channel images but the data has {data_channels} channel(s). Fix: {fix}."
    )


def load_checkpoint_weights(model: PreTrainedModel, checkpoint: str) -> None:
    """Load a checkpoint's weights into `model` strictly, through `from_pretrained`: it renames keys (ViT saves
    `vit.encoder.layer.*`), which the Trainer's plain `load_state_dict` skips, silently keeping the current weights."""
    if hasattr(model, "peft_config"):
        # A LoRA model's checkpoint holds its adapters and head only; the frozen base weights never change.
        from peft import load_peft_weights, set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_peft_weights(checkpoint))
        if result.unexpected_keys:
            raise ValueError(f"{checkpoint} holds weights this LoRA model lacks: {result.unexpected_keys[:5]}")
        return
    fix = (
        "it was saved by a run with other model options or data. Fix: resume with the options it was trained with "
        "(its config.json), or start a new run (a new `--output_dir`)."
    )
    if changed := config_changes(checkpoint, model.config):  # weights of the same shapes for another model
        raise ValueError(f"The checkpoint {checkpoint} is of another model ({first_three(changed)}): {fix}")
    try:
        with transformers_errors_only():  # its load report (a table per tensor) is summarised below in one line
            loaded, info = type(model).from_pretrained(
                checkpoint,
                config=model.config,
                dtype=next(model.parameters()).dtype,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"The checkpoint {checkpoint} does not fit this model ({one_line(error)}): {fix}") from error
    unfit = [
        f"{name}: {list(saved)} saved, {list(here)} here" for name, saved, here in sorted(info["mismatched_keys"])
    ]
    unfit += [f"{name} missing" for name in sorted(info["missing_keys"])]
    unfit += [f"{name} saved, not in this model" for name in sorted(info["unexpected_keys"])]
    if unfit:
        raise ValueError(f"The checkpoint {checkpoint} does not fit this model ({first_three(unfit)}): {fix}")
    model.load_state_dict(loaded.state_dict(), strict=True)


def config_changes(checkpoint: str, config) -> list[str]:
    """The fields of the checkpoint's config.json that `config` gives another value (another activation, number of
    heads, order of the classes), each as `name saved (now here)`; metadata (versions, paths, dtype) aside."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        return []
    saved, here = json.loads(path.read_text()), json.loads(config.to_json_string(use_diff=False))
    # Set on saving, by the Trainer (`use_cache`) or by `_framing_processor` (`pretrained_cfg`): not the model's.
    metadata = {"architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype", "use_cache",
                "pretrained_cfg"}  # fmt: skip
    names = sorted((saved.keys() & here.keys()) - metadata)

    def change(name: str) -> str:
        then, now = json.dumps(saved[name]), json.dumps(here[name])
        return f"{name} {then} (now {now})" if len(then + now) < 80 else f"{name} (another value now)"

    def differs(name: str) -> bool:  # a sub-config (CLIP's `vision_config`) is saved without its default fields
        then, now = saved[name], here[name]
        if isinstance(getattr(config, name, None), PretrainedConfig) and isinstance(then, dict):
            return any(then[key] != now[key] for key in then.keys() & now.keys() - metadata)
        return then != now

    return [change(name) for name in names if differs(name)]


# Parameters that weight decay would only pull towards zero without regularising anything (timm's `no_weight_decay`,
# in transformers' and timm's spellings), besides every bias and norm scale (the 1-D parameters).
NO_WEIGHT_DECAY_NAMES = (
    "position_embeddings", "pos_embed", "cls_token", "distillation_token", "dist_token", "mask_token", "reg_token",
    "register_tokens", "relative_position_bias_table",
)  # fmt: skip
# A numbered block: ViT's `vit.layers.3.`, ScratchViT's and DINOv2's `layer.3.`, timm's `blocks.3.`, and the stage
# then block of hierarchical models: Swin's `layers.1.blocks.0.`, ConvNeXt's `stages.1.layers.0.`.
BLOCK_PATTERN = re.compile(r"(?:^|\.)(?:layers?|blocks|stages)\.(\d+)(?=\.)")


def layer_id(model: torch.nn.Module) -> tuple[dict[str, int], int]:
    """BEiT's layer index of every parameter by name, and the number of blocks L (counted from the names: Swin's and
    ConvNeXt's `num_hidden_layers` count stages): 0 the embeddings, i the i-th block (stage/block pairs in order),
    what lies between blocks the block before's, L + 1 the rest (final norm, pooler, head)."""
    named = [(name, tuple(int(i) for i in BLOCK_PATTERN.findall(name)[:2])) for name, _ in model.named_parameters()]
    length = max(len(key) for _, key in named)  # 2 where blocks sit in stages, else 1
    blocks = dict.fromkeys(key for _, key in named if length and len(key) == length)  # in order, each once
    depth_of_block = {key: depth for depth, key in enumerate(blocks, start=1)}
    if not depth_of_block:
        raise ValueError(
            f"`layer_decay` needs the blocks of {type(model).__name__}, but none of its parameter names has a "
            "numbered `layer`, `layers`, `blocks` or `stages` module. Drop `layer_decay` for this model."
        )
    num_blocks = len(depth_of_block)
    last = max(i for i, (_, key) in enumerate(named) if key)
    ids, depth = {}, 0
    for i, (name, key) in enumerate(named):
        depth = depth_of_block.get(key, depth)
        ids[name] = num_blocks + 1 if i > last else depth
    return ids, num_blocks


def parameter_groups(
    model: torch.nn.Module, learning_rate: float, weight_decay: float, layer_decay: float | None = None
) -> list[dict]:
    """The optimizer's groups of the trainable parameters, by layer and weight decay (none for 1-D parameters and
    `NO_WEIGHT_DECAY_NAMES`). With `layer_decay`, a parameter of layer `layer_id` in a model of L blocks trains at
    `learning_rate * layer_decay ** (L + 1 - layer_id)`: the head at the full rate, each block below at less."""
    layers, num_blocks = layer_id(model) if layer_decay is not None else ({}, 0)
    groups: dict[tuple[int, bool], dict] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        layer = layers.get(name, 0)
        decay = parameter.ndim > 1 and not any(token in name for token in NO_WEIGHT_DECAY_NAMES)
        lr = learning_rate * layer_decay ** (num_blocks + 1 - layer) if layer_decay else learning_rate
        settings = {"weight_decay": weight_decay if decay else 0.0, "lr": lr}
        group = groups.setdefault((layer, decay), {"params": [], "param_names": [], **settings})
        group["params"].append(parameter)
        group["param_names"].append(name)
    # The head's (full-rate) group first: the Trainer logs, and the non-finite guard reports, the first group's rate.
    return [groups[key] for key in sorted(groups, reverse=True)]
