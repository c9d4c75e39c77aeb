"""The options of `finetune.run` and how they are read: command line, YAML config and the short `--help`.

Four dataclasses describe a run: `ModelArguments`, `DataArguments`, `ScratchViTArguments` and
`ImageClassificationTrainingArguments` (transformers' `TrainingArguments` with `TrainingLoopArguments`, defined here;
finetune/training_args.py). A YAML config is a flat map onto their fields, overridden by the command line; it may
start from another (`base: other.yaml`, relative to its folder) and state only its differences. `null` (or `none`,
except where `none` is a value: `report_to`, `decoded_cache_dir`) unsets an optional option: `--ema_decay none`. This
module imports neither torch nor transformers, so `--help` answers at once.
"""

import argparse
import dataclasses
import difflib
import enum
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from finetune.errors import CLI_NAMES, ArgumentParser, UsageError


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory=dataclasses.MISSING, **metadata) -> Any:
    """A dataclass field with its help and argparse settings (`choices`), as transformers' `HfArg` (not imported)."""
    return field(default=default, default_factory=factory, metadata={"help": help, **metadata})


# A switch whose default is unset (None) taken bare, as one with a default is: `--flip_tta` is `--flip_tta true`.
FLAG = {"nargs": "?", "const": True}


def check_ranges(options, checks) -> None:
    """Refuse a value out of range; `checks` holds (field name, validity test, what a valid value is)."""
    for name, valid, expected in checks:
        if not valid(getattr(options, name)):
            raise ValueError(f"`{name}` must be {expected}, got {getattr(options, name)}.")


def is_set(options, name: str) -> bool:
    """Whether the dataclass field `name` of `options` holds other than its default (a list field: its factory's)."""
    spec = options.__dataclass_fields__[name]
    default = spec.default if spec.default_factory is dataclasses.MISSING else spec.default_factory()
    return getattr(options, name) != default


def check_unused(options, names, without: str, fix: str) -> None:
    """Refuse the fields among `names` set where nothing uses them (`without` says why), rather than train as if they
    were not given."""
    given = [name for name in names if is_set(options, name)]
    if given:
        raise ValueError(
            f"{', '.join(f'`{name}`' for name in given)} set, but {without}, so nothing would use it. Fix: {fix}, or "
            "drop it."
        )


@dataclass
class ModelArguments:
    """Which model to train: a pretrained checkpoint, a ScratchViT built from its config fields, or both."""

    model_type: str = option(
        "pretrained",
        "`pretrained` fine-tunes `model_name_or_path`; `scratch` trains a ScratchViT built from the ScratchViTConfig "
        "fields given; `both` trains both on the same data and split, then writes a comparison report.",
        choices=["pretrained", "scratch", "both"],
    )
    model_name_or_path: str = option(
        "google/vit-base-patch16-224-in21k", "Pretrained image classifier: a Hub model id or a local directory."
    )
    model_revision: str = option("main", "Branch, tag or commit of the Hub checkpoint.")
    image_processor_name: str | None = option(
        None,
        "Image processor, if not the one of `model_name_or_path`; at another size, the position embeddings of a ViT, "
        "DeiT, ViT-MSN or ScratchViT (learned ones) are resized to it.",
    )
    ignore_mismatched_sizes: bool = option(
        True,
        "A new head where the checkpoint's classifies other classes (the same ones in another order keep their rows); "
        "false refuses such a checkpoint.",
    )
    trust_remote_code: bool = option(False, "Allow modeling code from the repository (e.g. a pushed ScratchViT).")
    cache_dir: str | None = option(None, "Where checkpoints downloaded from the Hub are stored.")
    token: str | None = option(None, "Hub token; prefer HF_TOKEN or `hf auth login`. Never saved.")
    attn_implementation: str | None = option(
        "auto",
        "Attention kernel: `auto` is eager on a CPU under bf16 with a head size <= 32 (2.5x faster there), else SDPA. "
        "Not saved with the model.",
        choices=["auto", "sdpa", "eager"],
    )
    convert_channels: bool = option(
        True, "Feed grayscale data to an RGB model (repeated) and RGB to a grayscale one (luma); false: an error."
    )
    finetune_method: str = option(
        "full",
        "`full` (every weight), `linear_probe` (the new head only) or `lora` (peft adapters on the attention "
        "projections, plus the head). Under `model_type: both` the scratch model trains fully.",
        choices=["full", "linear_probe", "lora"],
    )
    lora_r: int = option(8, "LoRA rank r of the update B A.")
    lora_alpha: float = option(16, "LoRA scaling: the update is multiplied by alpha / r.")
    lora_dropout: float = option(0.1, "Dropout on the input of the LoRA update.")
    lora_target_modules: list[str] | None = option(
        None,
        "Linear layers that get adapters. Default: the query and value projections; ScratchViT's one `qkv` projection "
        "(query, key and value together).",
    )
    merge_lora: bool = option(False, "Also save the model with the adapters merged to OUTPUT/merged (no peft needed).")
    layer_decay: float | None = option(
        None,
        "Layer-wise learning-rate decay (BEiT, timm's --layer-decay), e.g. 0.65-0.75: block i of L trains at "
        "learning_rate * decay^(L - i), the embeddings at decay^(L + 1), the head at the full rate.",
    )

    def __post_init__(self):
        check_choices(self)
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
        if self.finetune_method != "lora":
            lora = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
            check_unused(self, lora, f"`finetune_method` is {self.finetune_method}", "`finetune_method: lora`")
        check_ranges(self, [("layer_decay", lambda v: v is None or 0 < v <= 1, "in (0, 1] (e.g. 0.75)")])
        if self.finetune_method == "linear_probe":  # the head is the one block trained, at the full rate
            alone = "`finetune_method: linear_probe` trains the head alone"
            check_unused(self, ["layer_decay"], alone, "`finetune_method: full` to train every block")


