"""The model card (README.md) of a run's output directory, for the Hub.

The metadata is huggingface_hub's `ModelCardData` with `EvalResult`s, so it parses back with
`ModelCard.load(path).data` (tags, datasets, base model, pipeline tag, a `model-index` with validation and test
metrics). The body is written from `results.json`, `config.json` and the comparison's summary when there is one.
"""

import fnmatch
import json
import logging
import os
import sys
from importlib.metadata import version
from os.path import expanduser
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from finetune.errors import ArgumentParser, run_command
from finetune.locations import ADAPTER_CONFIG_NAME, edited_file, free_name, is_onnx_export, marked, write_whole
from finetune.results import RESULTS_NAME, Results
from finetune.tools.compare import REPORT_NAME, SUMMARY_NAME
from finetune.tools.report import (
    MISSING,
    copies_note,
    display_dataset,
    format_count,
    format_duration,
    format_number,
    format_percent,
    history_table,
    is_hub_id,
    markdown_table,
    summary_table,
    teacher_name,
)


logger = logging.getLogger(__name__)

CARD_NAME = "README.md"
COMPARISON_DIR_NAME = "comparison"
# Licenses of base checkpoints this project fine-tunes; a fine-tuned model inherits its base's license.
KNOWN_BASE_LICENSES = {"google/vit-": "apache-2.0", "facebook/deit-": "apache-2.0"}
LEGACY_WEIGHT_PATTERNS = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")
HISTORY_ROWS = 30
ARCHITECTURE_KEYS = (
    "image_size patch_size num_channels hidden_size num_hidden_layers num_attention_heads intermediate_size "
    "hidden_act qkv_bias qk_norm patch_embedding_type position_embedding_type pooling head_type head_hidden_size "
    "head_hidden_act drop_path_rate"
).split()


def find_comparison_dir(output_dir: str | os.PathLike) -> Path | None:
    """`output_dir/comparison/`, or a sibling `../comparison/` (`model_type: both`) whose `comparison.json` lists this
    run, if any."""
    output_dir = Path(output_dir)
    child = output_dir / COMPARISON_DIR_NAME
    if (child / REPORT_NAME).is_file():
        return child
    sibling = output_dir.resolve().parent / COMPARISON_DIR_NAME
    if not (sibling / REPORT_NAME).is_file():
        return None
    summary = _read_json(sibling / SUMMARY_NAME)  # without one, the sibling report is taken as covering this run
    listed = summary is None or output_dir.resolve().name in {row.get("run_dir") for row in summary.get("runs", [])}
    return sibling if listed else None


def run_dir_of(output_dir: str | os.PathLike) -> Path:
    """The folder whose results.json describes the model in `output_dir`: itself, or a LoRA run's for RUN/merged."""
    output_dir = Path(output_dir)
    run_dir = output_dir.resolve().parent
    merged = output_dir.name == "merged" and (run_dir / ADAPTER_CONFIG_NAME).is_file()
    return run_dir if merged else output_dir


def still_training(output_dir: Path, above: bool = True) -> str | None:
    """The live run that holds `output_dir`, or with `above` the folder above it (its process, host and start), or
    None."""
    import socket

    from finetune.checkpoints import LOCK_NAME, RunLock, holder_text, read_lock

    me = {"pid": os.getpid(), "host": socket.gethostname()}
    locks = (output_dir / LOCK_NAME, output_dir.parent / LOCK_NAME)[: 2 if above else 1]
    for lock in locks:  # a `both` run locks the folder above
        holder = read_lock(lock)
        if holder and not RunLock.is_stale(holder, me):
            return holder_text(holder)
    return None


