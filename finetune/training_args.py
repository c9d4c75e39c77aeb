"""`ImageClassificationTrainingArguments`: transformers' `TrainingArguments` with the pipeline's defaults and its
training-loop options (`finetune.arguments.TrainingLoopArguments`); the command-line parser; and `build_training_args`,
which builds them from concrete values once `finetune.hardware.choose_settings` has answered each `auto` (probing the
machine while building them made them change under the reader)."""

import argparse
import inspect
import logging
import math
import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed
from huggingface_hub import get_token
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import HfArgumentParser, SchedulerType, TrainingArguments
from transformers.integrations import get_available_reporting_integrations
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
from transformers.trainer_utils import IntervalStrategy, SaveStrategy
from transformers.utils import is_in_notebook

from finetune import hardware
from finetune.arguments import (
    CONFIG_HELP,
    NONE_WORDS,
    NULL_WORDS,
    DataArguments,
    ModelArguments,
    ScratchViTArguments,
    TrainingLoopArguments,
    check_choices,
    check_ranges,
    check_unused,
    command_name,
    is_set,
    option,
    option_specs,
    unset,
)
from finetune.errors import ArgumentParser
from finetune.locations import upload_switch
from finetune.metrics import EVAL_METRICS
from finetune.nonfinite import DEFAULT_MAX_CONSECUTIVE


logger = logging.getLogger(__name__)


