"""The reviews a model gets most wrong: the largest losses, most confident wrong predictions first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config.output_files import output_file

LARGEST_LOSSES = 50


def largest_losses(
    texts: Sequence[str], labels: Sequence[int], probabilities: Any, label_names: Sequence[str], count: int
) -> list[dict[str, Any]]:
    """The ``count`` reviews with the largest cross-entropy loss, largest first, as rows for a CSV.

    The loss of a review is ``-log p(true class)``, so a wrong prediction made
    with high confidence comes before a hesitant one; ``probability`` is the
    probability of the predicted class.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels)
    true_probability = probabilities[np.arange(len(labels)), labels]
    # A probability of exactly 0 would be an infinite loss; the order is what matters.
    losses = -np.log(np.clip(true_probability, 1e-12, None))
    order = np.argsort(-losses, kind="stable")[:count]
    predicted = probabilities.argmax(axis=1)
    return [
        {
            "text": texts[row],
            "true": label_names[labels[row]],
            "predicted": label_names[predicted[row]],
            "probability": round(float(probabilities[row, predicted[row]]), 6),
            "true_probability": round(float(true_probability[row]), 6),
            "loss": round(float(losses[row]), 6),
        }
        for row in order
    ]


def write_largest_losses(
    path: Path,
    texts: Sequence[str],
    labels: Sequence[int],
    probabilities: Any,
    label_names: Sequence[str],
    count: int = LARGEST_LOSSES,
) -> Path:
    """Write :func:`largest_losses` as CSV (``text, true, predicted, probability, true_probability, loss``)."""
    import pandas as pd

    rows = largest_losses(texts, labels, probabilities, label_names, count)
    columns = ["text", "true", "predicted", "probability", "true_probability", "loss"]
    with output_file(path) as handle:
        pd.DataFrame(rows, columns=columns).to_csv(handle, index=False)
    return path
