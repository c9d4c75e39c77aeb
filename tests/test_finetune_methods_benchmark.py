"""benchmarks/finetune_methods.py at a tiny size, so the methods benchmark cannot rot: the cifar10 measurement trains
its source on five classes and fine-tunes it on the other five; the ViT-B/16 figures count what each method trains."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_suite import small_cifar_parquet


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import finetune_methods  # noqa: E402


CIFAR10_NAMES = [*finetune_methods.CIFAR10_SOURCE_CLASSES, *finetune_methods.CIFAR10_TARGET_CLASSES]


@pytest.mark.slow
def test_cifar10_source_on_five_classes_fine_tuned_on_the_other_five(tmp_path):
    data = small_cifar_parquet(tmp_path / "train.parquet", n=200, names=CIFAR10_NAMES)
    work, out = tmp_path / "work", tmp_path / "out"
    rows = finetune_methods.main(
        ["cifar10", "--dataset_name", str(data), "--work_dir", str(work), "--output", str(out),
         "--methods", "linear_probe", "--num_train_epochs", "1", "--source_epochs", "1", "--validation_size", "20",
         "--per_device_train_batch_size", "16", "--decoded_cache_dir", "none"]
    )  # fmt: skip
    source = json.loads((work / "source_model" / "config.json").read_text())
    assert list(source["id2label"].values()) == finetune_methods.CIFAR10_SOURCE_CLASSES
    [row] = rows
    assert row["method"] == "linear_probe" and row["learning_rate"] == 1e-2
    assert row["trained_parameters"] == 64 * 5 + 5  # the new five-class head alone
    assert 0 <= row["validation_accuracy"] <= 1 and row["step_seconds"] > 0
    tuned = json.loads((work / "linear_probe" / "config.json").read_text())
    assert list(tuned["id2label"].values()) == finetune_methods.CIFAR10_TARGET_CLASSES
    assert "| linear_probe | 0.01 | 1.0 |" in (out / "cifar10.md").read_text()


@pytest.mark.slow
def test_a_failed_method_is_one_line_after_the_report_of_those_before_it(tmp_path):
    """`--merge_lora true` is refused by every method but LoRA: LoRA trains, then the linear probe fails at once."""
    small_cifar_parquet(tmp_path / "train.parquet", n=100, names=CIFAR10_NAMES)
    for name in ("source_init", "source_model"):  # the source found made and trained: not made again
        finetune_methods.make_cifar10_source_init(tmp_path / "work" / name)
    (tmp_path / "work" / "source_model" / "results.json").write_text("{}")
    argv = [
        "cifar10", "--dataset_name", "train.parquet", "--work_dir", "work", "--output", "out", "--methods", "lora",
        "linear_probe", "--merge_lora", "true", "--max_steps", "1", "--validation_size", "20",
        "--per_device_train_batch_size", "16", "--decoded_cache_dir", "none",
    ]  # fmt: skip
    command = [sys.executable, str(ROOT / "benchmarks" / "finetune_methods.py"), *argv]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.splitlines()[-1] == "error: The linear_probe run ended with exit status 1 (its output is above)."
    )
    [row] = json.loads((tmp_path / "out" / "cifar10.json").read_text())
    assert row["method"] == "lora" and "| lora | 0.005 |" in (tmp_path / "out" / "cifar10.md").read_text()


def test_vit_b16_figures_count_what_each_method_trains():
    probe, lora = (finetune_methods.method_figures(m) for m in ("linear_probe", "lora"))
    assert probe["parameters"] == 85_806_346 and probe["trained_parameters"] == 768 * 10 + 10  # ViT-B/16, its head
    adapters = 12 * 2 * 2 * 8 * 768  # 12 layers x (query, value) x (A, B) x r 8 x 768
    # peft trains a copy of the head (`modules_to_save`) and keeps the original beside it
    assert lora["trained_parameters"] == adapters + probe["trained_parameters"]
    assert lora["parameters"] == probe["parameters"] + lora["trained_parameters"]
    assert lora["adamw_state_mib"] == 8 * lora["trained_parameters"] / 2**20


@pytest.mark.slow
def test_batch_scaling_compares_a_small_batch_with_learning_rates_at_a_large_one(tmp_path):
    import batch_scaling

    data = small_cifar_parquet(tmp_path / "train.parquet", n=200, names=CIFAR10_NAMES)
    rows = batch_scaling.main(
        ["--dataset_name", str(data), "--work_dir", str(tmp_path / "work"), "--output", str(tmp_path / "out"),
         "--base_batch", "4", "--factor", "4", "--rates", "5e-4", "2e-3", "--num_train_epochs", "1",
         "--source_epochs", "1", "--validation_size", "20", "--decoded_cache_dir", "none"]
    )  # fmt: skip
    assert [r["name"] for r in rows] == ["batch4_lr0.0005", "batch16_lr0.0005", "batch16_lr0.002"]
    assert all(r["status"] == "finished" and 0 <= r["validation_accuracy"] <= 1 for r in rows)
    run = json.loads((tmp_path / "out" / "runs" / "batch16_lr0.002" / "results.json").read_text())
    assert run["hyperparameters"]["per_device_train_batch_size"] == 16
    assert run["hyperparameters"]["learning_rate"] == 2e-3
    assert "| batch16_lr0.002 | finished |" in (tmp_path / "out" / "sweep.md").read_text()
