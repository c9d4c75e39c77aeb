"""The one place a training step is read: what happens to a batch after transformers' `Trainer` hands it over.

Batches arrive on the training device as uint8 images at their stored resolution, with integer labels (multi-hot rows
(B, K) for multi-label data). A training micro-batch then goes through `training_step` -> `compiler.run` (which
reruns a failed compiled step eagerly) -> the Trainer's `training_step` -> `compute_loss`:

    batch_transform.augmented     uint8 (B, C, h, w) -> float pixels, augmented on the device (finetune/augment.py)
    mix                           MixUp/CutMix: images mixed, labels (B,) or (B, K) -> (B, K)     [mixup/cutmix_alpha]
    batch_transform.finish        -> normalised (B, C, H, W) at the model's resolution, erased         [random_erasing]
                                  (a teacher's: its own `teacher_transform.frame` and `.finish`, at its resolution,
                                  unerased)
    compiler.module_for           the compiled or the eager model (finetune/compile.py)            [torch_compile]
    classification_loss           cross-entropy with label smoothing (multi-label data: `multi_label_loss`, binary)
    distillation_loss             with a teacher: that, mixed with the loss on the teacher's logits    [distillation_*]

The Trainer runs the backward pass; then `guard.observe_loss` flags a non-finite loss on the device
(finetune/nonfinite.py) and `clock.add_loss` sums it. Per optimizer step the callbacks (finetune/callbacks.py) act: the
guard skips an update with bad gradients, the EMA follows the weights, the clock, the budget and the interrupt
handler act at the step's end. Evaluation (`prediction_step`) uses the same transform without augmentation, with
optional flip test-time augmentation. Nothing in a step waits for the device (under a fused optimizer, the default:
finetune/nonfinite.py), so the host queues work ahead of a GPU.

Private Trainer methods overridden, and why (pinned by tests/test_trainer_hooks.py, which fails the day transformers
changes them):
    _load_from_checkpoint, _load_best_model: the Trainer reloads weights with a non-strict `load_state_dict` of the
        saved file, which skips the key renaming that `from_pretrained` applies (transformers' ViT saves its blocks as
        `vit.encoder.layer.*` and holds them as `vit.layers.*`): it would silently keep the current weights.
        `load_checkpoint_weights` loads through `from_pretrained` and checks that every tensor arrived.
Other private transformers members read, for want of a public one (pinned by the same tests):
    PretrainedConfig._attn_implementation (finetune/run.py): the attention kernel the model runs (`sdpa`, `eager`),
        recorded with the run's results; transformers sets it with `set_attn_implementation` but has no getter.
    PreTrainedModel._init_weights and the `_is_hf_initialized` marks (models.reset_head): a checkpoint that classifies
        other classes than the dataset's gets its head initialised exactly as loading initialises a new head.
    PreTrainedModel._can_set_attn_implementation (overridden in scratch_vit/modeling_scratch_vit.py): transformers
        reads from a model's source whether `set_attn_implementation` may switch it; ScratchViT's attention reads the
        config at every call (pinned by tests/test_scratch_vit_model.py, and transformers' common tests in CI)."""

import copy
import functools
import os
import signal
import threading
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from transformers import EvalPrediction, PrinterCallback, ProgressCallback, Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_optimizer import is_optimizer_factory
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from transformers.utils import logging

from finetune.augment import MixUpCutMix
from finetune.callbacks import (
    ClockBeforeSave,
    EMACallback,
    InterruptCallback,
    ModelEMA,
    ProcessRandomness,
    ProgressLines,
    QuietProgress,
    ResumeCheck,
    ResumedEarlyStopping,
    RunClock,
    TrainingBudgetCallback,
)
from finetune.compile import TrainingCompiler
from finetune.data import is_multi_label
from finetune.hardware import CompileChoice
from finetune.models import load_checkpoint_weights, parameter_groups
from finetune.nonfinite import NonFiniteGuard, TrainingDiverged


logger = logging.get_logger(__name__)


def classification_loss(logits, targets, label_smoothing: float = 0.0, weight: torch.Tensor | None = None):
    """Cross-entropy of `logits` (B, K) against class indices (B,) or class probabilities (B, K), in float32, with
    optional per-class weights (K,)."""
    return F.cross_entropy(logits.float(), targets, weight=weight, label_smoothing=label_smoothing)


