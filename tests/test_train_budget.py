"""benchmarks/train_budget.py: the report from finished runs, and one real budgeted run (slow)."""

import json

import pytest
from test_sweeps import benchmark, tiny_inputs

from benchmarks import train_budget
from finetune.errors import UsageError


def _fake_run(root, name, accuracies):
    run = root / "runs" / name
    run.mkdir(parents=True)
    history = [
        {"epoch": i + 1.0, "step": 10 * (i + 1), "eval_accuracy": a, "elapsed_seconds": 30.0 * (i + 1)}
        for i, a in enumerate(accuracies)
    ]
    results = {
        "history": history,
        "train": {"images_per_second": 1000.0, "seconds": 80.0, "data_seconds": 8.0},
        "validation": {"accuracy": max(accuracies)},
        "test": None,
        "epochs": float(len(accuracies)),
        "num_parameters": 1234,
        "hyperparameters": {"mixed_precision": "no"},
        "hardware": {"device": "cpu", "cpu": "Test CPU", "torch_threads": 2},
    }
    (run / "results.json").write_text(json.dumps(results))
    (run / "command.txt").write_text(f"python finetune/run.py --config {name}.yaml\n")


def test_report_tables_and_plot(tmp_path):
    _fake_run(tmp_path, "a", [0.3, 0.5, 0.6])
    _fake_run(tmp_path, "b", [0.4, 0.45])
    text = train_budget.report(tmp_path)
    assert (tmp_path / "curve.png").stat().st_size > 1000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["name"] for r in summary] == ["a", "b"]
    assert summary[0]["data_share"] == pytest.approx(0.1) and summary[0]["minutes"] == pytest.approx(1.5)
    row = "| a | 60.00% | 60.00% | — | 1.5 | 3.0 | 1,000 | 10.00% | 1.2K | float32 | CPU Test CPU, 2 threads |"
    assert row in text
    assert "| 1.0 | 2.0 | 50.00% |" in text and "`python finetune/run.py --config a.yaml`" in text


@pytest.mark.slow
def test_a_failed_run_is_one_line_and_the_runs_before_it_are_reported(tmp_path):
    """Typed in another folder: its relative paths (the runs' own options too) are read and written there."""
    tiny_inputs(tmp_path)
    done = benchmark(
        "train_budget.py", "--config", "tiny.yaml", "--config", "missing.yaml", "--minutes", "1", "--output", "out",
        "--dataset_name", "data.parquet", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: The run of missing.yaml ended with exit status 1 (its output is above); the runs that finished are "
        "kept in out/runs."
    )
    assert "| tiny |" in (tmp_path / "out" / "results.md").read_text()
    command = (tmp_path / "out" / "runs" / "tiny" / "command.txt").read_text()
    assert "--config tiny.yaml --max_train_minutes 1.0 --output_dir out/runs/tiny" in command


def test_a_report_of_no_runs_is_one_line_and_makes_nothing(tmp_path):
    done = benchmark("train_budget.py", "--report_only", "--output", "missing", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: No finished runs (runs/*/results.json) in missing. Fix: train some first:")
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_budgeted_run_end_to_end(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "model_type: scratch\ndataset_name: sklearn:digits\nvalidation_size: 0.2\nimage_size: 8\npatch_size: 2\n"
        "hidden_size: 16\nnum_hidden_layers: 1\nnum_attention_heads: 2\nintermediate_size: 32\n"
        "lr_scheduler_type: cosine\nwarmup_steps: 5\nnum_train_epochs: 1000\nbudget_schedule: true\n"
        "horizontal_flip: false\ndecoded_cache_dir: none\nreport_to: none\n"
    )
    out = tmp_path / "out"
    train_budget.main(
        ["--config", str(config), "--minutes", "0.2", "--output", str(out), "--suffix", "s3", "--seed", "3"]
    )
    run = json.loads((out / "runs" / "tiny_s3" / "results.json").read_text())
    assert run["epochs"] < 1000, "the budget, not the epochs, ended training"
    assert run["hyperparameters"]["seed"] == 3, "extra arguments reach finetune/run.py"
    assert run["history"] and run["history"][-1]["elapsed_seconds"] < 0.2 * 60 + 10
    assert (out / "curve.png").exists() and "| tiny_s3 |" in (out / "results.md").read_text()
    assert "--seed 3" in (out / "runs" / "tiny_s3" / "command.txt").read_text()


def test_suffix_names_the_run_and_needs_a_budget():
    assert train_budget.run_name("configs/cifar10_scratch_cpu30.yaml") == "cifar10_scratch_cpu30"
    assert train_budget.run_name("configs/cifar10_scratch_cpu30.yaml", "seed1") == "cifar10_scratch_cpu30_seed1"
    args, overrides = train_budget.parse_args(["--config", "a.yaml", "--minutes", "1", "--suffix", "x", "--seed", "1"])
    assert args.suffix == "x" and overrides == ["--seed", "1"]
    with pytest.raises(UsageError, match="--minutes must be > 0"):
        train_budget.parse_args(["--config", "a.yaml"])
