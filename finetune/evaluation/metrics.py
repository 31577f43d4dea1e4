"""Classification metrics through ``evaluate``, from metric modules shipped in this package.

``evaluate.load("accuracy")`` fetches its code from the Hugging Face Hub; the
modules under ``metric_modules/`` are loaded by path instead, so scoring
works offline.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import evaluate
import numpy as np

from ..config.tasks import MULTI_LABEL, SINGLE_LABEL

METRIC_MODULES = Path(__file__).parent / "metric_modules"
# Past this many classes the confusion matrix is not kept, drawn nor tabled: 10,000 classes made a
# 900 MB test_report.json, and the report's picture (a number in every cell) was killed for memory.
CONFUSION_MATRIX_MAX_CLASSES = 50


@cache
def load_metric(name: str) -> evaluate.EvaluationModule:
    """One of the shipped metric modules: accuracy, f1, precision, recall, confusion_matrix."""
    return evaluate.load(str(METRIC_MODULES / name))


def classification_report(predictions: Any, references: Any, label_names: list[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision/recall/F1, each class's reviews and the confusion matrix.

    The confusion matrix is None past ``CONFUSION_MATRIX_MAX_CLASSES`` classes (it grows with their square).
    """
    predictions = np.asarray(predictions).tolist()
    references = np.asarray(references).tolist()
    labels = list(range(len(label_names)))
    scores = {"predictions": predictions, "references": references}
    per_class = {
        name: load_metric(name).compute(**scores, labels=labels, average=None)[name]
        for name in ("precision", "recall", "f1")
    }
    return {
        "accuracy": load_metric("accuracy").compute(**scores)["accuracy"],
        "macro_f1": load_metric("f1").compute(**scores, labels=labels, average="macro")["f1"],
        "per_class": {
            label: {metric: values[index] for metric, values in per_class.items()}
            for index, label in enumerate(label_names)
        },
        "confusion_matrix": (
            load_metric("confusion_matrix").compute(**scores, labels=labels)["confusion_matrix"]
            if len(labels) <= CONFUSION_MATRIX_MAX_CLASSES
            else None
        ),
        # Each class's reviews, which the confusion matrix's rows gave (it is None past the cap).
        "support": np.bincount(np.asarray(references, dtype=np.int64), minlength=len(labels)).tolist(),
        "num_samples": len(references),
    }


def scalar_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The report flattened to numbers, the shape ``Trainer`` logs (``f1_negative``, ...)."""
    flat = {"accuracy": report["accuracy"], "macro_f1": report["macro_f1"]}
    for label, values in report["per_class"].items():
        for metric, value in values.items():
            flat[f"{metric}_{label}"] = value
    return flat


def build_compute_metrics(label_names: list[str], task: str = SINGLE_LABEL) -> Callable[[Any], dict[str, float]]:
    """A ``compute_metrics`` for ``Trainer``: argmax the logits, then score.

    In a ``multi_label`` run a tag is predicted where its logit is above 0 (a sigmoid of 0.5, the thresholds
    being tuned only after training), and the scores are micro- and macro-F1, subset accuracy, Hamming loss
    and each tag's F1 (:mod:`.multi_label`). A ratings run's is :func:`.ordered.build_rating_metrics`.
    """

    def compute_metrics(eval_prediction: Any) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        if task == MULTI_LABEL:
            return _tag_metrics(np.asarray(logits) > 0, eval_prediction.label_ids, label_names)
        predictions = np.asarray(logits).argmax(axis=-1)
        return scalar_metrics(classification_report(predictions, eval_prediction.label_ids, label_names))

    return compute_metrics


def _tag_metrics(predicted: np.ndarray, labels: Any, tag_names: list[str]) -> dict[str, float]:
    """The scores of several tags per review, flat as ``Trainer`` logs them (``f1_price``, ...)."""
    from .multi_label import tag_scores

    scores = tag_scores(np.asarray(labels) > 0.5, predicted, tag_names)
    flat = {key: scores[key] for key in ("micro_f1", "macro_f1", "subset_accuracy", "hamming_loss")}
    for tag, values in scores["per_tag"].items():
        flat.update({f"{metric}_{tag}": values[metric] for metric in ("precision", "recall", "f1")})
    return flat
