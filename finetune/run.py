"""Fine-tune a pretrained ViT or train a ScratchViT (or both, then compare) on an image-classification dataset.

    accelerate launch -m finetune.run --config configs/cifar10_vit_b16.yaml [--key value ...]
    python -m finetune.run --config configs/quickstart.yaml        (or `python finetune/run.py`, `vit-finetune train`)

`main` runs `run_pipeline`, the stages of transformers' example scripts: arguments, settings and logging, data,
model, Trainer, training, evaluation, results, publishing. The options are described in finetune/arguments.py."""

import contextlib
import copy
import dataclasses
import itertools
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path


if __package__ in (None, ""):
    # Run as a script (`python finetune/run.py`): the project root importable without `pip install -e .`.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if __name__ == "__main__":
    # `--help` answers before torch, transformers and datasets are imported (6 s on a 2-core CPU).
    from finetune.arguments import answer_help

    answer_help(sys.argv[1:])

import datasets  # noqa: E402
import torch.distributed  # noqa: E402
import transformers  # noqa: E402
from transformers import TrainerState, TrainingArguments, set_seed  # noqa: E402
from transformers.dynamic_module_utils import custom_object_save  # noqa: E402
from transformers.trainer import TRAINER_STATE_NAME  # noqa: E402

from finetune import hardware  # noqa: E402
from finetune.arguments import (  # noqa: E402
    DataArguments,
    ModelArguments,
    is_set,
    parse_options,
    scratch_config_kwargs,
    stated_options,
)
from finetune.augment import (  # noqa: E402
    BatchTransform,
    CenterShare,
    describe_augmentation,
    training_recipe,
    use_random_resized_crop,
)
from finetune.callbacks import number, option, saved_options, total_batch_size  # noqa: E402
from finetune.checkpoints import (  # noqa: E402
    FINISHED,
    RemoveEarlierRun,
    cut_short,
    earlier_run,
    lock_output_dir,
    numbered_checkpoints,
    release_output_dirs,
    resolve_checkpoint,
)
from finetune.data import ImageData, check_separate_files, collate_batch, load_image_data  # noqa: E402
from finetune.errors import (  # noqa: E402
    NO_ROOM_FIX,
    Interrupted,
    in_words,
    one_line,
    out_of_space,
    run_command,
    signal_name,
)
from finetune.locations import check_folder  # noqa: E402
from finetune.metrics import compute_metrics, confusion_report, multi_label_report, multi_label_scores  # noqa: E402
from finetune.models import (  # noqa: E402
    attention_head_size,
    build_model,
    check_local_checkpoint,
    check_model_path,
    check_stochastic_depth,
    count_parameters,
    hub_errors,
    storage_size,
    weights_fingerprint,
)
from finetune.results import (  # noqa: E402
    RESULTS_NAME,
    EvalMetrics,
    Results,
    TrainMetrics,
    dataset_location,
    history_from_log_history,
    results_of_model,
)
from finetune.trainer import ImageClassificationTrainer, balanced_class_weights, check_optimizer  # noqa: E402
from finetune.training_args import (  # noqa: E402
    ImageClassificationTrainingArguments,
    build_training_args,
    check_batches,
    check_push_possible,
)


logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> dict[str, Results]:
    """Run the pipeline; returns the results of each trained (or evaluated) model keyed by model type."""
    try:
        return run_pipeline(argv)
    finally:
        release_output_dirs()
        # Processes that exit with the process group still up abort (gloo/NCCL); end it, after an error too.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_pipeline(argv: list[str] | None = None) -> dict[str, Results]:
    with stage("starting, before anything was written", RERUN, every_process=True):
        # ---- Arguments, then the settings this machine gives each `auto` (precision, compilation, CPU or GPU): a step
        # of its own, so that building the arguments probes nothing (finetune/training_args.py says why).
        model_args, data_args, scratch_args, options = parse_options(argv)
        settings = hardware.choose_settings(options)
        if settings.cpu_threads is not None:
            torch.set_num_threads(settings.cpu_threads)
        training_args = build_training_args(options, settings)
        check_model_and_output_dir(model_args, training_args)
        check_outside_the_data(data_args, training_args.output_dir)
        check_optimizer(training_args)
        setup_logging(training_args, settings)
        if training_args.n_gpu > 1:  # one process sees several GPUs: the Trainer splits each batch with DataParallel
            logger.warning(
                f"This process trains on {training_args.n_gpu} GPUs with DataParallel, slower than a process per GPU: "
                f"launch one on each (`accelerate launch --multi_gpu --num_processes {training_args.n_gpu} -m "
                "finetune.run ...`), or train on one (`CUDA_VISIBLE_DEVICES=0`)."
            )
        # Publishing is done once, at the end, by our own code: the Trainer would create the repo at start-up (failing
        # offline before any training) and push every checkpoint. The token is kept out of every saved file.
        push_to_hub, hub_token = training_args.push_to_hub, training_args.hub_token
        training_args.push_to_hub, training_args.hub_token = False, None

        # Refusals before the warnings of ignored options: a warning's "Fix: drop them" was followed by the error.
        if not training_args.do_train:
            check_evaluation_only(model_args, push_to_hub)
        else:
            check_separate_files(data_args)
            if training_args.teacher_model_name_or_path:
                teacher_config(training_args.teacher_model_name_or_path)
        stated = stated_options(sys.argv[1:] if argv is None else argv)
        if model_args.model_type == "pretrained" or not training_args.do_train:
            warn_of_scratch_options(scratch_args, training_args.do_train, stated)
        elif model_args.model_type == "scratch":
            warn_of_pretrained_options(model_args, stated)
        if not training_args.do_train:
            warn_of_training_options(model_args, data_args, scratch_args, training_args)
        output_dir = Path(training_args.output_dir)
        both = ("pretrained", "scratch") if model_args.model_type == "both" else ()
        run_dirs = {t: output_dir / t for t in both} or {model_args.model_type: output_dir}
        if push_to_hub and len(run_dirs) > 1:  # pushed as hub_model_id-pretrained and -scratch: ids of their own
            for model_type in run_dirs:
                check_push_possible(f"{training_args.hub_model_id}-{model_type}", hub_token)
        lock_output_dir(training_args.output_dir, training_args)  # one run per folder; `main` releases it
        if training_args.do_train:
            kept = {name: getattr(model_args, name) for name in ("layer_decay", "finetune_method")}
            both_models = len(run_dirs) > 1
            checkpoints = {
                t: resolve_checkpoint(run_dir, training_args, both_models, kept) for t, run_dir in run_dirs.items()
            }
            check_recipe_of_finished(run_dirs, checkpoints, training_args)
        else:
            check_no_earlier_results(run_dirs[model_args.model_type], training_args)

    with peers_answering(training_args):
        # ---- Data: decoded once (and cached) by the main process first. Photos are stored at the model's input size
        # plus a margin for RandomResizedCrop; a saved model is scored on the pixels its run scored (results.json),
        # else as its processor frames a photo (a ScratchViT's too: the options given now do not shape it).
        model_type = model_args.model_type if training_args.do_train else "pretrained"
        scored = None if training_args.do_train else results_of_model(model_args.model_name_or_path)
        if scored is not None and scored.stored_image_size:
            target_size = max(scored.stored_image_size)
        else:
            margin = training_args.do_train and data_args.random_resized_crop != "false"
            target_size = storage_size(model_type, model_args, scratch_args, margin)
            if training_args.do_train and training_args.teacher_model_name_or_path:  # a larger teacher: at its size
                teacher_args = ModelArguments(model_name_or_path=training_args.teacher_model_name_or_path)
                target_size = max(target_size, storage_size("pretrained", teacher_args, scratch_args, margin))
        doing = "loading and decoding the dataset"
        with (
            stage(f"{doing}, before training started", f"Rerun the same command {REUSED}.", every_process=True),
            training_args.main_process_first(desc=doing),
        ):
            if training_args.do_train and model_type != "scratch" and scratch_args.drop_path_rate is not None:
                check_stochastic_depth(model_args, scratch_args.drop_path_rate)  # not after the data loaded
            data = load_image_data(data_args, seed=data_seed(training_args), target_size=target_size)
        # The run's figures would be of images the evaluated model, its starting point or its teacher learned.
        if not training_args.do_train:
            check_held_out_as_trained(model_args.model_name_or_path, data_args, training_args, data)
        else:
            check_batches(training_args, len(data.train))
            if model_args.model_type != "scratch":
                check_held_out_as_trained(model_args.model_name_or_path, data_args, training_args, data, "model")
            if training_args.teacher_model_name_or_path:
                teacher_path = training_args.teacher_model_name_or_path
                check_held_out_as_trained(teacher_path, data_args, training_args, data, "teacher")

        results = {}
        for i, (model_type, run_dir) in enumerate(run_dirs.items()):
            # A copy, not `dataclasses.replace`: the arguments are already resolved (`auto` precision and its reason).
            args = copy.copy(training_args)
            args.output_dir = str(run_dir)
            if not training_args.do_train:
                results[model_type] = evaluate_only(model_args, data_args, args, settings, data)
            elif checkpoints[model_type] == FINISHED:
                logger.info(f"==== {model_type} model: finished earlier, kept as it is ({run_dir})")
                results[model_type] = Results.load(run_dir)
            else:
                next_model = next((t for t in list(run_dirs)[i + 1 :] if checkpoints[t] != FINISHED), None)
                results[model_type] = train_and_evaluate(
                    model_type,
                    model_args,
                    data_args,
                    scratch_args,
                    args,
                    settings,
                    data,
                    checkpoints[model_type],
                    next_model,
                )

        if training_args.process_index == 0:
            report = None
            if len(run_dirs) > 1:
                from finetune.tools.compare import write_comparison

                kept = "Both models finished and are kept: `--resume_from_checkpoint true` writes it without training."
                with stage("writing the comparison", kept):
                    report = write_comparison(list(run_dirs.values()), output_dir / "comparison")
            print(summary(results, run_dirs, report), flush=True)
            if push_to_hub:
                push_results(run_dirs, training_args, hub_token)
        return results


