"""Top-k accuracy from class scores, shipped in the package so that evaluation never needs the Hub. Not
scikit-learn's `top_k_accuracy_score`, which breaks ties by class index: here the classes tied with the label share the
places left in the top k, each image counting the chance that a random order of the tie puts the label among them. So
a model whose scores are all equal scores k / classes, not 100% (ties in the label's favour) nor what the class index
happens to give."""

import datasets
import evaluate
import numpy as np


_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): per-class scores (logits or probabilities), one row per sample.
    references (`list` of `int`): true labels.
    k (`int`, defaults to 5): how many of the highest-scored classes count as a hit.
Returns:
    top_k_accuracy (`float`)
"""


class TopKAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, k=5):
        scores, references = np.asarray(predictions, dtype=np.float64), np.asarray(references)
        if scores.ndim != 2 or len(scores) != len(references):
            raise ValueError(f"`predictions` must be (samples, classes) scores, got shape {scores.shape}.")
        # A label is a hit when fewer than k classes score strictly higher than it; tied, in a share of the orders.
        label_scores = scores[np.arange(len(references)), references]  # (N,)
        higher = (scores > label_scores[:, None]).sum(axis=1)  # (N, K) -> (N,)
        tied = (scores == label_scores[:, None]).sum(axis=1)  # (N,), the label included
        hits = np.clip((k - higher) / np.maximum(tied, 1), 0.0, 1.0)
        hits[np.isnan(scores).any(axis=1)] = 0.0  # NaN compares false with everything: a miss, not a hit
        return {"top_k_accuracy": float(hits.mean()) if len(references) else float("nan")}