def multi_label_loss(logits, targets, label_smoothing: float = 0.0, pos_weight: torch.Tensor | None = None):
    """Binary cross-entropy of `logits` (B, K) against multi-hot or mixed targets (B, K), in float32; label smoothing
    moves every target towards 1/2 (`y (1 - e) + e / 2`), `pos_weight` (K,) weighs each label's positive images."""
    targets = targets.float() * (1 - label_smoothing) + label_smoothing / 2
    return F.binary_cross_entropy_with_logits(logits.float(), targets, pos_weight=pos_weight)


def distillation_loss(
    student_logits,
    teacher_logits,
    targets,
    alpha: float,
    temperature: float = 1.0,
    kind: str = "soft",
    label_smoothing: float = 0.0,
    weight: torch.Tensor | None = None,
):
    """Knowledge distillation: `(1 - alpha) * classification_loss + alpha * ` the loss on the teacher's logits (B, K):
    `soft`, the KL divergence of the teacher's from the student's probabilities at `temperature` T, times T^2 so its
    gradients keep their scale (Hinton et al. 2015, timm); `hard`, cross-entropy on the teacher's top class (DeiT)."""
    label_loss = classification_loss(student_logits, targets, label_smoothing, weight)
    student_logits, teacher_logits = student_logits.float(), teacher_logits.float()
    if kind == "hard":
        teacher_loss = F.cross_entropy(student_logits, teacher_logits.argmax(-1))
    else:
        student_log_p = F.log_softmax(student_logits / temperature, dim=-1)
        teacher_log_p = F.log_softmax(teacher_logits / temperature, dim=-1)
        kl = F.kl_div(student_log_p, teacher_log_p, reduction="batchmean", log_target=True)
        teacher_loss = kl * temperature**2
    return (1 - alpha) * label_loss + alpha * teacher_loss


def check_optimizer(args) -> None:
    """An `optim` whose package is missing (bitsandbytes' 8-bit AdamW, say) fails at start-up in one line, not once
    the model is built; so do `optim_args` the optimizer would ignore (transformers passes AdamW none) or cannot read.
    Those that need the model (GaLore, Apollo, LOMO) are checked when `create_optimizer` builds them."""
    name = getattr(args.optim, "value", args.optim)

    def kwargs(optim_args: str | None) -> dict:
        changed = copy.copy(args)
        changed.optim_args = optim_args
        return Trainer.get_optimizer_cls_and_kwargs(changed)[1]

    try:
        plain = kwargs(None)
    except ImportError as error:
        fix = "Or choose another `optim` (the default: adamw_torch_fused)."
        raise ValueError(f"`optim: {name}`: {str(error).rstrip('.')}. {fix}") from error
    except (ValueError, TypeError, NotImplementedError):
        return  # it needs the model (or several processes cannot run it: said when it is built)

    def changes_kwargs(optim_args: str) -> bool:  # a key read with a default and given at it changes nothing
        try:
            return kwargs(optim_args) != plain
        except (ValueError, TypeError, AttributeError):
            return False

    ignored = []
    for item in (item.strip() for item in (args.optim_args or "").split(",") if item.strip()):
        key, _, value = (part.strip() for part in item.partition("="))
        try:
            given = kwargs(f"{key}={value}")
        except (ValueError, TypeError, AttributeError) as error:
            raise ValueError(f"`optim_args: {item}` cannot be read by `optim: {name}`: {error}.") from None
        if given == plain and not any(changes_kwargs(f"{key}={probe}") for probe in ("1", "2", "true", "float16")):
            ignored.append(key)
    if ignored:
        adam = "; AdamW takes `adam_beta1`, `adam_beta2`, `adam_epsilon` and `weight_decay`" if "adam" in name else ""
        raise ValueError(
            f"`optim_args` has {', '.join(ignored)}, which `optim: {name}` ignores. Drop or rename them{adam}."
        )


def balanced_class_weights(labels: torch.Tensor, label_names: list[str]) -> torch.Tensor:
    """scikit-learn's `compute_class_weight("balanced")`: images / (classes x the class's images), per class; for
    multi-hot `labels` (N, K), `multi_label_loss`'s `pos_weight`: each label's negative / positive images, at least
    1 / positive images (a label every image has keeps a gradient)."""
    from sklearn.utils.class_weight import compute_class_weight

    counts = labels.sum(0) if labels.ndim == 2 else torch.bincount(labels, minlength=len(label_names))
    empty = [label_names[i] for i in torch.nonzero(counts == 0).flatten().tolist()]
    if empty:
        raise ValueError(
            f"`class_weighting: balanced` needs training images of every class, and {', '.join(empty[:5])} has "
            "none. Keep only the classes with images (`include_labels`), or set `class_weighting: none`."
        )
    if labels.ndim == 2:
        return (len(labels) - counts).clamp(min=1) / counts
    weights = compute_class_weight("balanced", classes=np.arange(len(label_names)), y=labels.numpy())
    return torch.tensor(weights, dtype=torch.float32)


