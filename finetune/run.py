"""Fine-tune a pretrained ViT or train a ScratchViT (or both, then compare) on an image-classification dataset.

    accelerate launch finetune/run.py --config configs/cifar10_vit_b16.yaml [--key value ...]
    python finetune/run.py --config configs/quickstart.yaml

The YAML config is a flat map onto the argument dataclasses of `finetune/arguments.py` and transformers'
`TrainingArguments`; command-line values override it. Stages, as in transformers' example scripts: arguments and
logging, data, model, Trainer, training, evaluation, results, publishing.
"""

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import datasets
import transformers
from transformers import TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint


if __package__ in (None, ""):
    # `python finetune/run.py` / `accelerate launch finetune/run.py` run this file as a script: make the project
    # root importable so `finetune` resolves even without `pip install -e .`.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from finetune.arguments import DataArguments, ModelArguments, RunArguments, parse_args  # noqa: E402
from finetune.augment import BatchTransform, MixUpCutMix  # noqa: E402
from finetune.callbacks import training_callbacks  # noqa: E402
from finetune.data import ImageData, collate_batch, load_image_data  # noqa: E402
from finetune.metrics import compute_metrics, confusion_report  # noqa: E402
from finetune.models import build_model, count_parameters  # noqa: E402
from finetune.trainer import ImageClassificationTrainer, TrainingTimeCallback  # noqa: E402


logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Run the pipeline; returns the results of each trained model keyed by model type."""
    model_args, data_args, scratch_args, run_args, training_args = parse_args(argv)
    setup_logging(training_args)
    start = time.perf_counter()

    # Publishing is done once, at the end, by our own code: the Trainer would create the repo at start-up (failing
    # offline before any training) and push every checkpoint. The token is kept out of every saved file.
    push_to_hub, hub_token = training_args.push_to_hub, training_args.hub_token
    training_args.push_to_hub, training_args.hub_token = False, None

    model_types = ["pretrained", "scratch"] if model_args.model_type == "both" else [model_args.model_type]
    run_dirs = {
        t: Path(training_args.output_dir) / t if len(model_types) > 1 else Path(training_args.output_dir)
        for t in model_types
    }
    checkpoints = {t: resolve_checkpoint(run_dirs[t], training_args, run_args) for t in model_types}

    # ---- Data: decoded once into uint8 tensors (and cached); the main process decodes first, the others read it.
    target_size = scratch_args.image_size
    with training_args.main_process_first(desc="loading and decoding the dataset"):
        data = load_image_data(data_args, seed=training_args.data_seed or training_args.seed, target_size=target_size)

    results = {}
    for model_type in model_types:
        args = dataclasses.replace(training_args, output_dir=str(run_dirs[model_type]))
        args.push_to_hub, args.hub_token = False, None
        results[model_type] = train_and_evaluate(
            model_type, model_args, data_args, scratch_args, args, data, checkpoints[model_type], start, run_args
        )

    is_main = training_args.process_index == 0
    if is_main and len(model_types) > 1:
        from finetune.compare import write_comparison

        report = write_comparison([run_dirs[t] for t in model_types], Path(training_args.output_dir) / "comparison")
        logger.info(f"Comparison written to {report}")
    if is_main and push_to_hub:
        push_results(run_dirs, model_types, training_args, run_args, hub_token)

    from accelerate import PartialState

    # Processes that exit with the process group still up abort (gloo/NCCL); end it explicitly.
    PartialState().destroy_process_group()
    return results


def setup_logging(training_args: TrainingArguments) -> None:
    """Log to stdout: INFO on the main process, warnings only on the others (as the example scripts do)."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log:
        # The main process logs at INFO unless `log_level` says otherwise; replicas follow `log_level_replica`.
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    for name in ("finetune", "scratch_vit", __name__):
        logging.getLogger(name).setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.info(
        f"Process {training_args.process_index} of {training_args.world_size}, device {training_args.device}, "
        f"mixed precision: {mixed_precision(training_args)}"
    )


def mixed_precision(args: TrainingArguments) -> str:
    """`bf16`, `fp16` or `no`, from the arguments or `accelerate launch --mixed_precision`."""
    return str(args.mixed_precision)


