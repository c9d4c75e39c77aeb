"""Builders of tiny run output directories, as `finetune/run.py` writes them, for the compare/attention/predict/hub
tests: a saved model (ScratchViT or transformers' ViT), its `ViTImageProcessor`, a `results.json` that follows the
run schema, a `trainer_state.json`, and the big/private files a push must leave out (checkpoints, optimizer states,
`training_args.bin`, TensorBoard logs)."""

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

from finetune.results import Results, dataset_location
from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification


LABELS = ["airplane", "automobile", "bird"]


def tiny_scratch_model(
    image_size: int = 16,
    patch_size: int = 4,
    num_channels: int = 3,
    pooling: str = "cls",
    position_embedding_type: str = "learned",
    labels: list[str] = LABELS,
    seed: int = 0,
) -> ScratchViTForImageClassification:
    """A randomly initialised 2-layer ScratchViT (hidden 16, 2 heads)."""
    torch.manual_seed(seed)
    config = ScratchViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        num_channels=num_channels,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        pooling=pooling,
        position_embedding_type=position_embedding_type,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    return ScratchViTForImageClassification(config).eval()


def tiny_vit_model(image_size: int = 16, patch_size: int = 4, labels: list[str] = LABELS, seed: int = 0):
    """A randomly initialised 2-layer transformers `ViTForImageClassification` (hidden 16, 2 heads)."""
    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    return ViTForImageClassification(config).eval()


