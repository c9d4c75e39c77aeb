"""Command-line and YAML arguments of `finetune/run.py`.

A run is described by four dataclasses parsed together by `HfArgumentParser`: `ModelArguments`, `DataArguments`,
`ScratchViTArguments` (every `ScratchViTConfig` field, generated from the config so it stays the single source of
truth) and `ImageClassificationTrainingArguments` (transformers' `TrainingArguments` with the pipeline's defaults and
training-loop options, `finetune/training_args.py`).

A YAML config is a flat map onto their fields; values given on the command line override the file. A config may
start from another with `base: other.yaml` (a path relative to the config's folder) and state only its differences:
its keys override the base's, and bases may have bases of their own.
"""

import dataclasses
import difflib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from finetune.training_args import ImageClassificationTrainingArguments
from scratch_vit import ScratchViTConfig


MODEL_TYPES = ("pretrained", "scratch", "both")
FINETUNE_METHODS = ("full", "linear_probe", "lora")
CORRUPT_IMAGE_POLICIES = ("skip", "error")
RANDOM_RESIZED_CROP_CHOICES = ("auto", "true", "false")


@dataclass
class ModelArguments:
    """Which model to train: a pretrained checkpoint, a ScratchViT built from its config fields, or both."""

    model_type: str = field(
        default="pretrained",
        metadata={
            "help": "`pretrained`: fine-tune `model_name_or_path`. `scratch`: train a ScratchViT built from the "
            "ScratchViTConfig fields given (image_size, patch_size, hidden_size, ...). `both`: train both on the "
            "same data and split, then write a comparison report.",
            "choices": list(MODEL_TYPES),
        },
    )
    model_name_or_path: str = field(
        default="google/vit-base-patch16-224-in21k",
        metadata={"help": "Pretrained image-classification checkpoint: a Hub model id or a local directory."},
    )
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the Hub checkpoint."})
    image_processor_name: str | None = field(
        default=None, metadata={"help": "Image processor to use, if not the one next to `model_name_or_path`."}
    )
    ignore_mismatched_sizes: bool = field(
        default=True,
        metadata={"help": "Replace the checkpoint's classification head when its size differs from the dataset's."},
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow checkpoints whose modeling code lives in the repository (e.g. a pushed ScratchViT)."},
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where to store checkpoints downloaded from the Hub."}
    )
    token: str | None = field(
        default=None,
        metadata={"help": "Hub token; prefer the HF_TOKEN environment variable or `hf auth login`. Never saved."},
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "help": "Attention kernel of either model: `auto` (the default) takes the explicit path "
            "(softmax(QK^T/sqrt(d))V) on a CPU under bf16 autocast with heads of at most 32 dimensions, where SDPA's "
            "CPU kernel has no fast bf16 path (about 2.5x slower at head size 12-16), and `sdpa` (torch's fused "
            "scaled_dot_product_attention) elsewhere; `sdpa` or `eager` force one. Not saved with the model.",
            "choices": ["auto", "sdpa", "eager"],
        },
    )
    convert_channels: bool = field(
        default=True,
        metadata={
            "help": "Feed grayscale data to an RGB model (repeat the channel) and RGB data to a grayscale model "
            "(luma). When false, a channel mismatch is an error."
        },
    )

    finetune_method: str = field(
        default="full",
        metadata={
            "help": "How the pretrained model is fine-tuned: `full` (every weight), `linear_probe` (only the new "
            "classification head; the rest stays frozen) or `lora` (low-rank adapters on the attention projections "
            "through peft, plus the head). A saved ScratchViT fine-tunes the same way as `model_type: pretrained`; "
            "under `model_type: both` the scratch model trains fully.",
            "choices": list(FINETUNE_METHODS),
        },
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank r of the update B A (`finetune_method: lora`)."})
    lora_alpha: float = field(default=16, metadata={"help": "LoRA scaling: the update is multiplied by alpha / r."})
    lora_dropout: float = field(default=0.1, metadata={"help": "Dropout on the input of the LoRA update."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Names of the linear layers that get adapters. Default: the query and value projections of "
            "transformers' ViT (`q_proj`, `v_proj`; `query`, `value` in older layouts) and ScratchViT's fused "
            "`qkv` projection."
        },
    )
    merge_lora: bool = field(
        default=False,
        metadata={
            "help": "Also save the model with the adapters merged into its weights to OUTPUT/merged: a plain "
            "transformers model that loads without peft."
        },
    )
    layer_decay: float | None = field(
        default=None,
        metadata={
            "help": "Layer-wise learning-rate decay (BEiT, MAE, timm's --layer-decay), e.g. 0.65-0.75: block i of L "
            "trains at learning_rate * decay^(L - i), the embeddings at decay^(L + 1), the head at the full rate. "
            "Either model type."
        },
    )

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"`model_type` must be one of {list(MODEL_TYPES)}, got {self.model_type!r}.")
        if self.finetune_method not in FINETUNE_METHODS:
            raise ValueError(
                f"`finetune_method` must be one of {list(FINETUNE_METHODS)}, got {self.finetune_method!r}."
            )
        if self.model_type == "scratch" and self.finetune_method != "full":
            raise ValueError(
                f"`finetune_method: {self.finetune_method}` needs pretrained weights, but `model_type: scratch` "
                "starts from random ones. Fix: `model_type: pretrained` with `model_name_or_path` set to a saved "
                "ScratchViT (a run's output directory), or `finetune_method: full`."
            )
        if self.lora_r < 1 or self.lora_alpha <= 0 or not 0 <= self.lora_dropout < 1:
            raise ValueError(
                f"LoRA needs `lora_r` >= 1, `lora_alpha` > 0 and `lora_dropout` in [0, 1), got {self.lora_r}, "
                f"{self.lora_alpha} and {self.lora_dropout}."
            )
        if self.merge_lora and self.finetune_method != "lora":
            raise ValueError("`merge_lora: true` merges LoRA adapters: it needs `finetune_method: lora`.")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ValueError(f"`layer_decay` must be in (0, 1] (e.g. 0.75), got {self.layer_decay}.")


