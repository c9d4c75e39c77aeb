"""Confusion matrix (scikit-learn's) and per-class accuracy, shipped in the package so that evaluation never needs
the Hub."""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import confusion_matrix


_DESCRIPTION = "Counts, for every true label (row), how often each label was predicted (column)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`), references (`list` of `int`): predicted and true labels.
    num_labels (`int`, *optional*): size of the matrix; defaults to the largest label seen plus one.
Returns:
    confusion_matrix (`list` of `list` of `int`): `[true][predicted]` counts.
    per_class_accuracy (`list` of `float`): correct fraction per true label (the recall; `nan` for no sample).
"""


class ConfusionMatrix(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, num_labels=None):
        num_labels = num_labels or int(max(max(predictions, default=-1), max(references, default=-1))) + 1
        matrix = confusion_matrix(references, predictions, labels=range(num_labels))
        support = matrix.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_class = np.where(support > 0, np.diag(matrix) / support, np.nan)
        return {"confusion_matrix": matrix.tolist(), "per_class_accuracy": per_class.tolist()}
