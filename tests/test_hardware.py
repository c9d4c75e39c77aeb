"""Precision and attention chosen from the machine (`auto`), with the detection mocked; explicit choices are kept."""

import logging
from pathlib import Path

import pytest

from finetune import hardware
from finetune.training_args import ImageClassificationTrainingArguments


choose = hardware.choose_precision
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "device, probe, expected",
    [
        ("cpu", {"cpu_native_bf16": False}, (False, False, None)),
        ("cpu", {"cpu_native_bf16": True}, (True, False, None)),
        ("cuda", {"cuda_bf16": True, "cuda_capability": (9, 0)}, (True, False, True)),
        ("cuda", {"cuda_bf16": True, "cuda_capability": (8, 0)}, (True, False, True)),
        ("cuda", {"cuda_bf16": False, "cuda_capability": (7, 0)}, (False, True, None)),
        ("mps", {}, (False, False, None)),
    ],
)
def test_auto_follows_the_device(device, probe, expected):
    choice = choose("auto", "auto", "auto", device, **probe)
    assert (choice.bf16, choice.fp16, choice.tf32) == expected
    assert not choice.warnings and choice.reasons[0].startswith("auto")


def test_explicit_choices_are_kept_and_a_slow_one_warns():
    choice = choose(True, "auto", "auto", "cpu", cpu_native_bf16=False)
    assert (choice.bf16, choice.fp16) == (True, False)
    (warning,) = choice.warnings
    assert f"{hardware.CPU_BF16_SLOWDOWN} slower" in warning and "--bf16 auto" in warning
    assert not choose("true", "auto", "auto", "cpu", cpu_native_bf16=True).warnings
    choice = choose(False, "false", "false", "cuda", cuda_bf16=True, cuda_capability=(9, 0))
    assert (choice.bf16, choice.fp16, choice.tf32) == (False, False, False)
    assert choose("auto", True, "auto", "cuda", cuda_bf16=True, cuda_capability=(9, 0)).fp16


def test_the_launchers_precision_counts_as_explicit():
    choice = choose("auto", "auto", "auto", "cpu", cpu_native_bf16=True, launcher_precision="fp16")
    assert (choice.bf16, choice.fp16) == (False, False)  # the Trainer then takes fp16 from ACCELERATE_MIXED_PRECISION
    assert "accelerate launch" in choice.reasons[0]
    assert choose("auto", "auto", "auto", "cpu", cpu_native_bf16=False, launcher_precision="bf16").warnings
    assert choose("auto", "auto", "auto", "cpu", cpu_native_bf16=True, launcher_precision="no").bf16


def test_bad_switch_value():
    with pytest.raises(ValueError, match="`bf16` must be auto, true or false, got 'maybe'"):
        choose("maybe", "auto", "auto", "cpu")


@pytest.mark.parametrize(
    "requested, device, bf16, head_size, expected",
    [
        ("auto", "cpu", True, 16, "eager"),
        ("auto", "cpu", True, 32, "eager"),
        ("auto", "cpu", True, 64, "sdpa"),
        ("auto", "cpu", False, 16, "sdpa"),
        ("auto", "cuda", True, 16, "sdpa"),
        ("auto", "cpu", True, None, "sdpa"),
        ("sdpa", "cpu", True, 16, "sdpa"),
        ("eager", "cuda", False, 64, "eager"),
    ],
)
def test_attention_choice(requested, device, bf16, head_size, expected):
    assert hardware.choose_attention(requested, device, bf16, head_size)[0] == expected


def test_cpu_flags_name_native_bf16():
    assert hardware.cpu_has_native_bf16({"avx2", "avx512f", "avx512_bf16"})
    assert hardware.cpu_has_native_bf16({"amx_bf16", "amx_tile"})
    assert not hardware.cpu_has_native_bf16({"avx2", "fma", "avx512f"})
    # oneDNN capped below AVX512_CORE_BF16 (how benchmarks/precision.py emulates a CPU without native bf16)
    assert not hardware.cpu_has_native_bf16({"avx512_bf16"}, max_isa="avx2")
    assert hardware.cpu_has_native_bf16({"avx512_bf16"}, max_isa="AVX512_CORE_BF16")


@pytest.mark.parametrize("native", [False, True])
def test_training_arguments_resolve_auto(tmp_path, monkeypatch, native):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: native)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    args = ImageClassificationTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert args.bf16 is native and args.fp16 is False
    assert args.mixed_precision == ("bf16" if native else "no")
    assert ("has native bf16" if native else "no native bf16") in args.precision_choice


def test_explicit_bf16_on_a_cpu_without_it_warns(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: False)
    with caplog.at_level(logging.WARNING):
        args = ImageClassificationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True)
    assert args.bf16 and args.mixed_precision == "bf16"
    assert any(f"{hardware.CPU_BF16_SLOWDOWN} slower" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("native", [False, True])
def test_a_recipe_for_the_other_precision_names_the_one_to_use(tmp_path, monkeypatch, caplog, native):
    """The two 30-minute CPU recipes each name the other: the one tuned for bf16 warns on a CPU that trains in
    float32, and the float32 one on a CPU with native bf16; the recipe that fits says nothing."""
    from finetune.arguments import load_yaml_config

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda flags=None: native)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    configs = {}
    for name in ("cifar10_scratch_cpu30_stem.yaml", "cifar10_scratch_cpu30_stem_h48l4.yaml"):
        config = load_yaml_config(ROOT / "configs" / name)
        configs[config["recipe_precision"]] = (f"configs/{name}", config["recipe_alternative"])
    assert configs["bf16"][1] == configs["float32"][0] and configs["float32"][1] == configs["bf16"][0]
    for precision, (_, alternative) in configs.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            ImageClassificationTrainingArguments(
                output_dir=str(tmp_path), use_cpu=True, recipe_precision=precision, recipe_alternative=alternative
            )
        warned = [r.getMessage() for r in caplog.records if "This recipe is tuned for" in r.getMessage()]
        if precision == ("bf16" if native else "float32"):
            assert warned == []
        else:
            assert len(warned) == 1 and f"Use {alternative}, the recipe for it." in warned[0]
    with pytest.raises(ValueError, match="`recipe_precision` must be `bf16` or `float32`"):
        ImageClassificationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, recipe_precision="fp8")
