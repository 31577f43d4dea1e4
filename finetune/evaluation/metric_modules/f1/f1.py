"""F1 per class or averaged (an ``evaluate`` metric module)."""

import datasets
import evaluate
from sklearn.metrics import f1_score

_DESCRIPTION = "F1 = harmonic mean of precision and recall."
_AVERAGING = "average=None gives one value per class; 'macro' weights classes equally."
_INPUTS = "predictions, references: lists of int class ids; labels: class ids to score; average: None, 'macro', ..."


class F1(evaluate.Metric):
    """F1, shipped with finetune so it loads without the Hugging Face Hub."""

    def _info(self):
        return evaluate.MetricInfo(
            description=f"{_DESCRIPTION} {_AVERAGING}",
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions, references, labels=None, average="macro", zero_division=0):
        score = f1_score(references, predictions, labels=labels, average=average, zero_division=zero_division)
        return {"f1": score.tolist() if average is None else float(score)}
