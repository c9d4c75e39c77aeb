"""The Trainer of both model paths: transformers' `Trainer` plus batch preprocessing on the training device.

Batches arrive as uint8 images at their stored resolution. `_prepare_inputs`, which the Trainer calls for every
training and evaluation batch after moving it to the device, turns them into normalised float tensors at the
model's resolution, augmenting only in training. Doing this per batch on the device (airbench style) instead of per
PIL image in loader workers is what makes the input pipeline fast, and it keeps the stored images small
(32 px CIFAR-10 is upsampled to 224 px only on the way into ViT-B/16).
"""

import time

import torch
from transformers import Trainer, TrainerCallback


class ImageClassificationTrainer(Trainer):
    """`Trainer` that applies `batch_transform(pixel_values, train=...)` to every batch on the device."""

    def __init__(self, *args, batch_transform: torch.nn.Module, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_transform = batch_transform.to(self.args.device)

    def _prepare_inputs(self, inputs: dict) -> dict:
        inputs = super()._prepare_inputs(inputs)
        # `training_step` switches the model to train mode before calling us; evaluation switches it to eval mode.
        inputs["pixel_values"] = self.batch_transform(inputs["pixel_values"], train=self.model.training)
        return inputs


class TrainingTimeCallback(TrainerCallback):
    """Measures time spent in training steps alone (without evaluation and saving) for an honest images/s."""

    def __init__(self):
        self.train_seconds = 0.0
        self._epoch_start = None
        self._pause_start = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_start = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        # Called before the end-of-epoch evaluation and checkpoint, so those are not counted.
        if self._epoch_start is not None:
            self.train_seconds += time.perf_counter() - self._epoch_start
            self._epoch_start = None