def ignoring_stop_signals(worker_id: int, worker_init_fn=None) -> None:
    """A loader worker's start: SIGTERM and SIGINT are the main process's to answer (`InterruptCallback` saves a
    checkpoint, then shuts the workers down). A scheduler that signals every process of a job, or Ctrl-C, which
    reaches the terminal's whole process group, killed the workers too: the run ended with "DataLoader worker ...
    is killed by signal: Terminated", exit status 1, and no line on how to resume (or before the checkpoint's save).
    The main process's own SIGTERM (`terminate()`, which ends persistent workers as it exits) still ends a worker,
    as PyTorch's handler does; a worker whose main process is gone ends too (PyTorch's watchdog)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "sigwaitinfo"):  # which says who sent it (not on macOS: SIGTERM is left as it was there)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(target=exit_on_sigterm_from, args=(os.getppid(),), daemon=True).start()
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def exit_on_sigterm_from(parent: int) -> None:
    """A worker's thread that takes its SIGTERMs (blocked in every thread) and ends the worker on its parent's."""
    while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
        pass
    os._exit(0)


def workers_ignore_stop_signals(loader):
    """`loader`, whose worker processes (`dataloader_num_workers`) leave stop signals to the main process; set on the
    `DataLoader` that accelerate's wrapper iterates (`base_dataloader`), and that `skip_first_batches` copies."""
    base = getattr(loader, "base_dataloader", loader)
    init = base.worker_init_fn
    if base.num_workers and not (isinstance(init, functools.partial) and init.func is ignoring_stop_signals):
        base.worker_init_fn = functools.partial(ignoring_stop_signals, worker_init_fn=init)
    return loader


