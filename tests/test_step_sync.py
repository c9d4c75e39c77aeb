"""A training step never waits for the device: no host-device synchronisation between two steps.

On a CPU nothing waits, so the test tracks what would: every tensor computed from the model's weights or a batch is
marked (a `TorchFunctionMode` propagates the mark through every torch call), and a call that would copy such a tensor
to the host on a GPU (`.item()`, `bool()`, `float()`, `.tolist()`, `.cpu()`) is recorded. The real Trainer runs the
real pipeline with every training-loop option on: the non-finite guard, MixUp/CutMix, TrivialAugment, EMA.
"""

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from transformers import TrainerCallback

from finetune import compile as compile_module
from finetune.arguments import parse_args
from finetune.data import load_image_data
from finetune.models import build_model
from finetune.run import choose_attention, make_trainer


sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run import TINY_SCRATCH  # noqa: E402


# Tensor methods that copy a device tensor's value to the host, waiting for the device to compute it.
WAITING = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.cpu,
}


class DeviceValueReads(TorchFunctionMode):
    """Marks tensors computed from marked ones; records waiting calls on marked tensors while `recording`."""

    def __init__(self):
        super().__init__()
        self.recording = False
        self.reads: list[str] = []

    @staticmethod
    def mark(tensors) -> None:
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                t._from_device = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        marked = any(getattr(t, "_from_device", False) for t in inputs)
        if marked and self.recording and func in WAITING:
            self.reads.append(getattr(func, "__name__", str(func)))
        out = func(*args, **kwargs)
        if marked:
            self.mark(out)
        return out


class Recording(TrainerCallback):
    """Records from the first step's start to the last step's end (logging and evaluation are switched off; the
    Trainer reads its summed loss once, after the last step)."""

    def __init__(self, mode: DeviceValueReads):
        self.mode = mode

    def on_step_begin(self, args, state, control, **kwargs):
        self.mode.recording = True

    def on_step_end(self, args, state, control, **kwargs):
        self.mode.recording = state.global_step < state.max_steps


def device_reads_of_training(trainer, tensors) -> list[str]:
    """Train `trainer` with its batches and `tensors` (weights, buffers) marked; the waiting calls its steps made."""
    get_batch_samples = trainer.get_batch_samples

    def marked_batches(*args, **kwargs):
        batches, count = get_batch_samples(*args, **kwargs)
        DeviceValueReads.mark(batches)
        return batches, count

    trainer.get_batch_samples = marked_batches
    mode = DeviceValueReads()
    DeviceValueReads.mark(list(tensors))
    trainer.add_callback(Recording(mode))
    with mode:
        trainer.train()
    return mode.reads


def test_no_training_step_waits_for_the_device(tmp_path, monkeypatch):
    argv = [
        *TINY_SCRATCH, "--output_dir", str(tmp_path / "run"), "--report_to", "none", "--max_steps", "12",
        "--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false",
        "--logging_steps", "1000", "--mixup_alpha", "0.8", "--cutmix_alpha", "1.0", "--rand_augment_ops", "1",
        "--ema_decay", "0.99", "--patch_embedding_type", "conv_stem", "--torch_compile", "false",
    ]  # fmt: skip
    model_args, data_args, scratch_args, training_args = parse_args(argv)
    data = load_image_data(data_args, seed=0, target_size=8)
    model_args, _ = choose_attention("scratch", model_args, scratch_args, training_args)
    model, processor, prep = build_model("scratch", model_args, scratch_args, data)
    trainer = make_trainer(model, processor, prep, data_args, training_args, data)

    synchronizations = []
    monkeypatch.setattr(compile_module, "synchronize", lambda device: synchronizations.append(device))
    reads = device_reads_of_training(trainer, [*model.parameters(), *model.buffers()])
    assert trainer.state.global_step == 12
    assert reads == [], f"a training step reads device values on the host: {reads}"
    assert synchronizations == []


def test_the_mark_finds_a_read(tmp_path):
    """The detector itself: a step that reads its loss on the host is caught."""
    model = torch.nn.Linear(3, 1)
    mode = DeviceValueReads()
    DeviceValueReads.mark(list(model.parameters()))
    with mode:
        mode.recording = True
        loss = model(torch.randn(4, 3)).pow(2).mean()
        loss.backward()
        _ = float(loss), model.weight.grad.abs().max().item(), bool(torch.isfinite(loss)), torch.rand(()).item()
    assert mode.reads == ["__float__", "item", "__bool__"]
