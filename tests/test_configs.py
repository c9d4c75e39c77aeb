"""Every config in configs/ parses into the run's arguments and, for scratch runs, builds a valid ScratchViTConfig;
`base:` inheritance merges, overrides and fails clearly."""

import dataclasses
import inspect
import json
import typing
from pathlib import Path

import pytest
import yaml

from finetune import run
from finetune.arguments import ScratchViTArguments, load_yaml_config, parse_args, parse_options, scratch_config_kwargs
from finetune.errors import UsageError
from scratch_vit import ScratchViTConfig


CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_parses_and_builds(config):
    model_args, data_args, scratch_args, training_args = parse_args(["--config", str(config)])
    if model_args.model_type in ("scratch", "both"):
        ScratchViTConfig(**scratch_config_kwargs(scratch_args))  # raises ValueError on an invalid combination


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_base_config_is_merged_and_overridden(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "root.yaml", "model_type: scratch\nhidden_size: 64\nlearning_rate: 1.0e-3\nseed: 1\n")
    _write(tmp_path / "sub" / "middle.yaml", "base: ../root.yaml\nhidden_size: 48\nseed: 2\n")
    leaf = _write(tmp_path / "sub" / "leaf.yaml", "base: middle.yaml\nseed: 3\n")
    model_args, _, scratch_args, training_args = parse_args(["--config", str(leaf), "--output_dir", str(tmp_path)])
    assert model_args.model_type == "scratch"  # from the root
    assert scratch_args.hidden_size == 48  # the middle overrides the root
    assert training_args.seed == 3 and training_args.learning_rate == 1e-3  # the leaf overrides both
    _, _, _, training_args = parse_args(["--config", str(leaf), "--seed", "4", "--output_dir", str(tmp_path)])
    assert training_args.seed == 4, "the command line overrides the whole chain"


def test_shipped_variants_state_only_their_differences():
    root = CONFIGS[0].parent
    variant = load_yaml_config(root / "cifar10_scratch_cpu30_stem_h48l4.yaml")
    recipe = load_yaml_config(root / "cifar10_scratch_cpu30_stem.yaml")
    own = yaml.safe_load((root / "cifar10_scratch_cpu30_stem_h48l4.yaml").read_text())
    # base, output_dir, the encoder size (3 keys), and the precision it is for with the recipe for the other
    assert own["base"] == "cifar10_scratch_cpu30_stem.yaml" and len(own) <= 7
    assert {k for k in variant if variant[k] != recipe.get(k)} == {k for k in own if k != "base"}