@dataclass
class DataArguments:
    """Where the images come from, how they are split, and how batches are augmented on the device."""

    dataset_name: str = option(
        "uoft-cs/cifar10",
        "A Hub dataset id, `sklearn:digits`, or a local path: a parquet/arrow/csv file or a folder of them, an image "
        "folder (one subfolder per class, optionally under train/ validation/ test/), or `cifar-10-batches-py`.",
    )
    dataset_config_name: str | None = option(None, "Configuration of the Hub dataset.")
    train_file: str | None = option(None, "A local parquet/arrow/csv file for training.")
    validation_file: str | None = option(None, "A local file for validation.")
    test_file: str | None = option(None, "A local file for the final test evaluation.")
    image_column_name: str | None = option(None, "Column holding the images; found automatically (`img`, `image`).")
    label_column_name: str | None = option(None, "Column holding the labels; found automatically (`label`, `labels`).")
    validation_size: float = option(
        0.1,
        "Without a validation split, this much of train is held out (stratified, seeded, from every class before "
        "`include_labels`): a fraction below 1, or a number of images (with `include_labels`, that share of every "
        "class: about that number).",
    )
    include_labels: list[str] | None = option(
        None, "Keep only images of these classes (label names), renumbered in this order. Default: all."
    )
    max_train_samples: int | None = option(None, "Keep only this many training images.")
    max_eval_samples: int | None = option(None, "Keep only this many validation (and test) images.")
    corrupt_images: str = option(
        "skip",
        "`skip` drops undecodable images and logs them (a split most of whose images do not decode stops); `error` "
        "stops at the first.",
        choices=["skip", "error"],
    )
    decoded_cache_dir: str | None = option(
        None, "Cache of decoded uint8 images (default: $HF_HOME/vit-finetune/decoded); `none` disables it."
    )
    decode_size: int | None = option(
        None,
        "Store images as squares of this size (shorter side resized, centre kept). Default: the size the model's "
        "processor resizes to, plus a margin for RandomResizedCrop (256 for 224); images of one size no larger than "
        "that are stored as they are.",
    )
    decode_workers: int | None = option(None, "Processes that decode images (default: the CPU cores available).")
    random_resized_crop: str = option(
        "auto",
        "Train on random boxes resized to the model's input (RandomResizedCrop) instead of the padded random crop. "
        "`auto`: on for images stored larger than the model's input (photos), off for small ones (CIFAR-10).",
        choices=["auto", "true", "false"],
    )
    crop_scale: list[float] = option(
        help="RandomResizedCrop: range of the box's share of the image area (low high).", factory=lambda: [0.08, 1.0]
    )
    crop_ratio: list[float] = option(
        help="RandomResizedCrop: range of the box's aspect ratio (low high).", factory=lambda: [3 / 4, 4 / 3]
    )
    random_crop_padding: int = option(4, "Random crop with this much zero padding (source pixels); 0 disables it.")
    horizontal_flip: bool = option(True, "Random horizontal flips of training images.")
    rand_augment_ops: int = option(
        0, "Random ops per training image on the device: 0 off, 1 TrivialAugment, N > 1 RandAugment-style."
    )
    rand_augment_magnitude: float = option(1.0, "Largest magnitude of `rand_augment_ops`, a share of each op's range.")
    random_erasing: float = option(0.0, "Probability of erasing a random box of a training image (timm's --reprob).")

    def __post_init__(self):
        self.random_resized_crop = str(self.random_resized_crop).lower()  # YAML reads `true` as a bool
        check_choices(self)
        size = self.validation_size
        if not math.isfinite(size) or size <= 0 or size == 1 or (size > 1 and size != int(size)):
            # 1 would be read as one image, although it most often means "all of it".
            raise ValueError(
                f"`validation_size` must be a fraction in (0, 1) (e.g. 0.1) or a whole number of images >= 2 "
                f"(e.g. 5000), got {size}."
            )
        for name, low_bound, high_bound in (("crop_scale", 0, 1), ("crop_ratio", 0, float("inf"))):
            value = [float(v) for v in getattr(self, name)]
            if len(value) != 2 or not low_bound < value[0] <= value[1] <= high_bound:
                raise ValueError(
                    f"`{name}` must be two numbers `low high` with {low_bound} < low <= high"
                    f"{f' <= {high_bound}' if high_bound != float('inf') else ''}, got {getattr(self, name)}."
                )
            setattr(self, name, value)
        if isinstance(self.include_labels, str):
            raise ValueError(
                f"`include_labels` must be a list of label names, e.g. `include_labels: [{self.include_labels}, ...]`"
                f"; got the string {self.include_labels!r}."
            )
        # One class is refused once the data is loaded, after its name is checked.
        repeated = sorted({n for n in self.include_labels or [] if self.include_labels.count(n) > 1})
        if repeated:
            raise ValueError(f"`include_labels` names {repeated} more than once; name each class once.")
        check_ranges(
            self,
            [
                ("decode_workers", lambda v: v is None or v >= 1, ">= 1"),
                ("max_train_samples", lambda v: v is None or v >= 1, ">= 1 (or unset)"),
                ("max_eval_samples", lambda v: v is None or v >= 1, ">= 1 (or unset)"),
                ("decode_size", lambda v: v is None or v >= 1, ">= 1 (or unset)"),
                ("random_crop_padding", lambda v: v >= 0, ">= 0"),
                ("rand_augment_ops", lambda v: v >= 0, ">= 0"),
                ("rand_augment_magnitude", lambda v: 0 < v <= 1, "in (0, 1]"),
                ("random_erasing", lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
            ],
        )
        if self.rand_augment_ops == 0:
            check_unused(self, ["rand_augment_magnitude"], "`rand_augment_ops` is 0 (off)", "`rand_augment_ops: 1`")


@dataclass
class ScratchViTArguments:
    """The `ScratchViTConfig` fields of the scratch model; unset ones keep the config's defaults
    (scratch_vit/configuration_scratch_vit.py). Written out so that `--help` needs no transformers;
    tests/test_configs.py keeps the two the same."""

    image_size: int | None = None
    patch_size: int | None = None
    num_channels: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    hidden_act: str | None = None
    hidden_dropout_prob: float | None = None
    attention_probs_dropout_prob: float | None = None
    drop_path_rate: float | None = option(
        None, "Stochastic depth, also for a pretrained model that has it (BEiT, Swin, ConvNeXt, DINOv2, timm's)."
    )
    qkv_bias: bool | None = option(None, **FLAG)
    qk_norm: bool | None = option(None, **FLAG)
    layer_norm_eps: float | None = None
    initializer_range: float | None = None
    position_embedding_type: str | None = None
    patch_embedding_type: str | None = None
    pooling: str | None = None
    head_type: str | None = None
    head_hidden_size: int | None = None
    head_hidden_act: str | None = None
    head_dropout_prob: float | None = None

    def __post_init__(self):
        if self.head_type in (None, "linear"):
            mlp = ("head_hidden_size", "head_hidden_act")
            check_unused(self, mlp, "the head is linear (`head_type`, by default)", "`head_type: mlp`")


def scratch_config_kwargs(scratch_args: ScratchViTArguments) -> dict[str, Any]:
    """The `ScratchViTConfig` fields that the run sets explicitly."""
    return {k: v for k, v in dataclasses.asdict(scratch_args).items() if v is not None}


SWITCH = {"nargs": "?", "const": "true"}  # `--bf16` alone means true, as when these options were plain booleans


@dataclass
class TrainingLoopArguments:
    """The pipeline's own training options, and the machine-dependent ones that `finetune.hardware.choose_settings`
    answers where they say `auto` (or are unset). Other `TrainingArguments` options keep transformers' meaning."""

    output_dir: str | None = option("outputs/run", "Where the model, checkpoints and results.json are written.")
    do_train: bool = option(
        True, "`false`: evaluate the saved model `model_name_or_path` without training (results, predictions CSVs)."
    )
    overwrite_output_dir: bool = option(
        False, "Allow an `output_dir` that holds another run's checkpoints or results (replaced)."
    )
    bf16: str = option(
        "auto",
        "bf16 autocast: `auto` on GPUs with bf16 and on CPUs with AVX512-BF16 or AMX where a start-up measurement "
        "finds it at least 1.2x as fast as float32.",
        **SWITCH,
    )
    fp16: str = option("auto", "fp16 autocast with loss scaling: `auto` uses it on GPUs without bf16.", **SWITCH)
    tf32: str | None = option("auto", "TF32 matmuls: `auto` enables them on Ampere or newer GPUs.", **SWITCH)
    torch_compile: str = option(
        "auto",
        "torch.compile the training forward: `auto` compiles on CUDA GPUs with CUDA graphs where kernel launches "
        "set the step's pace, and keeps it only if a timed comparison finds it faster, eager elsewhere; `true` "
        "compiles (`torch_compile_backend` / "
        "`torch_compile_mode`), `false` never. A compiler error falls back to eager with a warning.",
        **SWITCH,
    )
    use_cpu: bool | None = option(None, "Train on the CPU (default: where torch sees no accelerator).", **FLAG)
    dataloader_pin_memory: bool | None = option(
        None, "Pin batches in page-locked memory (default: with CUDA).", **FLAG
    )
    max_train_minutes: float | None = option(
        None, "Stop training after this many minutes of wall-clock time; the best model is then kept as usual."
    )
    budget_schedule: bool = option(
        False, "With `max_train_minutes`: re-plan the learning-rate schedule to end exactly at the budget."
    )
    ema_decay: float | None = option(
        None,
        "Exponential moving average of the weights with this decay (e.g. 0.999, warmed up as min(decay, (1 + t) / "
        "(10 + t))), which evaluations, checkpoints and the final model use. Default: off.",
    )
    flip_tta: bool | None = option(
        None,
        "At evaluation, average the logits of each image and its mirror image. Default: off; with `do_train: false`, "
        "as the evaluated model's run evaluated (and as predict does).",
        **FLAG,
    )
    mixup_alpha: float = option(0.0, "MixUp of training batches with ratio ~ Beta(alpha, alpha); 0 disables it.")
    cutmix_alpha: float = option(
        0.0, "CutMix with ratio ~ Beta(alpha, alpha); 0 disables it. With MixUp on too, one of the two per batch."
    )
    early_stopping_patience: int | None = option(
        None, "Stop after this many evaluations without an improvement of `metric_for_best_model`. Default: off."
    )
    early_stopping_threshold: float = option(0.0, "The least improvement of the metric that counts as one.")
    class_weighting: str = option(
        "none",
        "`balanced`: weight each class's loss by images / (classes x its images), against class imbalance.",
        choices=["none", "balanced"],
    )
    teacher_model_name_or_path: str | None = option(
        None, "Distill from a trained classifier of the same labels (a run's folder, a checkpoint or a Hub id)."
    )
    distillation_type: str = option(
        "soft",
        "`soft` matches the teacher's probabilities at `distillation_temperature` (KL x T^2, Hinton et al.); `hard` "
        "trains on the teacher's top class (DeiT).",
        choices=["soft", "hard"],
    )
    distillation_alpha: float = option(0.5, "The weight of the distillation loss; the true labels' gets 1 - alpha.")
    distillation_temperature: float = option(2.0, "The temperature T that softens both models' probabilities.")
    recipe_precision: str | None = option(
        None,
        "The precision a config was tuned for; where the machine trains in another, the log names the alternative.",
        choices=["bf16", "float32"],
    )
    recipe_alternative: str | None = option(None, "The config to use where the precision is not `recipe_precision`.")
    hub_commit_message: str = option("Upload fine-tuned model", "Commit message of the push to the Hub.")


# Reading the options: the short help, YAML configs and their checks. The command line itself is parsed by
# `finetune.training_args.OptionParser` (transformers' `HfArgumentParser`).

GROUPS = {
    "model": ModelArguments,
    "data": DataArguments,
    "scratch model": ScratchViTArguments,
    "training loop": TrainingLoopArguments,
}
BASE_KEY = "base"
NULL_WORDS = ("null", "Null", "NULL", "~")  # YAML's spellings of null
NONE_WORDS = ("none", "None")  # also null, except for these options, where `none` is a value:
NONE_IS_A_VALUE = ("report_to", "decoded_cache_dir")  # transformers' "no integration"; no cache
CONFIG_HELP = "YAML config (configs/); options given here override it"


def command_name() -> str:
    return "vit-finetune train" if Path(sys.argv[0]).name in CLI_NAMES else "python -m finetune.run"


def help_parser() -> argparse.ArgumentParser:
    """The short `--help`, from the dataclasses alone; parsing with it reads `--config`, `--help` and `--help_all`."""
    parser = ArgumentParser(
        prog=command_name(),
        allow_abbrev=False,
        usage="%(prog)s [--config FILE.yaml] [--OPTION VALUE ...]",
        description="Fine-tune a pretrained ViT or train a ScratchViT (or both, then compare). Options come from "
        "the YAML config, then the command line.",
        epilog="Every other TrainingArguments option is accepted too (learning_rate, num_train_epochs, "
        "per_device_train_batch_size, weight_decay, warmup_steps, lr_scheduler_type, seed, eval_strategy, "
        "save_strategy, ...): --help_all lists them all. `--OPTION none` (or `null`) unsets an optional option, as in "
        "a config, except `report_to`, `decoded_cache_dir`, `bf16`, `fp16` and `torch_compile`, where it means off.",
    )
    parser.add_argument("--config", metavar="FILE.yaml", help=CONFIG_HELP)
    parser.add_argument("--help_all", action="store_true", help="every option in full, transformers' included")
    for title, options in GROUPS.items():
        group = parser.add_argument_group(f"{title} options", first_sentence(" ".join(options.__doc__.split())))
        for spec, (hint, choices, default) in zip(dataclasses.fields(options), option_specs([options]).values()):
            kind = parsed_type(hint)
            element = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
            nargs = "+" if element is not kind else "?" if kind is bool else None
            metavar = f"{{{','.join(choices)}}}" if choices else getattr(element, "__name__", "VALUE").upper()
            default = "" if default is None else f" [{default}]"
            group.add_argument(
                f"--{spec.name}",
                nargs=spec.metadata.get("nargs", nargs),
                metavar=metavar,
                default=argparse.SUPPRESS,
                help=(first_sentence(spec.metadata.get("help", "")) + default) or None,
            )
    return parser


def first_sentence(text: str) -> str:
    return re.split(r"(?<!e\.g)(?<!i\.e)\.(?:\s|$)", text, maxsplit=1)[0] + ("." if text else "")


def option_specs(dataclass_types) -> dict[str, tuple[Any, list | None, Any]]:
    """Each option's name -> (type hint, choices, default)."""
    specs = {}
    for options in dataclass_types:
        hints = typing.get_type_hints(options)  # not `f.type`, which HfArgumentParser rewrites
        for f in dataclasses.fields(options):
            if f.init:
                kind = parsed_type(hints[f.name])
                choices = f.metadata.get("choices")
                if isinstance(kind, type) and issubclass(kind, enum.Enum):
                    choices = [member.value for member in kind]
                elif typing.get_origin(kind) is typing.Literal:
                    choices = list(typing.get_args(kind))
                default = None if f.default is dataclasses.MISSING else getattr(f.default, "value", f.default)
                specs[f.name] = (hints[f.name], [str(c) for c in choices] if choices else None, default)
    return specs


def is_optional(hint) -> bool:
    return type(None) in typing.get_args(hint)


def parsed_type(hint):
    """The one type `HfArgumentParser` reads an option of type `hint` as: `X` of `X | None`, the non-string member of
    `X | str`, and a string where a union has more members (`dict | str | None`)."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    if bool in members or len(members) == 1:
        return bool if bool in members else members[0]
    return str if is_optional(hint) else members[0] if members[1] is str else members[1]


def unset(text: str, name: str, hint) -> bool:
    """Whether `text` for the option `name` means None: `null`, or `none` where not a value."""
    return is_optional(hint) and (text in NULL_WORDS or (text in NONE_WORDS and name not in NONE_IS_A_VALUE))


def load_yaml_config(path: str | os.PathLike, options: dict[str, tuple[Any, list | None, Any]] | None = None) -> dict:
    """A flat YAML config with its `base:` chain merged in; with `options` (`option_specs`), its keys and values
    checked."""
    values, chain = {}, []
    path = os.fspath(path)
    while path is not None:
        if not os.path.isfile(path):
            named_by = f" (the `base` of {chain[-1]})" if chain else ""
            what = "is a folder" if os.path.isdir(path) else "does not exist"
            raise FileNotFoundError(
                f"Config file {path!r}{named_by} {what}. Pass an existing YAML file, e.g. from configs/."
            )
        if os.path.realpath(path) in map(os.path.realpath, chain):
            raise ValueError(f"Config {chain[0]!r} has a `base` cycle: {' -> '.join([*chain, path])}. Remove one.")
        chain.append(path)
        own, lines = read_yaml(path)
        if options is not None:
            unknown = [k for k in own if k not in options and k != BASE_KEY]
            if unknown:
                raise ValueError(unknown_message(unknown, options, f"in {path}"))
            for key, value in own.items():
                if key in options:
                    where = f"`{key}` in {path}" + (f" (line {lines[key]})" if key in lines else "")
                    own[key] = checked_value(key, value, *options[key], where)
        base = own.pop(BASE_KEY, None)
        if base is not None and not isinstance(base, str):
            raise ValueError(f"`base` in {path} must be one file name (`base: other.yaml`), got {base!r}.")
        values = {**own, **values}
        path = os.path.join(os.path.dirname(path), base) if base is not None else None
    return values


class ExponentLoader(yaml.SafeLoader):
    """YAML 1.1 with the numbers YAML 1.2 and JSON read that it reads as text: `1e-5`, `1.0e5` (no dot, or an
    exponent without its sign); `lr_scheduler_kwargs: {min_lr: 1e-5}` reached the schedule as a string. Quoted, it
    stays text."""


ExponentLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def read_yaml(path: str) -> tuple[dict, dict[str, int]]:
    """The YAML map and the line of each key; a syntax error, or a key given twice, names the file, line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"Config file {path!r} is not text (not UTF-8): pass a YAML file.") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        values = yaml.safe_load(text) or {}
        if isinstance(values, dict) and any(isinstance(v, dict) for v in values.values()):
            # A map option's values reach the library as YAML read them (the top-level ones are converted by type).
            numbers = yaml.load(text, Loader=ExponentLoader)
            values = {k: numbers[k] if isinstance(v, dict) else v for k, v in values.items()}
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else ""
        hint = " YAML indents with spaces, never tabs: replace the tab." if "\t" in line else ""
        raise ValueError(f"Config file {path!r} is not valid YAML{where}: {error.problem}.{hint}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"Config file {path!r} is not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise ValueError(f"Config file {path!r} must be a flat YAML map of `key: value`, got {type(values).__name__}.")
    lines = {}
    for key, _ in node.value if node is not None else []:  # an empty file (or comments only) sets nothing
        if not isinstance(key, yaml.ScalarNode):
            continue
        if key.value in lines:  # YAML keeps the last silently: a config that sets one twice says one thing twice
            raise ValueError(
                f"Config file {path!r} sets `{key.value}` twice (lines {lines[key.value]} and "
                f"{key.start_mark.line + 1}). Keep one."
            )
        lines[key.value] = key.start_mark.line + 1
    wrong = [key for key in values if not isinstance(key, str)]
    if wrong:
        raise ValueError(
            f"Config file {path!r} has the key {wrong[0]!r}, which names no option: keys are option names."
        )
    return values, lines


def checked_value(key: str, value: Any, hint, choices: list[str] | None, default: Any, where: str) -> Any:
    """`value` as the option takes it, or a `ValueError` naming `where`: argparse converts only string defaults, so a
    YAML list would otherwise reach torch as a learning rate."""
    from transformers.hf_argparser import string_to_bool

    kind = parsed_type(hint)
    convert = {int: int, float: float, bool: string_to_bool}.get(kind)
    expected = {int: "an integer", float: "a number", bool: "true or false"}.get(kind)
    expected = expected or (f"one of {choices}" if choices else None)
    if value is None and not is_optional(hint):
        # An empty default (`debug`) is shown as YAML's empty string, not as nothing.
        example = "" if default is None or isinstance(default, bool) else f" (e.g. {default or repr(default)})"
        raise ValueError(
            f"{where} cannot be null: it needs {expected or 'a value'}{example}; remove the line to use the default."
        )
    if value is None or unset(str(value), key, hint):
        return None
    if typing.get_origin(kind) is list:
        if not isinstance(value, list):
            if key == "debug":  # TrainingArguments' list of debug modes, not the command line's bare `--debug`
                raise ValueError(
                    f"{where} lists transformers' debug modes (e.g. `[underflow_overflow]`), got {value!r}. For the "
                    "traceback of an error: `--debug` on the command line, or `LOG_LEVEL=debug`."
                )
            raise ValueError(f"{where} must be a list, e.g. `{key}: [{value}, ...]`; got {value!r}.")
        item = typing.get_args(kind)[0]  # YAML reads `[2, 0, 1]` as numbers, the command line as strings
        try:
            return [item(v) for v in value]
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be a list of {item.__name__} values, got {value!r}.") from None
    if isinstance(value, bool) and choices:
        value = "no" if value is False and "no" in choices else str(value).lower()  # YAML 1.1 reads `no` as false
    if isinstance(value, (list, dict)) and expected:
        raise ValueError(f"{where} must be {expected}, got the {type(value).__name__} {value!r}.")
    members = typing.get_args(hint) or (hint,)
    if kind is str and not any(m in (list, dict) or typing.get_origin(m) in (list, dict) for m in members):
        if isinstance(value, (list, dict)):
            raise ValueError(f"{where} must be text, got the {type(value).__name__} {value!r}.")
        value = str(value)  # YAML reads `output_dir: 2024` as a number
    try:
        if convert is not None:
            convert(str(value))
    except (ValueError, argparse.ArgumentTypeError):
        raise ValueError(f"{where} must be {expected}, got {value!r}.") from None
    if choices and str(value) not in choices:
        raise ValueError(f"{where} must be {expected}, got {value!r}.")
    return value


# Options of transformers' image-classification example (run_image_classification.py) named otherwise here.
EXAMPLE_OPTIONS = {
    "train_val_split": "`validation_size`, the same fraction",
    "train_dir": "`dataset_name` set to the folder, one subfolder per class",
    "validation_dir": "`dataset_name` with a folder holding train/ and validation/",
}
# Names other training scripts use, which the closest spelling would answer wrongly (`batch_size`: `patch_size`).
OTHER_NAMES = {
    "freeze": "`finetune_method: linear_probe`, which trains the head alone",
    "linear_probe": "`finetune_method: linear_probe`",
    "lora": "`finetune_method: lora`",
    "lr": "`learning_rate`",
    "epochs": "`num_train_epochs`",
    "batch_size": "`per_device_train_batch_size`, and `per_device_eval_batch_size` for evaluation",
    "warmup_ratio": "`warmup_steps` below 1, a share of the steps (e.g. 0.1)",
    "model": "`model_name_or_path`",
}


def unknown_message(unknown: list[str], known, where: str, prefix: str = "") -> str:
    """One line naming each unknown option and the closest known names."""
    parts = []
    for key in unknown:
        name = key.removeprefix(prefix).split("=")[0].replace("-", "_")
        close = difflib.get_close_matches(name, known, n=3)
        if name in EXAMPLE_OPTIONS:
            parts.append(f"{key!r} (transformers' example script's; here: {EXAMPLE_OPTIONS[name]})")
            continue
        if name in OTHER_NAMES:
            parts.append(f"{key!r} (here: {OTHER_NAMES[name]})")
            continue
        parts.append(f"{key!r}" + (f" (Did you mean {', '.join(repr(prefix + c) for c in close)}?)" if close else ""))
    return f"Unknown option(s) {where}: {', '.join(parts)}. `{command_name()} --help` lists the options."


def parse_options(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, ScratchViTArguments, dict]:
    """The config and command line as the three pipeline dataclasses and the `TrainingArguments` values as given,
    `auto` still unresolved."""
    from finetune.training_args import option_parser  # transformers: imported once a command line is read

    argv = joined_negative_numbers(list(sys.argv[1:] if argv is None else argv))
    known = help_parser().parse_known_args(argv)[0]  # answers --help
    if sum(a == "--config" or a.startswith("--config=") for a in argv) > 1:  # argparse would keep the last alone
        raise UsageError(
            "`--config` is given more than once; only one is read. Fix: one `--config`; a config can start from "
            "another with `base: other.yaml` and state only its differences."
        )
    parser = option_parser()
    if known.help_all:
        parser.print_help()
        parser.exit()
    if known.config is not None:
        # argparse converts string defaults by the option's type, so YAML's `2e-5` (a string to YAML) becomes a float.
        parser.set_defaults(**load_yaml_config(known.config, parser.options))
    namespace, extras = parser.parse_known_args(argv)
    if extras:
        unknown = [a for a in extras if a.startswith("-")]
        if unknown:
            raise UsageError(unknown_message(unknown, parser.options, "on the command line", prefix="--"))
        hint = f" Did you mean `--config {extras[0]}`?" if extras[0].endswith((".yaml", ".yml")) else ""
        raise UsageError(f"Unexpected argument {extras[0]!r}: every value follows its `--option`.{hint}")
    values = {k: None if v == [None] else v for k, v in vars(namespace).items()}  # `--list_option null` unsets too
    check_lists_given_once(argv, parser.options)
    if values["output_dir"] is None:  # transformers' default would write to ./trainer_output
        raise UsageError(
            "`output_dir` cannot be unset: the run writes its model, checkpoints and results.json there. Fix: name a "
            "folder, or leave the option out for the default outputs/run."
        )
    if values.get("report_to") is None:  # cleared (`null`): to its default, no integration (transformers refuses None)
        values["report_to"] = "none"
    del values["config"], values["help_all"]
    model_args, data_args, scratch_args = (
        cls(**{f.name: values.pop(f.name) for f in dataclasses.fields(cls)})
        for cls in (ModelArguments, DataArguments, ScratchViTArguments)
    )
    # After the options' own checks, which name their ranges: `--validation_size nan`'s a fraction or a count.
    check_finite({**vars(model_args), **vars(data_args), **vars(scratch_args), **values})
    return model_args, data_args, scratch_args, values


def joined_negative_numbers(argv: list[str]) -> list[str]:
    """`--option -1e-3` as `--option=-1e-3`: argparse before Python 3.13 reads a negative number with an exponent (or
    `-inf`) as an option, and stopped with "--option: expected one argument". The numbers it reads (`-1`, `-0.5`) are
    left to it, which also reads them as a list's items (`--include_labels -1 -2`)."""
    joined = []
    for arg in argv:
        previous = joined[-1] if joined else ""
        misread = arg.startswith("-") and not re.fullmatch(r"-\d+|-\d*\.\d+", arg) and is_number_text(arg)
        if previous.startswith("--") and "=" not in previous and misread:
            joined[-1] = f"{previous}={arg}"
        else:
            joined.append(arg)
    return joined


def is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_lists_given_once(argv: list[str], options) -> None:
    """Refuse a list option given twice on the command line: argparse keeps the last list alone (`--include_labels 0 1
    --include_labels 2 3` trained on 2 and 3). A value given twice is the last, as argparse and the examples take."""
    seen = set()
    for arg in argv:
        name = arg[2:].split("=")[0].replace("-", "_")
        if arg.startswith("--") and name in options and typing.get_origin(parsed_type(options[name][0])) is list:
            if name in seen:
                raise UsageError(
                    f"`--{name}` is given more than once, and only the last list would be read. Fix: give it once, "
                    f"with every value: `--{name} A B C`."
                )
            seen.add(name)


# `inf` turns clipping off while the Trainer still logs the gradient norm.
INFINITY_ALLOWED = ("max_grad_norm",)


def check_finite(values: dict) -> None:
    """Refuse NaN and infinite numbers: they passed the range checks and failed late, or did nothing meaningful."""
    for name, value in values.items():
        for number in value if isinstance(value, list) else [value]:
            allowed = name in INFINITY_ALLOWED and number in (math.inf, -math.inf)
            if isinstance(number, float) and not math.isfinite(number) and not allowed:
                raise UsageError(f"`{name}` must be a finite number, got {number}.")


def parse_args(argv: list[str] | None = None):
    """`(model_args, data_args, scratch_args, training_args)` as `finetune.run` builds them (tests, benchmarks)."""
    from finetune import hardware
    from finetune.training_args import build_training_args

    model_args, data_args, scratch_args, options = parse_options(argv)
    return model_args, data_args, scratch_args, build_training_args(options, hardware.choose_settings(options))


def stated_options(argv: list[str]) -> set[str]:
    """The options `argv` or the config it names state themselves: not a `base:` config's, which are shared, not this
    run's to drop (a ScratchViT config on a `model_type: both` base keeps the base's `model_name_or_path`)."""
    config = help_parser().parse_known_args(argv)[0].config
    given = {arg[2:].split("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}
    return given | set(read_yaml(config)[0] if config else ())


def check_choices(options, fields_of=None) -> None:
    """Refuse a value outside a field's `choices`, as the parser does, for dataclasses built in code."""
    for name, (hint, choices, _) in option_specs([fields_of or type(options)]).items():
        value = getattr(options, name)
        if choices and value not in choices and not (value is None and is_optional(hint)):  # None: unset
            raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


def answer_help(argv: list[str]) -> None:
    """Print the short help and exit where `argv` asks for it; called before torch and transformers are imported."""
    if "-h" in argv or "--help" in argv:
        help_parser().print_help()
        raise SystemExit(0)
