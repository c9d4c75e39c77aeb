"""The Trainer of both model paths: transformers' `Trainer` plus batch preprocessing on the training device.

Batches arrive as uint8 images at their stored resolution. `_prepare_inputs`, which the Trainer calls for every
training and evaluation batch after moving it to the device, turns them into normalised float tensors at the
model's resolution, augmenting only in training. Doing this per batch on the device (airbench style) instead of per
PIL image in loader workers is what makes the input pipeline fast, and it keeps the stored images small
(32 px CIFAR-10 is upsampled to 224 px only on the way into ViT-B/16).
"""

import time

import torch
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.utils import logging


logger = logging.get_logger(__name__)


class ImageClassificationTrainer(Trainer):
    """`Trainer` that applies `batch_transform(pixel_values, train=...)` to every batch on the device."""

    def __init__(self, *args, batch_transform: torch.nn.Module, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_transform = batch_transform.to(self.args.device)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_checkpoint_weights(self.accelerator.unwrap_model(model or self.model), resume_from_checkpoint)

    def _load_best_model(self) -> None:
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return super()._load_best_model()
        checkpoint = self.state.best_model_checkpoint
        logger.info(f"Loading the best model from {checkpoint} (accuracy {self.state.best_metric}).")
        load_checkpoint_weights(self.accelerator.unwrap_model(self.model), checkpoint)

    def _prepare_inputs(self, inputs: dict) -> dict:
        inputs = super()._prepare_inputs(inputs)
        # `training_step` switches the model to train mode before calling us; evaluation switches it to eval mode.
        inputs["pixel_values"] = self.batch_transform(inputs["pixel_values"], train=self.model.training)
        return inputs


def load_checkpoint_weights(model: PreTrainedModel, checkpoint: str) -> None:
    """Load a checkpoint's weights into `model` in place, strictly.

    transformers 5.18's Trainer resumes and reloads the best model with a plain, non-strict `load_state_dict` of the
    saved file. That skips the key renaming `from_pretrained` applies (ViT saves its layers under the legacy names
    `vit.encoder.layer.*` but names them `vit.layers.*` in memory), so for transformers' ViT it silently keeps the
    current weights. Loading through `from_pretrained` applies the renaming; the strict copy proves every tensor
    arrived.
    """
    loaded = type(model).from_pretrained(checkpoint, config=model.config, dtype=next(model.parameters()).dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)


class TrainingTimeCallback(TrainerCallback):
    """Measures time spent in training steps alone (without evaluation and saving) for an honest images/s."""

    def __init__(self):
        self.train_seconds = 0.0
        self._epoch_start = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_start = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        # Called before the end-of-epoch evaluation and checkpoint, so those are not counted.
        if self._epoch_start is not None:
            self.train_seconds += time.perf_counter() - self._epoch_start
            self._epoch_start = None