def check_trained_run(output_dir: Path, command: str = "card") -> None:
    """Refuse a folder that is not a finished training run's output (the card would describe, and the push upload, a
    model that is not there), naming what is missing and what to `command` instead."""
    if is_onnx_export(output_dir):  # `export` writes RUN/onnx: the card describes the run's PyTorch model
        fix = f"{command} its run folder"
        if (output_dir.resolve().parent / "config.json").is_file():
            fix = f"{command} the run folder {output_dir.parent}"
        raise FileNotFoundError(
            f"{output_dir} is an ONNX export, which the model card does not describe: {fix} (its card says how to "
            "export it)."
        )
    names = {p.name for p in output_dir.iterdir()} if output_dir.is_dir() else set()
    has_weights = any(fnmatch.fnmatch(name, p) for name in names for p in ("*.safetensors", *LEGACY_WEIGHT_PATTERNS))
    missing = [] if "config.json" in names else ["config.json"]
    missing += [] if (run_dir_of(output_dir) / RESULTS_NAME).is_file() else [RESULTS_NAME]
    missing += [] if has_weights else ["weights (model.safetensors)"]
    if not missing:
        return
    # Subfolders with a model and its results: not a run's checkpoint-* (resumed, not pushed), nor a model no run wrote
    # (the quickstart's source_init); nor an ONNX export.
    runs = [n for n in sorted(names) if all((output_dir / n / f).is_file() for f in ("config.json", RESULTS_NAME))]
    runs = [n for n in runs if not (output_dir / n / "model.onnx").is_file()]
    hint = f" It holds run directories: {command} {', '.join(runs)} separately." if runs else ""
    if output_dir.resolve().name.startswith("checkpoint-") and RESULTS_NAME not in names:
        hint = f" It is a checkpoint of the run {output_dir.parent}: {command} that run's folder (its kept model)."
    elif RESULTS_NAME not in names and any(name.startswith("checkpoint-") for name in names):
        hint = (
            " Its run has not finished (checkpoint-* folders, no results.json): resume it with the same command and "
            f"`--resume_from_checkpoint true`, then {command} it."
        )
        training = still_training(output_dir)
        if training:  # a resume would be refused while it runs
            hint = f" Its run is still training ({training}): {command} it once it has finished."
    elif not hint and RESULTS_NAME in names and "config.json" not in names:
        hint = f" It is an evaluation-only run's output: {command} the run that trained the model."
    raise FileNotFoundError(f"{output_dir} holds no trained model: missing {', '.join(missing)}.{hint}")


def hub_base(name: str | None, run_dir: Path, local: bool | None = None) -> str | None:
    """`name`, the model a run fine-tuned from, where it is a Hub id, else None. Without the run's `local` record (an
    earlier results.json), a name is local where it exists relative to a folder the run could have been launched from
    (`--model_name_or_path bases/vit --output_dir runs/vit`), which need not be the current one."""
    if local is None and name:
        local = any((folder / name).exists() for folder in run_dir.resolve().parents)
    return name if name and not local and is_hub_id(name) else None


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        logger.warning(f"Ignoring {path}: {error}")
        return None


def is_scratch(results: Results) -> bool:
    return results.model_type == "scratch" or "ScratchViT" in str(results.architecture)


def card_license(results: Results) -> str | None:
    if results.license or results.model_type != "pretrained":
        return results.license
    base = results.model_name_or_path or ""
    return next((name for prefix, name in KNOWN_BASE_LICENSES.items() if base.startswith(prefix)), None)


def architecture_tag(results: Results, config: dict) -> str | None:
    """The tag of the model's architecture, as the Hub names it (its config's `model_type`; timm's: `timm`)."""
    if is_scratch(results):
        return "vit"
    model_type = config.get("model_type")
    return "timm" if model_type == "timm_wrapper" else model_type


