"""Every config in configs/ parses into the run's arguments and, for scratch runs, builds a valid ScratchViTConfig."""

import dataclasses
from pathlib import Path

import pytest

from finetune.arguments import parse_args, scratch_config_kwargs
from scratch_vit import ScratchViTConfig


CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_parses_and_builds(config):
    model_args, data_args, scratch_args, run_args, training_args = parse_args(["--config", str(config)])
    if model_args.model_type in ("scratch", "both"):
        ScratchViTConfig(**scratch_config_kwargs(scratch_args))  # raises ValueError on an invalid combination


def _as_dicts(argv):
    return [dataclasses.asdict(group) for group in parse_args(argv)[:4]]


def test_cpu_recipe_is_the_measured_command():
    """The README's recipe figures come from the hidden-64 stem config with three overrides; the recipe file must
    hold exactly those settings (output_dir aside)."""
    root = Path(__file__).resolve().parent.parent / "configs"
    recipe = _as_dicts(["--config", str(root / "cifar10_scratch_cpu30_stem_h48l4.yaml")])
    measured = _as_dicts(
        ["--config", str(root / "cifar10_scratch_cpu30_stem.yaml"), "--hidden_size", "48", "--num_hidden_layers", "4"]
        + ["--intermediate_size", "192"]
    )
    assert recipe == measured
    recipe_training = parse_args(["--config", str(root / "cifar10_scratch_cpu30_stem_h48l4.yaml")])[4].to_dict()
    measured_training = parse_args(["--config", str(root / "cifar10_scratch_cpu30_stem.yaml")])[4].to_dict()
    for d in (recipe_training, measured_training):
        for key in ("output_dir", "logging_dir", "run_name"):
            d.pop(key, None)
    assert recipe_training == measured_training
