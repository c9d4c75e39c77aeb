"""Metrics of both model paths: `evaluate` modules shipped in this folder, so nothing needs the Hub.

`compute_metrics` is what the Trainer calls after gathering every process's predictions (without the duplicates
that even sharding adds), so the numbers of a multi-process run equal those of one process.
"""

from functools import cache
from pathlib import Path

import evaluate
import numpy as np
from transformers import EvalPrediction


METRICS_DIR = Path(__file__).resolve().parent
# What an evaluation reports (`eval_accuracy`, `eval_loss`), and so what `metric_for_best_model` may name.
EVAL_METRICS = {"accuracy": True, "loss": False}  # name -> whether greater is better


@cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """Load one of the metric modules shipped in `finetune/metrics/` (`accuracy`, `top_k_accuracy`,
    `precision_recall_f1`, `confusion_matrix`)."""
    path = METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        available = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"Unknown metric {name!r}; the package ships {available}.")
    return evaluate.load(str(path))


TOP_K = 5


def compute_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """Accuracy of the argmax predictions, top-5 accuracy (with more than 5 classes) and macro F1; the Trainer
    prefixes them (`eval_accuracy`, `test_top5_accuracy`, `eval_macro_f1`)."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    logits = logits[0] if isinstance(logits, tuple) else logits
    predictions = np.argmax(logits, axis=-1)
    num_labels = logits.shape[-1]
    metrics = load_metric("accuracy").compute(predictions=predictions, references=labels)
    if num_labels > TOP_K:
        top_k = load_metric("top_k_accuracy").compute(predictions=logits, references=labels, k=TOP_K)
        metrics[f"top{TOP_K}_accuracy"] = top_k["top_k_accuracy"]
    scores = load_metric("precision_recall_f1").compute(
        predictions=predictions, references=labels, num_labels=num_labels
    )
    metrics["macro_f1"] = scores["macro_f1"]
    return metrics


def confusion_report(logits: np.ndarray, labels: np.ndarray, label_names: list[str]) -> dict:
    """Confusion matrix (`[true][predicted]` counts) and per-class accuracy, precision, recall and F1 keyed by label
    name (None where undefined)."""
    predictions = np.argmax(logits, axis=-1)
    result = load_metric("confusion_matrix").compute(
        predictions=predictions, references=labels, num_labels=len(label_names)
    )
    scores = load_metric("precision_recall_f1").compute(
        predictions=predictions, references=labels, num_labels=len(label_names)
    )

    def by_name(values):
        return {name: (None if np.isnan(value) else value) for name, value in zip(label_names, values)}

    return {
        "confusion_matrix": result["confusion_matrix"],
        "per_class_accuracy": by_name(result["per_class_accuracy"]),
        "per_class_precision": by_name(scores["precision"]),
        "per_class_recall": by_name(scores["recall"]),
        "per_class_f1": by_name(scores["f1"]),
    }
