"""The shipped metric modules against hand-computed values (and scikit-learn), and the new metrics' path into
results.json, the comparison report and the model card."""

import json
import logging

import numpy as np
import pytest
from helpers_runs import make_run_dir
from huggingface_hub import ModelCard
from sklearn.metrics import f1_score, precision_recall_fscore_support, top_k_accuracy_score
from transformers import EvalPrediction

from finetune.metrics import compute_metrics, confusion_report, load_metric
from finetune.results import EvalMetrics, Results
from finetune.tools import compare, model_card


# Three classes, six images: class 0 TP 1 of 2 predicted / 2 true; class 1 TP 2 of 3 / 2; class 2 TP 1 of 1 / 2.
REFERENCES = [0, 0, 1, 1, 2, 2]
PREDICTIONS = [0, 1, 1, 1, 0, 2]
PRECISION = [1 / 2, 2 / 3, 1.0]
RECALL = [1 / 2, 1.0, 1 / 2]
F1 = [1 / 2, 4 / 5, 2 / 3]  # 2PR / (P + R): (2 * 2/3 * 1) / (5/3) = 4/5; (2 * 1 * 1/2) / (3/2) = 2/3
MACRO_F1 = 59 / 90  # (1/2 + 4/5 + 2/3) / 3 = (15 + 24 + 20) / 90


def test_precision_recall_f1_by_hand():
    result = load_metric("classification").compute(predictions=PREDICTIONS, references=REFERENCES)
    assert result["accuracy"] == pytest.approx(4 / 6)
    np.testing.assert_allclose(result["precision"], PRECISION)
    np.testing.assert_allclose(result["recall"], RECALL)
    np.testing.assert_allclose(result["f1"], F1)
    assert result["macro_f1"] == pytest.approx(MACRO_F1)
    assert result["macro_precision"] == pytest.approx((1 / 2 + 2 / 3 + 1) / 3)


def test_precision_recall_f1_matches_sklearn_with_absent_classes():
    rng = np.random.default_rng(0)
    references, predictions = rng.integers(0, 6, 200), rng.integers(0, 7, 200)
    predictions[predictions == 3] = 4  # class 3 is never predicted: precision undefined, counted as 0 in the mean
    result = load_metric("classification").compute(
        predictions=predictions, references=references, num_labels=8
    )  # class 7 occurs nowhere: left out of the macro averages, as scikit-learn does
    precision, recall, f1, _ = precision_recall_fscore_support(
        references, predictions, labels=range(8), zero_division=0
    )
    assert np.isnan(result["precision"][3]) and np.isnan(result["recall"][6]) and np.isnan(result["f1"][7])
    np.testing.assert_allclose(np.nan_to_num(result["f1"][:7]), f1[:7])
    np.testing.assert_allclose(np.nan_to_num(result["recall"][:6]), recall[:6])
    assert result["macro_f1"] == pytest.approx(f1_score(references, predictions, average="macro", zero_division=0))


def test_unknown_metric_names_the_shipped_ones():
    with pytest.raises(
        ValueError, match=r"Unknown metric 'f1'; the package ships \['classification', 'top_k_accuracy'\]"
    ):
        load_metric("f1")


def test_top_k_accuracy_by_hand():
    scores = np.tile(np.arange(7, dtype=np.float32), (4, 1))  # class 6 scores highest, class 0 lowest
    # label 6: 0 classes above it (hit); 2: 4 above (hit); 1: 5 above (miss); 0: 6 above (miss)
    result = load_metric("top_k_accuracy").compute(predictions=scores, references=[6, 2, 1, 0], k=5)
    assert result["top_k_accuracy"] == 0.5
    assert load_metric("top_k_accuracy").compute(predictions=scores[:2], references=[1, 1], k=6)["top_k_accuracy"] == 1
    # Ties share the places left: equal scores for 10 classes give 5 / 10 (they counted as hits: 100%); a label tied
    # with 3 others for the last 2 places of the top 5 counts 2 / 4.
    constant = load_metric("top_k_accuracy").compute(predictions=np.zeros((3, 10)), references=[0, 4, 9], k=5)
    assert constant["top_k_accuracy"] == pytest.approx(0.5)
    tie = np.array([[9.0, 8, 7, 5, 5, 5, 5, 1]])  # 3 classes above the label (class 3), tied with 3 more
    assert load_metric("top_k_accuracy").compute(predictions=tie, references=[3], k=5)["top_k_accuracy"] == 0.5
    nan = np.array([[np.nan] * 10, [np.nan] + [0.0] * 9])  # a diverged model's scores: misses, not hits
    assert load_metric("top_k_accuracy").compute(predictions=nan, references=[0, 1], k=5)["top_k_accuracy"] == 0
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=(50, 10)).astype(np.float32), rng.integers(0, 10, 50)
    ours = load_metric("top_k_accuracy").compute(predictions=logits, references=labels, k=5)["top_k_accuracy"]
    assert ours == pytest.approx(top_k_accuracy_score(labels, logits, k=5, labels=range(10)))


def one_hot_logits(predictions, num_labels):
    logits = np.zeros((len(predictions), num_labels), dtype=np.float32)
    logits[np.arange(len(predictions)), predictions] = 1.0
    return logits


