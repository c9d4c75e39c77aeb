"""`ImageClassificationTrainingArguments`: transformers' `TrainingArguments` with this pipeline's defaults and its
training-loop options, read by `ImageClassificationTrainer` (as `Seq2SeqTrainingArguments` is by `Seq2SeqTrainer`).

The options: a wall-clock budget (`max_train_minutes`, `budget_schedule`), an exponential moving average of the
weights (`ema_decay`), MixUp/CutMix (`mixup_alpha`, `cutmix_alpha`), flip test-time augmentation (`flip_tta`), the
non-finite guard (`max_nonfinite_steps`) and compilation chosen from the machine (`torch_compile: auto`); plus
`overwrite_output_dir` and `hub_commit_message`, used around training by `finetune/run.py`.
"""

import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy
from transformers.utils import logging

from finetune import hardware
from finetune.metrics import EVAL_METRICS
from finetune.nonfinite import DEFAULT_MAX_CONSECUTIVE


logger = logging.get_logger(__name__)


def has_accelerator() -> bool:
    """Whether torch sees a GPU (CUDA, ROCm, XPU, MPS...)."""
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


@dataclass
class ImageClassificationTrainingArguments(TrainingArguments):
    """`TrainingArguments` for image classification with the pipeline's defaults and training-loop options.

    Precision is chosen from the machine: `bf16`, `fp16` and `tf32` default to `auto` (`finetune.hardware.
    choose_precision`); `precision_choice` says what was chosen and why.

    Defaults that differ from the Trainer's: evaluate and save every epoch and keep the best model by validation
    accuracy (the one saved and tested), at most two checkpoints, no loader workers and no column pruning (the images
    are already decoded in memory), and `use_cpu` where no accelerator exists: without it, processes started by
    `accelerate launch --multi_gpu` or `torchrun` on a machine with no GPU each train alone (world size 1) instead of
    joining one gloo process group.
    """

    output_dir: str | None = field(
        default="outputs/run",
        metadata={"help": "Where the model, checkpoints and results.json are written."},
    )
    eval_strategy: IntervalStrategy | str = field(
        default="epoch", metadata={"help": "When to evaluate: `no`, `steps` or `epoch`."}
    )
    save_strategy: SaveStrategy | str = field(
        default="epoch", metadata={"help": "When to checkpoint: `no`, `steps`, `epoch`, `best`."}
    )
    do_train: bool = field(
        default=True,
        metadata={
            "help": "Train (the default). `false`: evaluate the saved model `model_name_or_path` on the validation "
            "and test splits without training, writing results.json and predictions_<split>.csv."
        },
    )
    logging_steps: float = field(default=50, metadata={"help": "Log every N optimizer steps (a ratio when < 1)."})
    load_best_model_at_end: bool = field(
        default=True, metadata={"help": "Reload the best checkpoint (by `metric_for_best_model`) at the end."}
    )
    metric_for_best_model: str | None = field(
        default="accuracy", metadata={"help": "The validation metric that picks the best checkpoint."}
    )
    greater_is_better: bool | None = field(
        default=True, metadata={"help": "Whether a larger `metric_for_best_model` is better."}
    )
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept (the best is always kept)."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Drop dataset columns the model's forward does not take (not needed here)."}
    )
    dataloader_num_workers: int = field(
        default=0, metadata={"help": "Loader worker processes; 0 suits images already decoded in memory."}
    )
    dataloader_pin_memory: bool | None = field(
        default=None, metadata={"help": "Pin batches in page-locked memory (default: where CUDA is available)."}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "Every parameter is used; searching for unused ones costs a graph walk per step."},
    )
    use_cpu: bool | None = field(
        default=None, metadata={"help": "Train on the CPU (default: where torch sees no accelerator)."}
    )

    bf16: str = field(
        default="auto",
        metadata={
            "help": "bf16 autocast: `auto` (the default) uses it on GPUs that support it and on CPUs with native bf16 "
            "(AVX512-BF16 or AMX), where it is fast; `true` or `false` force it."
        },
    )
    fp16: str = field(
        default="auto",
        metadata={
            "help": "fp16 autocast with loss scaling: `auto` uses it on GPUs without bf16; `true`/`false` force it."
        },
    )
    tf32: str | None = field(
        default="auto",
        metadata={"help": "TF32 matmuls: `auto` enables them on Ampere or newer GPUs; `true`/`false` force them."},
    )
    torch_compile: str = field(
        default="auto",
        metadata={
            "help": "torch.compile the training forward pass: `auto` (the default) compiles on CUDA GPUs with CUDA "
            "graphs (`torch_compile_mode: reduce-overhead`) and keeps it only if a timed comparison after warm-up "
            "finds it faster than eager; eager elsewhere. `true` compiles (with `torch_compile_backend` / "
            "`torch_compile_mode`), `false` never. A compiler error falls back to eager with a warning."
        },
    )
    max_nonfinite_steps: int = field(
        default=DEFAULT_MAX_CONSECUTIVE,
        metadata={
            "help": "Optimizer steps in a row with a non-finite (NaN or infinite) loss or gradient after which "
            "training stops with an error; each such step is skipped, not applied, and logged. The checkpoints and "
            "evaluations made so far are kept."
        },
    )
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={
            "help": "The Trainer's own filter of non-finite losses in the logged loss, which waits for the device at "
            "every step. Off: the pipeline skips and reports such steps itself (`max_nonfinite_steps`)."
        },
    )

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Allow training into an `output_dir` that already holds checkpoints or results of another run. "
            "Without it such a run stops before touching them (use `resume_from_checkpoint` to continue one)."
        },
    )
    hub_commit_message: str = field(
        default="Upload fine-tuned model", metadata={"help": "Commit message of the push to the Hub."}
    )
    recipe_precision: str | None = field(
        default=None,
        metadata={
            "help": "The precision a recipe (config) was tuned for, `bf16` or `float32`. Where the machine trains in "
            "another (`bf16: auto` chose otherwise), the log warns and names `recipe_alternative`."
        },
    )
    recipe_alternative: str | None = field(
        default=None,
        metadata={"help": "The config to use instead where the precision chosen is not `recipe_precision`."},
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many minutes of wall-clock time (evaluations included); the best "
            "model is then evaluated, tested and saved as usual. Default: no budget."
        },
    )
    budget_schedule: bool = field(
        default=False,
        metadata={
            "help": "With `max_train_minutes`: measure the time per step early on and re-plan the learning-rate "
            "schedule (cosine, linear, ...) to end exactly at the budget; `num_train_epochs` is then only an upper "
            "bound."
        },
    )
    ema_decay: float | None = field(
        default=None,
        metadata={
            "help": "Keep an exponential moving average of the weights with this decay (e.g. 0.999, warmed up as "
            "min(decay, (1 + t) / (10 + t))); evaluations, checkpoints and the final model use it. Default: off."
        },
    )
    flip_tta: bool = field(
        default=False, metadata={"help": "At evaluation, average the logits of each image and its mirror image."}
    )
    mixup_alpha: float = field(
        default=0.0, metadata={"help": "MixUp of training batches with ratio ~ Beta(alpha, alpha); 0 disables it."}
    )
    cutmix_alpha: float = field(
        default=0.0,
        metadata={
            "help": "CutMix of training batches with ratio ~ Beta(alpha, alpha); 0 disables it. With MixUp also on, "
            "each batch uses one of the two at random."
        },
    )

    def __post_init__(self):
        check_training_arguments(self)  # before the Trainer's own checks, whose messages name no fix
        # Unset means "from the machine"; resolved before the Trainer's own checks (bf16 needs `use_cpu` on a CPU).
        if self.use_cpu is None:
            self.use_cpu = not has_accelerator()
        if self.dataloader_pin_memory is None:
            self.dataloader_pin_memory = torch.cuda.is_available() and not self.use_cpu
        if self.accelerator_config is None and self.dataloader_pin_memory:
            # Batches in pinned memory go to the GPU without the host waiting for the copy (and so for the device).
            self.accelerator_config = {"non_blocking": True}
        device = hardware.accelerator_type(self.use_cpu)
        machine = hardware.probe(device)
        # The pipeline compiles the training forward itself (`finetune/compile.py`); the Trainer and accelerate, which
        # would also compile evaluation and stop the run on a compiler error, are told not to.
        self.compile_choice = hardware.choose_compile(
            self.torch_compile,
            device,
            self.torch_compile_mode,
            self.torch_compile_backend,
            cuda_capability=machine.get("cuda_capability", (0, 0)),
            gradient_accumulation_steps=self.gradient_accumulation_steps,
        )
        for warning in self.compile_choice.warnings:
            logger.warning(warning)
        self.torch_compile, self.torch_compile_mode, self.torch_compile_backend = False, None, None
        choice = hardware.choose_precision(
            self.bf16,
            self.fp16,
            self.tf32,
            device,
            launcher_precision=os.environ.get("ACCELERATE_MIXED_PRECISION"),
            **machine,
        )
        self.bf16, self.fp16, self.tf32 = choice.bf16, choice.fp16, choice.tf32
        for warning in choice.warnings:
            logger.warning(warning)
        super().__post_init__()
        # Not a field: what `auto` chose and why, for the log and results.json.
        self.precision_choice = choice.summary
        logger.info(f"Compilation: {self.compile_choice.summary}")
        self.warn_if_another_recipe_fits(choice)
        if self.max_train_minutes is not None and self.max_train_minutes <= 0:
            raise ValueError(f"`max_train_minutes` must be > 0, got {self.max_train_minutes}.")
        if self.budget_schedule and self.max_train_minutes is None:
            raise ValueError("`budget_schedule: true` needs `max_train_minutes`.")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ValueError(f"`ema_decay` must be in (0, 1), got {self.ema_decay}.")
        if isinstance(self.max_nonfinite_steps, bool) or self.max_nonfinite_steps < 1:
            raise ValueError(
                f"`max_nonfinite_steps` must be an integer >= 1, got {self.max_nonfinite_steps}. A diverged run makes "
                "every step non-finite; 5 (the default) stops it five steps in."
            )
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise ValueError(
                f"`mixup_alpha` and `cutmix_alpha` must be >= 0, got {self.mixup_alpha} and {self.cutmix_alpha}."
            )

    def warn_if_another_recipe_fits(self, choice: "hardware.PrecisionChoice") -> None:
        """Warn where the precision chosen for this machine is not the one the recipe was tuned for."""
        if self.recipe_precision is None:
            return
        if self.recipe_precision not in ("bf16", "float32"):
            raise ValueError(f"`recipe_precision` must be `bf16` or `float32`, got {self.recipe_precision!r}.")
        chosen = "bf16" if choice.bf16 else "fp16" if choice.fp16 else "float32"
        if chosen != self.recipe_precision:
            instead = f" Use {self.recipe_alternative}, the recipe for it." if self.recipe_alternative else ""
            logger.warning(
                f"This recipe is tuned for training in {self.recipe_precision}; this machine trains in {chosen} "
                f"({'; '.join(choice.reasons)}).{instead}"
            )


