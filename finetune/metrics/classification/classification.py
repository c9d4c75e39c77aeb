"""Accuracy, confusion matrix and per-class precision, recall and F1 with their macro averages (scikit-learn's),
shipped in the package so that evaluation never needs the Hub. One module, so one pass of `evaluate` per split."""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support


_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`), references (`list` of `int`): predicted and true labels; a prediction of -1 (no
        class: the model gave NaN) is wrong, and absent from the confusion matrix.
    num_labels (`int`, *optional*): number of classes; defaults to the largest label seen plus one.
Returns:
    accuracy (`float`): the fraction of predictions equal to their reference.
    confusion_matrix (`list` of `list` of `int`): `[true][predicted]` counts.
    precision, recall, f1 (`list` of `float`): per class; `nan` where undefined (precision of a class never
        predicted, recall of a class with no sample, F1 of a class absent from both). The recall is the per-class
        accuracy.
    macro_precision, macro_recall, macro_f1 (`float`): means over the classes that occur, undefined ones as 0
        (scikit-learn's `average="macro", zero_division=0`).
"""


class Classification(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, num_labels=None):
        num_labels = num_labels or int(max(max(predictions, default=-1), max(references, default=-1))) + 1
        labels, names = range(num_labels), ("precision", "recall", "f1")
        per_class = precision_recall_fscore_support(references, predictions, labels=labels, zero_division=np.nan)
        occurring = sorted((set(references) | set(predictions)) - {-1})  # -1: no prediction, never a class
        macro = precision_recall_fscore_support(
            references, predictions, labels=occurring, average="macro", zero_division=0
        )
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "confusion_matrix": confusion_matrix(references, predictions, labels=labels).tolist(),
            **{name: values.tolist() for name, values in zip(names, per_class)},
            **{f"macro_{name}": float(value) for name, value in zip(names, macro)},
        }