def make_results(
    model_type: str,
    run_name: str,
    num_parameters: int,
    labels: list[str] = LABELS,
    image_size: int = 16,
    validation_accuracy: float = 0.5,
    test_accuracy: float | None = 0.45,
    seed: int = 0,
    with_history: bool = True,
) -> dict:
    """A `results.json` dict in the run schema (`finetune.results.Results`), with plausible, reproducible numbers."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    confusion = rng.integers(0, 10, size=(n, n)) + np.diag(rng.integers(10, 30, size=n))
    per_class = {name: float(confusion[i, i] / confusion[i].sum()) for i, name in enumerate(labels)}
    epochs = 3
    history = [
        {
            "epoch": float(e),
            "step": 10 * e,
            "train_loss": round(1.2 / e + 0.1 * seed, 4),
            "eval_loss": round(1.3 / e + 0.1 * seed, 4),
            "eval_accuracy": round(validation_accuracy * e / epochs, 4),
            "elapsed_seconds": 250.0 * e,
        }
        for e in range(1, epochs + 1)
    ]
    return {
        "run_name": run_name,
        "model_type": model_type,
        "model_name_or_path": "google/vit-base-patch16-224-in21k" if model_type == "pretrained" else None,
        "architecture": ("ScratchViT" if model_type == "scratch" else "ViT") + "ForImageClassification",
        "dataset": "uoft-cs/cifar10",
        "label_names": list(labels),
        "image_size": image_size,
        "num_parameters": num_parameters,
        "num_samples": {"train": 90, "validation": 30, "test": 30 if test_accuracy is not None else None},
        "epochs": float(epochs),
        "hyperparameters": {
            "learning_rate": 2e-4 if model_type == "pretrained" else 1e-3,
            "per_device_train_batch_size": 8,
            "total_train_batch_size": 8,
            "num_train_epochs": float(epochs),
            "optim": "adamw_torch",
            "lr_scheduler_type": "cosine",
            "warmup_steps": 0.1,
            "weight_decay": 0.05,
            "label_smoothing_factor": 0.1,
            "seed": 42,
            "mixed_precision": "no",
            "world_size": 1,
        },
        "hardware": {"device": "cpu", "cpu": "Test CPU", "torch_threads": 2, "world_size": 1},
        "train": {
            "loss": history[-1]["train_loss"],
            "seconds": 754.5 + seed,
            "data_seconds": 20.0,
            "steps": 30,
            "images_per_second": 123.4 + seed,
        },
        "validation": {"accuracy": validation_accuracy, "loss": history[-1]["eval_loss"]},
        "test": {"accuracy": test_accuracy, "loss": 0.9} if test_accuracy is not None else None,
        "per_class_accuracy": per_class,
        "confusion_matrix": confusion.tolist(),
        "confusion_split": "test" if test_accuracy is not None else "validation",
        "wall_seconds": 800.0 + seed,
        "history": history if with_history else [],
    }


def trainer_state(history: list[dict]) -> dict:
    """A Trainer `trainer_state.json` whose `log_history` holds the given per-epoch rows."""
    log_history = []
    for row in history:
        log_history.append({"epoch": row["epoch"], "step": row["step"], "loss": row["train_loss"], "grad_norm": 1.0})
        log_history.append(
            {
                "epoch": row["epoch"],
                "step": row["step"],
                "eval_loss": row["eval_loss"],
                "eval_accuracy": row["eval_accuracy"],
            }
        )
    return {"log_history": log_history, "global_step": history[-1]["step"] if history else 0, "epoch": 3.0}


def make_run_dir(
    path: Path,
    model_type: str = "scratch",
    *,
    run_name: str | None = None,
    model=None,
    validation_accuracy: float = 0.5,
    test_accuracy: float | None = 0.45,
    seed: int = 0,
    with_history: bool = True,
    extras: bool = True,
) -> Path:
    """Write a complete run output directory at `path` and return it.

    `model` defaults to a tiny ScratchViT for `scratch` and a tiny transformers ViT for `pretrained`. With `extras`,
    also writes what a push must skip: `checkpoint-3/` (with optimizer and scheduler states), `training_args.bin`
    and a TensorBoard `runs/` folder.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if model is None:
        model = tiny_scratch_model(seed=seed) if model_type == "scratch" else tiny_vit_model(seed=seed)
    model.save_pretrained(path)
    channels = model.config.num_channels
    ViTImageProcessor(
        size={"height": model.config.image_size, "width": model.config.image_size},
        image_mean=[0.5] * channels,
        image_std=[0.5] * channels,
    ).save_pretrained(path)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    results = make_results(
        model_type,
        run_name or path.name,
        sum(p.numel() for p in model.parameters()),
        labels=labels,
        image_size=model.config.image_size,
        validation_accuracy=validation_accuracy,
        test_accuracy=test_accuracy,
        seed=seed,
        with_history=with_history,
    )
    (path / "results.json").write_text(json.dumps(results, indent=2))
    history = make_results(model_type, "x", 0, labels=labels, seed=seed, validation_accuracy=validation_accuracy)
    (path / "trainer_state.json").write_text(json.dumps(trainer_state(history["history"]), indent=2))
    if extras:
        checkpoint = path / "checkpoint-3"
        checkpoint.mkdir(exist_ok=True)
        (checkpoint / "optimizer.pt").write_bytes(b"\0" * 256)
        (checkpoint / "scheduler.pt").write_bytes(b"\0" * 16)
        (checkpoint / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
        (checkpoint / "config.json").write_text((path / "config.json").read_text())
        (path / "training_args.bin").write_bytes(b"\0" * 64)
        (path / "runs" / "Jan01_00-00-00").mkdir(parents=True, exist_ok=True)
        (path / "runs" / "Jan01_00-00-00" / "events.out.tfevents.0.host").write_bytes(b"\0" * 32)
    return path


def run_trained_on_photos(tmp_path: Path, model=None) -> Path:
    """A run folder (`tmp_path/run`) whose results.json says it trained on `tmp_path/photos` (cats/cat.png)."""
    run = make_run_dir(tmp_path / "run", model=model, extras=False)
    (tmp_path / "photos" / "cats").mkdir(parents=True)
    Image.new("RGB", (20, 30), (200, 10, 10)).save(tmp_path / "photos" / "cats" / "cat.png")
    results = Results.load(run)
    results.dataset, results.dataset_location = "photos", dataset_location(str(tmp_path / "photos"))
    results.save(run)
    return run


def make_images(folder: Path) -> dict[str, Path]:
    """Images of every kind `predict` must read: JPEG, PNG, BMP, WebP, grayscale, RGBA, palette, odd sizes, a
    nested folder, and one unreadable file. Returns name -> path."""
    folder = Path(folder)
    (folder / "nested" / "deeper").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def rgb(height, width):
        return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), "RGB")

    paths = {
        "jpg": folder / "photo.jpg",
        "png": folder / "wide.png",
        "bmp": folder / "tall.bmp",
        "webp": folder / "nested" / "pic.webp",
        "gray": folder / "nested" / "gray.png",
        "rgba": folder / "nested" / "deeper" / "alpha.png",
        "palette": folder / "nested" / "deeper" / "palette.gif",
    }
    rgb(37, 53).save(paths["jpg"])
    rgb(20, 71).save(paths["png"])
    rgb(45, 9).save(paths["bmp"])
    rgb(24, 24).save(paths["webp"])
    Image.fromarray(rng.integers(0, 256, size=(19, 23), dtype=np.uint8), "L").save(paths["gray"])
    Image.fromarray(rng.integers(0, 256, size=(30, 30, 4), dtype=np.uint8), "RGBA").save(paths["rgba"])
    rgb(17, 33).convert("P").save(paths["palette"])
    paths["broken"] = folder / "broken.jpg"
    paths["broken"].write_bytes(b"this is not an image")
    (folder / "notes.txt").write_text("not an image, and not named like one: folders skip it")
    return paths
