"""Metrics of both model paths: `evaluate` modules shipped in this folder, so nothing needs the Hub.

The Trainer calls `compute_metrics` on every process's predictions gathered (without the duplicates that even
sharding adds), so a multi-process run reports the numbers of one process.
"""

import logging
from functools import cache
from pathlib import Path

import evaluate
import numpy as np
from transformers import EvalPrediction


METRICS_DIR = Path(__file__).resolve().parent
# What every evaluation reports (`eval_accuracy`, `eval_loss`, `eval_macro_f1`; `eval_map` for multi-label data), and
# so what `metric_for_best_model` may name (not top-5 accuracy, which five classes or fewer have not).
EVAL_METRICS = {"accuracy": True, "loss": False, "map": True, "macro_f1": True}  # name -> whether greater is better
TOP_K = 5
LOWEST = float(np.finfo(np.float32).min)  # a multi-label NaN score ranks below every real one, and is finite
logger = logging.getLogger(__name__)


@cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    if not (METRICS_DIR / name / f"{name}.py").is_file():
        available = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"Unknown metric {name!r}; the package ships {available}.")
    return evaluate.load(str(METRICS_DIR / name))


def nan_rows(logits: np.ndarray) -> np.ndarray:
    """The images `(N,)` whose logits hold a NaN: each counts as wrong (an argmax would have taken the first NaN's
    class for a prediction)."""
    return np.isnan(logits).any(axis=-1)


def classification_scores(logits: np.ndarray, labels: np.ndarray, num_labels: int) -> dict:
    """The `classification` module's figures for the argmax of `logits`; NaN logits predict -1, no class."""
    predictions = np.where(nan_rows(logits), -1, np.argmax(logits, axis=-1))
    return load_metric("classification").compute(predictions=predictions, references=labels, num_labels=num_labels)


def compute_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """Accuracy, top-5 accuracy (with more than 5 classes) and macro F1, or `multi_label_scores`."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    logits = logits[0] if isinstance(logits, tuple) else logits
    if (nan := nan_rows(logits)).any():
        logger.warning(f"{nan.sum():,} of {len(nan):,} images got NaN logits from the model: each counts as wrong.")
    if labels.ndim == 2:
        return multi_label_scores(logits, labels)
    scores = classification_scores(logits, labels, logits.shape[-1])
    metrics = {"accuracy": scores["accuracy"]}
    if logits.shape[-1] > TOP_K:
        top_k = load_metric("top_k_accuracy").compute(predictions=logits, references=labels, k=TOP_K)
        metrics[f"top{TOP_K}_accuracy"] = top_k["top_k_accuracy"]
    return {**metrics, "macro_f1": scores["macro_f1"]}


def confusion_report(logits: np.ndarray, labels: np.ndarray, label_names: list[str]) -> dict:
    """Confusion matrix and per-class accuracy (the recall), precision, recall and F1 by label name."""
    scores = classification_scores(logits, labels, len(label_names))
    return {
        "confusion_matrix": scores["confusion_matrix"],
        "per_class_accuracy": _by_name(label_names, scores["recall"]),
        **{f"per_class_{key}": _by_name(label_names, scores[key]) for key in ("precision", "recall", "f1")},
    }


def _by_name(label_names: list[str], values) -> dict[str, float | None]:
    return {name: (None if np.isnan(value) else float(value)) for name, value in zip(label_names, values)}


def finite_scores(logits: np.ndarray) -> np.ndarray:
    """Multi-label `logits` with a NaN (`nan_rows`) as the lowest score, never above a threshold, and infinite ones
    clipped, which scikit-learn's average precision refuses."""
    return np.nan_to_num(logits, nan=LOWEST, neginf=LOWEST, posinf=-LOWEST)


def multi_label_scores(logits: np.ndarray, labels: np.ndarray, thresholds=None) -> dict[str, float]:
    """`map` over the labels that have a positive image (a label no image has has no F1 either), micro and macro F1 at
    `thresholds` (None: 0.5, as the evaluations during training have no thresholds yet)."""
    from scipy.special import expit
    from sklearn.metrics import average_precision_score, f1_score

    logits = finite_scores(logits)
    present = np.flatnonzero(labels.sum(0) > 0)
    if thresholds is None:
        predicted = logits > 0  # sigmoid(logits) > 0.5
    else:  # as `multi_label_report` and the predictions CSVs
        predicted = expit(np.asarray(logits, dtype=np.float64)) >= np.asarray(thresholds)  # (N, K)
    if not len(present):
        return {"map": float("nan"), "micro_f1": float("nan"), "macro_f1": float("nan")}
    average_precision = average_precision_score(labels[:, present], logits[:, present], average=None)
    return {
        "map": float(np.mean(average_precision)),
        "micro_f1": float(f1_score(labels, predicted, average="micro", zero_division=0)),
        "macro_f1": float(f1_score(labels, predicted, labels=present, average="macro", zero_division=0)),
    }


def multi_label_report(
    logits: np.ndarray, labels: np.ndarray, label_names: list[str], validation_logits, validation_labels
) -> dict:
    """Per label: the threshold that maximises its F1 on the validation split (0.5 for a label no validation image
    has), and at those thresholds the precision, recall, F1, support and average precision."""
    from scipy.special import expit
    from sklearn.metrics import average_precision_score, precision_recall_curve, precision_recall_fscore_support

    logits, validation_logits = finite_scores(logits), finite_scores(validation_logits)
    thresholds = []
    validation_probabilities = expit(np.asarray(validation_logits, dtype=np.float64))
    for scores, truth in zip(validation_probabilities.T, validation_labels.T):  # one label at a time
        if not truth.any():
            thresholds.append(0.5)
            continue
        precision, recall, cuts = precision_recall_curve(truth, scores)  # cuts: the distinct scores, increasing
        f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)  # (len(cuts) + 1,): the last is recall 0
        best = np.argmax(f1[:-1])
        # Midway to the next lower score: the same F1, and no image sits on the threshold, where rounding would decide.
        thresholds.append(float((cuts[best] + (cuts[best - 1] if best > 0 else 0.0)) / 2))
    predicted = expit(np.asarray(logits, dtype=np.float64)) >= np.asarray(thresholds)  # (N, K)
    per_class = precision_recall_fscore_support(labels, predicted, zero_division=np.nan)
    average_precision = [average_precision_score(t, s) if t.any() else np.nan for s, t in zip(logits.T, labels.T)]
    return {
        "per_class_threshold": dict(zip(label_names, thresholds)),
        **{
            f"per_class_{key}": _by_name(label_names, values)
            for key, values in zip(("precision", "recall", "f1"), per_class)
        },
        "per_class_support": {name: int(n) for name, n in zip(label_names, per_class[3])},
        "per_class_average_precision": _by_name(label_names, average_precision),
    }
