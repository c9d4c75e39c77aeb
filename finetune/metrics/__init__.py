"""Metrics of both model paths: `evaluate` modules shipped in this folder, so nothing needs the Hub.

The Trainer calls `compute_metrics` on every process's predictions gathered (without the duplicates that even
sharding adds), so a multi-process run reports the numbers of one process.
"""

from functools import cache
from pathlib import Path

import evaluate
import numpy as np
from transformers import EvalPrediction


METRICS_DIR = Path(__file__).resolve().parent
# What an evaluation reports (`eval_accuracy`, `eval_loss`), and so what `metric_for_best_model` may name.
EVAL_METRICS = {"accuracy": True, "loss": False}  # name -> whether greater is better
TOP_K = 5


@cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """One of the metric modules in `finetune/metrics/` (`classification`, `top_k_accuracy`)."""
    if not (METRICS_DIR / name / f"{name}.py").is_file():
        available = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"Unknown metric {name!r}; the package ships {available}.")
    return evaluate.load(str(METRICS_DIR / name))


def classification_scores(logits: np.ndarray, labels: np.ndarray, num_labels: int) -> dict:
    """The `classification` module's figures for the argmax predictions of `logits` `(N, K)`."""
    predictions = np.argmax(logits, axis=-1)
    return load_metric("classification").compute(predictions=predictions, references=labels, num_labels=num_labels)


def compute_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """Accuracy, top-5 accuracy (with more than 5 classes) and macro F1; the Trainer prefixes them
    (`eval_accuracy`, `test_top5_accuracy`, `eval_macro_f1`)."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    logits = logits[0] if isinstance(logits, tuple) else logits
    scores = classification_scores(logits, labels, logits.shape[-1])
    metrics = {"accuracy": scores["accuracy"]}
    if logits.shape[-1] > TOP_K:
        top_k = load_metric("top_k_accuracy").compute(predictions=logits, references=labels, k=TOP_K)
        metrics[f"top{TOP_K}_accuracy"] = top_k["top_k_accuracy"]
    return {**metrics, "macro_f1": scores["macro_f1"]}


def confusion_report(logits: np.ndarray, labels: np.ndarray, label_names: list[str]) -> dict:
    """Confusion matrix (`[true][predicted]` counts) and per-class accuracy (the recall), precision, recall and F1
    keyed by label name (None where undefined)."""
    scores = classification_scores(logits, labels, len(label_names))

    def by_name(values):
        return {name: (None if np.isnan(value) else value) for name, value in zip(label_names, values)}

    return {
        "confusion_matrix": scores["confusion_matrix"],
        "per_class_accuracy": by_name(scores["recall"]),
        **{f"per_class_{key}": by_name(scores[key]) for key in ("precision", "recall", "f1")},
    }
