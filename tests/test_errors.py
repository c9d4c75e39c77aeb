"""Bad input stops `finetune/run.py` early with an error that names the problem and the fix."""

import dataclasses
import io
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_run import tiny_vit_checkpoint
from transformers import Trainer

from finetune import run
from finetune.arguments import parse_args
from finetune.errors import UsageError


SCRATCH = ["--model_type", "scratch", "--image_size", "8", "--patch_size", "2", "--hidden_size", "8",
           "--num_hidden_layers", "1", "--num_attention_heads", "2", "--num_train_epochs", "1",
           "--decoded_cache_dir", "none"]  # fmt: skip


def write_yaml(path, text):
    path.write_text(text)
    return str(path)


def test_yaml_values_are_typed_and_the_command_line_overrides_them(tmp_path):
    config = write_yaml(tmp_path / "c.yaml", "model_type: scratch\nlearning_rate: 2e-5\nhidden_size: 96\n"
                        "num_train_epochs: 3\nhorizontal_flip: false\nreport_to: [tensorboard]\n")  # fmt: skip
    model_args, data_args, scratch_args, training_args = parse_args(
        ["--config", config, "--num_train_epochs", "5", "--output_dir", str(tmp_path)]
    )
    assert model_args.model_type == "scratch"
    assert training_args.learning_rate == 2e-5 and isinstance(training_args.learning_rate, float)
    assert training_args.num_train_epochs == 5
    assert scratch_args.hidden_size == 96 and scratch_args.patch_size is None
    assert data_args.horizontal_flip is False
    assert training_args.report_to == ["tensorboard"]
    # The pipeline's own defaults: keep the best model by validation accuracy.
    assert training_args.load_best_model_at_end and training_args.metric_for_best_model == "accuracy"


def test_unknown_yaml_key_is_named_with_a_suggestion(tmp_path):
    config = write_yaml(tmp_path / "c.yaml", "hiden_size: 64\nlearning_rate: 1e-3\n")
    with pytest.raises(ValueError, match=r"(?s)'hiden_size'.*Did you mean 'hidden_size'"):
        parse_args(["--config", config])


def test_unknown_command_line_key_is_named(tmp_path):
    with pytest.raises(UsageError, match=r"'--learnig_rate' \(Did you mean '--learning_rate'\?\)"):
        parse_args(["--learnig_rate", "3"])
    with pytest.raises(UsageError, match=r"'configs/quickstart.yaml'.*Did you mean `--config configs/quickstart"):
        parse_args(["configs/quickstart.yaml"])
    # transformers' example script's names get what replaces them, not a guess
    with pytest.raises(UsageError, match=r"'--train_val_split' \(transformers' example script's; here: `validation"):
        parse_args(["--train_val_split", "0.15"])


def test_other_scripts_option_names_point_to_this_one(tmp_path):
    # The closest spelling answered `--batch_size` with `--patch_size`, and `--freeze` with nothing.
    with pytest.raises(UsageError, match=r"'--freeze' \(here: `finetune_method: linear_probe`") as error:
        parse_args(["--freeze", "--batch_size", "8"])
    assert "'--batch_size' (here: `per_device_train_batch_size`" in str(error.value)
    assert "patch_size" not in str(error.value)
    config = write_yaml(tmp_path / "c.yaml", "lr: 1.0e-3\n")
    with pytest.raises(ValueError, match=r"'lr' \(here: `learning_rate`\)"):
        parse_args(["--config", config])


def test_missing_config_file():
    with pytest.raises(FileNotFoundError, match="does-not-exist.yaml"):
        parse_args(["--config", "does-not-exist.yaml"])