def test_compute_metrics_adds_top5_only_above_five_classes():
    metrics = compute_metrics(EvalPrediction(one_hot_logits(PREDICTIONS, 3), np.array(REFERENCES)))
    assert metrics == pytest.approx({"accuracy": 4 / 6, "macro_f1": MACRO_F1})
    logits = np.tile(np.arange(7, dtype=np.float32), (4, 1))
    metrics = compute_metrics(EvalPrediction(logits, np.array([6, 2, 1, 0])))
    assert metrics["top5_accuracy"] == 0.5 and metrics["accuracy"] == 0.25
    # argmax is class 6 for every image: F1 of class 6 is 2 * (1/4 * 1) / (5/4) = 0.4; classes 0, 1, 2 score 0
    assert metrics["macro_f1"] == pytest.approx(0.4 / 4)


def test_an_image_with_nan_logits_counts_as_wrong_everywhere(caplog):
    """argmax took a NaN row's first NaN for the prediction: a model of NaNs scored the share of class 0 in accuracy
    and 0 in top-5. Now such an image is wrong in every figure, absent from the confusion matrix, and said."""
    logits = one_hot_logits(PREDICTIONS, 4)
    logits[[0, 1]] = np.nan  # image 0 was right (a for a), image 1 wrong (b for a)
    with caplog.at_level(logging.WARNING, logger="finetune"):
        metrics = compute_metrics(EvalPrediction(logits, np.array(REFERENCES)))
        report = confusion_report(logits, np.array(REFERENCES), ["a", "b", "c", "d"])
    # Said once for the evaluation, not again by each figure of its report.
    assert caplog.text.count("2 of 6 images got NaN logits from the model: each counts as wrong.") == 1
    assert metrics["accuracy"] == pytest.approx(3 / 6)
    assert report["confusion_matrix"] == [[0, 0, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    assert report["per_class_recall"]["a"] == 0.0  # both images of a: one predicted c, one NaN
    # Macro F1 over the classes that occur (a, b, c), the NaN rows' -1 not among them: a 0, b 1, c 2/3.
    assert metrics["macro_f1"] == pytest.approx((0 + 1 + 2 / 3) / 3)
    everything_nan = np.full((4, 7), np.nan, dtype=np.float32)
    metrics = compute_metrics(EvalPrediction(everything_nan, np.array([0, 2, 1, 0])))
    assert metrics == {"accuracy": 0.0, "top5_accuracy": 0.0, "macro_f1": 0.0}


def test_confusion_report_per_class_by_name():
    report = confusion_report(one_hot_logits(PREDICTIONS, 4), np.array(REFERENCES), ["a", "b", "c", "d"])
    assert report["confusion_matrix"] == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    assert report["per_class_precision"] == pytest.approx({"a": 0.5, "b": 2 / 3, "c": 1.0, "d": None})
    assert report["per_class_recall"] == report["per_class_accuracy"]
    assert report["per_class_f1"]["b"] == pytest.approx(0.8) and report["per_class_f1"]["d"] is None


def test_eval_metrics_from_the_trainer_names():
    metrics = {"test_accuracy": 0.5, "test_top5_accuracy": 0.9, "test_macro_f1": 0.45, "test_loss": 1.0}
    assert EvalMetrics.from_trainer(metrics, "test") == EvalMetrics(
        accuracy=0.5, loss=1.0, top5_accuracy=0.9, macro_f1=0.45
    )


@pytest.fixture()
def run_with_new_metrics(tmp_path):
    run = make_run_dir(tmp_path / "run", "pretrained", extras=False)
    data = json.loads((run / "results.json").read_text())
    labels = data["label_names"]
    data["validation"].update(top5_accuracy=0.97, macro_f1=0.4812)
    data["test"].update(top5_accuracy=0.96, macro_f1=0.4401)
    data["per_class_precision"] = {label: 0.25 + 0.1 * i for i, label in enumerate(labels)}
    data["per_class_recall"] = data["per_class_accuracy"]
    data["per_class_f1"] = {label: 0.3 + 0.1 * i for i, label in enumerate(labels)}
    (run / "results.json").write_text(json.dumps(data))
    return run, data


def test_old_results_load_without_the_new_fields(tmp_path):
    run = make_run_dir(tmp_path / "old", "scratch", extras=False)
    results = Results.load(run)
    assert results.validation.top5_accuracy is None and results.per_class_precision == {}


def test_new_metrics_in_report_and_card(run_with_new_metrics, tmp_path):
    run, data = run_with_new_metrics
    results = Results.load(run)
    assert results.test.macro_f1 == 0.4401 and results.per_class_f1 == data["per_class_f1"]
    text = compare.write_comparison([run], tmp_path / "cmp").read_text()
    summary_line = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert summary_line.rstrip(" |").endswith("96.00% | 0.4401")  # top-5 and macro F1 of the test split
    first_label = data["label_names"][0]
    class_line = next(line for line in text.splitlines() if line.startswith(f"| {first_label} |"))
    assert "25.00%" in class_line and "30.00%" in class_line
    model_card.write_model_card(run, "me/model")
    card = ModelCard.load(run / "README.md")
    values = {(r.dataset_split, r.metric_type): (r.metric_value, r.metric_args) for r in card.data.eval_results}
    assert values[("test", "top_k_accuracy")] == (0.96, {"k": 5})
    assert values[("validation", "f1")] == (0.4812, {"average": "macro"})
    assert values[("test", "accuracy")][0] == data["test"]["accuracy"]
    assert "| test | 45.00% | 96.00% | 0.4401 |" in card.text
    assert f"| {first_label} | " in card.text and "Precision" in card.text