def card_data(
    results: Results,
    model_name: str,
    adapter_base_model: str | None = None,
    base_model: str | None = None,
    config: dict | None = None,
) -> ModelCardData:
    """The card's YAML metadata; `base_model` must be a Hub id (`hub_base`) or None: the Hub rejects any other."""
    scratch = is_scratch(results)
    dataset, dataset_name = results.dataset, display_dataset(results.dataset)
    task = {"task_type": "image-classification", "task_name": "Image Classification", "dataset_name": dataset_name}
    task["dataset_type"] = dataset if is_hub_id(dataset) else dataset_name
    eval_results = []
    for split in ("validation", "test"):
        metrics, name = getattr(results, split), split.capitalize()
        if metrics is None:
            continue
        # (value, metric id of the Hub's metrics, its arguments, the name shown)
        for value, metric_type, metric_args, metric_name in (
            (metrics.accuracy, "accuracy", None, f"{name} accuracy"),
            (metrics.top5_accuracy, "top_k_accuracy", {"k": 5}, f"{name} top-5 accuracy"),
            (metrics.macro_f1, "f1", {"average": "macro"}, f"{name} macro F1"),
            (metrics.map, "mean_average_precision", None, f"{name} mAP"),  # multi-label runs
            (metrics.micro_f1, "f1", {"average": "micro"}, f"{name} micro F1"),
        ):
            if value is not None:
                eval_results.append(
                    EvalResult(**task, dataset_split=split, metric_type=metric_type, metric_value=value,
                               metric_name=metric_name, metric_args=metric_args)
                )  # fmt: skip
    tags = ["image-classification", "vision", *filter(None, [architecture_tag(results, config or {})])]
    tags += ["scratch-vit", "custom_code"] if scratch else []
    tags += ["peft", "lora"] if adapter_base_model is not None else []
    return ModelCardData(
        library_name="peft" if adapter_base_model is not None else "transformers",
        license=card_license(results),
        tags=tags,
        datasets=[dataset] if is_hub_id(dataset) else None,
        base_model=base_model if adapter_base_model or not scratch else None,
        pipeline_tag="image-classification",
        model_name=model_name,
        eval_results=eval_results or None,
    )


def _parameters(results: Results, merged: bool) -> str:
    """The model's parameters and which of them trained. A LoRA run's count holds the adapters and the head's trained
    copy: the model itself (its base with the new head, as many as merged) is that count less the trained ones."""
    total, trained = format_count(results.num_parameters), format_count(results.num_trainable_parameters)
    if results.hyperparameters.get("finetune_method") == "lora":
        counts = (results.num_parameters, results.num_trainable_parameters)
        model = format_count(None if None in counts else counts[0] - counts[1])
        if merged:
            return f"{model} parameters; LoRA trained {trained}: the adapters, merged in, and the head"
        return f"{model} parameters in the base model, and {trained} trained by LoRA: the adapters and the head"
    if results.num_trainable_parameters in (None, results.num_parameters):
        return f"{total} parameters"
    return f"{total} parameters, of which {trained} trained"


def _teaching(results: Results, run_dir: Path) -> str:
    hyperparameters = results.hyperparameters
    teacher = hyperparameters.get("teacher_model_name_or_path")
    if not teacher:
        return ""
    # A local folder by its last two parts: no path of the training machine, and not to be read as a Hub id.
    local = results.teacher_is_local
    named = f"`{teacher}`" if hub_base(teacher, run_dir, local) else f"a local model, `{teacher_name(teacher)}`"
    kind = hyperparameters.get("distillation_type", "soft")
    how = f"{kind} distillation, alpha {hyperparameters.get('distillation_alpha')}"
    if kind == "soft":
        how += f", temperature {hyperparameters.get('distillation_temperature')}"
    return f" It was taught by {named} ({how})."


def _model_description(results: Results, config: dict, model_name: str, merged: bool, hub: str | None) -> str:
    dataset = f"`{display_dataset(results.dataset)}`"
    size = f"{results.image_size or config.get('image_size', '?')} px"
    params = _parameters(results, merged)
    if is_scratch(results):
        variant = ", ".join(
            f"{key.replace('_', ' ')} {config[key]}"
            for key in ("patch_embedding_type", "position_embedding_type", "pooling", "head_type")
            if key in config
        )
        # A `pretrained` run whose base is a scratch run's folder fine-tuned that run's weights.
        origin = "trained from random initialisation" if results.model_type == "scratch" else "fine-tuned"
        return (
            f"**{model_name}** is a ScratchViT, a Vision Transformer written from scratch as a transformers model, "
            f"{origin} on {dataset} at {size} ({params}; {variant}). "
            "Its modeling code is stored with the weights, so it loads with `trust_remote_code=True`."
        )
    architecture = results.architecture or (config.get("architectures") or ["a pretrained model"])[0]
    local = f"the local checkpoint `{Path(results.model_name_or_path).name}`" if results.model_name_or_path else None
    base = f"[`{hub}`](https://huggingface.co/{hub})" if hub else local or "a pretrained checkpoint"
    return (
        f"**{model_name}** is {base} (`{architecture}`) fine-tuned for image classification on {dataset} at {size} "
        f"({params})."
    )


