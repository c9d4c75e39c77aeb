"""Confusion matrix and per-class accuracy, shipped inside the package so that evaluation never needs the Hub."""

import datasets
import evaluate
import numpy as np


_DESCRIPTION = (
    "The confusion matrix counts, for every true label (row), how often each label was predicted (column). "
    "Per-class accuracy (recall) is the diagonal divided by the row sums."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): Predicted labels.
    references (`list` of `int`): Ground-truth labels.
    num_labels (`int`, *optional*): Size of the matrix; defaults to the largest label seen plus one.
Returns:
    confusion_matrix (`list` of `list` of `int`): `[true][predicted]` counts.
    per_class_accuracy (`list` of `float`): Correct fraction per true label (`nan` for a label with no sample).
Example:
    >>> metric = evaluate.load("finetune/metrics/confusion_matrix")
    >>> metric.compute(predictions=[0, 1, 1], references=[0, 1, 0], num_labels=2)["confusion_matrix"]
    [[1, 1], [0, 1]]
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
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
        predictions, references = np.asarray(predictions), np.asarray(references)
        if num_labels is None:
            num_labels = int(max(predictions.max(initial=-1), references.max(initial=-1))) + 1
        matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
        np.add.at(matrix, (references, predictions), 1)
        support = matrix.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_class = np.where(support > 0, np.diag(matrix) / support, np.nan)
        return {"confusion_matrix": matrix.tolist(), "per_class_accuracy": per_class.tolist()}
