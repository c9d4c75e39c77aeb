"""benchmarks/model_speed.py: both models really train under the benchmark, with paired, alternating timings."""

import json

import pytest

from benchmarks import model_speed


@pytest.mark.slow
def test_benchmark_times_both_models_in_pairs(tmp_path):
    output = tmp_path / "new" / "speed.json"  # a folder that does not exist yet: made before the measurement
    results = model_speed.main(
        ["--preset", "cifar", "--repeats", "3", "--steps", "1", "--threads", "1", "--output", str(output)]
    )
    assert [(r.preset, r.attention) for r in results] == [("cifar", "sdpa"), ("cifar", "eager")]
    for r in results:
        assert r.ours_params == r.transformers_params == 119_194  # the notebook's CIFAR-10 model, both sides
        assert len(r.ours_all) == len(r.transformers_all) == 3
        ratios = sorted(a / b for a, b in zip(r.ours_all, r.transformers_all))
        assert r.ratio == pytest.approx(ratios[1]) and (r.ratio_min, r.ratio_max) == pytest.approx(
            (ratios[0], ratios[-1])
        )
        assert r.ours_images_per_s > 0 and r.transformers_images_per_s > 0
    saved = json.loads(output.read_text())
    assert saved["threads"] == 1 and len(saved["results"]) == 2


def test_models_learn_under_the_benchmark_step():
    """The timed step is a real training step: the loss of both models falls on the fixed batch."""
    import torch

    models = model_speed.build_models(model_speed.PRESETS["cifar"], ["sdpa"])
    pixels, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    for model in models.values():
        step = model_speed.make_step(model, torch.device("cpu"), compile_model=False, bf16=False)
        with torch.no_grad():
            before = torch.nn.functional.cross_entropy(model(pixel_values=pixels).logits, labels).item()
        for _ in range(20):
            step(pixels, labels)
        with torch.no_grad():
            after = torch.nn.functional.cross_entropy(model(pixel_values=pixels).logits, labels).item()
        assert after < before - 0.1, (type(model).__name__, before, after)
