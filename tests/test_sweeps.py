"""benchmarks/gpu_sweep.py and benchmarks/lr_sweep.py at a CPU size: real runs side by side, one of them made to
diverge, and the tables that report it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
import gpu_sweep  # noqa: E402
import lr_sweep  # noqa: E402
import sweep  # noqa: E402
from test_gpu_suite import small_cifar_parquet  # noqa: E402


# ViT's patch projection (no BatchNorm to hold activations in range) goes non-finite at once at this rate.
ABSURD = "--learning_rate 1e6 --patch_embedding_type linear --max_nonfinite_steps 2"
# A run of a few seconds: 2 steps of a one-layer ScratchViT at 8 px, its data left to the command line.
TINY_CONFIG = (
    "model_type: scratch\nimage_size: 8\npatch_size: 4\nhidden_size: 16\nnum_hidden_layers: 1\n"
    "num_attention_heads: 2\nintermediate_size: 32\nvalidation_size: 16\nmax_steps: 2\n"
    "per_device_train_batch_size: 8\ndecoded_cache_dir: none\nreport_to: none\n"
)


def tiny_inputs(folder: Path) -> None:
    """`data.parquet` (48 CIFAR-like images) and `tiny.yaml` (`TINY_CONFIG`) in `folder`, for runs typed there."""
    small_cifar_parquet(folder / "data.parquet", n=48)
    (folder / "tiny.yaml").write_text(TINY_CONFIG)


def benchmark(script: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python benchmarks/SCRIPT ARGV` typed in `cwd`."""
    command = [sys.executable, str(ROOT / "benchmarks" / script), *argv]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_variant_parsing():
    assert sweep.Variant.parse("plain") == sweep.Variant("plain", [])
    assert sweep.Variant.parse("lr=--learning_rate 1e-3 --bf16 false") == sweep.Variant(
        "lr", ["--learning_rate", "1e-3", "--bf16", "false"]
    )
    with pytest.raises(ValueError, match="NAME=--key value"):
        sweep.Variant.parse("=--learning_rate 1")


@pytest.mark.slow
def test_a_sweep_typed_in_another_folder_reads_and_writes_there_and_names_a_failed_run(tmp_path):
    """Relative paths mean what they mean where the command is typed, the runs' own options included; a run that
    fails is one line naming it, after the report of every run."""
    tiny_inputs(tmp_path)
    done = benchmark(
        "sweep.py", "--config", "tiny.yaml", "--variant", "a", "--variant", "b=--learning_rate x", "--output", "out",
        "--dataset_name", "data.parquet", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: 1 of 2 runs failed; b ended with exit status 2: --learning_rate: invalid float value: 'x' "
        "(its log: out/runs/b.log; every run's row: out/sweep.md)."
    )
    a, b = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert a["status"] == "finished" and b["status"] == "failed", a["error"]
    assert (tmp_path / "out" / "runs" / "a" / "results.json").is_file()
    assert "--config tiny.yaml --dataset_name data.parquet --output_dir out/runs/a" in a["command"]


@pytest.mark.slow
def test_gpu_sweep_names_a_failed_run_after_its_report(tmp_path):
    """It wrote the report and exited 0: a sweep whose runs failed read as done."""
    small_cifar_parquet(tmp_path / "data.parquet")
    done = benchmark(
        "gpu_sweep.py", "--tiny", "--data", "data.parquet", "--output", "out", "--variants", "as_shipped",
        "--variant", "bad=--learning_rate x", "--num_train_epochs", "1", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.count("error:") == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: 1 of 2 runs failed; bad ended with exit status 2: --learning_rate: invalid float value: 'x' "
        "(its log: out/runs/bad.log; every run's row: out/sweep.md)."
    )
    finished, failed = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert finished["status"] == "finished" and failed["status"] == "failed", finished["error"]