def warn_of_scratch_options(scratch_args, do_train: bool, stated: set[str]) -> None:
    """Warn of ScratchViT options `stated` that a pretrained or evaluated model ignores (`drop_path_rate` it takes)."""
    ignored = [f"--{name}" for name in scratch_config_kwargs(scratch_args) if name in stated - {"drop_path_rate"}]
    if ignored:
        by, fix = ("`model_type: pretrained`", ", or train a ScratchViT with `model_type: scratch` (or `both`)")
        by, fix = (by, fix) if do_train else ("`do_train: false`", "")
        if do_train and "--image_size" in ignored:  # the way to fine-tune a checkpoint at another resolution
            fix += "; to fine-tune it at another size, `image_processor_name`: an image processor of that size"
        logger.warning(
            f"{', '.join(ignored)}: ScratchViT options, ignored by {by}, which keeps the architecture and resolution "
            f"of `model_name_or_path`. Fix: drop them{fix}."
        )


# The options only training uses, that an evaluation (`do_train: false`) names as ignored where given (a config of the
# run, say). The evaluation loss is plain cross-entropy, as timm's: runs compare whatever their label smoothing.
TRAINING_OPTIONS = """
    label_smoothing_factor finetune_method lora_r lora_alpha lora_dropout lora_target_modules merge_lora
    layer_decay random_resized_crop crop_scale crop_ratio random_crop_padding horizontal_flip rand_augment_ops
    rand_augment_magnitude random_erasing learning_rate num_train_epochs max_steps weight_decay warmup_steps
    lr_scheduler_type per_device_train_batch_size gradient_accumulation_steps max_train_minutes budget_schedule
    ema_decay mixup_alpha cutmix_alpha early_stopping_patience early_stopping_threshold class_weighting
    teacher_model_name_or_path distillation_type distillation_alpha distillation_temperature max_nonfinite_steps
    optim optim_args adam_beta1 adam_beta2 adam_epsilon max_grad_norm lr_scheduler_kwargs drop_path_rate
""".split()


def warn_of_training_options(*options) -> None:
    """Warn of training options given to `do_train: false` (a run's config reused, say)."""
    given = [f"`{name}`" for o in options for name in TRAINING_OPTIONS if hasattr(o, name) and is_set(o, name)]
    if given:
        logger.warning(
            f"{', '.join(given)}: training options, ignored by `do_train: false`, which scores `model_name_or_path` "
            "as it was saved."
        )


def warn_of_pretrained_options(model_args: ModelArguments, stated: set[str]) -> None:
    """Warn of pretrained-model options `stated` that `model_type: scratch` ignores (a run's folder to train on)."""
    names = [name for name in ("model_name_or_path", "image_processor_name") if name in stated]
    ignored = [f"--{name}" for name in names if is_set(model_args, name)]
    if ignored:
        logger.warning(
            f"{', '.join(ignored)}: ignored by `model_type: scratch`, which trains a new ScratchViT from random "
            "weights, at `image_size`. Fix: `model_type: pretrained` to train on from a saved model (a run's folder "
            "too), or drop them."
        )


@contextlib.contextmanager
def peers_answering(training_args: TrainingArguments):
    """A peer that froze, was stopped or died ends the run with one line in every process still running, after
    `ddp_timeout` seconds (the process group's timeout, also on the CPU: `build_training_args`)."""
    try:
        yield
    except RuntimeError as error:
        # gloo reports a peer's timeout or closed connection as a plain RuntimeError naming its transport.
        transport = isinstance(error, torch.distributed.DistError) or re.search(r"gloo|NCCL|[Cc]onnection", str(error))
        if training_args.world_size == 1 or not transport:
            raise
        # An evaluation saves no checkpoint: any in its folder are another run's.
        then = resume_or_rerun(Path(training_args.output_dir)) if training_args.do_train else RERUN
        raise RuntimeError(
            f"Another process of this run stopped answering: it was stopped, died or froze (waited at most "
            f"`ddp_timeout` = {training_args.ddp_timeout:g} s; {one_line(error, 200)}). {then} Raise `ddp_timeout` "
            "only where a process legitimately works alone that long (the first decode of a large dataset)."
        ) from error


@contextlib.contextmanager
def stage(doing: str, then: str | Callable[[], str], every_process: bool = False):
    """A stage outside the training loop (where `InterruptCallback` answers signals): a signal ends the run with one
    line saying what it was `doing` and what to do `then`. Errors of a stage where `every_process` does the same work
    on the same inputs (start-up, data) are said once (`errors.said_elsewhere`)."""
    try:
        yield
    except Exception as error:
        if out_of_space(error):  # said with the way on from this stage (a resume where checkpoints are kept)
            then = then() if callable(then) else then
            full = OSError(f"{in_words(error, 160)} while {doing}: {NO_ROOM_FIX}; then: {then}")
            full.every_process = every_process
            raise full from error
        if every_process:
            error.every_process = True
        raise
    except KeyboardInterrupt as error:
        if isinstance(error, Interrupted) and not error.generic:
            raise  # it says how to go on already (InterruptCallback's stop, a stage's)
        signum = getattr(error, "signum", signal.SIGINT)
        then = then() if callable(then) else then
        raise Interrupted(f"stopped by {signal_name(signum)} while {doing}. {then}", signum) from None