@dataclass
class ImageClassificationTrainingArguments(TrainingLoopArguments, TrainingArguments):
    """`TrainingArguments` with the pipeline's training-loop options and defaults: evaluate and save every epoch and
    keep the best model by validation accuracy, at most two checkpoints, no loader workers and no column pruning (the
    images are decoded in memory). Built in code, pass `bf16`, `fp16`, `tf32` and `torch_compile` as booleans."""

    eval_strategy: IntervalStrategy | str = option("epoch", "When to evaluate: `no`, `steps` or `epoch`.")
    save_strategy: SaveStrategy | str = option("epoch", "When to checkpoint: `no`, `steps`, `epoch`, `best`.")
    logging_steps: float = option(50, "Log every N optimizer steps (a ratio when < 1).")
    load_best_model_at_end: bool = option(True, "Reload the best checkpoint (by `metric_for_best_model`) at the end.")
    metric_for_best_model: str | None = option("accuracy", "The validation metric that picks the best checkpoint.")
    save_total_limit: int | None = option(2, "Checkpoints kept (the best is always kept).")
    remove_unused_columns: bool = option(False, "Drop dataset columns the model's forward does not take.")
    dataloader_num_workers: int = option(0, "Loader worker processes; 0 suits images already decoded in memory.")
    ddp_find_unused_parameters: bool | None = option(
        False, "Every parameter is used; searching for unused ones costs a graph walk per step."
    )
    logging_nan_inf_filter: bool = option(
        False, "The Trainer's filter of non-finite logged losses, which waits for the device at every step."
    )
    do_eval: bool = option(True, "Always on: every run is scored on its validation split (`eval_strategy`: when).")
    do_predict: bool = option(True, "Always on: a dataset's test split, where it has one, is scored once at the end.")
    max_nonfinite_steps: int = option(
        DEFAULT_MAX_CONSECUTIVE,
        "Optimizer steps in a row with a non-finite loss or gradient (each skipped and logged) that stop training.",
    )

    def __post_init__(self):
        """Refuse values and combinations that would crash inside the Trainer or train something other than asked,
        before the Trainer's own checks, whose messages name no fix."""
        for name in ("bf16", "fp16", "tf32", "torch_compile"):
            if isinstance(getattr(self, name), str):
                raise ValueError(
                    f"`{name}: {getattr(self, name)}` is not chosen yet: build the arguments with "
                    f"`build_training_args` after `hardware.choose_settings`, or pass `{name}` as true or false."
                )
        if self.max_steps == 0:
            raise ValueError(
                "Nothing to train: `max_steps` is 0. Drop it (the run then lasts `num_train_epochs`), or set "
                "`max_steps` > 0."
            )
        if self.max_steps < 0 and self.num_train_epochs <= 0:
            raise ValueError(
                f"Nothing to train: `num_train_epochs` is {self.num_train_epochs} and `max_steps` unset. Set "
                "`num_train_epochs` > 0, or `max_steps` > 0."
            )
        check_choices(self, TrainingLoopArguments)
        check_ranges(
            self,
            [
                ("per_device_train_batch_size", lambda v: v >= 1, "an integer >= 1"),
                ("per_device_eval_batch_size", lambda v: v >= 1, "an integer >= 1"),
                ("gradient_accumulation_steps", lambda v: v >= 1, "an integer >= 1"),
                ("label_smoothing_factor", lambda v: 0 <= v < 1, "in [0, 1) (e.g. 0.1; 0 is off)"),
                ("max_train_minutes", lambda v: v is None or v > 0, "> 0"),
                ("ema_decay", lambda v: v is None or 0 < v < 1, "in (0, 1)"),
                ("early_stopping_patience", lambda v: v is None or v >= 1, ">= 1 evaluations"),
                ("learning_rate", lambda v: v >= 0, ">= 0"),
                ("warmup_steps", lambda v: v >= 0, ">= 0 (optimizer steps, or a share of them when < 1)"),
                # numpy's seeds are 32-bit: out of range, the run stopped only after the data was loaded.
                ("seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32 - 1]"),
                ("data_seed", lambda v: v is None or 0 <= v < 2**32, "an integer in [0, 2**32 - 1] (or unset)"),
                ("weight_decay", lambda v: v >= 0, ">= 0"),
                ("mixup_alpha", lambda v: v >= 0, ">= 0"),
                ("cutmix_alpha", lambda v: v >= 0, ">= 0"),
                ("distillation_alpha", lambda v: 0 <= v <= 1, "in [0, 1] (e.g. 0.5)"),
                ("distillation_temperature", lambda v: v > 0, "> 0 (e.g. 2)"),
                # torch refused them only once the optimizer was built, naming no option.
                ("adam_beta1", lambda v: 0 <= v < 1, "in [0, 1) (e.g. 0.9)"),
                ("adam_beta2", lambda v: 0 <= v < 1, "in [0, 1) (e.g. 0.999)"),
                ("adam_epsilon", lambda v: v >= 0, ">= 0 (e.g. 1e-8)"),
                # Below 0 the Trainer skipped clipping without a word, as at 0.
                ("max_grad_norm", lambda v: v >= 0, ">= 0 (e.g. 1.0; 0 or inf turns clipping off)"),
                # A diverged run makes every step non-finite: the default stops it five steps in.
                ("max_nonfinite_steps", lambda v: not isinstance(v, bool) and v >= 1, "an integer >= 1 (default 5)"),
                # torch refused it once the data was loaded and the model built.
                ("dataloader_num_workers", lambda v: v >= 0, "an integer >= 0 (0 loads in the main process)"),
                # transformers kept every checkpoint at 0 or below.
                ("save_total_limit", lambda v: v is None or v >= 1, "an integer >= 1 (`none` keeps every checkpoint)"),
            ],
        )
        for kind in ("eval", "save", "logging"):
            # transformers takes `save_steps: 0` as a multiple of any `eval_steps`, then saves no best checkpoint.
            steps, strategy = getattr(self, f"{kind}_steps"), getattr(self, f"{kind}_strategy")
            if str(getattr(strategy, "value", strategy)) == "steps" and steps is not None and steps <= 0:
                raise ValueError(
                    f"`{kind}_steps` must be > 0 with `{kind}_strategy: steps` (optimizer steps, or a share of the "
                    f"run when < 1), got {steps}."
                )
        evaluate, save = (str(getattr(s, "value", s)) for s in (self.eval_strategy, self.save_strategy))
        if self.eval_steps is not None and evaluate != "steps":
            raise ValueError(
                f"`eval_steps: {self.eval_steps:g}` counts steps, but `eval_strategy` is {evaluate}, so it would "
                "be ignored. Fix: `eval_strategy: steps` and `save_strategy: steps` with it, or drop `eval_steps`."
            )
        if is_set(self, "save_steps") and save != "steps":
            raise ValueError(
                f"`save_steps: {self.save_steps:g}` counts steps, but `save_strategy` is {save}, so it would be "
                "ignored. Fix: `save_strategy: steps` (and `eval_strategy: steps`) with it, or drop `save_steps`."
            )
        if save == "best" and evaluate == "no":
            raise ValueError(
                "`save_strategy: best` saves when an evaluation finds a new best model, and `eval_strategy: no` runs "
                "none: no checkpoint would be saved, and the run could not be resumed. Fix: `eval_strategy: epoch` "
                "(or steps), or another `save_strategy`."
            )
        if self.early_stopping_patience is None:
            check_unused(
                self, ["early_stopping_threshold"], "no `early_stopping_patience`", "`early_stopping_patience`"
            )
        if self.recipe_precision is None:  # the alternative is named only where the precision is not the recipe's
            check_unused(
                self, ["recipe_alternative"], "no `recipe_precision`", "`recipe_precision: bf16` (or `float32`)"
            )
        if self.teacher_model_name_or_path is None:
            distilling = ("distillation_type", "distillation_alpha", "distillation_temperature")
            without = "no `teacher_model_name_or_path` to distill from"
            check_unused(self, distilling, without, "name the teacher (a trained run's folder)")
        elif self.distillation_type == "hard":  # cross-entropy on the teacher's top class, which no temperature moves
            without = "`distillation_type: hard` trains on the teacher's top class"
            check_unused(self, ["distillation_temperature"], without, "`distillation_type: soft`")
        # Trainer options this pipeline's evaluation and models do not support: ignored, or failing late.
        if self.label_names not in (None, ["labels"]):
            raise ValueError(f"`label_names: {self.label_names}`: the batches' labels are `labels`. Drop the option.")
        unsupported = {
            "prediction_loss_only": "evaluations report accuracy and the other metrics, which need the predictions",
            "batch_eval_metrics": "the metrics are computed once over all the predictions",
            "use_liger_kernel": "Liger's kernels are for language models",
        }
        for name, why in unsupported.items():
            if getattr(self, name):
                raise ValueError(f"`{name}: true` is not supported here: {why}. Drop the option.")
        if not self.eval_do_concat_batches:  # the first evaluation failed, after an epoch of training
            raise ValueError(
                "`eval_do_concat_batches: false` is not supported here: the metrics are computed once over all the "
                "predictions, concatenated. Drop the option."
            )
        if not self.do_eval:
            raise ValueError(
                "`do_eval: false`: every run is scored on its validation split, for results.json and the best "
                "checkpoint. To score it once, after training: `eval_strategy: no`, `load_best_model_at_end: false`."
            )
        if not self.do_predict:
            raise ValueError(
                "`do_predict: false`: a dataset's test split, where it has one, is scored once after training, and "
                "nothing else uses it. Drop the option."
            )
        if self.push_to_hub:
            check_push_possible(self.hub_model_id, self.hub_token)
        metric = self.metric_for_best_model
        if metric is not None and metric.removeprefix("eval_") not in EVAL_METRICS:
            raise ValueError(
                f"`metric_for_best_model: {metric}` names no metric of the evaluation; it reports "
                f"{', '.join(EVAL_METRICS)}."
            )
        if self.load_best_model_at_end:
            if evaluate == "no" or save == "no":
                raise ValueError(
                    f"`eval_strategy: {evaluate}` and `save_strategy: {save}` cannot keep a best model, which the "
                    "pipeline does by default (`load_best_model_at_end: true`). Set `load_best_model_at_end: false`, "
                    "or evaluate and save (`eval_strategy: epoch`, `save_strategy: epoch`)."
                )
            if save not in (evaluate, "best"):
                raise ValueError(
                    f"`load_best_model_at_end` needs a checkpoint at every evaluation: `save_strategy` ({save}) must "
                    f"equal `eval_strategy` ({evaluate}), with `save_steps` equal to `eval_steps`, or be `best`."
                )
        if self.budget_schedule and self.max_train_minutes is None:
            raise ValueError("`budget_schedule: true` needs `max_train_minutes`.")
        if self.restore_callback_states_from_checkpoint:
            raise ValueError(
                "`restore_callback_states_from_checkpoint` would replace the pipeline's callbacks with new ones on "
                "resume; they restore their own state from the checkpoint already. Drop the option."
            )
        if self.early_stopping_patience is not None and (
            not self.load_best_model_at_end or self.metric_for_best_model is None
        ):
            raise ValueError(
                "`early_stopping_patience` keeps the best model, so it needs `load_best_model_at_end: true` and a "
                "`metric_for_best_model` (the defaults): drop the setting that turned them off."
            )
        eval_steps_given = self.eval_steps
        super().__post_init__()  # also reads `lr_scheduler_kwargs` given as a JSON string, and lists `report_to`
        check_scheduler_kwargs(self)
        if self.accelerator_config.split_batches:  # the batch, the steps of an epoch and a resume's check all differ
            raise ValueError(
                "`accelerator_config: {split_batches: true}` splits each batch across the processes, which the "
                "pipeline does not follow (it counts `per_device_train_batch_size` images per process). Fix: drop it "
                "and divide `per_device_train_batch_size` by the number of processes."
            )
        if self.load_best_model_at_end and evaluate == save == "steps" and self.save_steps != self.eval_steps:
            # transformers takes any multiple; the best evaluation between two checkpoints was then kept by none, and
            # the run ended with its last model, tested and recorded as the best, without a word.
            taken = " (`logging_steps`, which transformers takes where `eval_steps` is unset)"
            raise ValueError(
                f"`load_best_model_at_end` keeps the checkpoint of the best evaluation: with `save_steps` "
                f"{self.save_steps:g} and `eval_steps` {self.eval_steps:g}{taken if eval_steps_given is None else ''}"
                f", an evaluation between two checkpoints would have none. Fix: `eval_steps: {self.save_steps:g}`, "
                "`save_strategy: best` (a checkpoint at each new best), or `load_best_model_at_end: false`."
            )
        available = get_available_reporting_integrations()
        unknown = [name for name in self.report_to if name not in (*INTEGRATION_TO_CALLBACK, "none", "all")]
        if unknown:
            raise ValueError(
                f"`report_to: {', '.join(unknown)}` names no logging integration; transformers has "
                f"{', '.join(INTEGRATION_TO_CALLBACK)} (installed here: {', '.join(available) or 'none'}), or none."
            )
        missing = [name for name in self.report_to if name not in (*available, "none", "all")]
        if missing:
            raise ValueError(
                f"`report_to: {', '.join(missing)}` needs {' and '.join(missing)} installed (`pip install "
                f"{' '.join(missing)}`); available here: {', '.join(available) or 'none'}. Fix: install it, or "
                "`--report_to none`."
            )
        # Unset, `metric_for_best_model` falls back to the loss there, and an unset `greater_is_better` follows it.
        if self.metric_for_best_model is not None:
            greater = EVAL_METRICS[self.metric_for_best_model.removeprefix("eval_")]
            if self.greater_is_better != greater:
                raise ValueError(
                    f"`metric_for_best_model: {metric or 'null'}`{'' if metric else ' (the loss)'} with "
                    f"`greater_is_better: {self.greater_is_better}` would keep the worst checkpoint. Set "
                    f"`greater_is_better: {str(greater).lower()}`, or drop it."
                )