@dataclass
class DataArguments:
    """Where the images come from, how they are split, and how batches are augmented on the device."""

    dataset_name: str = field(
        default="uoft-cs/cifar10",
        metadata={
            "help": "A Hub dataset id (`uoft-cs/cifar10`, `ylecun/mnist`), `sklearn:digits` (shipped with "
            "scikit-learn), or a local path: a parquet/arrow/csv file, a folder of such files, an image folder "
            "(one subfolder per class, optionally under train/ validation/ test/), or `cifar-10-batches-py`."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of the Hub dataset."})
    train_file: str | None = field(default=None, metadata={"help": "A local parquet/arrow/csv file for training."})
    validation_file: str | None = field(default=None, metadata={"help": "A local file for validation."})
    test_file: str | None = field(default=None, metadata={"help": "A local file for the final test evaluation."})
    image_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the images; found automatically (`img`, `image`)."}
    )
    label_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the labels; found automatically (`label`, `labels`)."}
    )
    validation_size: float = field(
        default=0.1,
        metadata={
            "help": "Without a validation split, this much of train is held out (stratified by label, seeded by "
            "`data_seed` or `seed`): a fraction below 1, or a number of images (5000 for CIFAR-10)."
        },
    )
    include_labels: list[str] | None = field(
        default=None,
        metadata={
            "help": "Keep only images of these classes (label names), renumbered in this order; e.g. a source "
            "task for transfer learning. Default: all classes."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training images."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep only this many validation (and test) images."}
    )
    corrupt_images: str = field(
        default="skip",
        metadata={
            "help": "`skip`: drop images that cannot be decoded and log their count and indices. `error`: stop.",
            "choices": list(CORRUPT_IMAGE_POLICIES),
        },
    )
    decoded_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where decoded uint8 images are cached so a second run skips decoding "
            "(default: $HF_HOME/vit-finetune/decoded). Set to `none` to disable the cache."
        },
    )
    decode_size: int | None = field(
        default=None,
        metadata={
            "help": "Store images as squares of this size (shorter side resized, centre kept) when decoding. "
            "Default: images of one size are stored as they are; images of mixed sizes at the model's input size "
            "plus a margin for crops (256 for a 224 model)."
        },
    )
    decode_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that decode images in parallel (default: the CPU cores available). Only the first "
            "process of a node decodes; the others map its decoded cache (keep `decoded_cache_dir` on for that)."
        },
    )
    random_resized_crop: str = field(
        default="auto",
        metadata={
            "help": "Train on random boxes of each image resized to the model's input (RandomResizedCrop, as the "
            "transformers example and timm do for photos) instead of the padded random crop. `auto`: on for images "
            "stored larger than the model's input (photos), off for small native images (CIFAR-10, MNIST).",
            "choices": list(RANDOM_RESIZED_CROP_CHOICES),
        },
    )
    crop_scale: list[float] = field(
        default_factory=lambda: [0.08, 1.0],
        metadata={"help": "RandomResizedCrop: range of the box's share of the image area (low high)."},
    )
    crop_ratio: list[float] = field(
        default_factory=lambda: [3 / 4, 4 / 3],
        metadata={"help": "RandomResizedCrop: range of the box's aspect ratio, width / height (low high)."},
    )
    random_crop_padding: int = field(
        default=4,
        metadata={
            "help": "Random crop with this much zero padding (in source pixels); 0 disables it. Used when "
            "`random_resized_crop` is off."
        },
    )
    horizontal_flip: bool = field(default=True, metadata={"help": "Random horizontal flips of training images."})
    rand_augment_ops: int = field(
        default=0,
        metadata={
            "help": "Random photometric/geometric ops per training image, on the device: 0 off, 1 TrivialAugment, "
            "N > 1 RandAugment-style (N ops in a row, random magnitudes)."
        },
    )
    rand_augment_magnitude: float = field(
        default=1.0, metadata={"help": "Largest magnitude of `rand_augment_ops`, as a share of each op's range."}
    )

    def __post_init__(self):
        if self.corrupt_images not in CORRUPT_IMAGE_POLICIES:
            raise ValueError(
                f"`corrupt_images` must be one of {list(CORRUPT_IMAGE_POLICIES)}, got {self.corrupt_images!r}."
            )
        size = self.validation_size
        if size <= 0 or size == 1 or (size > 1 and size != int(size)):
            # 1 would be read as one image, although it most often means "all of it".
            raise ValueError(
                f"`validation_size` must be a fraction in (0, 1) (e.g. 0.1) or a whole number of images >= 2 "
                f"(e.g. 5000), got {size}."
            )
        self.random_resized_crop = str(self.random_resized_crop).lower()
        if self.random_resized_crop not in RANDOM_RESIZED_CROP_CHOICES:
            raise ValueError(
                f"`random_resized_crop` must be one of {list(RANDOM_RESIZED_CROP_CHOICES)}, got "
                f"{self.random_resized_crop!r}."
            )
        for name, low_bound, high_bound in (("crop_scale", 0, 1), ("crop_ratio", 0, float("inf"))):
            value = [float(v) for v in getattr(self, name)]
            if len(value) != 2 or not low_bound < value[0] <= value[1] <= high_bound:
                raise ValueError(
                    f"`{name}` must be two numbers `low high` with {low_bound} < low <= high"
                    f"{f' <= {high_bound}' if high_bound != float('inf') else ''}, got {getattr(self, name)}."
                )
            setattr(self, name, value)
        if self.decode_workers is not None and self.decode_workers < 1:
            raise ValueError(f"`decode_workers` must be >= 1, got {self.decode_workers}.")
        if isinstance(self.include_labels, str):
            raise ValueError(
                f"`include_labels` must be a list of label names, e.g. `include_labels: [{self.include_labels}, ...]`"
                f"; got the string {self.include_labels!r}."
            )
        if self.include_labels is not None:
            # One class is refused once the data is loaded (`_check_num_classes`), after its name is checked.
            repeated = sorted({n for n in self.include_labels if self.include_labels.count(n) > 1})
            if repeated:
                raise ValueError(f"`include_labels` names {repeated} more than once; name each class once.")
        for name in ("max_train_samples", "max_eval_samples", "decode_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1 (or unset), got {getattr(self, name)}.")
        if self.random_crop_padding < 0:
            raise ValueError(f"`random_crop_padding` must be >= 0, got {self.random_crop_padding}.")
        if self.rand_augment_ops < 0:
            raise ValueError(f"`rand_augment_ops` must be >= 0, got {self.rand_augment_ops}.")
        if not 0 < self.rand_augment_magnitude <= 1:
            raise ValueError(f"`rand_augment_magnitude` must be in (0, 1], got {self.rand_augment_magnitude}.")