REUSED = "(splits already decoded into the cache are reused)"
RERUN = "Nothing was saved: rerun the same command."


def resume_or_rerun(out: Path, resume_for: str = "") -> str:
    """The way on after a stop: resume where `out` (or, under `both`, a model's folder in it) holds checkpoints."""
    checkpoints = [*out.glob("checkpoint-*"), *out.glob("*/checkpoint-*")]
    if not all(map(cut_short, checkpoints)):
        return f"Its checkpoints are kept: resume with `--resume_from_checkpoint true`{resume_for}."
    if checkpoints:  # a save stopped or failed midway, the first: `true` would refuse them
        return "No checkpoint was saved whole: rerun the same command with `--resume_from_checkpoint auto`."
    return RERUN


# What the summary names in a run's folder where it is there, and the file that shows it is.
WRITTEN = (("model", "config.json"), ("merged/", "merged"), ("results.json", "results.json"),
           ("predictions_*.csv", "predictions_*.csv"), ("confusion_matrix.png", "confusion_matrix.png"),
           ("checkpoint-*", "checkpoint-*"))  # fmt: skip


def summary(results: dict[str, Results], run_dirs: dict[str, Path], report: Path | None) -> str:
    """The closing lines of a run: each model's scores, training time and files, and the comparison's summary."""
    lines = ["", "Summary"]
    for model_type, result in results.items():
        name, key = ("mAP", "map") if result.multi_label else ("accuracy", "accuracy")
        scores = f"validation {name} {getattr(result.validation, key):.2%}"
        if result.test is not None:
            scores += f", test {name} {getattr(result.test, key):.2%}"
        if result.train.seconds:
            seconds = result.train.seconds
            scores += f", {seconds:.{0 if seconds >= 10 else 1}f} s of training"  # not "0 s" for a run of 0.4 s
        lines.append(f"  {result.model_type}: {scores}")  # an evaluation's: what the model is
        written = ", ".join(name for name, pattern in WRITTEN if any(run_dirs[model_type].glob(pattern)))
        lines.append(f"    files: {run_dirs[model_type]}/ ({written})")
    if report is not None:
        section = report.read_text().split("## Summary", 1)[-1].strip().splitlines()
        lines += ["", *itertools.takewhile(lambda line: line.startswith("|"), section)]
        lines.append(f"  comparison report: {report} (with {report.parent / 'learning_curves.png'})")
    return "\n".join(lines)


class ConsoleFormatter(logging.Formatter):
    """Information as plain lines; warnings and errors prefixed with their level."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno == logging.INFO:
            return message
        level = record.levelname.lower()
        if message.lower().startswith(f"{level}:"):  # transformers' "Warning: The following arguments do not match"
            message = message[len(level) + 1 :].lstrip()
        return f"{level}: {message}"


def setup_logging(training_args: TrainingArguments, settings: hardware.Settings) -> None:
    """The pipeline's own lines at INFO on the main process (warnings only on the others, as the example scripts do),
    the libraries' at WARNING unless `log_level` asks for more."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(ConsoleFormatter())
    logging.basicConfig(handlers=[handler])  # a no-op where the root logger has handlers already (tests, notebooks)
    # `log_level` / `log_level_replica` as the Trainer reads them; `passive` on the main process: INFO for ours only.
    passive_main = training_args.should_log and training_args.log_level == "passive"
    ours = logging.INFO if passive_main else training_args.get_process_log_level()
    libraries = logging.WARNING if passive_main else ours
    for name in ("finetune", "scratch_vit", __name__):
        logging.getLogger(name).setLevel(ours)
    # Every process reads the data and the options the main process read first: their warnings (skipped files, unused
    # options) are said by that one alone, unless `log_level_replica` asks the others for more. Errors still end each.
    if not training_args.should_log and ours >= logging.WARNING:
        for name in ("finetune.data", "finetune.training_args", __name__):
            logging.getLogger(name).setLevel(logging.ERROR)
    datasets.utils.logging.set_verbosity(libraries)
    transformers.utils.logging.set_verbosity(libraries)
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.enable_propagation()  # through our handler and format
    transformers.utils.logging.disable_progress_bar()  # a bar per weight file written or read; the Trainer's stay
    # Said at every checkpoint rotation on file systems with coarse timestamps; the order falls back correctly.
    logging.getLogger("transformers.trainer_utils").addFilter(lambda r: "mtime may not be reliable" not in r.msg)
    # Said when a resumed run whose training had ended takes no step (`ResumedEarlyStopping`, the budget say why).
    logging.getLogger("transformers.trainer").addFilter(lambda r: "not to be a single sample" not in str(r.msg))
    logger.info(
        f"Process {training_args.process_index} of {training_args.world_size}, device {training_args.device}, "
        f"mixed precision: {training_args.mixed_precision} ({settings.summary})"
    )
    for warning in settings.warnings:
        logger.warning(warning)


def check_model_and_output_dir(model_args: ModelArguments, training_args: TrainingArguments) -> None:
    """Before any data is loaded: a local model the run reads must be a complete classifier that the run does not
    write into (saving would replace weights, config and labels; `overwrite_output_dir` would delete checkpoints), nor
    may it replace files of the user's."""
    if not training_args.output_dir.strip():
        raise ValueError(
            "`output_dir` is empty, which would write the run into the current folder. Name a folder, e.g. "
            "`--output_dir outputs/run`."
        )
    check_folder(training_args.output_dir, "`output_dir`")  # it, or a folder it would be made in, a file
    output = Path(training_args.output_dir).expanduser().resolve()
    # The folders the run writes into (saves, checkpoint rotation, cleanup): under `both`, one per model.
    run_dirs = [output / "pretrained", output / "scratch"] if model_args.model_type == "both" else [output]
    if model_args.model_type == "both" and training_args.do_train:  # found after training, a file in their way
        from finetune.tools.compare import check_report_folder

        for folder in run_dirs:
            check_folder(folder, "`output_dir`")
        check_report_folder(output / "comparison", "`output_dir`")
    if not training_args.do_train:
        reads = {"the model to evaluate": model_args.model_name_or_path}
    else:
        pretrained = model_args.model_name_or_path if model_args.model_type != "scratch" else None
        reads = {"the pretrained model": pretrained, "the teacher": training_args.teacher_model_name_or_path}
    for what, path in reads.items():  # a path that looks local but is no folder, here rather than after the data
        if path:
            check_model_path(path, "teacher_model_name_or_path" if what == "the teacher" else "model_name_or_path")
    sources = {what: path for what, path in reads.items() if path and is_local(path)}
    for what, path in sources.items():
        model = Path(path).expanduser().resolve()
        for run_dir in run_dirs:
            if run_dir == model or model in run_dir.parents or run_dir in model.parents:
                relation = "is" if run_dir == model else "is inside" if model in run_dir.parents else "contains"
                raise ValueError(
                    f"`output_dir` {training_args.output_dir}: the run's folder {run_dir} {relation} {what} {path}, "
                    "which it would overwrite or mix with. Nothing was written. Choose an `output_dir` outside that "
                    "folder."
                )
    for run_dir in run_dirs if training_args.do_train else []:  # an evaluation writes neither file
        theirs = [name for name in ("README.md", "config.json") if (run_dir / name).is_file()]
        if theirs and not (earlier_run(run_dir) or (run_dir / "trainer_state.json").exists()):
            raise FileExistsError(
                f"`output_dir` {run_dir} holds {', '.join(theirs)} of no earlier run, which training would replace. "
                "Nothing was written. Fix: a new or empty folder as `--output_dir`, or an earlier run's."
            )
    check_not_in_another_run(output, run_dirs, model_args.model_type, training_args.do_train)
    for what, path in sources.items():  # an export, an evaluation's results, a LoRA checkpoint-*, ...: one line each
        check_local_checkpoint(Path(path).expanduser(), model_args.trust_remote_code and what != "the teacher")


