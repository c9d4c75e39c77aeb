"""Accuracy, scikit-learn's `accuracy_score` as the Hub's `evaluate-metric/accuracy` computes it, shipped in the
package so that evaluation never needs the Hub."""

import datasets
import evaluate
from sklearn.metrics import accuracy_score


_DESCRIPTION = "Accuracy is the fraction of predictions that equal their reference label."
_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`), references (`list` of `int`): predicted and true labels.
    normalize (`bool`, defaults to `True`): the fraction correct; `False`: the number correct.
    sample_weight (`list` of `float`, *optional*): per-sample weights.
Returns:
    accuracy (`float`)
"""


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
        return {
            "accuracy": float(
                accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight)
            )
        }
