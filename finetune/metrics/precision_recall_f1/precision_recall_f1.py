"""Per-class precision, recall and F1, and their macro averages, shipped inside the package so that evaluation never
needs the Hub."""

import datasets
import evaluate
import numpy as np


_DESCRIPTION = (
    "Per class c: precision = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2 PR / (P + R). The macro averages are "
    "unweighted means over the classes: a class absent from both references and predictions is left out, and a class "
    "whose precision or recall is undefined (no prediction, or no sample, of it) counts as 0 there, as scikit-learn's "
    "`zero_division=0` does."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): Predicted labels.
    references (`list` of `int`): Ground-truth labels.
    num_labels (`int`, *optional*): Number of classes; defaults to the largest label seen plus one.
Returns:
    precision, recall, f1 (`list` of `float`): Per class. Precision is `nan` for a class never predicted, recall for
        a class with no sample; F1 is 0 where either is undefined, and `nan` for a class absent from both.
    macro_precision, macro_recall, macro_f1 (`float`): Means over the classes that occur.
Example:
    >>> metric = evaluate.load("finetune/metrics/precision_recall_f1")
    >>> metric.compute(predictions=[0, 1, 1], references=[0, 1, 0], num_labels=2)["macro_f1"]
    0.6666666666666666
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PrecisionRecallF1(evaluate.Metric):
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
        true_positives = np.bincount(references[predictions == references], minlength=num_labels)
        predicted = np.bincount(predictions, minlength=num_labels)
        support = np.bincount(references, minlength=num_labels)
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = np.where(predicted > 0, true_positives / predicted, np.nan)
            recall = np.where(support > 0, true_positives / support, np.nan)
            both = np.nan_to_num(precision) + np.nan_to_num(recall)
            f1 = np.where(both > 0, 2 * np.nan_to_num(precision) * np.nan_to_num(recall) / both, 0.0)
        f1 = np.where((predicted > 0) | (support > 0), f1, np.nan)
        present = (predicted > 0) | (support > 0)

        def macro(values):
            return float(np.nan_to_num(values[present]).mean()) if present.any() else float("nan")

        return {
            "precision": precision.tolist(),
            "recall": recall.tolist(),
            "f1": f1.tolist(),
            "macro_precision": macro(precision),
            "macro_recall": macro(recall),
            "macro_f1": macro(f1),
        }