def train_and_evaluate(
    model_type: str,
    model_args: ModelArguments,
    data_args: DataArguments,
    scratch_args,
    args: ImageClassificationTrainingArguments,
    settings: hardware.Settings,
    data: ImageData,
    checkpoint: str | None,
    next_model: str | None = None,
) -> Results:
    """Train one model, keep the best by validation, test it and write `results.json`; `next_model`: the one trained
    next (`model_type: both`), which a signal after the last step (the results written first) keeps from starting."""
    start = time.perf_counter()
    output_dir = Path(args.output_dir)
    logger.info(f"==== {model_type} model -> {args.output_dir}")
    set_seed(args.seed)
    # Under `both` the other model's folder refuses a plain rerun; resuming resumes or starts each model.
    resume = " with `--resume_from_checkpoint true`" if model_args.model_type == "both" else ""
    rerun = f"Rerun the same command{resume} {REUSED}."
    # Not `every_process`: placing the model on a device can fail in one process alone (a GPU another job fills).
    with stage(f"building the {model_type} model, before it trained", rerun):
        model_args, attention_why = choose_attention(model_type, model_args, scratch_args, args)
        model, processor, prep = build_model(model_type, model_args, scratch_args, data)
        trainer = make_trainer(
            model, processor, prep, data_args, args, data, model_args.layer_decay, settings.compile,
            model_args.convert_channels, model_args.finetune_method,
        )  # fmt: skip

    # ---- Training. With `load_best_model_at_end` the best checkpoint by validation accuracy is reloaded here.
    if checkpoint is None or Path(checkpoint).resolve().parent != output_dir.resolve():  # another run's checkpoint
        trainer.add_callback(RemoveEarlierRun(output_dir))  # once a resumed checkpoint has passed its checks
    # A signal before the first step (the optimizer, a resumed checkpoint's loading) is answered by the stage; after
    # it, by `InterruptCallback`, which saves a checkpoint first.
    with stage(f"training the {model_type} model", lambda: rerun if resume else resume_or_rerun(output_dir)):
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
    # ---- After training: a signal from here on is answered here (`InterruptCallback` only acts while training).
    with stage(
        f"saving and evaluating the {model_type} model after training",
        lambda: resume_or_rerun(output_dir, " for the evaluation and results"),
    ):
        history = history_from_log_history(trainer.state.log_history)  # before the final evaluations add their own
        card = output_dir / "README.md"
        earlier_card = card.read_bytes() if card.is_file() else None
        trainer.save_model()
        if hasattr(model, "peft_config") and trainer.is_world_process_zero():
            save_lora_model(model, processor, output_dir, model_args.merge_lora, earlier_card)
        # The whole run's training (`RunClock` keeps its totals across a resume): transformers' `train_result.metrics`
        # are this session's (a resumed finished run: loss 0), for train_results.json as for the at-chance warning.
        figures = trainer.clock.figures(args)
        train = TrainMetrics(
            loss=figures["train_loss"],
            seconds=figures["train_runtime"],
            steps=trainer.clock.steps,
            nonfinite_steps=trainer.guard.bad_steps,
            stopped_by=trainer.stopped_by,
            images_per_second=figures["train_samples_per_second"],
        )
        trainer.save_metrics("train", {**train_result.metrics, **figures})
        trainer.save_state()

        # ---- Evaluation of the kept model: validation, then the test split (used only here), each scored once.
        on_validation = trainer.predict(data.validation, metric_key_prefix="eval")
        if trainer.is_world_process_zero():
            warn_if_at_chance(on_validation.metrics, data, train.loss)
        on_test = trainer.predict(data.test, metric_key_prefix="test") if data.test is not None else None

        chosen = {"attention_choice": attention_why, "torch_compile": trainer.compiler.summary()}
        chosen["augmentation"] = training_recipe(trainer.batch_transform, args.mixup_alpha, args.cutmix_alpha)
        if data.validation_held_out:  # an evaluation holds out the same split: `check_held_out_as_trained`
            chosen["validation_size"] = data_args.validation_size
            chosen["held_out_images"] = data.validation_held_out
        chosen.update(evaluated_subsets(data_args))
        results = Results(
            model_type=model_type,
            model_name_or_path=model_args.model_name_or_path if model_type == "pretrained" else None,
            model_is_local=is_local(model_args.model_name_or_path) if model_type == "pretrained" else None,
            teacher_is_local=is_local(args.teacher_model_name_or_path) if args.teacher_model_name_or_path else None,
            **evaluated_model_fields(args, model, prep, data, on_validation, on_test, start),
            epochs=float(train_result.metrics.get("epoch", args.num_train_epochs)),
            num_trainable_parameters=count_parameters(model, trainable=True),
            hyperparameters=hyperparameters(args, settings, model, model_type, model_args, chosen),
            train=train,
            history=history,
        )
        if trainer.is_world_process_zero():
            logger.info(f"Results written to {results.save(output_dir)}")
    if next_model and trainer.interrupt.deferred:
        signum = trainer.interrupt.deferred
        raise Interrupted(
            f"stopped by {signal_name(signum)} after the {model_type} model's last step; its results are written "
            f"and the {next_model} model has not started. Go on with the same command and "
            "`--resume_from_checkpoint true`.",
            signum,
        )
    return results


def warn_if_at_chance(metrics: dict, data: ImageData, train_loss: float | None) -> None:
    """Warn when the kept model is no better than always answering the largest class (multi-label: a constant score):
    a run that diverged with a finite loss (or learned nothing) must not pass for a result."""
    labels = data.validation.labels
    if data.multi_label:
        name, score, baseline = "mAP", metrics.get("eval_map"), "a constant score"
        shares = labels.float().mean(0)  # (K,) the mAP of a constant score, per label with positives
        chance = float(shares[shares > 0].mean()) if bool((shares > 0).any()) else 1.0
    else:
        name, score, baseline = "accuracy", metrics.get("eval_accuracy"), "always the largest class"
        chance = float(labels.bincount().max()) / len(labels) if len(labels) else 1.0
    if score is not None and score <= chance + 0.01:
        loss = "" if train_loss is None else f"; training loss {train_loss:.4g}"
        logger.warning(
            f"Validation {name} {score:.2%} is at chance level ({chance:.2%}, {baseline}{loss}): the model learned "
            "nothing. Check the learning rate (a diverged run can keep a finite loss), the labels and the epochs."
        )


