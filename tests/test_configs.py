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


def _settings(argv: list[str]) -> list[dict]:
    """Every argument group of a run as dicts, without the output paths (which name the run, not its settings)."""
    *groups, training_args = parse_args(argv)
    training = training_args.to_dict()
    for key in ("output_dir", "logging_dir", "run_name"):
        training.pop(key, None)
    return [dataclasses.asdict(group) for group in groups] + [training]


def test_small_encoder_variant_is_the_measured_command():
    """The README's figures for cifar10_scratch_cpu30_stem_h48l4.yaml come from the hidden-64 stem config with three
    overrides; the file must hold exactly those settings."""
    root = Path(__file__).resolve().parent.parent / "configs"
    variant = _settings(["--config", str(root / "cifar10_scratch_cpu30_stem_h48l4.yaml")])
    measured = _settings(
        ["--config", str(root / "cifar10_scratch_cpu30_stem.yaml"), "--hidden_size", "48", "--num_hidden_layers", "4"]
        + ["--intermediate_size", "192"]
    )
    assert variant == measured
