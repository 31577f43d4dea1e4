"""Does a probability of 0.9 mean right nine times in ten? Expected calibration error and temperature scaling.

ECE (Guo et al., 2017): the reviews are put in ``BINS`` equal-width bins by
the probability of the predicted class (their confidence); ECE is the
review-weighted mean over bins of ``|accuracy - mean confidence|``.

Temperature scaling divides the logits by one number T > 0 fitted on the
validation split to minimise the negative log-likelihood; it changes the
probabilities but never the predicted class. :func:`scale_classifier` folds
1/T into the last linear layer (weights and bias), so the saved model's
logits are already divided by T and ``transformers.pipeline`` needs no code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BINS = 15


def calibration_table(probabilities: Any, labels: Any, bins: int = BINS) -> list[dict[str, float]]:
    """Per non-empty confidence bin: its bounds, reviews, mean confidence and accuracy."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels)
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    # Bins are (low, high]: a confidence of exactly 1/bins belongs to the first.
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    table = []
    for index in range(bins):
        members = which == index
        if members.any():
            table.append(
                {
                    "low": float(edges[index]),
                    "high": float(edges[index + 1]),
                    "reviews": int(members.sum()),
                    "confidence": float(confidence[members].mean()),
                    "accuracy": float(correct[members].mean()),
                }
            )
    return table


def expected_calibration_error(probabilities: Any, labels: Any, bins: int = BINS) -> float:
    """Review-weighted mean of ``|accuracy - confidence|`` over the confidence bins."""
    table = calibration_table(probabilities, labels, bins)
    total = sum(row["reviews"] for row in table)
    return float(sum(row["reviews"] * abs(row["accuracy"] - row["confidence"]) for row in table) / total)


def temperature_scaled(probabilities: Any, temperature: float) -> np.ndarray:
    """``softmax(log p / T)``: the probabilities the logits divided by T would give."""
    logits = np.log(np.clip(np.asarray(probabilities, dtype=np.float64), 1e-12, None)) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def fit_temperature(probabilities: Any, labels: Any) -> float:
    """The T in [0.05, 20] that minimises the negative log-likelihood of ``labels`` (bounded 1-D search)."""
    from scipy.optimize import minimize_scalar

    labels = np.asarray(labels)

    def negative_log_likelihood(log_temperature: float) -> float:
        scaled = temperature_scaled(probabilities, float(np.exp(log_temperature)))
        return float(-np.log(np.clip(scaled[np.arange(len(labels)), labels], 1e-12, None)).mean())

    # Searched in log T, where the loss is smooth and T stays positive.
    result = minimize_scalar(negative_log_likelihood, bounds=(np.log(0.05), np.log(20.0)), method="bounded")
    return float(np.exp(result.x))


def scale_classifier(model: Any, temperature: float) -> Any:
    """Divide the model's logits by ``temperature`` by scaling its last linear layer (weights and bias) by 1/T."""
    import torch

    head = [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-1]
    if head.out_features != model.config.num_labels:
        raise ValueError(f"the last linear layer has {head.out_features} outputs, not {model.config.num_labels}")
    with torch.no_grad():
        head.weight.div_(temperature)
        if head.bias is not None:
            head.bias.div_(temperature)
    return model


def calibrate_in_place(model: Any, probabilities: Any, labels: Any, fitted_on: str) -> dict[str, Any]:
    """Fit T on ``probabilities`` (the model's, on held-out ``labels``), fold it into ``model``; return the record.

    The record is what ``calibration.json`` keeps: T and the expected
    calibration error before and after, on the reviews it was fitted on.
    """
    temperature = fit_temperature(probabilities, labels)
    scale_classifier(model, temperature)
    return {
        "method": "temperature scaling, folded into the last linear layer (weights and bias divided by T)",
        "temperature": temperature,
        "total_temperature": temperature,
        "fitted_on": fitted_on,
        "validation_ece_before": expected_calibration_error(probabilities, labels),
        "validation_ece_after": expected_calibration_error(temperature_scaled(probabilities, temperature), labels),
    }
