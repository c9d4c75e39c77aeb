"""benchmarks/gpu_suite.py at a CPU size, so the GPU suite cannot rot: every part runs and writes its files, every row
has the hardware's limit beside it, and a failing row or part is recorded while the rest goes on."""

import json
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import flops  # noqa: E402
import gpu_suite  # noqa: E402

from scratch_vit import ScratchViTConfig, ScratchViTForImageClassification  # noqa: E402


def small_cifar_parquet(path: Path, n: int = 320, names: list[str] | None = None) -> Path:
    """A parquet file in the Hub's CIFAR-10 schema (`img`, `label`) with random 32 px images (label names `names`,
    default c0 ... c9)."""
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=names or [f"c{i}" for i in range(10)])}
    )
    dataset = datasets.Dataset.from_dict({"img": images, "label": [i % 10 for i in range(n)]}, features=features)
    dataset.to_parquet(str(path))
    return path


@pytest.mark.slow
def test_tiny_suite_writes_every_part(tmp_path):
    data = small_cifar_parquet(tmp_path / "train.parquet")
    out = tmp_path / "gpu"
    suite = gpu_suite.main(["--tiny", "--data", str(data), "--output", str(out)])
    saved = json.loads((out / "suite.json").read_text())
    text = (out / "suite.md").read_text()
    assert saved["device"] == suite["device"] and saved["device"] in text.splitlines()[0]
    assert saved["matmul_peak_tflops"] > 0
    for part in ("pipeline", "notebook_job", "scratch_recipe", "model_speed", "methods"):
        assert saved[part] and not [row for row in saved[part] if "error" in row], part

    pipelines = {(r["pipeline"], r["num_workers"], r["compile"]) for r in saved["pipeline"]}
    assert pipelines == {("example", 0, "no"), ("example", 8, "no"), ("ours", 0, "no"), ("ours", 0, "auto")}
    ours = [r for r in saved["pipeline"] if r["pipeline"] == "ours"]
    assert all(r["train_images_per_s"] > 0 and r["speedup_vs_example_best"] > 0 for r in ours if r["batch_size"] == 8)
    auto = next(r for r in ours if r["compile"] == "auto")
    assert "ms per step compiled against" in auto["compile_outcome"]
    assert all(r["training_flops_per_image"] > 0 for r in saved["pipeline"])

    jobs = {r["config"]: r for r in saved["notebook_job"]}
    assert list(jobs) == list(gpu_suite.NOTEBOOK_CONFIGS)
    assert all(r["train_seconds"] > 0 and r["images_per_second"] > 0 for r in jobs.values())
    assert jobs["configs/cifar10_vit_b16.yaml"]["batch_size"] == 16  # the tiny override of both configs' batch

    assert 0 <= saved["scratch_recipe"][0]["validation_accuracy"] <= 1
    assert (out / "scratch_recipe" / "results.md").is_file()
    assert {r["preset"] for r in saved["model_speed"]} == {"cifar"}
    methods = {r["method"]: r for r in saved["methods"]}
    assert list(methods) == ["full", "linear_probe", "lora", "full + layer_decay 0.75"]
    assert methods["linear_probe"]["trained_parameters"] == 32 * 10 + 10  # the head alone
    assert methods["linear_probe"]["training_flops_per_image"] < methods["full"]["training_flops_per_image"]
    for heading in ("## Training steps by input pipeline", "## The notebook's job", "## Scratch GPU recipe",
                    "## ScratchViT against", "## Fine-tuning methods", "TFLOP/s", "of measured peak"):  # fmt: skip
        assert heading in text, heading


def test_a_failing_row_and_part_are_recorded_and_the_rest_goes_on(tmp_path, monkeypatch):
    data = small_cifar_parquet(tmp_path / "train.parquet")
    out = tmp_path / "gpu"

    def crash(argv):
        raise AssertionError("InductorError in tiling_utils.get_pw_red_splits\nsecond line")

    monkeypatch.setattr(gpu_suite.model_speed, "main", crash)
    monkeypatch.setattr(gpu_suite.finetune_methods, "method_figures", lambda method, *args: {"bad": 1 / 0})
    gpu_suite.main(["--tiny", "--data", str(data), "--output", str(out), "--parts", "model_speed", "methods"])
    saved = json.loads((out / "suite.json").read_text())
    (row,) = saved["model_speed"]
    assert row["preset"] == "cifar" and row["compile"] is False
    assert row["error"] == "AssertionError: InductorError in tiling_utils.get_pw_red_splits"
    assert [r["error"] for r in saved["methods"]] == ["ZeroDivisionError: division by zero"] * 4
    text = (out / "suite.md").read_text()
    assert "cifar (False): **failed**, `AssertionError: InductorError" in text and "lora: **failed**" in text


def test_suite_files_are_written_as_it_goes(tmp_path, monkeypatch):
    data = small_cifar_parquet(tmp_path / "train.parquet")
    out = tmp_path / "gpu"
    seen = []

    def interrupted(*args):
        seen.append(json.loads((out / "suite.json").read_text()))
        raise KeyboardInterrupt  # the machine is taken back mid-suite

    monkeypatch.setattr(gpu_suite, "methods_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gpu_suite.main(["--tiny", "--data", str(data), "--output", str(out), "--parts", "model_speed", "methods"])
    assert seen[0]["model_speed"][0]["ours_images_per_s"] > 0  # on disk before the next part began


def test_training_flops_of_a_vit_match_the_formula():
    """A ViT's matrix products, counted by hand: patch projection, per layer QKV, QK^T, AV, output projection and
    MLP, and the head (2 FLOPs per multiply-add); a training step adds about twice the forward pass."""
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                       intermediate_size=128, num_labels=10)  # fmt: skip
    model = ViTForImageClassification(config)
    N, D, I, L = (32 // 8) ** 2, 64, 128, 3
    T = N + 1
    forward = 2 * (N * 3 * 8 * 8 * D + L * (T * D * 3 * D + 2 * T * T * D + T * D * D + 2 * T * D * I) + D * 10)
    assert flops.forward_flops_per_image(model, 32) == forward
    assert 2.8 * forward < flops.training_flops_per_image(model, 32) < 3.0 * forward
    vit_b16 = ViTForImageClassification(ViTConfig(num_labels=10))
    assert flops.training_flops_per_image(vit_b16, 224) == pytest.approx(105.1e9, rel=0.01)  # 3 x 17.6 GMAC


def test_flops_of_a_scratch_vit_with_a_stem_count_its_convolutions():
    linear = ScratchViTForImageClassification(ScratchViTConfig(num_labels=10))
    stem = ScratchViTForImageClassification(ScratchViTConfig(num_labels=10, patch_embedding_type="conv_stem"))
    assert flops.forward_flops_per_image(stem, 32) > flops.forward_flops_per_image(linear, 32)


def test_peaks_and_achieved_rates():
    assert flops.spec_peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert flops.spec_peak_tflops("NVIDIA H200") == 989.4
    assert flops.spec_peak_tflops("Some new GPU") is None
    assert flops.achieved(1000.0, 1e9, 4.0) == {"tflops": 1.0, "peak_share": 0.25}
    assert flops.achieved(None, 1e9, 4.0) == {"tflops": None, "peak_share": None}
    assert flops.matmul_peak_tflops(torch.device("cpu"), torch.float32, size=128) > 0