def _adapter_resizes_positions(config: dict, base: str) -> bool:
    """Whether a LoRA run's model used its base's position embeddings interpolated to another size (training resizes
    them, frozen, and saves only the adapters): the base's config.json, read from its folder or the Hub, says the
    base's size. Where it cannot be read, yes: the code that interpolates is right at any size."""
    from finetune.models import RESIZABLE_POSITION_EMBEDDINGS

    if config.get("model_type") not in RESIZABLE_POSITION_EMBEDDINGS:
        return False
    base_config = _read_json(Path(base) / "config.json")
    if base_config is None:
        try:
            from huggingface_hub import hf_hub_download

            base_config = _read_json(Path(hf_hub_download(base, "config.json")))
        except Exception:  # offline, private or gone: unknown
            return True
    return not isinstance(base_config, dict) or base_config.get("image_size") != config.get("image_size")


def _usage(results: Results, config: dict, repo: str, base: str | None, hub: str | None) -> str:
    """How to load and run the model: transformers' Auto classes (and pipeline), or peft for a LoRA adapter of `base`
    (a local one by a placeholder: its path on the training machine means nothing to readers)."""
    remote = ", trust_remote_code=True" if is_scratch(results) else ""
    mode = "L" if config.get("num_channels") == 1 else "RGB"
    # A LoRA run at another size than its base's: the base's position embeddings, interpolated at each call.
    interpolate = (
        ", interpolate_pos_encoding=True" if base is not None and _adapter_resizes_positions(config, base) else ""
    )
    forward = f"logits = model(**inputs{interpolate}).logits"
    pipeline = ""
    if mode == "RGB" and base is None:  # transformers' pipeline converts every image to RGB: not a 1-channel model
        pipeline = f"""

# or, in one line (pipeline() reads transparent and 16-bit images otherwise):
classifier = pipeline("image-classification", model=repo{remote})
print(classifier("image.jpg"))"""
    if results.hyperparameters.get("flip_tta"):  # the scores above and the thresholds are of flip-averaged logits
        mirror = f'model(pixel_values=inputs["pixel_values"].flip(-1){interpolate}).logits'
        forward = "# as the scores above: the mean of the image's logits and its mirror image's (flip_tta)\n    " + (
            f"logits = (model(**inputs{interpolate}).logits + {mirror}) / 2"
        )
        pipeline = pipeline.replace("in one line (", "in one line (without the mirror image; ")
    top_k = min(5, len(results.label_names) or 5)  # predict's default, at most every class
    answer, printed = "print(model.config.id2label[logits.argmax(-1).item()])", f"the top-{top_k} classes"
    if results.multi_label:  # the thresholds chosen on the validation split are in results.json
        thresholds = [round(results.per_class_threshold.get(name, 0.5), 4) for name in results.label_names]
        answer = (
            f"thresholds = {thresholds}  # per label, chosen on the validation split\n"
            "print([model.config.id2label[i] for i, p in enumerate(logits.sigmoid()[0]) if p >= thresholds[i]])"
        )
        printed = "every label above its threshold (results.json's `per_class_threshold`)"
    auto = f"AutoImageProcessor, AutoModelForImageClassification{', pipeline' if pipeline else ''}"
    loading = f"""from transformers import {auto}

repo = "{repo}"
processor = AutoImageProcessor.from_pretrained(repo)
model = AutoModelForImageClassification.from_pretrained(repo{remote})"""
    if base is not None:
        source = hub or f"path/to/{Path(base).name}"
        size = ""
        if interpolate:
            size = (
                f"# the base loads at its own size; the adapter was trained with its position embeddings interpolated "
                f"to {config.get('image_size')} px, as the calls below do\n"
                f'config.image_size = AutoConfig.from_pretrained("{source}"{remote}).image_size\n'
            )
        base_args = f'"{source}", config=config, ignore_mismatched_sizes=True{remote}'
        loading = f"""from peft import PeftModel
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

repo = "{repo}"
config = AutoConfig.from_pretrained(repo{remote})  # the fine-tuned labels
{size}base = AutoModelForImageClassification.from_pretrained({base_args})
model = PeftModel.from_pretrained(base, repo).merge_and_unload()
processor = AutoImageProcessor.from_pretrained(repo)"""
    code = f"""```python
import numpy as np
import torch
from PIL import Image, ImageOps
{loading}


def open_image(path):  # as training read images: upright by their EXIF tag, 16-bit scaled to 8, transparency on white
    image = ImageOps.exif_transpose(Image.open(path))
    if image.mode.startswith("I"):
        image = Image.fromarray((np.asarray(image).clip(0, 65535) >> 8).astype(np.uint8))
    if image.mode in ("RGBA", "LA", "P", "PA"):
        image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA"))
    return image.convert("{mode}")


inputs = processor(open_image("image.jpg"), return_tensors="pt")
with torch.no_grad():
    {forward}
{answer}{pipeline}
```
{_framing_note(results)}"""
    if base is not None:
        named = f"`{hub}`" if hub else f"the local model `{Path(base).name}`"
        return (
            f"A LoRA adapter (peft) of {named}, with the fine-tuned classification head:\n\n{code}\nWith this "
            "project's code, `python -m finetune.tools.predict MODEL_DIR image.jpg` loads the adapter folder as it "
            'is. `pipeline("image-classification", ...)` and `AutoModelForImageClassification` alone take a plain '
            'model, not this adapter: `model.save_pretrained("merged")` and `processor.save_pretrained("merged")` '
            "after the code above write one they load (a run with `merge_lora: true` saved it as `MODEL_DIR/merged`)."
        )
    serve, tensors = "To serve without PyTorch", '"np")["pixel_values"]'
    if config.get("model_type") == "timm_wrapper":  # transformers' TimmWrapper processor makes only PyTorch tensors
        serve, tensors = "To serve from ONNX (a timm processor needs PyTorch)", '"pt")["pixel_values"].numpy()'
    mirror = " (one view: `predict MODEL_DIR/onnx` adds the mirror image's, as above)" if "mirror" in forward else ""
    # What `attention` draws: a transformer's global attention over patches, not Swin's windows, nor a CNN's none.
    draws = config.get("num_attention_heads") and config.get("patch_size") and not config.get("window_size")
    attention = (
        ", and `python -m finetune.tools.attention MODEL_DIR image.jpg --output maps/` plots the attention maps"
        if draws
        else ""
    )
    return f"""{code}
With this project's code, `python -m finetune.tools.predict MODEL_DIR image.jpg` prints {printed}{attention}.

{serve}, `vit-finetune export MODEL_DIR --format onnx` writes `MODEL_DIR/onnx/model.onnx` (its \
logits checked against PyTorch's within 1e-4 on real images), which runs with onnxruntime: \
`onnxruntime.InferenceSession("onnx/model.onnx").run(["logits"], {{"pixel_values": \
AutoImageProcessor.from_pretrained("onnx")(images, return_tensors={tensors}}})`{mirror}."""