def resolve_checkpoint(run_dir: Path, training_args: TrainingArguments, run_args: RunArguments) -> str | None:
    """The checkpoint to resume from, and a guard that never trains over an earlier run's work by accident."""
    resume = training_args.resume_from_checkpoint
    if resume is not None and str(resume).lower() in ("true", "last", "latest"):
        last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        if last is None:
            raise FileNotFoundError(
                f"`resume_from_checkpoint: {resume}` but {run_dir} holds no checkpoint-* folder. Train without it "
                "first, or pass the path of a checkpoint folder."
            )
        logger.info(f"Resuming from {last}")
        return last
    if resume is not None and str(resume).lower() not in ("false", "none", ""):
        if not os.path.isdir(resume):
            raise FileNotFoundError(f"`resume_from_checkpoint` {resume!r} is not a checkpoint folder.")
        return resume
    earlier = sorted(p.name for p in run_dir.glob("checkpoint-*")) + [
        p.name for p in (run_dir / "results.json",) if p.exists()
    ]
    if earlier and not run_args.overwrite_output_dir:
        raise FileExistsError(
            f"{run_dir} already holds an earlier run ({', '.join(earlier[:3])}). Nothing was changed. Fix: "
            "`--resume_from_checkpoint true` to continue it, a new `--output_dir`, or `--overwrite_output_dir true` "
            "to replace it."
        )
    if earlier and training_args.process_index == 0:
        # Asked to replace the run: its old checkpoints would otherwise mix with the new ones in rotation.
        logger.warning(f"--overwrite_output_dir: removing the earlier run's {', '.join(earlier)} in {run_dir}")
        for name in earlier:
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return None


def train_and_evaluate(
    model_type: str,
    model_args: ModelArguments,
    data_args: DataArguments,
    scratch_args,
    args: TrainingArguments,
    data: ImageData,
    checkpoint: str | None,
    start: float,
    run_args: RunArguments | None = None,
) -> dict:
    """Train one model, keep the best by validation accuracy, test it and write `results.json`."""
    logger.info(f"==== {model_type} model -> {args.output_dir}")
    set_seed(args.seed)
    model, processor, prep = build_model(model_type, model_args, scratch_args, data)
    batch_transform = BatchTransform(
        image_size=prep.image_size,
        mean=prep.image_mean,
        std=prep.image_std,
        in_channels=data.num_channels,
        out_channels=prep.num_channels,
        random_crop_padding=data_args.random_crop_padding,
        horizontal_flip=data_args.horizontal_flip,
        rand_augment_ops=data_args.rand_augment_ops,
        rand_augment_magnitude=data_args.rand_augment_magnitude,
    )
    mix = None
    if data_args.mixup_alpha > 0 or data_args.cutmix_alpha > 0:
        mix = MixUpCutMix(len(data.label_names), data_args.mixup_alpha, data_args.cutmix_alpha)
    timer = TrainingTimeCallback()
    budget_callbacks, ema = training_callbacks(run_args, model)
    trainer = ImageClassificationTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.validation,
        data_collator=collate_batch,
        compute_metrics=compute_metrics,
        processing_class=processor,
        callbacks=[timer, *budget_callbacks],
        batch_transform=batch_transform,
        mix=mix,
        flip_tta=run_args.flip_tta if run_args is not None else False,
        ema=ema,
    )

    # ---- Training. With `load_best_model_at_end` the best checkpoint by validation accuracy is reloaded here.
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    history = epoch_history(trainer.state.log_history)  # before the final evaluations add their own entries
    trainer.save_model()
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()

    # ---- Evaluation of the kept model: validation, then the test split (used only here), with a confusion matrix.
    validation = trainer.evaluate(data.validation, metric_key_prefix="eval")
    trainer.log_metrics("eval", validation)
    test = None
    if data.test is not None:
        prediction = trainer.predict(data.test, metric_key_prefix="test")
        test = prediction.metrics
        trainer.log_metrics("test", test)
        confusion_split = "test"
    else:
        prediction = trainer.predict(data.validation, metric_key_prefix="eval")
        confusion_split = "validation"
    confusion = confusion_report(prediction.predictions, prediction.label_ids, data.label_names)

    results = build_results(
        model_type=model_type,
        model_args=model_args,
        data=data,
        model=model,
        prep=prep,
        args=args,
        train_metrics=train_result.metrics,
        validation=validation,
        test=test,
        confusion={**confusion, "confusion_split": confusion_split},
        history=history,
        timer=timer,
        wall_time=time.perf_counter() - start,
    )
    # Where the training time went: the data path (loader + device transforms) against all training steps.
    results["train"].update(seconds=timer.train_seconds, data_seconds=trainer.data_seconds)
    if trainer.is_world_process_zero():
        with open(Path(args.output_dir) / "results.json", "w") as f:
            json.dump(results, f, indent=2)
        logger.info(f"Results written to {Path(args.output_dir) / 'results.json'}")
    return results


