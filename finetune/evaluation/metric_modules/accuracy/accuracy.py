"""Accuracy: the share of predictions equal to the reference label (an ``evaluate`` metric module)."""

import datasets
import evaluate
from sklearn.metrics import accuracy_score

_DESCRIPTION = "Accuracy = correct predictions / all predictions."
_INPUTS = "predictions: list of int class ids; references: list of int class ids."


class Accuracy(evaluate.Metric):
    """Accuracy, shipped with finetune so it loads without the Hugging Face Hub."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references):
        return {"accuracy": float(accuracy_score(references, predictions))}