class OptionParser(ArgumentParser, HfArgumentParser):
    """`HfArgumentParser` with one-line errors, where `--OPTION null` (`arguments.unset`) unsets an optional option."""

    def __init__(self, dataclass_types, **kwargs):
        self.options = option_specs(dataclass_types)  # name -> (type hint, choices, default), read by `parse_options`
        super().__init__(dataclass_types, allow_abbrev=False, **kwargs)

    def add_argument(self, *names, **kwargs):
        name = names[0].removeprefix("--")
        hint = self.options.get(name, (None,))[0]
        convert = kwargs.get("type")
        if convert is not None and hint is not None and unset("null", name, hint):

            def convert_or_none(text: str):
                return None if unset(text, name, hint) else convert(text)

            convert_or_none.__name__ = getattr(convert, "__name__", "value")  # argparse names it in its errors
            kwargs["type"] = convert_or_none
            if kwargs.get("choices") is not None:
                kwargs["choices"] = [*kwargs["choices"], None]
        elif convert not in (None, str) and hint is not None and kwargs.get("choices") is None:  # text: a value
            default = self.options[name][2]

            def convert_not_none(text: str):  # argparse said `invalid float value: 'none'`, naming no fix
                if text in (*NULL_WORDS, *NONE_WORDS):
                    shown = str(default).lower() if isinstance(default, bool) else default
                    raise argparse.ArgumentTypeError(
                        f"cannot be unset (`{text}`): give a value (the default is {shown})"
                    )
                return convert(text)

            convert_not_none.__name__ = getattr(convert, "__name__", "value")
            kwargs["type"] = convert_not_none
        return super().add_argument(*names, **kwargs)