def _strip(metrics: dict | None, prefix: str) -> dict | None:
    if metrics is None:
        return None
    names = {
        "accuracy": "accuracy",
        "loss": "loss",
        "runtime": "runtime_seconds",
        "samples_per_second": "images_per_second",
    }
    return {names[k[len(prefix) + 1 :]]: v for k, v in metrics.items() if k[len(prefix) + 1 :] in names}


def epoch_history(log_history: list[dict]) -> list[dict]:
    """One row per evaluation: epoch, step, the last logged training loss before it, validation loss and accuracy."""
    rows, last_train_loss = [], None
    for entry in log_history:
        if "loss" in entry:
            last_train_loss = entry["loss"]
        if "eval_accuracy" in entry:
            rows.append(
                {
                    "epoch": entry.get("epoch"),
                    "step": entry.get("step"),
                    "train_loss": last_train_loss,
                    "eval_loss": entry.get("eval_loss"),
                    "eval_accuracy": entry["eval_accuracy"],
                    "elapsed_seconds": entry.get("elapsed_seconds"),
                }
            )
    return rows


def build_results(
    *, model_type, model_args, data, model, prep, args, train_metrics, validation, test, confusion, history,
    timer, wall_time,
) -> dict:  # fmt: skip
    """The run's `results.json`: everything the comparison report and the model card need."""
    total_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    # Steps x batch size overcounts the last, partial batch of each epoch by less than one batch.
    images_per_second = timer.steps * total_batch_size / timer.train_seconds if timer.train_seconds else None
    return {
        "run_name": args.run_name or Path(args.output_dir).name,
        "model_type": model_type,
        "model_name_or_path": model_args.model_name_or_path if model_type == "pretrained" else None,
        "architecture": type(model).__name__,
        "dataset": data.source,
        "label_names": list(data.label_names),
        "image_size": prep.image_size[0],
        "num_parameters": count_parameters(model),
        "num_samples": {
            "train": len(data.train),
            "validation": len(data.validation),
            "test": len(data.test) if data.test is not None else None,
        },
        "epochs": float(train_metrics.get("epoch", args.num_train_epochs)),
        "hyperparameters": {
            "learning_rate": args.learning_rate,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "total_train_batch_size": total_batch_size,
            "num_train_epochs": args.num_train_epochs,
            "optim": str(getattr(args.optim, "value", args.optim)),
            "lr_scheduler_type": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
            "warmup_steps": args.warmup_steps,
            "weight_decay": args.weight_decay,
            "label_smoothing_factor": args.label_smoothing_factor,
            "seed": args.seed,
            "mixed_precision": mixed_precision(args),
            "attn_implementation": model.config._attn_implementation,
            "world_size": args.world_size,
        },
        "train": {
            "loss": train_metrics.get("train_loss"),
            "runtime_seconds": train_metrics.get("train_runtime"),
            "images_per_second": images_per_second,
        },
        "validation": _strip(validation, "eval"),
        "test": _strip(test, "test"),
        **confusion,
        "wall_time_seconds": wall_time,
        "train_images_per_second": images_per_second,
        "history": history,
    }


def push_results(run_dirs, model_types, training_args, run_args, token) -> None:
    """Push each trained model to the Hub (`hub_model_id`, suffixed by the model type when both were trained)."""
    from finetune.hub import push_output_dir

    if not training_args.hub_model_id:
        raise ValueError("`push_to_hub: true` needs `hub_model_id` (e.g. `your-name/vit-cifar10`).")
    for model_type in model_types:
        repo_id = training_args.hub_model_id + (f"-{model_type}" if len(model_types) > 1 else "")
        url = push_output_dir(
            run_dirs[model_type],
            repo_id=repo_id,
            private=training_args.hub_private_repo,
            revision=training_args.hub_revision,
            commit_message=run_args.hub_commit_message,
            token=token,
        )
        logger.info(f"Pushed {run_dirs[model_type]} to {url}")


if __name__ == "__main__":
    main()