def evaluated_model_fields(args, model, prep, data: ImageData, on_validation, on_test, start: float) -> dict:
    """The `Results` fields of a trained or an evaluation-only run alike; the confusion report is of the test split
    where there is one (multi-label data: the per-label report, at thresholds chosen on validation)."""
    prediction, confusion_split = (on_validation, "validation") if on_test is None else (on_test, "test")
    logits, labels, names = prediction.predictions, prediction.label_ids, data.label_names
    if data.multi_label:
        report = multi_label_report(logits, labels, names, on_validation.predictions, on_validation.label_ids)
        # Micro and macro F1 at those thresholds too, as the per-label figures and the predictions CSVs: the Trainer's
        # are at 0.5. On validation, where the thresholds were chosen, they are optimistic.
        thresholds = list(report["per_class_threshold"].values())
        for prefix, split in (("eval", on_validation), ("test", on_test)):
            if split is not None:
                scores = multi_label_scores(split.predictions, split.label_ids, thresholds)
                split.metrics.update({f"{prefix}_{key}": value for key, value in scores.items()})
    else:
        report = confusion_report(logits, labels, names)
    return {
        "validation": EvalMetrics.from_trainer(on_validation.metrics, "eval"),
        "test": EvalMetrics.from_trainer(on_test.metrics if on_test else None, "test"),
        "run_name": args.run_name or Path(args.output_dir).name,
        "architecture": type(model.get_base_model() if hasattr(model, "peft_config") else model).__name__,
        "dataset": data.source,
        "dataset_fingerprint": data.fingerprint,
        "dataset_location": dataset_location(data.source),
        "label_names": list(data.label_names),
        "image_size": prep.image_size[0],
        "stored_image_size": list(data.train.image_size),
        "num_parameters": count_parameters(model),
        "hardware": {**hardware.describe(args.device), "world_size": args.world_size},
        **report,  # confusion_matrix and the per-class figures
        "multi_label": data.multi_label,
        "confusion_split": confusion_split,
        "num_samples": {
            **({"train": len(data.train)} if args.do_train else {}),
            "validation": len(data.validation),
            "test": len(data.test) if data.test is not None else None,
        },
        "training_image_copies": data.training_image_copies,
        "wall_seconds": time.perf_counter() - start,
    }


# The `DataArguments` that `BatchTransform` takes as they are.
AUGMENTATION_OPTIONS = ("random_crop_padding", "horizontal_flip", "rand_augment_ops", "rand_augment_magnitude",
                        "random_erasing", "crop_scale", "crop_ratio")  # fmt: skip


def make_trainer(
    model,
    processor,
    prep,
    data_args: DataArguments,
    args,
    data: ImageData,
    layer_decay: float | None = None,
    compile_choice: hardware.CompileChoice | None = None,
    convert_channels: bool = True,
    finetune_method: str = "full",
) -> ImageClassificationTrainer:
    """The Trainer of one model, with the batch transform that feeds it at its resolution and normalisation."""
    # A peft model's forward takes **kwargs, from which the Trainer cannot tell that `labels` are the labels.
    args.label_names = args.label_names or ["labels"]
    metric = (args.metric_for_best_model or "").removeprefix("eval_")
    if data.multi_label and metric == "accuracy":
        args.metric_for_best_model = "map"  # several labels per image have no accuracy: the best mAP is kept
        logger.info("Multi-label data: the best model is the one of the highest validation mAP.")
    elif not data.multi_label and metric == "map":
        raise ValueError("`metric_for_best_model: map` is for data with several labels per image; use `accuracy`.")
    augmentation = {name: getattr(data_args, name) for name in AUGMENTATION_OPTIONS}
    crop = use_random_resized_crop(data_args.random_resized_crop, data.train.image_size, prep.image_size)
    if crop and args.do_train and is_set(data_args, "random_crop_padding"):
        stored, size = ("x".join(map(str, s)) for s in (data.train.image_size, prep.image_size))
        logger.warning(
            f"`random_crop_padding: {data_args.random_crop_padding}` is ignored: training crops with "
            f"RandomResizedCrop (`random_resized_crop: {data_args.random_resized_crop}`; images stored at {stored}, "
            f"the model takes {size}). Fix: `--random_resized_crop false` for the padded crop, or drop "
            "`random_crop_padding`."
        )
    boxes = [f"`{name}`" for name in ("crop_scale", "crop_ratio") if is_set(data_args, name)]
    if boxes and not crop and args.do_train:
        logger.warning(
            f"{' and '.join(boxes)} ignored: training crops with the padded random crop, not RandomResizedCrop "
            f"(`random_resized_crop: {data_args.random_resized_crop}`; images stored at "
            f"{'x'.join(map(str, data.train.image_size))}). Fix: `--random_resized_crop true`, or drop them."
        )
    teacher, teacher_prep, teacher_transform = None, None, None
    if args.do_train and args.teacher_model_name_or_path:
        teacher, teacher_prep = load_teacher(args.teacher_model_name_or_path, model, data, convert_channels)
    # RandomResizedCrop's boxes at the larger of the two models' sizes: a larger teacher sees them at its own.
    crop_size = tuple(map(max, prep.image_size, teacher_prep.image_size)) if teacher_prep else None
    batch_transform = BatchTransform.for_model(
        prep, data.num_channels, random_resized_crop=crop, crop_size=crop_size, **augmentation
    )
    mixing = {"mixup_alpha": args.mixup_alpha, "cutmix_alpha": args.cutmix_alpha, "flip_tta": bool(args.flip_tta)}
    logger.info(describe_augmentation(batch_transform, args.do_train, **mixing))
    weighted = args.class_weighting == "balanced" and args.do_train
    class_weights = balanced_class_weights(data.train.labels, data.label_names) if weighted else None
    if teacher is not None:
        # Only its `frame` and `finish` run: the teacher takes the student's augmented images, not augmentations of
        # its own, framed by the student's share of the image; where the teacher's evaluation crops a smaller centre
        # (resize 10, crop 8), it sees that within them (the whole image it saw scored 62% where the teacher has 88%).
        teacher_transform = BatchTransform.for_model(
            teacher_prep, data.num_channels, random_crop_padding=0, horizontal_flip=False
        )
        student, own = (getattr(t.frame, "share", (1.0, 1.0)) for t in (batch_transform, teacher_transform))
        share = (1.0, 1.0) if crop else tuple(min(1.0, t / s) for t, s in zip(own, student))  # a box: as it is
        teacher_transform.frame = CenterShare(share) if share != (1.0, 1.0) else torch.nn.Identity()
    return ImageClassificationTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.validation,
        data_collator=collate_batch,
        compute_metrics=compute_metrics,
        # timm's lives in config.json (`pretrained_cfg`); its save_pretrained only warns that it is disabled.
        processing_class=None if getattr(processor, "data_config", None) else processor,
        batch_transform=batch_transform,
        layer_decay=layer_decay,
        compile_choice=compile_choice,
        class_weights=class_weights,
        teacher=teacher,
        teacher_transform=teacher_transform,
        data_options={
            # The same data by its place (the real paths of local data, or the Hub id): another dataset with the same
            # classes went on silently, its evaluations in one history with the first's.
            "dataset": dataset_key(data_args),
            "validation_size": data_args.validation_size if data.validation_held_out else None,
            "held_out_images": data.validation_held_out or None,  # of the whole train split, every class's
            "validation_images": data.validation_images,  # the same count of other images, where files changed
            "split_redrawn": bool(data.validation_held_out)
            and not data.multi_label
            and data.label_names != data.all_label_names,
            **{name: getattr(data_args, name) for name in ("include_labels", "max_train_samples", "max_eval_samples")},
            "stored_image_size": list(data.train.image_size),  # the pixels trained and scored so far
            # A teacher retrained at the same path (or updated on the Hub) is another teacher.
            "teacher_weights": weights_fingerprint(teacher) if teacher is not None else None,
            # The learning rate of each layer, which the saved optimizer state holds (as `learning_rate`), and the
            # weights it trains, which the checkpoint holds (adapters, the head, or all).
            "layer_decay": layer_decay,
            "finetune_method": finetune_method,
            # Said when changed, not refused (`RECIPE_OPTIONS`).
            "augmentation": {
                name: getattr(data_args, name) for name in ("random_resized_crop", *AUGMENTATION_OPTIONS)
            },
        },
    )


def teacher_config(path: str):
    """The config of the teacher at `path` (`teacher_model_name_or_path`), read before the data loads (a Hub id
    offline failed after it, and the student's build)."""
    local_fix = (
        f"`teacher_model_name_or_path` {path!r} holds no trained classifier (no config.json). Pass a run's output "
        "directory or a checkpoint-* folder."
    )
    with hub_errors("teacher", path, local_fix, option="teacher_model_name_or_path"):
        return transformers.AutoConfig.from_pretrained(path)