def option_parser() -> OptionParser:
    """The parser of the whole command line: every option of the four dataclasses, `--config` and `--help_all`."""
    parser = OptionParser(
        (ModelArguments, DataArguments, ScratchViTArguments, ImageClassificationTrainingArguments),
        prog=command_name(),
    )
    parser.add_argument("--config", metavar="FILE.yaml", help=CONFIG_HELP)
    parser.add_argument("--help_all", action="store_true", help="Show this help (`--help` is the short one).")
    return parser


# What `transformers.get_scheduler` passes to every schedule itself, beside `lr_scheduler_kwargs`.
SCHEDULE_ARGUMENTS = ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")


def check_scheduler_kwargs(args: TrainingArguments) -> None:
    """Refuse `lr_scheduler_kwargs` the schedule does not take or lacks now, not at the first step (a TypeError)."""
    kind = SchedulerType(args.lr_scheduler_type)
    name, schedule = kind.value, TYPE_TO_SCHEDULER_FUNCTION.get(kind)
    parameters = inspect.signature(schedule).parameters if schedule else {}
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return  # e.g. `reduce_lr_on_plateau`, which passes them on to torch
    given = args.lr_scheduler_kwargs or {}
    taken = [p for p in parameters if p not in SCHEDULE_ARGUMENTS]
    missing = [p for p in taken if parameters[p].default is inspect.Parameter.empty and p not in given]
    if {"min_lr", "min_lr_rate"} <= set(taken) and not given.keys() & {"min_lr", "min_lr_rate"}:
        missing.append("min_lr")  # the cosine schedules to a floor: one of the two
    if missing:
        raise ValueError(
            f"`lr_scheduler_type: {name}` needs {', '.join(missing)} in `lr_scheduler_kwargs` (it takes "
            f"{', '.join(taken)}), e.g. `--lr_scheduler_kwargs '{{\"{missing[0]}\": ...}}'`."
        )
    unknown = sorted(set(given) - set(taken))
    if unknown:
        raise ValueError(
            f"`lr_scheduler_kwargs` has {', '.join(unknown)}, which `lr_scheduler_type: {name}` does not take; it "
            f"takes {', '.join(taken) or 'none'}. Fix: drop or rename them, or choose the schedule that takes them."
        )


