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
    """Load one of the metric modules shipped in `finetune/metrics/` (`accuracy`, `confusion_matrix`)."""
    path = METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        available = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"Unknown metric {name!r}; the package ships {available}.")
    return evaluate.load(str(path))


def compute_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """Accuracy of the argmax predictions; the Trainer prefixes it (`eval_accuracy`, `test_accuracy`)."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    logits = logits[0] if isinstance(logits, tuple) else logits
    return load_metric("accuracy").compute(predictions=np.argmax(logits, axis=-1), references=labels)


def confusion_report(logits: np.ndarray, labels: np.ndarray, label_names: list[str]) -> dict:
    """Confusion matrix (`[true][predicted]` counts) and per-class accuracy keyed by label name."""
    result = load_metric("confusion_matrix").compute(
        predictions=np.argmax(logits, axis=-1), references=labels, num_labels=len(label_names)
    )
    per_class = {
        name: (None if np.isnan(acc) else acc) for name, acc in zip(label_names, result["per_class_accuracy"])
    }
    return {"confusion_matrix": result["confusion_matrix"], "per_class_accuracy": per_class}