def _framing_note(results: Results) -> str:
    """Where the processor cannot give training's pixels: images stored smaller than the model's input (CIFAR-10's
    32 px for a 224 px ViT), which evaluation enlarged; a larger photo is shrunk to the stored size first by predict,
    straight to the input size by the processor."""
    stored, size = results.stored_image_size, results.image_size
    if not stored or not size or max(stored) >= size:
        return ""
    stored_text = "x".join(map(str, stored)) if len(set(stored)) > 1 else f"{stored[0]} px"
    return (
        f"\nThe training images were stored at {stored_text} and enlarged to {size} px: for a photo larger than that, "
        f"`predict` (below) shrinks it to {stored_text} first, as training saw its images, where the processor "
        f"resizes it straight to {size} px, sharper than anything the model trained on.\n"
    )


def _results_section(results: Results) -> list[str]:
    multi = results.multi_label
    rows = [
        [split, *(format_percent(x) for x in ((m.map, m.micro_f1) if multi else (m.accuracy, m.top5_accuracy)))]
        + [format_number(m.macro_f1, 4), format_number(m.loss, 4), results.num_samples.get(split) or MISSING]
        for split, m in (("validation", results.validation), ("test", results.test))
        if m
    ]
    scores = ["mAP", "Micro F1"] if multi else ["Accuracy", "Top-5 accuracy"]
    sections = ["## Results", markdown_table(["Split", *scores, "Macro F1", "Loss", "Images"], rows)]
    if results.training_image_copies:
        sections.append(f"**Scored in part on training images**: {copies_note(results)}")
    split = results.confusion_split or "evaluation"
    if multi:
        keys = ("threshold", "precision", "recall", "f1", "average_precision")
        rows = [
            [label, *(format_percent(getattr(results, f"per_class_{key}").get(label)) for key in keys)]
            + [results.per_class_support.get(label, MISSING)]
            for label in results.label_names
        ]
        headers = ["Label", "Threshold", "Precision", "Recall", "F1", "Average precision", "Images"]
        sections += [
            f"Per label on the {split} split, at the probability threshold chosen on the validation split (the one "
            "`predict` uses):",
            markdown_table(headers, rows),
        ]
        if results.test is None:  # scored on the images the thresholds were chosen on
            sections.append(
                "Without a test split, these are the validation images the thresholds were chosen on: the F1, "
                "precision and recall figures are optimistic; mAP and average precision do not depend on thresholds."
            )
        return sections
    if not results.per_class_accuracy:
        return sections
    headers, columns = ["Class", "Accuracy"], [results.per_class_accuracy]
    heading = f"Per-class accuracy on the {split} split:"
    if results.per_class_precision:  # results.json of schema version 3 and later
        headers = ["Class", "Accuracy (recall)", "Precision", "F1"]
        columns += [results.per_class_precision, results.per_class_f1]
        heading = (
            f"Per-class accuracy, precision and F1 on the {split} split (accuracy is the recall: the fraction of the "
            "class's images predicted as it):"
        )
    rows = [
        [label] + [format_percent(column.get(label)) for column in columns] for label in results.per_class_accuracy
    ]
    return sections + [heading, markdown_table(headers, rows)]


