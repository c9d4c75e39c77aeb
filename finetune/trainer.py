"""The Trainer of both model paths: transformers' `Trainer` plus batch preprocessing on the training device.

Batches arrive as uint8 images at their stored resolution. `_prepare_inputs`, which the Trainer calls for every
training and evaluation batch after moving it to the device, turns them into normalised float tensors at the
model's resolution, augmenting only in training. Doing this per batch on the device (airbench style) instead of per
PIL image in loader workers is what makes the input pipeline fast, and it keeps the stored images small
(32 px CIFAR-10 is upsampled to 224 px only on the way into ViT-B/16).
"""

import os
import shutil
import time

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback
from transformers.modeling_outputs import ImageClassifierOutput
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_optimizer import is_optimizer_factory
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, get_last_checkpoint, rotate_checkpoints
from transformers.utils import logging

from finetune.augment import MixUpCutMix
from finetune.callbacks import EMACallback, ModelEMA, RunClock, TrainingBudgetCallback
from finetune.compile import TrainingCompiler, synchronize
from finetune.hardware import CompileChoice
from finetune.models import load_checkpoint_weights, parameter_groups
from finetune.nonfinite import DEFAULT_MAX_CONSECUTIVE, BadStep, NonFiniteGuard


logger = logging.get_logger(__name__)

# A checkpoint is written under this prefix and renamed to `checkpoint-N` once complete. Neither transformers'
# `get_last_checkpoint` nor its rotation (both match `checkpoint-*` from the start of the name) ever sees it.
PARTIAL_CHECKPOINT_PREFIX = "tmp-"
# On a GPU the data path of one optimizer step in this many is timed, between two synchronisations; every step would
# stop the host from queueing the next step while the device works.
GPU_DATA_TIMING_INTERVAL = 25