def load_teacher(path: str, student, data: ImageData, convert_channels: bool = True):
    """The teacher at `path` and its `Preprocessing`; its labels must be the student's, in the same order, or
    distillation would teach wrong classes."""
    from finetune.models import config_label_names, load_trained_model

    config = teacher_config(path)  # the labels, checked before the weights are read
    teacher_labels, student_labels = config_label_names(config), config_label_names(student.config)
    if teacher_labels != student_labels:
        raise ValueError(
            f"The teacher {path} classifies {teacher_labels[:10]} but the student {student_labels[:10]} "
            f"({len(teacher_labels)} and {len(student_labels)} classes): distillation needs the same labels in the "
            "same order. Teach with a model trained on this dataset and classes (`include_labels` in the teacher's "
            "order), or drop `teacher_model_name_or_path`."
        )
    teacher_args = ModelArguments(model_name_or_path=path, attn_implementation=None, convert_channels=convert_channels)
    teacher, _, prep = load_trained_model(teacher_args, data)
    logger.info(f"Teacher: {type(teacher).__name__} from {path} at {prep.image_size[0]} px ({config.model_type}).")
    return teacher, prep


def save_lora_model(model, processor, output_dir: Path, merge: bool, earlier_card: bytes | None = None) -> None:
    """Next to the adapter: the fine-tuned `config.json` (its labels, to load the base with the right head), and with
    `merge` the merged model in `output_dir/merged`. The README.md peft's `save_pretrained` wrote goes (back to
    `earlier_card`): `card` would keep it as edited by hand, and `push` upload it in place of the run's card."""
    card = output_dir / "README.md"
    if earlier_card is None:
        card.unlink(missing_ok=True)
    else:
        card.write_bytes(earlier_card)
    base = model.get_base_model()
    base.config.save_pretrained(output_dir)
    if getattr(base.config, "auto_map", None):  # remote code (ScratchViT): the modeling file config.json names
        custom_object_save(base, output_dir)
    if merge:
        merged = copy.deepcopy(model).merge_and_unload()
        merged.save_pretrained(output_dir / "merged")
        processor.save_pretrained(output_dir / "merged")
        logger.info(f"Merged model (adapters folded into the weights) written to {output_dir / 'merged'}")


def is_local(model_name_or_path: str) -> bool:
    """Whether a model (or data) path is a local folder (else a Hub id)."""
    return os.path.isdir(os.path.expanduser(model_name_or_path))


def check_evaluation_only(model_args: ModelArguments, push_to_hub: bool) -> None:
    if model_args.model_type == "both":
        raise ValueError(
            "`do_train: false` evaluates one saved model, but `model_type: both` trains two. Fix: `model_type: "
            "pretrained` (or `scratch`) with `model_name_or_path` set to the model's folder."
        )
    if model_args.model_type == "scratch" and not is_local(model_args.model_name_or_path):
        raise ValueError(
            "`do_train: false` with `model_type: scratch` needs a trained ScratchViT to score: set "
            "`model_name_or_path` to its run's output directory or one of its checkpoint-* folders."
        )
    if push_to_hub:
        raise ValueError("`do_train: false` trains no model to push: drop `push_to_hub`, or push the model's own run.")


def check_outside_the_data(data_args: DataArguments, output_dir: str) -> None:
    """Never write inside the folder of images the run reads: its next read would take the files for images or
    classes (`outputs/` became a class of its own), and a decoded cache there changed the data it is keyed by (every
    run decoded again, and a trained model's evaluation was refused as on files changed since)."""
    cache = data_args.decoded_cache_dir
    written = {"output_dir": output_dir, "decoded_cache_dir": None if str(cache).lower() == "none" else cache}
    for name, where in written.items():
        output = Path(where).expanduser().resolve() if where else None
        for path in (data_args.dataset_name, data_args.train_file, data_args.validation_file, data_args.test_file):
            folder = Path(path).expanduser().resolve() if path and is_local(path) else None
            if output is not None and folder is not None and (output == folder or folder in output.parents):
                raise ValueError(
                    f"`{name}` {where} is inside the data folder {path}, where the run's files would be read as "
                    f"data the next time. Nothing was written. Fix: a `--{name}` outside it."
                )


def check_not_in_another_run(output: Path, run_dirs: list[Path], model_type: str, training: bool = True) -> None:
    """Training never writes into a checkpoint of another run (a mix of two runs), nor beside a run of the other
    layout (`model_type: both`'s pretrained/ and scratch/, or one model's at the top), which compare leaves out; an
    evaluation never at the top of a `both` run's folder."""
    for run_dir in run_dirs if training else []:
        if (run_dir / "trainer_state.json").is_file() and run_dir in numbered_checkpoints(run_dir.parent):
            raise FileExistsError(
                f"`output_dir` {run_dir} is a checkpoint of the run in {run_dir.parent}, which training would "
                f"overwrite. Nothing was written. Fix: a new `--output_dir`, or resume that run with `--output_dir "
                f"{run_dir.parent} --resume_from_checkpoint {run_dir}`."
            )
    layouts = ["pretrained", "scratch"] if model_type != "both" else ["."]
    found = [name for name in layouts if (output / name / RESULTS_NAME).is_file()]
    if found:
        what = "of one model" if model_type == "both" else "of `model_type: both` (" + ", ".join(found) + ")"
        this = f"this {model_type} run" if training else "this evaluation's results"
        raise FileExistsError(
            f"`output_dir` {output} holds a finished run {what}, which {this} would be mixed with (a "
            "comparison of the folder would leave one out). Nothing was written. Fix: a new `--output_dir`."
        )


# The options a `model_type: both` run trains both models with: the comparison sets them side by side as one recipe.
SHARED_RECIPE = ("learning_rate", "total_train_batch_size", "num_train_epochs", "max_steps", "optim")
SHARED_RECIPE += ("lr_scheduler_type", "warmup_steps", "weight_decay", "label_smoothing_factor", "seed")


def check_recipe_of_finished(run_dirs: dict[str, Path], checkpoints: dict, args) -> None:
    """Refuse to train one model of a resumed `both` run with other options than the one that finished trained with
    (its results.json's): the report compared the two as one recipe, exit 0."""
    if FINISHED not in checkpoints.values() or all(c == FINISHED for c in checkpoints.values()):
        return  # nothing trains beside a finished model
    now = {name: option(args, name) for name in SHARED_RECIPE if hasattr(args, name)}
    now.update(total_train_batch_size=total_batch_size(args), max_steps=args.max_steps if args.max_steps > 0 else None)
    for model_type, run_dir in run_dirs.items():
        if checkpoints[model_type] != FINISHED:
            continue
        saved = {"max_steps": None, **Results.load(run_dir).hyperparameters}  # recorded where > 0
        if saved["max_steps"] is not None and now["max_steps"] is not None:
            saved.pop("num_train_epochs", None)  # ignored under `max_steps`
        changed = [
            f"{name} {number(saved[name])} (now {number(now[name])})"
            for name in SHARED_RECIPE
            if name in saved and saved[name] != now[name]
        ]
        if changed:
            raise ValueError(
                f"The {model_type} model ({run_dir}) finished with {', '.join(changed)}, and the comparison would set "
                "the other model's new values beside them as one recipe. Nothing was changed. Fix: resume with the "
                "options it was trained with, or a new `--output_dir` to train both anew."
            )