def _training_section(results: Results) -> list[str]:
    from finetune.hardware import short_name

    rows = [[f"`{key}`", value] for key, value in results.hyperparameters.items()]
    rows += [
        ["hardware", short_name(results.hardware) or MISSING],
        ["trained parameters", format_count(results.num_trainable_parameters)],
        ["epochs trained", format_number(results.epochs, 2)],
        ["training images", results.num_samples.get("train", MISSING)],
        ["training time (training loop)", format_duration(results.train.seconds)],
        ["training images/s", format_number(results.train.images_per_second, 1)],
        ["mean training loss (whole run)", format_number(results.train.loss, 4)],  # the Trainer's train_loss
    ]
    sections = ["## Training", "### Hyperparameters", markdown_table(["Hyperparameter", "Value"], rows)]
    if results.history:
        sections += ["### Training history", history_table(results.history, max_rows=HISTORY_ROWS)]
    return sections


def build_model_card(output_dir: str | os.PathLike, repo_id: str | None = None) -> ModelCard:
    check_trained_run(Path(output_dir))
    output_dir, run_dir = Path(output_dir), run_dir_of(output_dir)
    results = Results.load(run_dir)
    merged = run_dir != output_dir
    config = _read_json(output_dir / "config.json") or {}
    model_name = repo_id.split("/")[-1] if repo_id else str(results.run_name or output_dir.name)
    repo = repo_id or f"path/to/{output_dir.resolve().name}"

    adapter = _read_json(output_dir / ADAPTER_CONFIG_NAME)  # a LoRA run's peft adapter names its base model
    base = adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None
    hub = hub_base(base or results.model_name_or_path, run_dir, results.model_is_local)
    description = _model_description(results, config, model_name, merged, hub) + _teaching(results, run_dir)
    sections = [f"# {model_name}", description, *_results_section(results)]
    comparison_dir = find_comparison_dir(run_dir)
    summary = _read_json(comparison_dir / SUMMARY_NAME) if comparison_dir else None
    if summary and summary.get("runs"):
        link = f"{COMPARISON_DIR_NAME}/{REPORT_NAME}"  # where a push uploads it; a card read here links where it is
        if repo_id is None:
            link = Path(os.path.relpath(comparison_dir / REPORT_NAME, output_dir)).as_posix()
        datasets = {row.get("dataset") for row in summary["runs"]}  # any runs can be compared: say so when they differ
        where = f"all on `{datasets.pop()}`" if len(datasets) == 1 else "on different datasets (see the table)"
        if summary.get("data_differences"):
            where += f", not scored on the same images (they differ in their {', '.join(summary['data_differences'])})"
        sections += [
            "## Comparison",
            f"This run is compared below with the others of its comparison report, {where}; the full report, with "
            f"learning curves and confusion matrices, is [{link}]({link}).",
            summary_table(summary["runs"]),
        ]
    sections += ["## How to use", _usage(results, config, repo, base, hub), *_training_section(results)]
    architecture_rows = [[f"`{key}`", config[key]] for key in ARCHITECTURE_KEYS if config.get(key) is not None]
    if architecture_rows:
        architecture = results.architecture or (config.get("architectures") or ["?"])[0]
        sections += ["## Architecture", f"`{architecture}`:", markdown_table(["Field", "Value"], architecture_rows)]
    packages = (("Transformers", "transformers"), ("PyTorch", "torch"), ("huggingface_hub", "huggingface_hub"))
    sections += ["## Framework versions", "\n".join(f"- {name} {version(package)}" for name, package in packages)]
    data = card_data(results, model_name, base, hub, config)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def edited_card(output_dir: str | os.PathLike) -> Path | None:
    """`output_dir/README.md` unless it is a card written here and left unchanged."""
    return edited_file(Path(output_dir) / CARD_NAME)