def check_push_possible(repo_id: str | None, token: str | None) -> None:
    """Refuse, before anything is trained, what would make `push_to_hub`'s push after training fail for certain."""
    later = "Nothing was trained; fix it, or drop `push_to_hub` and push later (`vit-finetune push RUN --repo_id ID`)."
    if not repo_id:
        raise ValueError(f"`push_to_hub: true` needs `hub_model_id` (e.g. `your-name/vit-cifar10`). {later}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ValueError(
            f"`hub_model_id: {repo_id}` is not a Hub repo id (namespace/name: letters, digits, '-', '_', '.'). {later}"
        ) from None
    switch = upload_switch()
    if switch:
        raise ValueError(f"`push_to_hub: true` with {switch}=1 set, which switches the Hub off. {later}")
    try:
        token = token or get_token()
    except Exception:  # a token read from elsewhere (an OIDC exchange) failed: the push will say why
        return
    if not token:
        raise ValueError(
            "`push_to_hub: true` needs a Hub token with write access: set HF_TOKEN, log in with `hf auth login`, or "
            f"pass `hub_token`. {later}"
        )


def check_batches(args: TrainingArguments, num_images: int) -> None:
    """The training batches one epoch of `num_images` gives each process, as accelerate shards them: none is refused
    (transformers would stop on `max_steps`); fewer than `gradient_accumulation_steps` (smaller steps) are said. A
    process's batch is `train_batch_size`: all its GPUs' where the Trainer splits it over several with DataParallel."""
    size, world, drop = args.train_batch_size, args.world_size, args.dataloader_drop_last
    batches = num_images // size // world if drop else math.ceil(math.ceil(num_images / size) / world)
    if batches == 0:
        raise ValueError(
            f"`dataloader_drop_last: true` drops every training image: {num_images:,} of them give no full batch of "
            f"{size} to each of {world} process(es). Lower `per_device_train_batch_size`, or drop the option."
        )
    if batches < args.gradient_accumulation_steps:
        steps, images = args.gradient_accumulation_steps, batches * size * world if drop else num_images
        logger.warning(
            f"`gradient_accumulation_steps: {steps}` is more than the {batches} batch(es) of {size} an epoch gives "
            f"each process, so each optimizer step averages {batches} (the epoch's {images:,} images, not "
            f"{steps * size * world:,}). Lower it, or train on more images."
        )