class ImageClassificationTrainer(Trainer):
    """`Trainer` that applies `batch_transform(pixel_values, train=...)` to every batch on the device.

    It builds the training-loop options of `ImageClassificationTrainingArguments` (each off by default) itself:
        mixup_alpha / cutmix_alpha: a `MixUpCutMix`; training batches are mixed and trained on the mixed (soft)
            targets, with the Trainer's `label_smoothing_factor` applied to those targets.
        flip_tta: at evaluation, average the logits of each image and its mirror image (one forward pass on both).
        ema_decay: a `ModelEMA` kept up to date by an `EMACallback`: evaluations and checkpoints use the averaged
            weights, and the model ends training holding them.
        max_train_minutes / budget_schedule: a `TrainingBudgetCallback` on the run's clock.

    The optimizer (`create_optimizer`) trains every parameter that requires a gradient, in the groups of
    `parameter_groups`: no weight decay on norms, biases, position embeddings and the CLS token, and with `layer_decay`
    a learning rate per layer.

    Every optimizer step goes through a `NonFiniteGuard` (`finetune/nonfinite.py`): a step with a non-finite loss or
    gradient is skipped, and `max_nonfinite_steps` of them in a row end training with `TrainingDiverged`, keeping
    the checkpoints and the evaluations so far. The training forward pass runs through a `TrainingCompiler`
    (`finetune/compile.py`) as `torch_compile` chose: compiled or eager, with a fallback to eager on a compiler error.
    Nothing in a step waits for the device, so the host queues work ahead of a GPU.

    `clock` (a `RunClock`, registered first) is the run's one timer; the Trainer times the training batches' data
    path (fetching from the loader, moving to the device and `batch_transform`): every step on a CPU; on a GPU each
    epoch's first step and one step in `GPU_DATA_TIMING_INTERVAL` of the others.
    """

    def __init__(
        self,
        *args,
        batch_transform: torch.nn.Module,
        layer_decay: float | None = None,
        compile_choice: CompileChoice | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.layer_decay = layer_decay
        self.batch_transform = batch_transform.to(self.args.device)
        on_cpu = self.args.device.type == "cpu"
        self.clock = RunClock(data_timing_interval=1 if on_cpu else GPU_DATA_TIMING_INTERVAL)
        self.add_callback(self.clock)
        self.guard = NonFiniteGuard(
            self.model,
            max_consecutive=getattr(self.args, "max_nonfinite_steps", DEFAULT_MAX_CONSECUTIVE),
            step_info=lambda: (self.state.global_step + 1, self._get_learning_rate()),
            on_bad_step=self._record_bad_step,
            on_diverged=self._diverged,
            world_size=self.args.world_size,
            scaler=getattr(self.accelerator, "scaler", None),
        )
        if self.optimizer is not None:  # passed in by the caller (`optimizers=`), so `create_optimizer` never runs
            self.guard.install(self.optimizer)
        choice = compile_choice or CompileChoice(False, reason="not requested")
        self.compiler = TrainingCompiler(choice, self.args.device, self.args.world_size)
        self.add_callback(StepHooks(self))
        self._data_timed = False
        minutes = getattr(self.args, "max_train_minutes", None)
        if minutes is not None:
            fit = getattr(self.args, "budget_schedule", False)
            self.add_callback(TrainingBudgetCallback(minutes, clock=self.clock, fit_schedule=fit))
        decay = getattr(self.args, "ema_decay", None)
        self.ema = ModelEMA(self.model, decay) if decay is not None else None
        if self.ema is not None:
            self.add_callback(EMACallback(self.ema))
        mixup, cutmix = getattr(self.args, "mixup_alpha", 0.0), getattr(self.args, "cutmix_alpha", 0.0)
        self.mix = MixUpCutMix(self.model.config.num_labels, mixup, cutmix) if mixup > 0 or cutmix > 0 else None
        self.flip_tta = getattr(self.args, "flip_tta", False)

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        opt_model = self.model if model is None else model
        if self.optimizer is not None:
            return self.optimizer
        optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(
            self.args, opt_model
        )
        special = {"params", "model", "optimizer_dict"} & set(optimizer_kwargs) or is_optimizer_factory(optimizer_cls)
        if special or self.is_deepspeed_enabled or self.is_fsdp_enabled:
            # Optimizers that group parameters themselves (GaLore, LOMO, Muon, layer-wise) keep the Trainer's groups.
            if self.layer_decay is not None:
                raise ValueError(f"`layer_decay` does not work with `optim: {self.args.optim}`; use adamw_torch.")
            optimizer = super().create_optimizer(model)
            self.guard.install(optimizer)
            return optimizer
        groups = parameter_groups(opt_model, self.args.learning_rate, self.args.weight_decay, self.layer_decay)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        self.guard.install(self.optimizer)
        return self.optimizer

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

    def _save_checkpoint(self, model, trial) -> None:
        """transformers 5.18's `Trainer._save_checkpoint`, made atomic: every file goes into `tmp-checkpoint-N`,
        which is renamed to `checkpoint-N` only once complete, so a save that fails or is interrupted (a full disk,
        Ctrl-C) never leaves a `checkpoint-N` that `resume_from_checkpoint` would pick."""
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        final_dir = os.path.join(run_dir, name)
        partial_dir = os.path.join(run_dir, PARTIAL_CHECKPOINT_PREFIX + name)
        if self.args.should_save and os.path.isdir(partial_dir):
            shutil.rmtree(partial_dir)  # the remains of an earlier, failed save of this step
        self.accelerator.wait_for_everyone()
        try:
            self._write_checkpoint(partial_dir, final_dir, run_dir)
        except BaseException:
            if self.args.should_save:
                shutil.rmtree(partial_dir, ignore_errors=True)
            raise
        self.accelerator.wait_for_everyone()  # every process has written its share (RNG states, shards)
        if self.args.should_save:
            if os.path.isdir(final_dir):
                # The same step saved again (e.g. after a resume): swap, so a complete copy exists at every moment.
                stale_dir = os.path.join(run_dir, PARTIAL_CHECKPOINT_PREFIX + "old-" + name)
                os.replace(final_dir, stale_dir)
                os.replace(partial_dir, final_dir)
                shutil.rmtree(stale_dir, ignore_errors=True)
            else:
                os.replace(partial_dir, final_dir)
        self.accelerator.wait_for_everyone()
        if self.args.push_to_hub:
            self._push_from_checkpoint(final_dir)
        if self.args.should_save:
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )

    def _write_checkpoint(self, output_dir: str, final_dir: str, run_dir: str) -> None:
        self.save_model(output_dir, _internal_call=True)
        best_step = self.state.best_global_step
        if self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST) and best_step:
            # The best checkpoint is this one (under its final name once renamed) or an earlier, complete one.
            best_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{best_step}")
            if best_dir == final_dir or os.path.exists(best_dir):
                self.state.best_model_checkpoint = best_dir
        if not self.args.save_only_model:
            self._save_optimizer_and_scheduler(output_dir)
            self._save_scaler(output_dir)
            self._save_rng_state(output_dir)
        if self.args.should_save:
            # Callbacks' and `TrainerControl`'s state as of now, restored on resume.
            for cb in [c for c in self.callback_handler.callbacks + [self.control] if isinstance(c, ExportableState)]:
                cb_name = cb.__class__.__name__
                if isinstance(self.state.stateful_callbacks[cb_name], list):
                    self.state.stateful_callbacks[cb_name].append(cb.state())
                else:
                    self.state.stateful_callbacks[cb_name] = cb.state()
            self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        # A timed step starts with an idle device, so that its data path is measured alone (on a CPU: always).
        self._data_timed = self.clock.times_data_of_step(self.state.global_step)
        if self._data_timed:
            synchronize(self.args.device)
            start = time.perf_counter()
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._data_timed:
            self.clock.add_data_time(time.perf_counter() - start, new_step=True)
        return batches

    def _prepare_inputs(self, inputs: dict) -> dict:
        # `training_step` switches the model to train mode before calling us; evaluation switches it to eval mode.
        training = self.model.training
        timed = training and self._data_timed
        if timed:
            synchronize(self.args.device)
            start = time.perf_counter()
        inputs = super()._prepare_inputs(inputs)
        inputs["pixel_values"] = self.batch_transform(inputs["pixel_values"], train=training)
        if training and self.mix is not None:
            inputs["pixel_values"], inputs["soft_labels"] = self.mix(inputs["pixel_values"], inputs.pop("labels"))
        if timed:
            synchronize(self.args.device)
            self.clock.add_data_time(time.perf_counter() - start, new_step=False)
        return inputs

    def training_step(self, model, inputs, num_items_in_batch=None):
        """One micro-batch's forward and backward pass, compiled or eager, watched by the guard. A failure in the
        compiled model is retried eagerly; only if the eager step succeeds is it the compiler's fault, and training
        goes on eagerly."""
        self.guard.begin_step(self.state.global_step)
        first_compiled = self.compiler.active and self.compiler.compile_seconds is None
        start = time.perf_counter()
        loss = self.compiler.run(
            lambda: super(ImageClassificationTrainer, self).training_step(model, inputs, num_items_in_batch),
            on_fallback=self.guard.skip_step,
        )
        if first_compiled and self.compiler.used:
            synchronize(self.args.device)
            self.compiler.compile_seconds = time.perf_counter() - start
            logger.info(f"torch.compile: the first compiled step took {self.compiler.compile_seconds:.1f} s.")
        return self.guard.observe_loss(loss)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            model = self.compiler.module_for(model, inputs["pixel_values"].shape[0])
        if "soft_labels" in inputs:
            return self._soft_target_loss(model, inputs, return_outputs)
        if self.flip_tta and not model.training and "labels" in inputs:
            return self._flip_tta_loss(model, inputs, return_outputs)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _record_bad_step(self, bad: BadStep) -> None:
        """A skipped step in the log history (saved in trainer_state.json), where the sweeps find the first one."""
        if self.guard.bad_steps <= 100:
            entry = {"step": bad.step, "nonfinite_step": bad.step, "nonfinite_loss": bad.loss}
            self.state.log_history.append({**entry, "learning_rate": bad.learning_rate})

    def _diverged(self, bad: BadStep) -> str:
        """What a diverged run keeps and what to try, for `TrainingDiverged`'s message; saves the Trainer state
        (every evaluation so far) next to the checkpoints."""
        output_dir = self.args.output_dir
        if self.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))
        for callback in self.callback_handler.callbacks:
            if getattr(callback, "training_bar", None) is not None:
                callback.training_bar.close()  # ends the progress bar's line, so the error gets a line of its own
                callback.training_bar = None
        kept = []
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last:
            kept.append(f"the last checkpoint {last}")
        evaluations = [e for e in self.state.log_history if "eval_accuracy" in e]
        if evaluations:
            last_eval = evaluations[-1]
            kept.append(
                f"the evaluations in {os.path.join(output_dir, TRAINER_STATE_NAME)} (last: validation accuracy "
                f"{last_eval['eval_accuracy']:.2%} at epoch {last_eval.get('epoch', 0):.2f})"
            )
        kept_text = f"Kept: {'; '.join(kept)}." if kept else "No checkpoint or evaluation had been made yet."
        tries = []
        if bad.learning_rate:
            tries.append(f"a lower `learning_rate` (e.g. {bad.learning_rate / 2:.2g}) or a longer warmup")
        if self.args.bf16 or self.args.fp16:
            tries.append("`bf16: false` and `fp16: false` (float32)")
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if getattr(config, "model_type", None) == "scratch_vit" and not getattr(config, "qk_norm", True):
            tries.append("`qk_norm: true`")
        if not self.args.max_grad_norm:
            tries.append("`max_grad_norm: 1.0`")
        return f"{kept_text} Try {', '.join(tries)}." if tries else kept_text

    def _soft_target_loss(self, model, inputs, return_outputs):
        targets = inputs.pop("soft_labels")  # (B, K)
        outputs = model(**inputs)
        smoothing = self.args.label_smoothing_factor
        targets = targets * (1 - smoothing) + smoothing / targets.shape[-1]
        loss = -(targets * outputs.logits.float().log_softmax(dim=-1)).sum(dim=-1).mean()
        return (loss, outputs) if return_outputs else loss

    def _flip_tta_loss(self, model, inputs, return_outputs):
        pixel_values, labels = inputs["pixel_values"], inputs["labels"]
        B = pixel_values.shape[0]
        both = torch.cat([pixel_values, pixel_values.flip(-1)])  # (B, C, H, W) -> (2B, C, H, W)
        logits = model(pixel_values=both).logits
        logits = (logits[:B] + logits[B:]) / 2  # (2B, K) -> (B, K)
        loss = F.cross_entropy(logits.float(), labels)
        return (loss, ImageClassifierOutput(loss=loss, logits=logits)) if return_outputs else loss

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        # Evaluate and checkpoint the averaged weights, then train on with the raw ones.
        swap = self.ema is not None and (self.control.should_evaluate or self.control.should_save)
        if swap:
            self.ema.swap(self.model)
        try:
            return super()._maybe_log_save_evaluate(*args, **kwargs)
        finally:
            if swap:
                self.ema.swap(self.model)

    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        if self.ema is not None and not (self.args.load_best_model_at_end and self.state.best_model_checkpoint):
            # Without a best checkpoint to reload (which holds averaged weights already), keep the final average.
            self.ema.copy_to(self.model)
        return output


class StepHooks(TrainerCallback):
    """The trainer's per-step bookkeeping: the compiler's speed check and reading the guard's last flags."""

    def __init__(self, trainer: ImageClassificationTrainer):
        self.trainer = trainer

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer.compiler.on_step_begin()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.guard.before_optimizer_step(self.trainer.optimizer)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.guard.after_optimizer_step()

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.compiler.on_step_end()

    def on_evaluate(self, args, state, control, **kwargs):
        self.trainer.compiler.interrupted()

    def on_save(self, args, state, control, **kwargs):
        self.trainer.compiler.interrupted()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.trainer.compiler.interrupted()
        # Before the epoch's evaluation and checkpoint: a divergence in its last steps is reported first.
        self.trainer.guard.finish()

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer.guard.finish()