def write_model_card(output_dir: str | os.PathLike, repo_id: str | None = None, keep_edited: bool = False) -> str:
    """Write the model card of a run to `output_dir/README.md` and return its text. A README.md edited since it was
    written is never replaced: with `keep_edited` it is kept and its text returned, else refused."""
    card = str(build_model_card(output_dir, repo_id)).rstrip("\n") + "\n"  # checks the folder first
    edited = edited_card(output_dir)
    if edited and keep_edited:
        logger.warning(f"Keeping {edited} as it is: it was edited after the card was written (or not written here).")
        return edited.read_text(encoding="utf-8", errors="replace")
    if edited:
        raise FileExistsError(
            f"{edited} was edited after the card was written (or not written here), and is kept. To write a new card, "
            f"move it away first: mv {edited} {free_name(edited, 'edited')}"
        )
    text = marked(card, "finetune.tools.model_card")
    write_whole(Path(output_dir) / CARD_NAME, text)
    return text


def main(argv: list[str] | None = None) -> Path:
    """`python -m finetune.tools.model_card OUTPUT_DIR [--repo_id ID]` writes OUTPUT_DIR/README.md."""
    parser = ArgumentParser(prog="python -m finetune.tools.model_card", description=main.__doc__)
    parser.add_argument(
        "output_dir", metavar="OUTPUT_DIR", type=expanduser, help="A run's output directory (with results.json)."
    )
    parser.add_argument("--repo_id", "--repo-id", help="The Hub repo id the card is for (it names the model).")
    args = parser.parse_args(argv)
    write_model_card(args.output_dir, args.repo_id)
    path = Path(args.output_dir) / CARD_NAME
    print(path)
    return path


if __name__ == "__main__":
    sys.exit(run_command(main))