def _scratch_vit_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """One optional field per `ScratchViTConfig.__init__` argument; `None` keeps the config's default."""
    fields = []
    for name, parameter in inspect.signature(ScratchViTConfig.__init__).parameters.items():
        if name == "self" or parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        annotation = parameter.annotation
        base = annotation if annotation in (int, float, str, bool) else int
        help_text = f"ScratchViTConfig.{name} (default {parameter.default!r}); used with model_type scratch/both."
        fields.append((name, base | None, field(default=None, metadata={"help": help_text})))
    return fields


ScratchViTArguments = dataclasses.make_dataclass("ScratchViTArguments", _scratch_vit_fields())
ScratchViTArguments.__doc__ = "The `ScratchViTConfig` fields of the scratch model; unset fields keep their defaults."


def scratch_config_kwargs(scratch_args) -> dict[str, Any]:
    """The `ScratchViTConfig` fields that the run sets explicitly."""
    return {k: v for k, v in dataclasses.asdict(scratch_args).items() if v is not None}


SWITCH_FLAGS = ("--bf16", "--fp16", "--tf32", "--torch_compile")


def parse_args(argv: list[str] | None = None):
    """Parse `--config FILE.yaml` (optional) and command-line overrides into the argument dataclasses.

    Returns `(model_args, data_args, scratch_args, training_args)`. An unknown key in the YAML file fails with the
    closest known names; unknown command-line flags fail the same way.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--bf16` alone means true, as it did when these were plain booleans (they take `auto` now).
    argv = [
        token
        for i, a in enumerate(argv)
        for token in (
            [a, "true"] if a in SWITCH_FLAGS and (i + 1 == len(argv) or argv[i + 1].startswith("--")) else [a]
        )
    ]
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, ScratchViTArguments, ImageClassificationTrainingArguments)
    )
    config_path = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("`--config` needs a path to a YAML file, e.g. `--config configs/quickstart.yaml`.")
        config_path = argv[i + 1]
        del argv[i : i + 2]
    if config_path is not None:
        # argparse type-converts string defaults, so YAML's `2e-5` (read as a string) still becomes a float.
        parser.set_defaults(**load_yaml_config(config_path, parser))
    known = {action.dest for action in parser._actions}
    unknown_flags = [a[2:].split("=")[0] for a in argv if a.startswith("--") and a[2:].split("=")[0] not in known]
    if unknown_flags:
        raise ValueError(_unknown_keys_message(unknown_flags, known, "on the command line"))
    return parser.parse_args_into_dataclasses(args=argv)


BASE_KEY = "base"


def load_yaml_config(path: str | os.PathLike, parser: HfArgumentParser | None = None) -> dict[str, Any]:
    """Read a flat YAML config, with its `base:` chain merged in, and check every key against the parser's arguments.

    The config's own keys override its base's; the base's path is relative to the config's folder.
    """
    values, chain = {}, []
    path = os.fspath(path)
    while path is not None:
        if not os.path.isfile(path):
            named_by = f" (the `base` of {chain[-1]})" if chain else ""
            raise FileNotFoundError(
                f"Config file {path!r}{named_by} does not exist. Pass an existing YAML file, e.g. from configs/."
            )
        if os.path.realpath(path) in map(os.path.realpath, chain):
            raise ValueError(f"Config {chain[0]!r} has a `base` cycle: {' -> '.join([*chain, path])}. Remove one.")
        chain.append(path)
        with open(path) as f:
            text = f.read()
        own, lines = _read_yaml(text, path)
        if not isinstance(own, dict):
            raise ValueError(
                f"Config file {path!r} must be a flat YAML map of `key: value`, got {type(own).__name__}."
            )
        if parser is not None:
            known = {action.dest for action in parser._actions} | {BASE_KEY}
            unknown = [k for k in own if k not in known]
            if unknown:
                raise ValueError(_unknown_keys_message(unknown, known, f"in {path}"))
            own = _check_yaml_types(own, parser, path, lines)
        base = own.pop(BASE_KEY, None)
        values = {**own, **values}
        path = os.path.join(os.path.dirname(path), base) if base is not None else None
    return values


def _read_yaml(text: str, path: str) -> tuple[Any, dict[str, int]]:
    """The YAML document and the line of each top-level key; a syntax error names the file, line and column."""
    try:
        values = yaml.safe_load(text) or {}
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
        hint = " YAML indents with spaces, never tabs: replace the tab." if "\t" in line else ""
        raise ValueError(f"Config file {path!r} is not valid YAML{where}: {error.problem}.{hint}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"Config file {path!r} is not valid YAML: {error}") from None
    lines = {}
    if isinstance(node, yaml.MappingNode):
        lines = {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}
    return values, lines


def _check_yaml_types(values: dict[str, Any], parser: HfArgumentParser, path: str, lines: dict[str, int]) -> dict:
    """Refuse a value of the wrong kind (a list where a number belongs, a string where a list belongs, a value outside
    a field's choices) with the file and line: argparse converts only string defaults, so a YAML list would otherwise
    reach torch as a learning rate."""
    actions = {}
    for action in parser._actions:
        if action.nargs != 0:
            actions.setdefault(action.dest, action)
    checked = dict(values)
    for key, value in values.items():
        action = actions.get(key)
        if action is None or value is None:
            continue
        where = f"`{key}` in {path}" + (f" (line {lines[key]})" if key in lines else "")
        if action.choices and value is False and "no" in map(str, action.choices):
            checked[key] = value = "no"  # YAML 1.1 reads a bare `no` as false
        if action.nargs in ("+", "*"):
            if not isinstance(value, list):
                raise ValueError(f"{where} must be a list, e.g. `{key}: [{value}, ...]`; got {value!r}.")
            continue
        scalar_type = {int: "an integer", float: "a number", string_to_bool: "true or false"}.get(action.type)
        if isinstance(value, (list, dict)) and (scalar_type or action.choices):
            kind = scalar_type or f"one of {list(map(str, action.choices))}"
            raise ValueError(f"{where} must be {kind}, got the {type(value).__name__} {value!r}.")
        if scalar_type:
            try:
                action.type(str(value))
            except Exception:
                raise ValueError(f"{where} must be {scalar_type}, got {value!r}.") from None
        if action.choices and str(value) not in map(str, action.choices):
            raise ValueError(f"{where} must be one of {list(map(str, action.choices))}, got {value!r}.")
    return checked


def _unknown_keys_message(unknown: list[str], known: set[str], where: str) -> str:
    lines = [f"Unknown argument(s) {where}:"]
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        lines.append(f"  {key!r}.{hint}")
    lines.append("Run `python finetune/run.py --help` for the full list of arguments.")
    return "\n".join(lines)
