"""benchmarks/gpu_suite.py at a CPU size, so the GPU suite cannot rot: every part runs and writes its files."""

import json
import sys
from pathlib import Path

import datasets
import numpy as np
from PIL import Image


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_suite  # noqa: E402


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


def test_tiny_suite_writes_every_part(tmp_path):
    data = small_cifar_parquet(tmp_path / "train.parquet")
    out = tmp_path / "gpu"
    suite = gpu_suite.main(["--tiny", "--data", str(data), "--output", str(out)])
    saved = json.loads((out / "suite.json").read_text())
    text = (out / "suite.md").read_text()
    assert saved["device"] == suite["device"] and saved["device"] in text.splitlines()[0]
    pipelines = {(r["pipeline"], r["num_workers"]) for r in saved["pipeline"]}
    assert pipelines == {("example", 0), ("example", 8), ("ours", 0)}
    ours = next(r for r in saved["pipeline"] if r["pipeline"] == "ours")
    assert ours["train_images_per_s"] > 0 and ours["speedup_vs_example_default"] > 0
    assert 0 <= saved["scratch_recipe"]["validation_accuracy"] <= 1
    assert (out / "scratch_recipe" / "results.md").is_file()
    assert {r["preset"] for r in saved["model_speed"]} == {"cifar"}
    assert "## Scratch GPU recipe" in text and "ours / best example" in text
    methods = {r["method"]: r for r in saved["methods"]}
    assert list(methods) == ["full", "linear_probe", "lora", "full + layer_decay 0.75"]
    assert methods["full"]["trained_parameters"] == methods["full"]["parameters"]
    assert methods["linear_probe"]["trained_parameters"] == 32 * 10 + 10  # the head alone
    assert 0 < methods["lora"]["trained_parameters"] < methods["full"]["trained_parameters"]
    assert all(r["step_seconds"] > 0 for r in methods.values()) and "## Fine-tuning methods" in text