class ImageClassificationTrainer(Trainer):
    """`Trainer` for image classification: the device transform, MixUp/CutMix, compilation, the non-finite guard,
    EMA, a time budget and a checkpoint on SIGTERM, each switched by `ImageClassificationTrainingArguments`.

    Args:
        batch_transform: `finetune.augment.BatchTransform`: training calls its `augmented` and `finish` (MixUp and the
            teacher between them), evaluation the whole of it, `batch_transform(pixel_values, train=False)`.
        compile_choice: `torch_compile` resolved for this machine (`finetune.hardware.choose_compile`).
        layer_decay: per-layer learning-rate decay of `parameter_groups` (BEiT's), or None.
        class_weights: per-class weights (K,) of the training loss (multi-label: `pos_weight`), or None.
        teacher: a trained classifier of the same labels (`distillation_loss`), or None; never trained or saved.
        teacher_transform: the `BatchTransform` that feeds the teacher (its `frame` and `finish` only).
        data_options: the options that chose the images of each split, which a resume must keep (`ResumeCheck`)."""

    def __init__(self, *args, batch_transform, compile_choice: CompileChoice | None = None, layer_decay=None,
                 class_weights: torch.Tensor | None = None, teacher=None, teacher_transform=None,
                 data_options: dict | None = None, **kw):  # fmt: skip
        with warnings.catch_warnings():
            # Said of multi-label data: transformers drops its label smoother, unused here; `multi_label_loss` smooths.
            warnings.filterwarnings("ignore", "Label smoothing is not compatible with multi-label", UserWarning)
            super().__init__(*args, **kw)
        # `compute_loss` returns a micro-batch's mean loss; the Trainer then divides it by the accumulation steps.
        self.model_accepts_loss_kwargs = False
        self.batch_transform = batch_transform.to(self.args.device)
        self.layer_decay = layer_decay
        self.class_weights = class_weights.to(self.args.device) if class_weights is not None else None
        # Not an attribute of the model: the Trainer neither trains, wraps nor saves it.
        self.teacher = teacher.to(self.args.device).eval().requires_grad_(False) if teacher is not None else None
        self.teacher_transform = teacher_transform.to(self.args.device) if teacher is not None else None
        self.multi_label = is_multi_label(self.model.config)
        if self.multi_label and teacher is not None:
            raise ValueError(
                "Distillation teaches one class per image, and this dataset has several labels per image: drop "
                "`teacher_model_name_or_path` for multi-label data."
            )
        self.loss_fn = multi_label_loss if self.multi_label else classification_loss
        # The Trainer calls `compute_metrics`: the given metrics (`metric_fn`), with the loss (`metrics_and_loss`).
        self.metric_fn = self.compute_metrics
        if self.compute_metrics is not None:
            self.compute_metrics = self.metrics_and_loss
        a = self.args
        self.mix = None
        if a.mixup_alpha > 0 or a.cutmix_alpha > 0:
            self.mix = MixUpCutMix(self.model.config.num_labels, a.mixup_alpha, a.cutmix_alpha)
        self.clock = RunClock(num_images=len(self.train_dataset) if self.train_dataset is not None else None)
        self.guard = NonFiniteGuard(self.model, a.max_nonfinite_steps, a.world_size, self.accelerator.scaler)
        choice = compile_choice or CompileChoice(False, reason="not requested")
        budget_left = None
        if a.max_train_minutes is not None:
            budget_left = lambda: 60.0 * a.max_train_minutes - self.clock.elapsed()  # noqa: E731
        self.compiler = TrainingCompiler(choice, a.device, a.world_size, seconds_left=budget_left)
        self.ema = EMACallback(ModelEMA(self.model, a.ema_decay), self.model) if a.ema_decay is not None else None
        self.budget = self.early_stopping = None
        if a.max_train_minutes is not None:
            guard = self.guard if a.world_size > 1 else None
            self.budget = TrainingBudgetCallback(
                a.max_train_minutes, self.clock, a.budget_schedule, guard=guard,
                settle_steps=self.compiler.first_compiled_step,
            )  # fmt: skip
        if a.early_stopping_patience is not None:
            self.early_stopping = ResumedEarlyStopping(a.early_stopping_patience, a.early_stopping_threshold)
        self.remove_callback(PrinterCallback if a.disable_tqdm else ProgressCallback)
        # Order matters: the EMA's training weights are back before the guard keeps a step's buffers; the callbacks
        # that ask for a save (budget, early stopping, interrupt) act before the EMA swaps its average in, last.
        progress = ProgressLines(self.clock, self.budget) if a.disable_tqdm else QuietProgress(self.budget)
        callbacks = [ProcessRandomness(), self.ema and self.ema.restorer, ResumeCheck(data_options), self.clock]
        callbacks += [self.guard, self.compiler]
        self.interrupt = InterruptCallback(self.guard)
        callbacks += [self.budget, self.early_stopping, progress, self.interrupt]
        callbacks += [ClockBeforeSave(self.clock), self.ema]
        for callback in filter(None, callbacks):
            self.add_callback(callback)

    # ---- The training step.

    def training_step(self, model, inputs, num_items_in_batch=None):
        """The Trainer's forward and backward pass of one micro-batch; if the compiled model fails, it runs again
        eagerly and training goes on eagerly (that optimizer step is skipped)."""
        loss = self.compiler.run(
            lambda: super(ImageClassificationTrainer, self).training_step(model, inputs, num_items_in_batch),
            on_fallback=self.guard.skip_step,
        )
        loss = self.guard.observe_loss(loss)
        self.clock.add_loss(loss)
        return loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:  # a training log: after a resume, over the steps before it too (`RunClock.logged_loss`)
            logs["loss"] = self.clock.logged_loss(logs["loss"])
        super().log(logs, *args, **kwargs)

    def save_model(self, output_dir: str | None = None, *args, **kwargs) -> None:
        """The Trainer's, and into a checkpoint the EMA's state, beside its weights: written on `on_save`, it came
        after the Trainer had removed the older checkpoints, and a kill between the two left no whole checkpoint."""
        super().save_model(output_dir, *args, **kwargs)
        checkpoint = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.ema is not None and output_dir is not None and os.path.basename(output_dir) == checkpoint:
            self.ema.save_state(self.args, output_dir)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        # The Trainer reads `should_training_stop` only after a step: one set before the first (a resumed run whose
        # training had ended: `ResumedEarlyStopping`, `TrainingBudgetCallback`) gets an empty step, ending the loop.
        if self.control.should_training_stop:
            return [], None
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """A training micro-batch, from uint8 images and labels on the device to its loss."""
        images = self.batch_transform.augmented(inputs["pixel_values"])  # uint8 (B, C, h, w) -> float, augmented
        targets = inputs["labels"]  # (B,), or multi-hot (B, K)
        if self.mix is not None:
            images, targets = self.mix(images, targets)  # targets -> mixed (B, K)
        pixel_values = self.batch_transform.finish(images, train=True)  # -> normalised (B, C, H, W)
        forward = self.compiler.module_for(model, pixel_values.shape[0])
        outputs = forward(pixel_values=pixel_values)
        a = self.args
        if self.teacher is None:
            loss = self.loss_fn(outputs.logits, targets, a.label_smoothing_factor, self.class_weights)
        else:
            with torch.no_grad():  # the same images, framed as its evaluation, at its resolution and normalisation
                teacher_view = self.teacher_transform.finish(self.teacher_transform.frame(images), train=True)
                teacher_logits = self.teacher(pixel_values=teacher_view).logits
            loss = distillation_loss(
                outputs.logits,
                teacher_logits,
                targets,
                a.distillation_alpha,
                a.distillation_temperature,
                a.distillation_type,
                a.label_smoothing_factor,
                self.class_weights,
            )
        return (loss, outputs) if return_outputs else loss

    # ---- Evaluation and prediction.

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Logits of an evaluation batch (the loss too where labels are given without `compute_metrics`, which the
        pipeline always has: then `metrics_and_loss` computes it); with `flip_tta`, the mean logits of each image and
        its mirror image, in one forward pass."""
        pixel_values = self.batch_transform(inputs["pixel_values"].to(self.args.device), train=False)
        labels = inputs.get("labels")
        B = pixel_values.shape[0]
        if self.args.flip_tta:
            pixel_values = torch.cat([pixel_values, pixel_values.flip(-1)])  # (B, C, H, W) -> (2B, C, H, W)
        with torch.no_grad():
            logits = model(pixel_values=pixel_values).logits
        if self.args.flip_tta:
            logits = (logits[:B] + logits[B:]) / 2  # (2B, K) -> (B, K)
        if labels is None or not (prediction_loss_only or self.compute_metrics is None):
            return None, logits, labels  # the loss comes with the metrics (`metrics_and_loss`)
        return self.loss_fn(logits, labels).detach(), None if prediction_loss_only else logits, labels

    def metrics_and_loss(self, eval_pred: EvalPrediction) -> dict[str, float]:
        """`compute_metrics` and the loss, of every process's predictions gathered without the duplicates that even
        sharding pads the last batches with (the Trainer's own loss, per batch, counted them). The loss is plain
        cross-entropy (binary for multi-label), without label smoothing or class weights, as timm validates."""
        logits, labels = torch.from_numpy(eval_pred.predictions), torch.from_numpy(eval_pred.label_ids)
        return {"loss": self.loss_fn(logits, labels).item(), **self.metric_fn(eval_pred)}

    def get_train_dataloader(self):
        # torch's `DataLoader` draws its workers' base seed from the global generator as each iterator starts: every
        # epoch's, but with persistent workers the first one's only. A run resumed at an epoch's start (the Trainer
        # restores the generators before that epoch's iterator, its new loader's first) drew one number more than the
        # uninterrupted run, and augmented every later step otherwise. From a generator of the loader's own, the
        # global one is the steps' alone, with or without (persistent) workers.
        loader = workers_ignore_stop_signals(super().get_train_dataloader())
        getattr(loader, "base_dataloader", loader).generator = torch.Generator().manual_seed(self.args.seed)
        return loader

    def get_eval_dataloader(self, eval_dataset=None):
        return self.every_image(super().get_eval_dataloader, eval_dataset)

    def get_test_dataloader(self, test_dataset):
        return self.every_image(super().get_test_dataloader, test_dataset)

    def every_image(self, get_dataloader, dataset):
        """The Trainer applies `dataloader_drop_last` to evaluation too, scoring a split without its last images:
        here it is for training only."""
        drop, self.args.dataloader_drop_last = self.args.dataloader_drop_last, False
        try:
            return workers_ignore_stop_signals(get_dataloader(dataset))
        finally:
            self.args.dataloader_drop_last = drop

    def evaluate(self, *args, **kwargs):
        # Evaluation draws no number from the training's random generators, so a run resumed from a checkpoint saved
        # before an evaluation replays the same batches and augmentations.
        with torch.random.fork_rng(devices=[self.args.device] if self.args.device.type == "cuda" else []):
            return super().evaluate(*args, **kwargs)

    # ---- Optimizer, training and checkpoint loading.

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The Trainer's optimizer over `parameter_groups` (no weight decay on norms, biases, position embeddings
        and prefix tokens; with `layer_decay` a learning rate per layer)."""
        if self.optimizer is not None:
            return self.optimizer
        model = self.model if model is None else model
        # `optimizer_cls_and_kwargs`, passed to the Trainer, replaces the one `optim` names, as in the Trainer's own.
        optimizer_cls, kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(self.args, model)
        special = {"params", "model", "optimizer_dict"} & set(kwargs) or is_optimizer_factory(optimizer_cls)
        if special or self.is_deepspeed_enabled or self.is_fsdp_enabled:
            # Optimizers that group parameters themselves (GaLore, LOMO, Muon, layer-wise) keep the Trainer's groups.
            if self.layer_decay is not None:
                raise ValueError(f"`layer_decay` does not work with `optim: {self.args.optim}`; use adamw_torch.")
            return super().create_optimizer(model)
        groups = parameter_groups(model, self.args.learning_rate, self.args.weight_decay, self.layer_decay)
        self.optimizer = optimizer_cls(groups, **kwargs)
        return self.optimizer

    def train(self, *args, **kwargs):
        """The Trainer's training; a divergence says what was kept and what to try, a signal how to resume."""
        if self.ema is not None:
            self.ema.resume_from = kwargs.get("resume_from_checkpoint")
        try:
            output = super().train(*args, **kwargs)
        except BaseException as error:
            # No `on_train_end` comes: a later run must find the handlers as they were (a stale one swallows its
            # first signal).
            self.interrupt.restore_handlers()
            for callback in self.callback_handler.callbacks:  # the error line then starts a line of its own
                if getattr(callback, "training_bar", None) is not None:
                    callback.training_bar.close()
                    callback.training_bar = None
            if isinstance(error, TrainingDiverged):
                message = f"{error} {self._after_divergence(error)}"
                raise TrainingDiverged(message, error.step, error.learning_rate) from None
            raise
        if self.stopped_by == "early_stopping":
            a = self.args
            logger.info(
                f"Early stopping at epoch {self.state.epoch:.2f}: `{a.metric_for_best_model}` did not improve by more "
                f"than {a.early_stopping_threshold} in {a.early_stopping_patience} evaluations; kept the best model "
                f"({self.state.best_model_checkpoint})."
            )
        return output

    @property
    def stopped_by(self) -> str | None:
        """What ended training before its epochs: `early_stopping`, `time_budget`, or None."""
        if self.state.global_step >= self.state.max_steps > 0:  # it ran its steps (the stop came at the last one)
            return None
        stopping = self.early_stopping
        if stopping is not None and stopping.early_stopping_patience_counter >= stopping.early_stopping_patience:
            return "early_stopping"
        return "time_budget" if self.budget is not None and self.budget.stopped_at is not None else None

    def _after_divergence(self, error: TrainingDiverged) -> str:
        """What a diverged run keeps (its trainer state is saved beside the checkpoints) and what to try."""
        output_dir = self.args.output_dir
        state_file = os.path.join(output_dir, TRAINER_STATE_NAME)
        if self.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            self.state.save_to_json(state_file)
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        kept = [f"the last checkpoint {last}"] if last else []
        key, name = ("eval_map", "mAP") if self.multi_label else ("eval_accuracy", "accuracy")
        evaluations = [e for e in self.state.log_history if key in e]
        if evaluations:
            kept.append(
                f"the evaluations in {state_file} (last: validation {name} {evaluations[-1][key]:.2%} at epoch "
                f"{evaluations[-1].get('epoch', 0):.2f})"
            )
        text = f"Kept: {'; '.join(kept)}." if kept else "No checkpoint or evaluation had been made yet."
        tries = []
        if error.learning_rate:
            tries.append(f"a lower `learning_rate` (e.g. {error.learning_rate / 2:.2g}) or a longer warmup")
        if self.args.bf16 or self.args.fp16:
            tries.append("`bf16: false` and `fp16: false` (float32)")
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if getattr(config, "model_type", None) == "scratch_vit" and not getattr(config, "qk_norm", True):
            tries.append("`qk_norm: true`")
        if not self.args.max_grad_norm:
            tries.append("`max_grad_norm: 1.0`")
        return f"{text} Try {', '.join(tries)}." if tries else text

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_checkpoint_weights(self.accelerator.unwrap_model(model or self.model), resume_from_checkpoint)

    def _load_best_model(self):
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            return super()._load_best_model()
        checkpoint = self.state.best_model_checkpoint
        metric = self.args.metric_for_best_model
        logger.info(f"Loading the best model from {checkpoint} ({metric} {self.state.best_metric:.4g}).")
        load_checkpoint_weights(self.accelerator.unwrap_model(self.model), checkpoint)