def check_no_earlier_results(run_dir: Path, args: ImageClassificationTrainingArguments) -> None:
    earlier = [p.name for p in (run_dir / RESULTS_NAME, *run_dir.glob("predictions_*.csv")) if p.exists()]
    # results.json is written last: without it the files are of an evaluation stopped midway, which this one redoes.
    if RESULTS_NAME in earlier and not args.overwrite_output_dir:
        raise FileExistsError(
            f"{run_dir} already holds {', '.join(earlier)}. Nothing was changed. Fix: a new `--output_dir` for the "
            "evaluation, or `--overwrite_output_dir true` to replace them (checkpoints and weights are kept)."
        )


def check_held_out_as_trained(
    path: str, data_args: DataArguments, args: ImageClassificationTrainingArguments, data: ImageData, role: str = ""
) -> None:
    """An evaluation of the model at `path`, or a run that starts from it or that it teaches (`role`: "model",
    "teacher"), that holds out its validation split from train holds out the one the model was trained without (seed,
    data_seed, the images held out of the whole train split): another holds images it trained on."""
    if not data.validation_held_out:
        return
    trained = results_of_model(path)
    model = f"The {'pretrained model' if role == 'model' else role} {path}" if role else path
    this = "this run's" if args.do_train else "this evaluation's"
    if trained is None:  # a checkpoint of a run still training, or stopped: its split as its checkpoint saved it
        recorded = checkpoint_options(path)
        if recorded.get("dataset") is None or recorded["dataset"] != dataset_key(data_args):
            return
        same = changed = True
    else:
        recorded = trained.hyperparameters
        # A local dataset: the same files, however the path is spelt; a Hub id (or older results.json): the name.
        fingerprint, local = trained.dataset_fingerprint, os.path.exists(os.path.expanduser(data.source))
        same = fingerprint == data.fingerprint if fingerprint and local else trained.dataset == data.source
        changed = trained.dataset_location is not None and trained.dataset_location == dataset_location(data.source)
    trained_classes = trained.label_names if trained else recorded.get("include_labels") or data.all_label_names
    if not data.multi_label and not set(trained_classes) & set(data.label_names):
        return  # it trained on none of these classes' images (a source model of other classes)
    if not same and changed and not recorded.get("evaluation_only"):
        raise ValueError(
            f"{model} was trained on {data.source} as it was then: its files have changed since, so {this} held-out "
            "validation split is not the one the model was trained without, and may hold images it trained on. Fix: "
            "the data as it was, or a validation split of its own (`validation_file`, or a validation/ folder)."
        )
    if not same or recorded.get("evaluation_only") or "seed" not in recorded:
        return
    held_out, trained_size = recorded.get("held_out_images"), recorded.get("validation_size")
    if held_out is None and trained_classes != data.all_label_names and not data.multi_label:
        raise ValueError(
            f"{model} was trained on some classes of {data.source} (`include_labels`), holding out its validation "
            f"split from their images alone, as runs did before the split was drawn from every class (its results "
            f"have no `held_out_images`): {this} split may hold images it trained on. Fix: train it again, or a "
            "validation split of its own (`validation_file`, or a validation/ folder)."
        )
    if held_out is None and trained_size is not None and trained_size >= 1:  # saved before it was recorded
        held_out = int(trained_size)  # a number of the whole train split's images then
    trained_data_seed = recorded.get("data_seed")
    trained_seed = recorded["seed"] if trained_data_seed is None else trained_data_seed
    seed, size = data_seed(args), data_args.validation_size
    flag = "seed" if trained_data_seed is None and args.data_seed is None else "data_seed"  # `data_seed` overrides
    fixes = [f"`--{flag} {trained_seed}`"] if trained_seed != seed else []
    if held_out is not None and held_out != data.validation_held_out:
        # A fraction holds out the same share of every class, whatever `include_labels`; a number is of its images.
        fixes.append(
            f"`--validation_size {trained_size:g}`"
            if trained_size is not None and trained_size < 1
            else f"a `validation_size` that holds out {held_out} images of the whole train split, as it did (now "
            f"{data.validation_held_out}; a fraction holds out the same share of every class)"
        )
    elif held_out is None and trained_size not in (None, size):
        fixes.append(f"`--validation_size {trained_size:g}`")
    if not fixes:
        return
    fix = " and ".join(fixes) + (f", or a {role} trained with this run's split" if role else "")
    raise ValueError(
        f"{model} was trained on {data.source} holding out its validation split with seed {trained_seed}"
        f"{f', validation_size {trained_size:g}' if trained_size else ''}: {this} (seed {seed}, validation_size "
        f"{size:g}) would hold out images it trained on. Fix: {fix}."
    )


def dataset_key(data_args: DataArguments) -> str:
    """The data as a checkpoint records it (`ResumeCheck`): real local paths, however spelt, or the Hub id."""
    names = (data_args.dataset_name, data_args.dataset_config_name, data_args.train_file, data_args.validation_file)
    names += (data_args.test_file,)
    paths = [os.path.expanduser(name) for name in names if name]
    return ", ".join(os.path.realpath(path) if os.path.exists(path) else path for path in paths)


def checkpoint_options(path: str) -> dict:
    """The options a checkpoint's run trained with, as it saved them (`saved_options`), or {} for another folder."""
    state_file = Path(path).expanduser() / TRAINER_STATE_NAME
    try:
        return saved_options(TrainerState.load_from_json(str(state_file))) if state_file.is_file() else {}
    except (OSError, ValueError, TypeError):
        return {}  # resuming or loading it says what is wrong with it


def data_seed(args: ImageClassificationTrainingArguments) -> int:
    """The seed of the data's split and subsets, as the Trainer reads `data_seed` for its sampler: `seed` if unset."""
    return args.seed if args.data_seed is None else args.data_seed


def evaluate_only(
    model_args: ModelArguments,
    data_args: DataArguments,
    args: ImageClassificationTrainingArguments,
    settings: hardware.Settings,
    data: ImageData,
) -> Results:
    """Score the saved model `model_name_or_path` without training it: `results.json`, `confusion_matrix.png` (not for
    multi-label data) and `predictions_<split>.csv` per split."""
    from finetune.models import load_trained_model
    from finetune.tools.predict import run_flip_tta
    from finetune.tools.report import plot_confusion_matrix, write_predictions_csv

    start = time.perf_counter()
    logger.info(f"==== evaluating {model_args.model_name_or_path} (no training) -> {args.output_dir}")
    set_seed(args.seed)
    trained = results_of_model(model_args.model_name_or_path)
    if args.flip_tta is None:  # as its run's figures (and predict's probabilities) are: with the mirror image or not
        args.flip_tta = run_flip_tta(trained)
        if args.flip_tta:
            logger.info("flip_tta: on, as the model's run evaluated (`--flip_tta false` scores each image alone).")
    with stage("loading the model to evaluate", RERUN, every_process=True):  # the same files in every process
        model_args, attention_why = choose_attention("pretrained", model_args, None, args)
        model, processor, prep = load_trained_model(model_args, data)
    with stage("evaluating the model, before its results were written", RERUN):
        trainer = make_trainer(model, processor, prep, data_args, args, data, compile_choice=settings.compile)
        splits = {"validation": "eval", **({"test": "test"} if data.test is not None else {})}
        predictions = {s: trainer.predict(getattr(data, s), metric_key_prefix=p) for s, p in splits.items()}
    # What the evaluated model is, not the `model_type` given: as the run that trained it recorded it (a ScratchViT
    # fine-tuned from a scratch run's folder is `pretrained`), else `scratch` for a ScratchViT (not a LoRA adapter).
    if trained is not None and trained.model_type:
        model_type = trained.model_type
    else:
        scratch_vit = model.config.model_type == "scratch_vit" and not hasattr(model, "peft_config")
        model_type = "scratch" if scratch_vit else "pretrained"
    output_dir = Path(args.output_dir)
    results = Results(
        model_type=model_type,
        model_name_or_path=model_args.model_name_or_path,
        model_is_local=is_local(model_args.model_name_or_path),
        **evaluated_model_fields(args, model, prep, data, predictions["validation"], predictions.get("test"), start),
        hyperparameters={
            "evaluation_only": True,
            "per_device_eval_batch_size": args.per_device_eval_batch_size,
            "mixed_precision": str(args.mixed_precision),
            "attn_implementation": model.config._attn_implementation,
            "attention_choice": attention_why,
            "world_size": args.world_size,
            **({"flip_tta": True} if args.flip_tta else {}),
            # The images scored, as a training run records them: compare tells other splits apart by them.
            "seed": args.seed,
            **({"data_seed": args.data_seed} if args.data_seed is not None else {}),
            **({"validation_size": data_args.validation_size} if data.validation_held_out else {}),
            **({"held_out_images": data.validation_held_out} if data.validation_held_out else {}),
            **evaluated_subsets(data_args),
        },
    )
    if trainer.is_world_process_zero():
        for split, prediction in predictions.items():
            path = write_predictions_csv(
                output_dir / f"predictions_{split}.csv",
                prediction.predictions,
                prediction.label_ids,
                data.label_names,
                thresholds=list(results.per_class_threshold.values()),
                positions=getattr(data, split).positions,
                files=getattr(data, split).files,
            )
            logger.info(f"Predictions of the {split} split written to {path}")
        if not data.multi_label:
            plot_confusion_matrix(
                results.confusion_matrix,
                results.label_names,
                f"{results.run_name}\n{results.confusion_split} split, normalized per true class",
                output_dir / "confusion_matrix.png",
            )
        logger.info(f"Results written to {results.save(output_dir)}")
    return results


