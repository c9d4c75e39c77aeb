"""Accuracy, shipped inside the package so that evaluation never needs the Hub.

The same definition as the Hub's `evaluate-metric/accuracy`: the fraction of predictions equal to the references,
optionally weighted per sample.
"""

import datasets
import evaluate
import numpy as np


_DESCRIPTION = "Accuracy is the fraction of predictions that equal their reference label."

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): Predicted labels.
    references (`list` of `int`): Ground-truth labels.
    normalize (`bool`, defaults to `True`): Return the fraction correct; `False` returns the number correct.
    sample_weight (`list` of `float`, *optional*): Per-sample weights.
Returns:
    accuracy (`float`): Fraction (or count) of correct predictions.
Example:
    >>> metric = evaluate.load("finetune/metrics/accuracy")
    >>> metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'accuracy': 0.6666666666666666}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        correct = np.asarray(predictions) == np.asarray(references)
        weights = np.ones(len(correct)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        total = float((correct * weights).sum())
        return {"accuracy": float(total / weights.sum()) if normalize else total}