def _name(value) -> str:
    return str(getattr(value, "value", value))


def check_training_arguments(args: ImageClassificationTrainingArguments) -> None:
    """Refuse values and combinations that would crash inside the Trainer or train something other than asked."""
    if args.max_steps == 0 or (args.max_steps < 0 and args.num_train_epochs <= 0):
        raise ValueError(
            f"Nothing to train: `num_train_epochs` is {args.num_train_epochs} and `max_steps` {args.max_steps}. "
            "Set `num_train_epochs` > 0, or `max_steps` > 0."
        )
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"`{name}` must be an integer >= 1, got {getattr(args, name)}.")
    if not 0 <= args.label_smoothing_factor < 1:
        raise ValueError(
            f"`label_smoothing_factor` must be in [0, 1) (e.g. 0.1; 0 is off), got {args.label_smoothing_factor}."
        )
    if args.learning_rate < 0 or args.weight_decay < 0:
        raise ValueError(
            f"`learning_rate` and `weight_decay` must be >= 0, got {args.learning_rate} and {args.weight_decay}."
        )
    if args.push_to_hub and not args.hub_model_id:
        raise ValueError(
            "`push_to_hub: true` needs `hub_model_id` (e.g. `your-name/vit-cifar10`). Nothing was trained; set it, "
            "or push later with `python -m finetune.tools.hub push OUTPUT_DIR --repo_id ID`."
        )
    metric = args.metric_for_best_model
    if metric is not None:
        name = metric.removeprefix("eval_")
        if name not in EVAL_METRICS:
            raise ValueError(
                f"`metric_for_best_model: {metric}` names no metric of the evaluation; it reports "
                f"{', '.join(EVAL_METRICS)}."
            )
        if args.greater_is_better is not None and args.greater_is_better != EVAL_METRICS[name]:
            raise ValueError(
                f"`metric_for_best_model: {metric}` with `greater_is_better: {args.greater_is_better}` would keep the "
                f"worst checkpoint. Set `greater_is_better: {str(EVAL_METRICS[name]).lower()}`."
            )
    if args.load_best_model_at_end:
        evaluate, save = _name(args.eval_strategy), _name(args.save_strategy)
        if evaluate == "no" or save == "no":
            raise ValueError(
                f"`eval_strategy: {evaluate}` and `save_strategy: {save}` cannot keep a best model, which the "
                "pipeline does by default (`load_best_model_at_end: true`). Set `load_best_model_at_end: false`, or "
                "evaluate and save (`eval_strategy: epoch`, `save_strategy: epoch`)."
            )
        if save not in (evaluate, "best"):
            raise ValueError(
                f"`load_best_model_at_end` needs a checkpoint at every evaluation: `save_strategy` ({save}) must "
                f"equal `eval_strategy` ({evaluate}), with `save_steps` a multiple of `eval_steps`, or be `best`."
            )