def choose_attention(
    model_type: str, model_args: ModelArguments, scratch_args, args: ImageClassificationTrainingArguments
) -> tuple[ModelArguments, str]:
    """`model_args` with `attn_implementation` resolved for this machine and precision, and the reason."""
    head_size = attention_head_size(model_type, model_args, scratch_args)
    if head_size is None:
        # No attention heads in the config (ConvNeXt), or timm's own attention, which transformers' TimmWrapper
        # does not switch: an explicit kernel would be recorded without effect (or refused with transformers' message).
        if model_args.attn_implementation not in (None, "auto"):
            logger.warning(
                f"`attn_implementation: {model_args.attn_implementation}` has no effect on this model (it has no "
                "transformers attention layers to switch): it keeps its own. Fix: leave the option at `auto`."
            )
        return dataclasses.replace(model_args, attn_implementation=None), "the model's default"
    bf16 = args.bf16 or args.mixed_precision == "bf16"
    attention, attention_why = hardware.choose_attention(
        model_args.attn_implementation, args.device.type, bf16, head_size
    )
    logger.info(f"Attention: {attention} ({attention_why})")
    return dataclasses.replace(model_args, attn_implementation=attention), attention_why


def evaluated_subsets(data_args: DataArguments) -> dict:
    """`max_eval_samples` where set: the evaluated splits are then seeded subsets, which other seeds draw otherwise."""
    return {"max_eval_samples": data_args.max_eval_samples} if data_args.max_eval_samples else {}


# Recorded only where they are on (not None, False, 0 or `none`); the distillation settings only with a teacher.
OPTIONAL_SETTINGS = ("max_train_minutes", "budget_schedule", "ema_decay", "mixup_alpha", "cutmix_alpha",
                     "flip_tta", "early_stopping_patience", "early_stopping_threshold", "class_weighting")  # fmt: skip
DISTILLATION_SETTINGS = (
    "teacher_model_name_or_path", "distillation_type", "distillation_alpha", "distillation_temperature"
)  # fmt: skip
ADAM_SETTINGS = ("adam_beta1", "adam_beta2", "adam_epsilon")
OFF = (None, False, 0, "none")


def hyperparameters(args, settings: hardware.Settings, model, model_type: str, model_args: ModelArguments, chosen):
    """The settings a reader of the results needs to reproduce them."""
    method = model_args.finetune_method if model_type == "pretrained" else "full"
    values = {
        "learning_rate": args.learning_rate,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "total_train_batch_size": total_batch_size(args),
        "num_train_epochs": args.num_train_epochs,
        **({"max_steps": args.max_steps} if args.max_steps > 0 else {}),  # it overrides the epochs
        "optim": args.optim.value,
        "lr_scheduler_type": args.lr_scheduler_type.value,
        "warmup_steps": args.warmup_steps,
        "weight_decay": args.weight_decay,
        **{name: getattr(args, name) for name in ADAM_SETTINGS if "adam" in args.optim.value},
        "max_grad_norm": args.max_grad_norm,
        **{name: getattr(args, name) for name in ("optim_args", "lr_scheduler_kwargs") if getattr(args, name)},
        "label_smoothing_factor": args.label_smoothing_factor,
        "seed": args.seed,
        **({"data_seed": args.data_seed} if args.data_seed is not None else {}),  # 0 too
        "mixed_precision": str(args.mixed_precision),
        "tf32": args.tf32,
        "precision_choice": settings.precision.summary,
        "attn_implementation": model.config._attn_implementation,
        "world_size": args.world_size,
        **{name: getattr(args, name) for name in OPTIONAL_SETTINGS if getattr(args, name) not in OFF},
        **{name: getattr(args, name) for name in DISTILLATION_SETTINGS if args.teacher_model_name_or_path},
        **chosen,
        "finetune_method": method,
    }
    if method == "lora":
        values.update({name: getattr(model_args, name) for name in ("lora_r", "lora_alpha", "lora_dropout")})
        values["lora_target_modules"] = model_args.lora_target_modules or "default (query and value projections)"
    if model_args.layer_decay is not None:
        values["layer_decay"] = model_args.layer_decay
    if getattr(model.config, "drop_path_rate", None):  # stochastic depth, a ScratchViT's or a pretrained model's
        values["drop_path_rate"] = model.config.drop_path_rate
    if args.gradient_accumulation_steps > 1:  # folded into total_train_batch_size
        values["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    if args.load_best_model_at_end:  # the validation figure that chose the kept model
        values["metric_for_best_model"] = args.metric_for_best_model
    return values


def push_results(run_dirs, training_args, token) -> None:
    """Push each trained model to the Hub (suffixed by the model type under `both`); a failed push does not stop the
    next, and the error at the end names the command that retries each failed one."""
    from finetune.tools.hub import HubPushError, push_output_dir, retry_command

    # `hub_model_id` is checked with the arguments, before anything is trained (`finetune/training_args.py`).
    options = {
        "private": training_args.hub_private_repo,
        "revision": training_args.hub_revision,
        "commit_message": training_args.hub_commit_message,
    }
    failed = {}
    for model_type, run_dir in run_dirs.items():
        repo_id = training_args.hub_model_id + (f"-{model_type}" if len(run_dirs) > 1 else "")
        try:
            url = push_output_dir(run_dir, repo_id=repo_id, token=token, **options)
        except HubPushError as error:
            if len(run_dirs) == 1:
                raise  # its message says why and how to retry
            logger.error(str(error))
            failed[model_type] = retry_command(run_dir, repo_id, **options)
            continue
        logger.info(f"Pushed {run_dir} to {url}")
    if failed:
        raise HubPushError(
            f"Pushing {' and '.join(failed)} to the Hub failed (why: logged above); every local file is still in "
            f"place. Retry with: {' ; '.join(failed.values())}"
        )


if __name__ == "__main__":
    sys.exit(run_command(main))
