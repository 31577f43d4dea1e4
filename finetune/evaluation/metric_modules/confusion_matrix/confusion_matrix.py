"""Confusion matrix: row i, column j counts references of class i predicted as j (an ``evaluate`` metric module)."""

import datasets
import evaluate
from sklearn.metrics import confusion_matrix

_DESCRIPTION = "Counts of (reference, prediction) pairs; rows are references, columns predictions."
_INPUTS = "predictions, references: lists of int class ids; labels: class ids giving the row/column order."


class ConfusionMatrix(evaluate.Metric):
    """Confusion matrix, shipped with finetune so it loads without the Hugging Face Hub."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references, labels=None):
        return {"confusion_matrix": confusion_matrix(references, predictions, labels=labels).tolist()}