def build_training_args(options: dict, settings: hardware.Settings) -> ImageClassificationTrainingArguments:
    """The run's `TrainingArguments`: the options as given, with the settings chosen for this machine. On the CPU
    with several processes the gloo group starts here with `ddp_timeout`, which transformers does not pass on there
    (a frozen peer would block the others for 30 minutes; accelerate then joins this group), and every process takes
    process 0's precision (`bf16: auto` measures in each, and a CPU near the threshold could split). Where stderr is
    not a terminal (nor a notebook's), `disable_tqdm` defaults to true."""
    values = {**options, **settings.arguments}
    if values.get("disable_tqdm") is None and not sys.stderr.isatty() and not is_in_notebook():
        values["disable_tqdm"] = True  # a log file: a line per log (`ProgressLines`), not tqdm's redrawn bars
    if values["use_cpu"] and int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        timeout = timedelta(seconds=values.get("ddp_timeout", 1800))
        torch.distributed.init_process_group(values.get("ddp_backend") or "gloo", timeout=timeout)
    if values["use_cpu"] and torch.distributed.is_initialized():
        chosen = torch.tensor([int(bool(values["bf16"]))])
        torch.distributed.broadcast(chosen, src=0)
        if bool(chosen.item()) != bool(values["bf16"]):
            values["bf16"] = settings.precision.bf16 = bool(chosen.item())
            settings.precision.reasons.append("process 0's choice, which every process of the run takes")
    return ImageClassificationTrainingArguments(**values)