@pytest.mark.parametrize("script", ["sweep.py", "lr_sweep.py"])
def test_a_report_of_no_runs_is_one_line_and_makes_nothing(tmp_path, script):
    (tmp_path / "empty").mkdir()
    for output in ("missing", "empty"):
        done = benchmark(script, "--report_only", "--output", output, cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("error: No runs ") and f"{output}/runs" in done.stderr
        assert f"`python benchmarks/{script} " in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["empty"]


def test_an_lr_sweep_whose_data_cannot_be_read_makes_nothing(tmp_path):
    """It made --output before loading the data, and left it empty."""
    done = benchmark("lr_sweep.py", "--dataset_name", "missing.parquet", "--output", "out", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: The dataset path 'missing.parquet' does not exist.")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_gpu_sweep_runs_variants_side_by_side_and_reports_a_divergence(tmp_path):
    data = small_cifar_parquet(tmp_path / "train.parquet")
    out = tmp_path / "sweep"
    argv = ["--tiny", "--data", str(data), "--output", str(out), "--minutes", "2", "--parallel", "2"]
    rows = gpu_sweep.main([*argv, "--variants", "as_shipped", "no_qk_norm", "--variant", f"absurd_lr={ABSURD}"])
    by_name = {r["name"]: r for r in rows}
    assert list(by_name) == ["as_shipped", "no_qk_norm", "absurd_lr"]
    for name in ("as_shipped", "no_qk_norm"):
        row = by_name[name]
        assert row["status"] == "finished" and row["first_nonfinite_step"] is None
        assert len(row["timeline"]) == 2 and 0 <= row["validation_accuracy"] <= 1
        assert row["images_per_second"] > 0 and 0 < row["data_share"] < 1
    diverged = by_name["absurd_lr"]
    assert diverged["status"] == "diverged" and diverged["first_nonfinite_step"] >= 1
    assert diverged["error"].startswith("Training diverged: 2 optimizer steps in a row")
    text = (out / "sweep.md").read_text()
    assert "| absurd_lr | diverged |" in text and "first non-finite step" in text
    assert json.loads((out / "sweep.json").read_text()) == rows
    saved = json.loads((out / "runs" / "no_qk_norm" / "config.json").read_text())
    assert saved["qk_norm"] is False and "--qk_norm false" in by_name["no_qk_norm"]["command"]
    assert json.loads((out / "runs" / "as_shipped" / "config.json").read_text())["qk_norm"] is True


@pytest.mark.slow
def test_lr_sweep_tabulates_each_variant_and_learning_rate(tmp_path):
    data = small_cifar_parquet(tmp_path / "train.parquet")
    out = tmp_path / "lr"
    rows = lr_sweep.main(
        [
            "--dataset_name", str(data), "--output", str(out), "--learning_rates", "1e-3", "1e6",
            "--variants", "float32", "bf16_qk_norm", "--max_steps", "6", "--warmup_steps", "1",
            "--validation_size", "64", "--logit_images", "16", "--decoded_cache_dir", str(tmp_path / "cache"),
            "--hidden_size", "24", "--num_attention_heads", "2", "--intermediate_size", "48",
            "--num_hidden_layers", "1", "--patch_embedding_type", "linear", "--per_device_train_batch_size", "32",
            "--logging_steps", "2", "--max_nonfinite_steps", "2",
        ]
    )  # fmt: skip
    for variant in ("float32", "bf16_qk_norm"):
        calm, absurd = rows[variant]["1e-3"], rows[variant]["1e6"]
        assert calm["status"] == "finished" and calm["largest_attention_logit"] > 0
        assert calm["last_train_loss"] is not None
        assert absurd["status"] == "diverged" and absurd["largest_attention_logit"] is None
    text = (out / "lr_sweep.md").read_text()
    assert "| learning rate | float32 | bf16_qk_norm |" in text
    assert text.count("**diverged** at step") == 2
    assert (out / "lr_sweep.png").stat().st_size > 0 and (out / "sweep.md").is_file()
    run_config = json.loads((out / "runs" / "bf16_qk_norm_lr1e-3" / "config.json").read_text())
    assert run_config["qk_norm"] is True and run_config["hidden_size"] == 24
