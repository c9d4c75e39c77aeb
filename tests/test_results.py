"""The results.json schema: a run's file round-trips through `Results`, and readers tolerate missing parts."""

import json

import pytest
from helpers_runs import make_run_dir

from finetune.results import EvalMetrics, Results, find_run_dirs, history_from_log_history, results_of_model


def test_round_trip_keeps_every_field(tmp_path):
    run = make_run_dir(tmp_path / "run", "pretrained", extras=False)
    written = json.loads((run / "results.json").read_text())
    results = Results.load(run)
    assert results.validation.accuracy == written["validation"]["accuracy"]
    assert results.train.seconds == written["train"]["seconds"] and results.history[0].epoch == 1.0
    results.save(tmp_path)
    again = json.loads((tmp_path / "results.json").read_text())
    assert Results.from_dict(again) == results
    for key, value in written.items():  # every value written survives; missing optional ones come back as None
        if isinstance(value, dict):
            assert value.items() <= again[key].items(), key
        elif key == "history":  # rows alike
            assert len(value) == len(again[key]) and all(r.items() <= a.items() for r, a in zip(value, again[key]))
        else:
            assert again[key] == value, key


def test_trainer_metrics_lose_their_prefix():
    metrics = {"eval_accuracy": 0.5, "eval_loss": 1.0, "eval_runtime": 2.0, "eval_samples_per_second": 3.0, "epoch": 1}
    assert EvalMetrics.from_trainer(metrics, "eval") == EvalMetrics(0.5, 1.0, 2.0, 3.0)
    assert EvalMetrics.from_trainer(None, "test") is None


def test_history_rows_carry_the_last_training_loss_and_the_clock():
    log = [
        {"loss": 2.0, "step": 5},
        {"loss": 1.5, "step": 10},
        {"eval_accuracy": 0.4, "eval_loss": 1.6, "epoch": 1.0, "step": 10, "elapsed_seconds": 12.5},
        {"loss": 1.0, "step": 15},
        {"eval_accuracy": 0.6, "eval_loss": 1.1, "epoch": 2.0, "step": 20, "elapsed_seconds": 25.0},
    ]
    rows = history_from_log_history(log)
    assert [(r.train_loss, r.eval_accuracy, r.elapsed_seconds) for r in rows] == [(1.5, 0.4, 12.5), (1.0, 0.6, 25.0)]


def test_unreadable_results_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="results.json does not exist"):
        Results.load(tmp_path)
    (tmp_path / "results.json").write_text("{not json")
    # The fix named the rerun, which took the model for finished (`model_type: both`) and failed the same way.
    with pytest.raises(ValueError, match=r"results.json is not valid JSON .* `--resume_from_checkpoint true`, which"):
        Results.load(tmp_path)


def test_the_results_of_a_model_are_its_own_or_its_run_folders(tmp_path):
    """One rule for evaluation (`check_held_out_as_trained`), predict and export: a model folder without results.json
    inside a run folder (a checkpoint-*, a LoRA run's merged/, an ONNX export) takes the run folder's."""
    run = make_run_dir(tmp_path / "run", run_name="the-run")  # it writes checkpoint-3/ too
    (run / "onnx").mkdir()
    (run / "onnx" / "model.onnx").write_bytes(b"onnx")
    make_run_dir(run / "inner", run_name="inner-run")
    assert results_of_model(run).run_name == "the-run"
    assert results_of_model(run / "checkpoint-3").run_name == "the-run"
    assert results_of_model(run / "onnx").run_name == "the-run"
    assert results_of_model(run / "inner").run_name == "inner-run"
    assert results_of_model(run / "inner" / "checkpoint-3").run_name == "inner-run"
    assert results_of_model(tmp_path / "elsewhere") is None
    assert results_of_model("google/vit-base-patch16-224-in21k") is None


def test_a_run_given_twice_is_compared_once(tmp_path):
    """`compare RUN RUN` and `compare OUTPUT OUTPUT/scratch` compared a run with itself, "good and good"."""
    output = tmp_path / "out"
    scratch, pretrained = make_run_dir(output / "scratch"), make_run_dir(output / "pretrained", "pretrained")
    assert find_run_dirs([scratch, scratch]) == [scratch]
    assert find_run_dirs([output, scratch]) == [pretrained, scratch]
    found = find_run_dirs([scratch, tmp_path / "out" / ".." / "out"])  # the same folders by another path
    assert [p.resolve() for p in found] == [scratch.resolve(), pretrained.resolve()]