def test_base_errors_name_the_file(tmp_path):
    missing = _write(tmp_path / "a.yaml", "base: nowhere.yaml\nseed: 1\n")
    with pytest.raises(FileNotFoundError, match="nowhere.yaml.*the `base` of .*a.yaml"):
        load_yaml_config(missing)
    _write(tmp_path / "b.yaml", "base: c.yaml\n")
    cycle = _write(tmp_path / "c.yaml", "base: b.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        load_yaml_config(cycle)
    listed = _write(tmp_path / "f.yaml", "base: [d.yaml]\n")
    with pytest.raises(ValueError, match=r"`base` in .*f.yaml must be one file name .*got \['d.yaml'\]"):
        load_yaml_config(listed)
    _write(tmp_path / "d.yaml", "hidden_sise: 3\n")
    child = _write(tmp_path / "e.yaml", "base: d.yaml\n")
    with pytest.raises(ValueError, match=r"'hidden_sise' \(Did you mean 'hidden_size'") as error:
        parse_args(["--config", str(child)])
    assert "d.yaml" in str(error.value)


GPU_RECIPE = CONFIGS[0].parent / "cifar10_scratch_gpu.yaml"


@pytest.mark.parametrize("word", ["none", "null", "None"])
def test_an_option_a_config_sets_can_be_cleared_on_the_command_line(tmp_path, word):
    *_, training_args = parse_args(["--config", str(GPU_RECIPE), "--output_dir", str(tmp_path)])
    assert training_args.ema_decay == 0.9995
    *_, training_args = parse_args(["--config", str(GPU_RECIPE), "--ema_decay", word, "--output_dir", str(tmp_path)])
    assert training_args.ema_decay is None and training_args.max_train_minutes == 10  # the rest of the recipe stays
    # Optional string options too: `none` was taken as a Hub id for the teacher, and as a ScratchViT pooling.
    child = _write(tmp_path / "child.yaml", f"base: {GPU_RECIPE}\nteacher_model_name_or_path: runs/teacher\n")
    _, _, scratch_args, options = parse_options(
        ["--config", str(child), "--teacher_model_name_or_path", word, "--pooling", word]
    )
    assert options["teacher_model_name_or_path"] is None and scratch_args.pooling is None
    assert scratch_args.patch_embedding_type == "conv_stem"


def test_an_empty_config_sets_nothing(tmp_path):
    for text in ("", "# only a comment\n"):  # both crashed (AttributeError)
        empty = _write(tmp_path / "empty.yaml", text)
        assert parse_options(["--config", str(empty)]) == parse_options([])


def test_a_second_config_and_an_unset_output_dir_are_refused(tmp_path):
    """argparse kept the last `--config` alone (the first was silently ignored); `--output_dir none` wrote to
    transformers' default ./trainer_output."""
    first, second = _write(tmp_path / "a.yaml", "seed: 1\n"), _write(tmp_path / "b.yaml", "seed: 2\n")
    with pytest.raises(UsageError, match=r"`--config` is given more than once.*`base: other.yaml`"):
        parse_options(["--config", str(first), f"--config={second}"])
    for word in ("none", "null"):
        with pytest.raises(UsageError, match="`output_dir` cannot be unset.*default outputs/run"):
            parse_options(["--output_dir", word])


def test_null_in_a_config_and_none_for_a_string_option(tmp_path):
    child = _write(
        tmp_path / "child.yaml", f"base: {GPU_RECIPE}\nema_decay: null\nsave_total_limit: None\npooling: none\n"
    )
    _, data_args, scratch_args, options = parse_options(["--config", str(child), "--lora_target_modules", "null"])
    assert options["ema_decay"] is None and options["save_total_limit"] is None and scratch_args.pooling is None
    # For these two `none` is a value (`decoded_cache_dir: none` turns the cache off; `report_to none`).
    _, data_args, _, options = parse_options(["--decoded_cache_dir", "none", "--report_to", "none"])
    assert data_args.decoded_cache_dir == "none" and options["report_to"] == "none"
    model_args, data_args, _, _ = parse_options(["--decoded_cache_dir", "null", "--lora_target_modules", "null"])
    assert data_args.decoded_cache_dir is None and model_args.lora_target_modules is None
    # `report_to: null` clears it to its default, no integration (it reached transformers as None, refused late).
    *_, training_args = parse_args(["--report_to", "null", "--output_dir", str(tmp_path)])
    assert training_args.report_to == []
    config = _write(tmp_path / "c.yaml", "report_to: null\n")
    assert parse_args(["--config", str(config), "--output_dir", str(tmp_path)])[-1].report_to == []


def test_a_text_option_takes_a_yaml_number_as_text_and_refuses_a_list(tmp_path):
    # `output_dir: 2024` reached os.path as an int, `dataset_name: [a, b]` str methods: "unexpected" errors, late.
    _, data_args, _, options = parse_options(["--config", str(_write(tmp_path / "a.yaml", "output_dir: 2024\n"))])
    assert options["output_dir"] == "2024"
    config = _write(tmp_path / "b.yaml", "model_type: scratch\ndataset_name: [a, b]\n")
    with pytest.raises(ValueError, match=r"`dataset_name` in .*b.yaml \(line 2\) must be text, got the list"):
        parse_options(["--config", str(config)])
    # A text option that also takes a mapping keeps it.
    config = _write(tmp_path / "c.yaml", "lr_scheduler_kwargs: {min_lr: 0.0001}\n")
    assert parse_options(["--config", str(config)])[-1]["lr_scheduler_kwargs"] == {"min_lr": 0.0001}


def test_a_bare_switch_means_true_and_auto_waits_for_the_settings(tmp_path):
    *_, options = parse_options(["--config", str(GPU_RECIPE), "--fp16", "--bf16", "false", "--output_dir", "x"])
    assert (options["bf16"], options["fp16"], options["torch_compile"]) == ("false", "true", "auto")


def test_scratch_arguments_are_the_scratch_vit_config_fields():
    """`ScratchViTArguments` is written out so that `--help` needs no transformers; it must stay the config's."""
    parameters = inspect.signature(ScratchViTConfig.__init__).parameters
    expected = {name: p.annotation for name, p in parameters.items() if name != "self" and p.kind != p.VAR_KEYWORD}
    hints = typing.get_type_hints(ScratchViTArguments)
    assert [f.name for f in dataclasses.fields(ScratchViTArguments)] == list(expected)
    for name, annotation in expected.items():
        assert hints[name] == annotation | None, name


# A tiny ScratchViT on digits: 8 px images, patch 2, 240 training images.
TINY_RUN = """model_type: scratch
dataset_name: sklearn:digits
image_size: 8
patch_size: 2
hidden_size: 16
num_hidden_layers: 1
num_attention_heads: 2
intermediate_size: 32
max_train_samples: 240
per_device_train_batch_size: 32
learning_rate: 3.0e-3
horizontal_flip: false
decoded_cache_dir: none
report_to: none
"""


def test_an_unset_best_metric_keeps_the_checkpoint_of_least_loss(tmp_path):
    """Unset, `metric_for_best_model` falls back to the loss (transformers), which the best model must minimise."""
    config = _write(tmp_path / "c.yaml", TINY_RUN + "metric_for_best_model: null\nnum_train_epochs: 3\n")
    run.main(["--config", str(config), "--output_dir", str(tmp_path / "out"), "--save_total_limit", "null"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    losses = [row["eval_loss"] for row in saved["history"]]
    assert len(losses) == 3 and max(losses) > min(losses)
    assert saved["validation"]["loss"] == pytest.approx(min(losses))
    for metric in ("null", "loss", "eval_loss"):
        training_args = parse_args(["--config", str(config), "--metric_for_best_model", metric])[3]
        assert training_args.greater_is_better is False, metric
    assert parse_args(["--config", str(config), "--metric_for_best_model", "accuracy"])[3].greater_is_better is True
    with pytest.raises(ValueError, match=r"^`metric_for_best_model: null` \(the loss\) with `greater_is_better: True` "
                       r"would keep the worst checkpoint\. Set `greater_is_better: false`"):  # fmt: skip
        parse_args(["--config", str(config), "--greater_is_better", "true"])


def test_the_best_model_can_be_the_one_of_the_highest_macro_f1(tmp_path):
    """Macro F1, which every evaluation reports, can choose the kept model (imbalanced classes); it was refused as
    "no metric of the evaluation"."""
    config = _write(tmp_path / "c.yaml", TINY_RUN + "metric_for_best_model: macro_f1\nnum_train_epochs: 3\n")
    run.main(["--config", str(config), "--output_dir", str(tmp_path / "out"), "--save_total_limit", "null"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    scores = [row["eval_macro_f1"] for row in state["log_history"] if "eval_macro_f1" in row]
    assert len(scores) == 3 and state["best_metric"] == max(scores)
    assert saved["validation"]["macro_f1"] == pytest.approx(max(scores))
    assert saved["hyperparameters"]["metric_for_best_model"] == "macro_f1"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("learning_rate:", r"a number \(e\.g\. 5e-05\)"),
        ("num_train_epochs: ~", r"a number \(e\.g\. 3\.0\)"),
        ("validation_size: null", r"a number \(e\.g\. 0\.1\)"),
        ("seed: null", r"an integer \(e\.g\. 42\)"),
        ("model_type:", r"one of \['pretrained', 'scratch', 'both'\] \(e\.g\. pretrained\)"),
        ("finetune_method: null", r"one of \['full', 'linear_probe', 'lora'\] \(e\.g\. full\)"),
        ("horizontal_flip: null", r"true or false"),
        ("dataset_name: null", r"a value \(e\.g\. uoft-cs/cifar10\)"),
        ("debug: null", r"a value \(e\.g\. ''\)"),  # an empty default, shown as YAML's empty string
    ],
)
def test_null_for_an_option_that_cannot_be_unset_names_the_option(tmp_path, line, expected):
    key = line.split(":")[0]
    config = _write(tmp_path / "c.yaml", f"weight_decay: 0.01\n{line}\n")
    with pytest.raises(ValueError, match=rf"^`{key}` in .*c\.yaml \(line 2\) cannot be null: it needs {expected}; "
                       "remove the line to use the default\\.$"):  # fmt: skip
        parse_options(["--config", str(config)])


def test_a_field_with_choices_built_in_code_cannot_be_none():
    from finetune.arguments import ModelArguments

    with pytest.raises(ValueError, match=r"`model_type` must be one of \['pretrained', 'scratch', 'both'\], got None"):
        ModelArguments(model_type=None)


def test_list_items_in_a_config_take_the_options_item_type(tmp_path):
    """YAML reads `[2, 0, 1]` as numbers; the labels are names, as on the command line."""
    from finetune.data import load_image_data

    config = _write(
        tmp_path / "c.yaml", "dataset_name: sklearn:digits\ninclude_labels: [2, 0, 1]\ncrop_scale: [1, 1]\n"
    )
    _, data_args, _, _ = parse_options(["--config", str(config), "--decoded_cache_dir", "none"])
    assert data_args.include_labels == ["2", "0", "1"] and data_args.crop_scale == [1.0, 1.0]
    assert load_image_data(data_args, seed=0).label_names == ["2", "0", "1"]


def test_a_config_that_sets_a_key_twice_or_is_no_yaml_map_of_options_is_named(tmp_path):
    """YAML kept the last of two `learning_rate` lines without a word; a number as a key failed with an AttributeError,
    a binary file with a bare UnicodeDecodeError, a folder as "does not exist"."""
    (twice := tmp_path / "twice.yaml").write_text("learning_rate: 0.1\nnum_train_epochs: 1\nlearning_rate: 0.002\n")
    with pytest.raises(ValueError, match=r"twice\.yaml' sets `learning_rate` twice \(lines 1 and 3\)\. Keep one\.$"):
        load_yaml_config(twice)
    (number := tmp_path / "number.yaml").write_text("3: 4\n")
    with pytest.raises(ValueError, match=r"number\.yaml' has the key 3, which names no option"):
        load_yaml_config(number)
    (binary := tmp_path / "binary.yaml").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    with pytest.raises(ValueError, match=r"binary\.yaml' is not text \(not UTF-8\): pass a YAML file\.$"):
        load_yaml_config(binary)
    with pytest.raises(FileNotFoundError, match=r"is a folder\. Pass an existing YAML file"):
        load_yaml_config(tmp_path)
    for config in sorted(Path(__file__).resolve().parents[1].glob("configs/*.yaml")):  # the shipped ones hold none
        load_yaml_config(config)


def test_options_a_base_config_sets_are_not_named_as_ignored(tmp_path, caplog):
    """A ScratchViT config on a `model_type: both` base (configs/quickstart_distilled.yaml) inherits the base's
    `model_name_or_path`, which it cannot drop: only options the config or command line state are named as ignored."""
    _write(
        tmp_path / "base.yaml", TINY_RUN.replace("model_type: scratch", "model_type: both") + "model_name_or_path: m\n"
    )
    config = _write(tmp_path / "c.yaml", "base: base.yaml\nmodel_type: scratch\nmax_steps: 1\n")
    run.main(["--config", str(config), "--output_dir", str(tmp_path / "out")])
    assert "ignored by `model_type: scratch`" not in caplog.text
    _write(tmp_path / "c.yaml", "base: base.yaml\nmodel_type: scratch\nmax_steps: 1\nmodel_name_or_path: m\n")
    run.main(["--config", str(config), "--output_dir", str(tmp_path / "out"), "--overwrite_output_dir"])
    assert "--model_name_or_path: ignored by `model_type: scratch`" in caplog.text
    caplog.clear()  # and a pretrained config on it: the base's ScratchViT options are the base's
    _write(tmp_path / "c.yaml", "base: base.yaml\nmodel_type: pretrained\n")
    for argv in (["--config", str(config)], ["--config", str(config), "--image_size", "8"]):
        run.warn_of_scratch_options(parse_args(argv)[2], True, run.stated_options(argv))
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("--image_size: ScratchViT options, ignored by `model_type: pretrained`")
    # The fix names the way to fine-tune the checkpoint at another size, which `image_size` does not do.
    assert "to fine-tune it at another size, `image_processor_name`: an image processor of that size" in warning


def test_numbers_in_a_config_map_are_read_as_yaml_1_2_and_json_read_them(tmp_path):
    """YAML 1.1 reads `1e-5` as text: `lr_scheduler_kwargs: {min_lr: 1e-5}` reached the schedule as a string, and the
    run stopped with a TypeError once the data was loaded. A quoted number stays text."""
    config = _write(
        tmp_path / "c.yaml",
        "lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr: 1e-5, num_cycles: 5.0e-1}\n",
    )
    _, _, _, training_args = parse_args(["--config", str(config), "--output_dir", str(tmp_path)])
    assert training_args.lr_scheduler_kwargs == {"min_lr": 1e-5, "num_cycles": 0.5}
    config = _write(tmp_path / "c.yaml", "lr_scheduler_kwargs: {min_lr: '1e-5', other: [2e-3, x]}\n")
    kwargs = parse_options(["--config", str(config)])[-1]["lr_scheduler_kwargs"]
    assert kwargs == {"min_lr": "1e-5", "other": [2e-3, "x"]}


def test_a_recipe_alternative_without_the_recipes_precision_is_refused(tmp_path):
    """`recipe_alternative` is named only where the machine trains in another precision than `recipe_precision`:
    without it the option did nothing, and the run went on without a word."""
    with pytest.raises(ValueError, match=r"`recipe_alternative` set, but no `recipe_precision`.*Fix: `recipe_prec"):
        parse_args(["--recipe_alternative", "other.yaml", "--output_dir", str(tmp_path)])


def test_a_negative_number_with_an_exponent_is_an_options_value():
    """argparse before Python 3.13 takes `-1e-3` for an option: `--early_stopping_threshold -1e-3` stopped with
    "expected one argument" (`-0.001` and `--early_stopping_threshold=-1e-3` were read)."""
    argv = ["--early_stopping_patience", "2", "--early_stopping_threshold", "-1e-3", "--max_grad_norm", "-inf"]
    options = parse_options(argv)[-1]
    assert options["early_stopping_threshold"] == -1e-3 and options["max_grad_norm"] == float("-inf")
    with pytest.raises(ValueError, match=r"`learning_rate` must be >= 0, got -0\.001\."):
        parse_args(["--learning_rate", "-1E-3"])
    # The numbers argparse reads itself are left to it, also as a list's items.
    assert parse_options(["--include_labels", "-1", "-2"])[1].include_labels == ["-1", "-2"]
