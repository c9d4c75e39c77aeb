"""Top-k accuracy from class scores, shipped inside the package so that evaluation never needs the Hub."""

import datasets
import evaluate
import numpy as np


_DESCRIPTION = "Top-k accuracy is the fraction of samples whose reference label is among the k highest-scored classes."

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): Per-class scores (logits or probabilities), one row per sample.
    references (`list` of `int`): Ground-truth labels.
    k (`int`, defaults to 5): How many of the highest-scored classes count as a hit.
Returns:
    top_k_accuracy (`float`): Fraction of samples whose label is among the k best-scored classes.
Example:
    >>> metric = evaluate.load("finetune/metrics/top_k_accuracy")
    >>> metric.compute(predictions=[[0.1, 0.5, 0.4], [0.6, 0.3, 0.1]], references=[2, 1], k=2)
    {'top_k_accuracy': 1.0}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TopKAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float32")), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, k=5):
        scores, references = np.asarray(predictions, dtype=np.float64), np.asarray(references)
        if scores.ndim != 2 or len(scores) != len(references):
            raise ValueError(f"`predictions` must be (samples, classes) scores, got shape {scores.shape}.")
        # A label is a hit when fewer than k classes score strictly higher than it (ties count in its favour).
        label_scores = scores[np.arange(len(references)), references]  # (N,)
        higher = (scores > label_scores[:, None]).sum(axis=1)  # (N, K) -> (N,)
        return {"top_k_accuracy": float((higher < k).mean()) if len(references) else float("nan")}