def test_missing_dataset_path(tmp_path):
    missing = tmp_path / "no_such_data.parquet"
    with pytest.raises(FileNotFoundError, match="no_such_data.parquet"):
        run.main([*SCRATCH, "--dataset_name", str(missing), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "results.json").exists()


def test_dataset_without_label_column(tmp_path):
    import datasets

    image = Image.new("RGB", (8, 8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": buffer.getvalue(), "path": None}] * 4, "target": [0, 1, 0, 1]}
    )
    ds = ds.cast_column("image", datasets.Image())
    path = tmp_path / "train.parquet"
    ds.to_parquet(str(path))
    with pytest.raises(ValueError, match=r"(?s)target.*label_column_name"):
        run.main([*SCRATCH, "--dataset_name", str(path), "--output_dir", str(tmp_path / "out")])


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--num_channels", "2"], r"(?s)2-channel.*1 channel.*num_channels: 1"),
        (["--num_channels", "3", "--convert_channels", "false"], r"(?s)3-channel.*convert_channels: true"),
    ],
)
def test_model_channels_that_disagree_with_the_data(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        run.main([*SCRATCH, *extra, "--dataset_name", "sklearn:digits", "--output_dir", str(tmp_path / "out")])


def test_hub_model_unreachable_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"(?s)google/vit-base-patch16-224-in21k.*HF_HUB_OFFLINE.*local directory"):
        run.main(["--model_type", "pretrained", "--dataset_name", "sklearn:digits", "--decoded_cache_dir", "none",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_local_model_path_that_does_not_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)not a directory.*Hub model id"):
        run.main(["--model_type", "pretrained", "--model_name_or_path", str(tmp_path / "missing_model"),
                  "--dataset_name", "sklearn:digits", "--decoded_cache_dir", "none",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_a_model_file_is_refused_with_its_folder(tmp_path, monkeypatch):
    """A weights file given for the model (in the current folder: no path separator, so a Hub id to transformers)
    was read as a config.json and reported as the Hub being off."""
    monkeypatch.chdir(tmp_path)
    Path("model.safetensors").write_bytes(b"weights")
    with pytest.raises(FileNotFoundError, match=r"^`model_name_or_path` 'model.safetensors' is a file\. Pass the fo"):
        run.main(["--model_type", "pretrained", "--model_name_or_path", "model.safetensors",
                  "--dataset_name", "/nonexistent/data", "--output_dir", "out"])  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_a_classifier_that_returns_no_logits_is_refused_before_the_data_loads(tmp_path):
    """PP-LCNet's ForImageClassification returns its scores as `last_hidden_state`, with no loss: training failed at
    the first step with an AttributeError, after the data loaded."""
    import transformers

    if not hasattr(transformers, "PPLCNetConfig"):
        pytest.skip("this transformers has no PP-LCNet")
    model = tmp_path / "lcnet"
    config = transformers.PPLCNetConfig(scale=0.25, class_expand=16, num_labels=3)
    transformers.PPLCNetForImageClassification(config).save_pretrained(model)
    transformers.PPLCNetImageProcessor().save_pretrained(model)
    refused = r"^.*lcnet is a PPLCNetForImageClassification, whose output \(BaseModelOutputWithNoAttention\) holds no"
    with pytest.raises(ValueError, match=refused):
        run.main(["--model_type", "pretrained", "--model_name_or_path", str(model), "--dataset_name",
                  "/nonexistent/data", "--output_dir", str(tmp_path / "out")])  # fmt: skip
    from finetune.tools import predict

    with pytest.raises(ValueError, match=refused):
        predict.load_classifier(model)


def test_a_teacher_path_that_does_not_exist_is_named_before_the_data_loads(tmp_path):
    """It was tried as a Hub id after the data loaded and the model was built ("Repo id must be in the form")."""
    with pytest.raises(FileNotFoundError, match=r"^`teacher_model_name_or_path` .*_teacher. is not a directory"):
        run.main([*SCRATCH, "--dataset_name", "/nonexistent/data", "--teacher_model_name_or_path",
                  str(tmp_path / "missing_teacher"), "--output_dir", str(tmp_path / "out")])  # fmt: skip
    assert not (tmp_path / "out").exists()
    # A Hub id offline: named before the data loads too, with the fix ("Pass ... a Hub id" was said of a Hub id,
    # offline, after the data loaded and the student was built).
    hub = r"^Could not load the teacher 'google/vit-base-patch16-224': the Hub is switched off \(HF_HUB_OFFLINE=1\)"
    with pytest.raises(OSError, match=hub + r".*pass the local directory as `teacher_model_name_or_path`\.$"):
        run.main([*SCRATCH, "--dataset_name", "/nonexistent/data", "--teacher_model_name_or_path",
                  "google/vit-base-patch16-224", "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_invalid_scratch_config_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"(?s)`hidden_size` \(8\).*`num_attention_heads` \(3\)"):
        run.main([*SCRATCH, "--num_attention_heads", "3", "--dataset_name", "sklearn:digits",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip


STEPS = ["--eval_strategy", "steps", "--save_strategy", "steps", "--eval_steps", "5"]


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--num_train_epochs", "0"], r"Nothing to train.*`num_train_epochs` > 0"),
        (["--num_train_epochs", "-2"], r"Nothing to train"),
        (["--max_steps", "0"], r"^Nothing to train: `max_steps` is 0\. Drop it .*, or set `max_steps` > 0\.$"),
        (["--warmup_steps", "-1"], r"^`warmup_steps` must be >= 0 .*, got -1\.0\.$"),
        (["--seed", "-1"], r"^`seed` must be an integer in \[0, 2\*\*32 - 1\], got -1\.$"),
        (["--seed", "99999999999"], r"^`seed` must be an integer in \[0, 2\*\*32 - 1\], got 99999999999\.$"),
        (["--data_seed", "-3"], r"^`data_seed` must be an integer in \[0, 2\*\*32 - 1\] \(or unset\), got -3\.$"),
        (["--per_device_train_batch_size", "0"], r"`per_device_train_batch_size` must be an integer >= 1"),
        (["--per_device_eval_batch_size", "0"], r"`per_device_eval_batch_size` must be an integer >= 1"),
        (["--gradient_accumulation_steps", "0"], r"`gradient_accumulation_steps` must be an integer >= 1"),
        (["--label_smoothing_factor", "2"], r"`label_smoothing_factor` must be in \[0, 1\)"),
        (["--label_smoothing_factor", "-0.1"], r"`label_smoothing_factor` must be in \[0, 1\)"),
        (["--learning_rate", "-1"], r"`learning_rate` must be >= 0, got -1.0"),
        (["--validation_size", "1.0"], r"`validation_size` must be a fraction in \(0, 1\).*whole number"),
        (["--validation_size", "2.5"], r"`validation_size` must be a fraction"),
        (["--validation_size", "0"], r"`validation_size` must be a fraction"),
        (["--eval_strategy", "no"], r"(?s)cannot keep a best model.*`load_best_model_at_end: false`, or evaluate"),
        (["--save_strategy", "no"], r"cannot keep a best model"),
        (["--eval_strategy", "steps"], r"`save_strategy` \(epoch\) must equal `eval_strategy` \(steps\)"),
        # transformers' "save_steps a multiple of eval_steps" passes 0: the run kept its last model, not its best.
        (STEPS + ["--save_steps", "0"], r"^`save_steps` must be > 0 with `save_strategy: steps` .*, got 0\.0\.$"),
        (STEPS + ["--eval_steps", "0"], r"^`eval_steps` must be > 0 with `eval_strategy: steps`"),
        (["--logging_steps", "0"], r"^`logging_steps` must be > 0 with `logging_strategy: steps`"),
        (["--metric_for_best_model", "f1"], r"`metric_for_best_model: f1` names no metric.*accuracy, loss"),
        (
            ["--metric_for_best_model", "loss", "--greater_is_better", "true"],
            r"would keep the worst checkpoint.*`greater_is_better: false`",
        ),
        (["--push_to_hub", "true"], r"`push_to_hub: true` needs `hub_model_id`.*Nothing was trained"),
        (["--include_labels", "cat", "cat"], r"names \['cat'\] more than once"),
        (["--max_train_samples", "0"], r"`max_train_samples` must be >= 1"),
        # The schedule refused it at the first step, after the data loaded, as an "unexpected" TypeError.
        (
            ["--lr_scheduler_kwargs", '{"min_lr": 1e-6}'],
            r"^`lr_scheduler_kwargs` has min_lr, which `lr_scheduler_type: linear` does not take; it takes none\. Fix",
        ),
        (
            ["--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", '{"num_cycle": 2, "num_training_steps": 9}'],
            r"has num_cycle, num_training_steps, which `lr_scheduler_type: cosine` does not take; it takes num_cycles",
        ),
        # Each of these failed only after the data loaded and the model was built, or was silently ignored.
        (["--lr_scheduler_type", "cosine_with_min_lr"], r"`lr_scheduler_type: cosine_with_min_lr` needs min_lr in"),
        (["--lr_scheduler_type", "warmup_stable_decay"], r"needs num_decay_steps in `lr_scheduler_kwargs`"),
        (["--adam_beta1", "1.5"], r"^`adam_beta1` must be in \[0, 1\) \(e\.g\. 0\.9\), got 1\.5\.$"),
        (["--dataloader_num_workers", "-1"], r"^`dataloader_num_workers` must be an integer >= 0 \(0 loads in"),
        (["--adam_epsilon", "-1"], r"^`adam_epsilon` must be >= 0"),
        # Clipping was skipped without a word; `-inf` passed the finite check, which lets `inf` turn it off.
        (["--max_grad_norm", "-1"], r"^`max_grad_norm` must be >= 0 \(e\.g\. 1\.0; 0 or inf turns clipping off\)"),
        (["--max_grad_norm=-inf"], r"^`max_grad_norm` must be >= 0"),
        # An option that cannot be unset said `invalid float value: 'none'`, naming no fix.
        (
            ["--mixup_alpha", "none"],
            r"^--mixup_alpha: cannot be unset \(`none`\): give a value \(the default is 0\.0\)$",
        ),
        (
            ["--horizontal_flip", "null"],
            r"^--horizontal_flip: cannot be unset \(`null`\): give a value \(the default is true",
        ),
        (["--eval_steps", "2"], r"^`eval_steps: 2` counts steps, but `eval_strategy` is epoch, so it would be"),
        # Each of these was ignored, or kept no best model, without a word.
        (["--save_steps", "100"], r"^`save_steps: 100` counts steps, but `save_strategy` is epoch, so it would be"),
        (
            ["--save_strategy", "best", "--eval_strategy", "no", "--load_best_model_at_end", "false"],
            r"^`save_strategy: best` saves when an evaluation finds a new best model, and `eval_strategy: no` runs",
        ),
        (
            [*STEPS, "--save_steps", "15"],
            r"^`load_best_model_at_end` keeps the checkpoint of the best evaluation: with `save_steps` 15 and "
            r"`eval_steps` 5, an evaluation between two checkpoints would have none\. Fix: `eval_steps: 15`",
        ),
        (
            ["--eval_strategy", "steps", "--save_strategy", "steps", "--save_steps", "200", "--logging_steps", "10"],
            r"`eval_steps` 10 \(`logging_steps`, which transformers takes where `eval_steps` is unset\), an ",
        ),
        (["--early_stopping_threshold", "0.5"], r"^`early_stopping_threshold` set, but no `early_stopping_patience`"),
        (["--rand_augment_magnitude", "0.3"], r"^`rand_augment_magnitude` set, but `rand_augment_ops` is 0 \(off\)"),
        (["--head_hidden_size", "64"], r"^`head_hidden_size` set, but the head is linear \(`head_type`, by default\)"),
        (
            ["--finetune_method", "linear_probe", "--layer_decay", "0.5"],
            r"^`layer_decay` set, but `finetune_method: linear_probe` trains the head alone, so nothing would use it",
        ),
        (["--distillation_alpha", "0.9"], r"^`distillation_alpha` set, but no `teacher_model_name_or_path`"),
        (["--lora_r", "4", "--lora_alpha", "8"], r"^`lora_r`, `lora_alpha` set, but `finetune_method` is full"),
        (["--label_names", "foo"], r"^`label_names: \['foo'\]`: the batches' labels are `labels`"),
        (
            ["--do_eval", "false"],
            r"^`do_eval: false`: every run is scored on its validation.*`eval_strategy: no`",
        ),
        (["--do_predict", "false"], r"^`do_predict: false`: a dataset's test split.*Drop the option\.$"),
        (["--prediction_loss_only", "true"], r"^`prediction_loss_only: true` is not supported here"),
        (["--batch_eval_metrics", "true"], r"^`batch_eval_metrics: true` is not supported here"),
        (["--report_to", "wandbb"], r"^`report_to: wandbb` names no logging integration; transformers has .*wandb"),
        # The first evaluation failed, after an epoch; with `overwrite_output_dir` the earlier run was gone too.
        (["--eval_do_concat_batches", "false"], r"^`eval_do_concat_batches: false` is not supported here"),
        # It trained at half the batch results.json recorded, and refused a resume at the real one.
        (["--accelerator_config", '{"split_batches": true}'], r"^`accelerator_config: \{split_batches: true\}` spl"),
        (["--save_total_limit", "0"], r"^`save_total_limit` must be an integer >= 1 \(`none` keeps every checkpoint"),
        # NaN stopped training early with exit 0 ("did not improve by more than nan"); inf failed after the data.
        (
            ["--early_stopping_patience", "1", "--early_stopping_threshold", "nan"],
            r"^`early_stopping_threshold` must be a finite number, got nan\.$",
        ),
        (["--num_train_epochs", "inf"], r"^`num_train_epochs` must be a finite number, got inf\.$"),
        (["--learning_rate", "inf"], r"^`learning_rate` must be a finite number, got inf\.$"),
        # The last list alone was read: it trained on 2 and 3.
        (["--include_labels", "0", "1", "--include_labels", "2", "3"], r"^`--include_labels` is given more than once"),
    ],
)
def test_arguments_are_checked_before_any_data_is_loaded(tmp_path, flags, match):
    with pytest.raises(ValueError, match=match):
        parse_args([*flags, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_arguments_that_agree_are_accepted(tmp_path):
    flags = ["--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false",
             "--metric_for_best_model", "eval_loss", "--greater_is_better", "false", "--validation_size", "500",
             "--max_steps", "3", "--num_train_epochs", "0"]  # fmt: skip
    training_args = parse_args(flags)[3]
    assert training_args.max_steps == 3 and str(training_args.eval_strategy.value) == "no"
    schedule = ["--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", '{"min_lr": 1e-6}']
    assert parse_args(schedule)[3].lr_scheduler_kwargs == {"min_lr": 1e-6}
    plateau = ["--lr_scheduler_type", "reduce_lr_on_plateau", "--lr_scheduler_kwargs", '{"patience": 2}']
    assert parse_args([*plateau, "--eval_strategy", "epoch"])[3].lr_scheduler_kwargs == {"patience": 2}
    lora = ["--model_type", "pretrained", "--finetune_method", "lora", "--lora_r", "4"]
    assert parse_args([*lora, "--model_name_or_path", "x"])[0].lora_r == 4
    teacher = ["--teacher_model_name_or_path", "some/teacher", "--distillation_alpha", "0.9"]
    assert parse_args(teacher)[3].distillation_alpha == 0.9
    # A switch unset by default taken bare, as `--help` shows it (`--flip_tta [BOOL]`); it was refused.
    assert parse_args(["--flip_tta", "--use_cpu"])[3].flip_tta is True
    assert parse_args(["--model_type", "scratch", "--qk_norm"])[2].qk_norm is True
    # Clipping off, the gradient norm still logged; a value given twice is the last, as argparse reads it.
    assert parse_args(["--max_grad_norm", "inf", "--seed", "1", "--seed", "2"])[3].max_grad_norm == float("inf")


@pytest.mark.parametrize(
    "flags, refused",
    [
        (
            ["--optim_args", "beta1=0.8"],
            r"^`optim_args` has beta1, which `optim: adamw_torch_fused` ignores.*adam_beta",
        ),
        (["--optim", "adafactor", "--optim_args", "scale_parameter=False"], r"has scale_parameter, which `optim: ada"),
        (["--optim", "sgd", "--optim_args", "momentum=0.9,nesterovv=true"], r"^`optim_args` has nesterovv, which"),
        (["--optim", "sgd", "--optim_args", "momentum=abc"], r"^`optim_args: momentum=abc` cannot be read by `optim"),
        (["--optim", "sgd", "--optim_args", "momentum=0.9, nesterov=true"], {"momentum": 0.9, "nesterov": True}),
        (["--optim", "rmsprop", "--optim_args", "alpha=0.95"], {"alpha": 0.95}),
    ],
)
def test_optim_args_the_optimizer_ignores_are_refused_at_start_up(tmp_path, flags, refused):
    """transformers passes AdamW and Adafactor no `optim_args` and SGD only the keys it knows: the rest trained with
    the defaults, silently. (A key read with a default, given at that default, is tried at other values: the
    optimizers that read keys so, bitsandbytes' AdEMAMix or schedule-free ones, need packages not installed here.)"""
    from finetune.trainer import check_optimizer

    args = parse_args([*flags, "--output_dir", str(tmp_path / "out")])[3]
    if isinstance(refused, dict):  # accepted: these reach the optimizer
        check_optimizer(args)
        kwargs = Trainer.get_optimizer_cls_and_kwargs(args)[1]
        assert {key: kwargs[key] for key in ("momentum", "alpha", "nesterov") if key in kwargs} == refused
    else:
        with pytest.raises(ValueError, match=refused):
            check_optimizer(args)


def test_a_logging_integration_that_is_not_installed_is_named_before_training(tmp_path):
    """`report_to: wandb` without wandb stopped after the data loaded and the model was built."""
    from transformers.integrations import get_available_reporting_integrations

    installed = get_available_reporting_integrations()
    absent = next(name for name in ("wandb", "mlflow", "comet_ml", "neptune") if name not in installed)
    with pytest.raises(ValueError, match=rf"^`report_to: {absent}` needs {absent} installed .*`--report_to none`\.$"):
        parse_args(["--report_to", absent, "--output_dir", str(tmp_path / "out")])


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "learning_rate: [1, 2]\n",
            r"`learning_rate` in .*c\.yaml \(line 1\) must be a number, got the list \[1, 2\]",
        ),
        ("model_type: scratch\nnum_hidden_layers: 2.5\n", r"`num_hidden_layers` in .*\(line 2\) must be an integer"),
        ("horizontal_flip: maybe\n", r"`horizontal_flip` .* must be true or false, got 'maybe'"),
        ("include_labels: cat\n", r"`include_labels` .* must be a list, e.g. `include_labels: \[cat, \.\.\.\]`"),
        # The fix named was `debug: [True, ...]`: the traceback switch is the command line's bare `--debug`.
        (
            "debug: true\n",
            r"`debug` .* lists transformers' debug modes .* got True\. For the traceback .*`--debug` on",
        ),
        ("eval_strategy: sometimes\n", r"`eval_strategy` .* must be one of \['no', 'steps', 'epoch'\]"),
        ("recipe_precision: fp8\n", r"`recipe_precision` .*\(line 1\) must be one of \['bf16', 'float32'\]"),
        ("ema_decay: often\n", r"`ema_decay` .*\(line 1\) must be a number, got 'often'"),
        ("model_type: scratch\n\tlearning_rate: 1\n", r"(?s)c\.yaml' is not valid YAML, line 2, column 1.*tabs"),
        ("model_type: [scratch\n", r"c\.yaml' is not valid YAML, line 2"),
    ],
)
def test_yaml_values_of_the_wrong_kind_name_the_file_and_line(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        parse_args(["--config", write_yaml(tmp_path / "c.yaml", text)])


def test_yaml_no_is_the_strategy_no(tmp_path):
    """YAML 1.1 reads a bare `no` as false; for a strategy it means the choice `no`."""
    config = write_yaml(tmp_path / "c.yaml", "eval_strategy: no\nsave_strategy: no\nload_best_model_at_end: false\n")
    training_args = parse_args(["--config", config])[3]
    assert str(training_args.eval_strategy.value) == "no" and str(training_args.save_strategy.value) == "no"


def saved_vit(path):
    """A tiny transformers ViT classifier saved with its image processor, as a local pretrained model."""
    from helpers_runs import tiny_vit_model
    from transformers import ViTImageProcessor

    tiny_vit_model().save_pretrained(path)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(path)
    return path


PRETRAINED = ["--model_type", "pretrained", "--dataset_name", "sklearn:digits", "--decoded_cache_dir", "none",
              "--num_train_epochs", "1", "--max_train_samples", "32", "--max_eval_samples", "16"]  # fmt: skip


def test_a_head_of_another_size_with_ignore_mismatched_sizes_false_is_named(tmp_path):
    # transformers' own error said "For details look at the above report!", of a report that is not shown.
    match = r"has a 3-class head \(.*\) and the dataset 10 classes \(0, 1, .*\), but `ignore_mismatched_sizes: "
    match += r"false` keeps the checkpoint's head\. Fix: `ignore_mismatched_sizes: true`"
    with pytest.raises(ValueError, match=match):
        run.main([*PRETRAINED, "--model_name_or_path", str(saved_vit(tmp_path / "vit")), "--ignore_mismatched_sizes",
                  "false", "--output_dir", str(tmp_path / "out")])  # fmt: skip


@pytest.mark.parametrize("where, relation", [(".", "is"), ("run", "is inside"), ("..", "contains")])
def test_output_dir_that_would_overwrite_the_pretrained_model(tmp_path, where, relation):
    model_dir = saved_vit(tmp_path / "models" / "vit")
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    output_dir = model_dir / where
    with pytest.raises(ValueError, match=rf"`output_dir` .* {relation} the pretrained model .*Nothing was written"):
        run.main([*PRETRAINED, "--model_name_or_path", str(model_dir), "--output_dir", str(output_dir)])
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before
    assert not (model_dir / "run").exists()


def test_output_dir_holding_the_teacher_is_refused_before_anything_is_deleted(tmp_path):
    """`overwrite_output_dir` removes an earlier run's checkpoints: a teacher among them was deleted, then blamed."""
    out = tmp_path / "out"
    teacher = saved_vit(out / "checkpoint-16")
    before = {p.name: p.read_bytes() for p in teacher.iterdir()}
    with pytest.raises(ValueError, match=r"`output_dir` .* contains the teacher .*checkpoint-16.*Nothing was written"):
        run.main([*PRETRAINED, "--model_type", "scratch", "--teacher_model_name_or_path", str(teacher),
                  "--output_dir", str(out), "--overwrite_output_dir", "true"])  # fmt: skip
    assert {p.name: p.read_bytes() for p in teacher.iterdir()} == before


def test_a_model_beside_the_run_folders_of_both_is_accepted(tmp_path):
    """The quickstart's layout: `model_type: both` writes OUTPUT/pretrained and OUTPUT/scratch, so a source model in
    OUTPUT/source_model is beside the run folders, not in them."""
    from finetune.arguments import parse_args

    model_dir = saved_vit(tmp_path / "out" / "source_model")
    model_args, _, _, training_args = parse_args(
        ["--model_type", "both", "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "out")]
    )
    run.check_model_and_output_dir(model_args, training_args)  # no error
    model_args, _, _, training_args = parse_args(
        ["--model_type", "both", "--model_name_or_path", str(model_dir), "--output_dir", str(model_dir / "..")]
    )
    inside = saved_vit(tmp_path / "out" / "pretrained" / "base")
    model_args.model_name_or_path = str(inside)
    with pytest.raises(ValueError, match="contains the pretrained model"):
        run.check_model_and_output_dir(model_args, training_args)


def test_both_refuses_before_training_what_it_would_write_at_the_end(tmp_path):
    """`model_type: both` found a file at OUTPUT/comparison (or OUTPUT/scratch) after training both models, and
    replaced an edited comparison report."""
    from finetune.arguments import parse_args

    model_dir = saved_vit(tmp_path / "vit")
    for blocker, match in (("comparison", "comparison is a file"), ("scratch", "scratch is a file")):
        out = tmp_path / blocker
        out.mkdir()
        (out / blocker).write_text("notes")
        args = ["--model_type", "both", "--model_name_or_path", str(model_dir), "--output_dir", str(out)]
        with pytest.raises(ValueError, match=rf"`output_dir` .*{match}, not a folder"):
            run.check_model_and_output_dir(*parse_args(args)[::3])
    (tmp_path / "edited" / "comparison").mkdir(parents=True)
    (tmp_path / "edited" / "comparison" / "report.md").write_text("# notes\n")
    args = ["--model_type", "both", "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "edited")]
    with pytest.raises(FileExistsError, match="report.md was edited .* Fix: another `output_dir`, or move it away"):
        run.check_model_and_output_dir(*parse_args(args)[::3])


def test_a_local_model_folder_without_weights(tmp_path):
    model_dir = saved_vit(tmp_path / "vit")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"holds a config.json but no weights \(model.safetensors or"):
        run.main([*PRETRAINED, "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_corrupt_safetensors_file_is_named(tmp_path):
    model_dir = saved_vit(tmp_path / "vit")
    (model_dir / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(OSError, match=r"vit/model.safetensors is damaged or incomplete"):
        run.main([*PRETRAINED, "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "out")])
    from finetune.tools.predict import load_classifier

    with pytest.raises(OSError, match=r"model.safetensors is damaged"):
        load_classifier(model_dir)


def test_a_model_of_a_type_without_image_classification(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                         vocab_size=16)).save_pretrained(tmp_path / "bert")  # fmt: skip
    with pytest.raises(ValueError, match=r"holds a 'bert' model, which has no image-classification head.*vit, deit"):
        run.main([*PRETRAINED, "--model_name_or_path", str(tmp_path / "bert"), "--output_dir", str(tmp_path / "o")])


def labelled_parquet(path, labels):
    import datasets

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    ds = datasets.Dataset.from_dict({"image": [{"bytes": buffer.getvalue(), "path": None}] * len(labels),
                                     "label": labels})  # fmt: skip
    ds.cast_column("image", datasets.Image()).to_parquet(str(path))
    return str(path)


def test_a_dataset_with_one_class_is_refused(tmp_path):
    data = labelled_parquet(tmp_path / "train.parquet", [4] * 12)
    with pytest.raises(ValueError, match=r"1 class \(\['4'\]\): a classifier needs at least 2"):
        run.main([*SCRATCH, "--dataset_name", data, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"1 class \(\['3'\]\): a classifier needs at least 2"):
        run.main([*SCRATCH, "--dataset_name", "sklearn:digits", "--include_labels", "3",
                  "--output_dir", str(tmp_path / "out")])  # fmt: skip


def test_sparse_label_ids_are_renumbered_and_keep_their_names(tmp_path, caplog):
    from finetune.data import load_image_data

    data_args = parse_args(["--dataset_name", labelled_parquet(tmp_path / "train.parquet", [0, 1, 3000] * 6),
                            "--decoded_cache_dir", "none", "--validation_size", "0.5"])[1]  # fmt: skip
    with caplog.at_level("WARNING"):
        data = load_image_data(data_args, seed=0)
    assert data.label_names == ["0", "1", "3000"]
    assert sorted(set(data.train.labels.tolist()) | set(data.validation.labels.tolist())) == [0, 1, 2]
    assert "not consecutive" in caplog.text and "renumbered 0..2" in caplog.text
    # `include_labels` chooses among the ids that occur, by their names, and lists those (not 0..3000) when refused.
    kept = load_image_data(dataclasses.replace(data_args, include_labels=["3000", "0"]), seed=0)
    assert kept.label_names == ["3000", "0"] and len(kept.train) + len(kept.validation) == 12
    with pytest.raises(
        ValueError, match=r"`include_labels` has .*'5'.*; the dataset's labels are \['0', '1', '3000'\]\.$"
    ):
        load_image_data(dataclasses.replace(data_args, include_labels=["0", "5"]), seed=0)


@pytest.mark.parametrize("below", ["", "run"])
def test_output_dir_that_is_a_file_or_in_one(tmp_path, below):
    """A file where the run's folder, or a folder it would be made in, is: one line naming it, before any data."""
    (tmp_path / "out").write_text("notes")
    output_dir = str(tmp_path / "out" / below) if below else str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"^`output_dir` '.*out(/run)?': .*out is a file, not a folder. Fix: an"):
        run.main([*SCRATCH, "--dataset_name", "sklearn:digits", "--output_dir", output_dir])
    assert (tmp_path / "out").read_text() == "notes"


def test_an_empty_output_dir_or_a_folder_of_the_users_files_is_refused(tmp_path, monkeypatch):
    """`--output_dir ""` wrote the run into the current folder, and a folder of the user's lost its README.md and
    config.json to the run's: only a new or empty folder, or an earlier run's, is written into."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("my notes")
    with pytest.raises(ValueError, match=r"^`output_dir` is empty, which would write the run into the current folder"):
        run.main([*SCRATCH, "--dataset_name", "sklearn:digits", "--output_dir", ""])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    (mine / "README.md").write_text("my notes")
    refused = (r"^`output_dir` .*mine holds README\.md, config\.json of no earlier run.*Nothing was written\. Fix: a "
               r"new or empty folder as `--output_dir`, or an earlier run's\.$")  # fmt: skip
    with pytest.raises(FileExistsError, match=refused):
        run.main([*SCRATCH, "--dataset_name", "sklearn:digits", "--output_dir", str(mine)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "mine"]
    assert sorted(p.name for p in mine.iterdir()) == ["README.md", "config.json"]
    assert (mine / "README.md").read_text() == "my notes"


def test_a_checkpoint_of_another_run_or_a_run_of_the_other_layout_is_refused_as_output_dir(tmp_path):
    """A run into `run/checkpoint-8` replaced that checkpoint's weights and state and kept its optimizer (a mix of two
    runs), and a run of one model beside a `model_type: both` run's pretrained/ and scratch/ (or the reverse) made a
    folder whose comparison left one out: both refused before anything is written."""
    checkpoint = tmp_path / "run" / "checkpoint-8"
    checkpoint.mkdir(parents=True)
    for name in ("trainer_state.json", "model.safetensors", "optimizer.pt"):
        (checkpoint / name).write_text(name)
    refused = (
        r"^`output_dir` .*checkpoint-8 is a checkpoint of the run in .*run, which training would "
        r"overwrite\. Nothing was written\. Fix: .*`--output_dir .*run --resume_from_checkpoint .*8`\.$"
    )
    with pytest.raises(FileExistsError, match=refused):
        run.main([*SCRATCH, "--dataset_name", "sklearn:digits", "--output_dir", str(checkpoint)])
    assert {p.name: p.read_text() for p in checkpoint.iterdir()} == {
        name: name for name in ("trainer_state.json", "model.safetensors", "optimizer.pt")
    }
    (tmp_path / "both" / "scratch").mkdir(parents=True)
    (tmp_path / "both" / "scratch" / "results.json").write_text("{}")
    with pytest.raises(FileExistsError, match=r"holds a finished run of `model_type: both` \(scratch\), which this"):
        run.main([*SCRATCH, "--dataset_name", "sklearn:digits", "--output_dir", str(tmp_path / "both")])
    # An evaluation's results.json at the top of the folder: compare read it and left the two runs out.
    model = tiny_vit_checkpoint(tmp_path / "model", num_labels=10)
    with pytest.raises(FileExistsError, match=r"\(scratch\), which this evaluation's results would be mixed with"):
        run.main(["--do_train", "false", "--model_name_or_path", str(model), "--dataset_name", "sklearn:digits",
                  "--output_dir", str(tmp_path / "both")])  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "both").iterdir()) == ["scratch"]
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "results.json").write_text("{}")
    with pytest.raises(FileExistsError, match=r"holds a finished run of one model, which this both run"):
        run.main([*SCRATCH, "--model_type", "both", "--model_name_or_path", "google/vit-base-patch16-224-in21k",
                  "--dataset_name", "sklearn:digits", "--output_dir", str(tmp_path / "one")])  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["results.json"]


def test_an_image_folder_with_one_class_subfolder(tmp_path):
    (tmp_path / "images" / "cat").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(tmp_path / "images" / "cat" / f"{i}.png")
    with pytest.raises(ValueError, match=r"one subfolder per class, at least two \(e.g. cat/ and dog/\)\.$"):
        run.main([*SCRATCH, "--dataset_name", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out")])
    # Two classes, and one image beside their folders: named, since it is what stops the folder from being read.
    (tmp_path / "images" / "dog").mkdir()
    for i in range(4):
        Image.new("RGB", (8, 8), (0, 60 * i, 0)).save(tmp_path / "images" / "dog" / f"{i}.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "stray.png")
    with pytest.raises(ValueError, match=r"and no image beside them: move stray.png into one\.$"):
        run.main([*SCRATCH, "--dataset_name", str(tmp_path / "images"), "--output_dir", str(tmp_path / "out")])


def test_resuming_a_checkpoint_of_another_model(tmp_path):
    """Also a checkpoint holding tensors this model lacks (a block, a CLS token), which would otherwise fail later
    on the optimizer's parameter groups, naming neither the checkpoint nor the fix."""
    tiny = [*SCRATCH, "--dataset_name", "sklearn:digits", "--max_train_samples", "32", "--max_eval_samples", "16",
            "--num_hidden_layers", "2", "--position_embedding_type", "sinusoidal"]  # fmt: skip
    run.main([*tiny, "--output_dir", str(tmp_path / "a")])
    checkpoint = next((tmp_path / "a").glob("checkpoint-*"))
    options = (["--hidden_size", "16"], ["--num_hidden_layers", "1"], ["--pooling", "mean"])

    def refused(other: list[str]) -> str:
        with pytest.raises(ValueError, match=r"checkpoint-\d+ .*Fix: resume with the options") as e:
            run.main([*tiny, *other, "--output_dir", str(tmp_path / "b"), "--resume_from_checkpoint", str(checkpoint)])
        assert "\n" not in str(e.value)
        return str(e.value)

    changes = ("head_hidden_size 8 (now 16); hidden_size 8 (now 16))", "num_hidden_layers 2 (now 1))",
               'pooling "cls" (now "mean"))')  # fmt: skip
    for change, other in zip(changes, options):
        assert f"is of another model ({change}" in refused(other)
    # Without a config.json, the tensors tell.
    (checkpoint / "config.json").unlink()
    tensors = ("classifier.1.weight: [10, 8] saved, [10, 16] here",
               "vit.encoder.layer.1.attention.out_proj.bias saved, not in this model",
               "vit.embeddings.cls_token saved, not in this model)")  # fmt: skip
    for tensor, other in zip(tensors, options):
        assert f"does not fit this model ({tensor}" in refused(other)


def test_weights_that_do_not_fit_their_config_are_refused_not_started_at_random(tmp_path):
    """A config.json of another model beside the weights (a layer more), or a file of unrelated weights: predict,
    an evaluation and fine-tuning ran with random weights there and exited 0 (transformers only printed a table)."""
    import json

    from safetensors.torch import save_file
    from test_run import tiny_vit_checkpoint

    from finetune.tools import predict

    model = tiny_vit_checkpoint(tmp_path / "model", num_labels=10)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    Image.new("L", (8, 8)).save(image := tmp_path / "digit.png")
    lack = r"^The weight files of .*model lack vit\.(encoder\.layer|layers)\.2\..* and \d+ more, of the ViTFor"
    with pytest.raises(ValueError, match=lack):
        predict.main([str(model), str(image)])
    with pytest.raises(ValueError, match=lack):
        run.main(["--do_train", "false", "--model_name_or_path", str(model), "--dataset_name", "sklearn:digits",
                  "--decoded_cache_dir", "none", "--output_dir", str(tmp_path / "evaluation")])  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    save_file({"unrelated.weight": torch.zeros(2)}, model / "model.safetensors")
    with pytest.raises(ValueError, match=r"^None of the weights of .*model fit the ViTForImageClassification its"):
        run.main(["--num_train_epochs", "1", "--decoded_cache_dir", "none", "--model_name_or_path", str(model),
                  "--dataset_name", "sklearn:digits", "--output_dir", str(tmp_path / "run")])  # fmt: skip


def test_an_output_dir_or_decoded_cache_inside_the_data_folder_is_refused(tmp_path):
    """An evaluation into `photos/evaluation` wrote its CSV and figures into the dataset: the next run failed on the
    CSV or trained on a class named `evaluation`."""
    for name in ("cat", "dog"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(tmp_path / "photos" / name / f"{i}.png")
    inside = (
        r"^`output_dir` .*photos/run is inside the data folder .*photos, where the run's files would be read as data"
    )
    with pytest.raises(ValueError, match=inside):
        run.main([*SCRATCH, "--dataset_name", str(tmp_path / "photos"), "--output_dir", str(tmp_path / "photos/run")])
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == ["cat", "dog"]
    # A decoded cache there: each run decoded anew into a class folder of no images, the data's fingerprint changed.
    with pytest.raises(ValueError, match=r"^`decoded_cache_dir` .*photos/cache is inside the data folder .*photos, "):
        run.main([*SCRATCH, "--dataset_name", str(tmp_path / "photos"), "--output_dir", str(tmp_path / "run"),
                  "--decoded_cache_dir", str(tmp_path / "photos/cache")])  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == ["cat", "dog"]


def test_weight_files_without_batch_norm_step_counters_load(tmp_path):
    """`num_batches_tracked` counts steps, learns nothing; converted weight files often leave it out: not refused."""
    from safetensors.torch import load_file, save_file
    from transformers import ResNetConfig, ResNetForImageClassification

    from finetune.models import load_saved_classifier

    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)
    ResNetForImageClassification(config).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if not k.endswith("num_batches_tracked")}, tmp_path / "model.safetensors"
    )
    assert type(load_saved_classifier(tmp_path)).__name__ == "ResNetForImageClassification"


def test_a_write_that_found_no_room_is_told_from_other_failures(tmp_path):
    """A full disk is said with its fix; other write failures, and a name that reads like torch's writer, are not."""
    import errno

    import torch

    from finetune.errors import error_line, out_of_space

    with pytest.raises(RuntimeError) as not_a_file:  # `inline_container.cc:... open file failed ... Is a directory`
        torch.save({}, tmp_path)
    assert not out_of_space(not_a_file.value)
    assert not out_of_space(OSError(errno.EACCES, "Permission denied", "x"))
    assert not out_of_space(OSError("Could not load the model 'inline_container' (PytorchStreamWriter)"))
    full = OSError(errno.ENOSPC, "No space left on device", "run/checkpoint-8/optimizer.pt")
    assert out_of_space(full) and "the disk (or quota) is full. Fix: free space on it" in error_line(full)
    wrapped = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert out_of_space(wrapped) and out_of_space(RuntimeError("I/O error: File too large (os error 27)"))
