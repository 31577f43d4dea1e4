"""The reviews a model gets most wrong: the largest losses, most confident wrong predictions first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config.csv_cells import guard_row
from ..config.output_files import output_file

LARGEST_LOSSES = 50
ERROR_COLUMNS = ["text", "true", "predicted", "probability", "true_probability", "loss", "top_words"]
# Given the mistakes' texts and probabilities, each one's top words as a cell (evaluation/explain.py).
Explainer = Callable[[list[str], np.ndarray], list[str]]


def largest_losses(
    texts: Sequence[str], labels: Sequence[int], probabilities: Any, label_names: Sequence[str], count: int
) -> list[dict[str, Any]]:
    """The ``count`` reviews with the largest cross-entropy loss, largest first, as rows for a CSV.

    The loss of a review is ``-log p(true class)``, so a wrong prediction made
    with high confidence comes before a hesitant one; ``probability`` is the
    probability of the predicted class; ``top_words`` is empty (see :func:`write_largest_losses`).
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels)
    true_probability = probabilities[np.arange(len(labels)), labels]
    losses = -np.log(np.clip(true_probability, 1e-12, None))
    order = _largest_loss_order(labels, probabilities, count)
    predicted = probabilities.argmax(axis=1)
    return [
        {
            "text": texts[row],
            "true": label_names[labels[row]],
            "predicted": label_names[predicted[row]],
            "probability": round(float(probabilities[row, predicted[row]]), 6),
            "true_probability": round(float(true_probability[row]), 6),
            "loss": round(float(losses[row]), 6),
            "top_words": "",
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
    explainer: Explainer | None = None,
    raw_csv: bool = False,
) -> Path:
    """Write :func:`largest_losses` as CSV (``ERROR_COLUMNS``).

    With ``explainer``, each listed mistake (a row whose predicted class is
    not the true one) gets the words that pushed the model toward its wrong
    label in ``top_words``; rows it got right are left empty, so the cost is
    that of explaining at most ``count`` reviews.

    Review text and every other text cell that a spreadsheet would run as a
    formula is written after a ``'`` (:mod:`finetune.config.csv_cells`), unless ``raw_csv``.
    """
    import pandas as pd

    rows = largest_losses(texts, labels, probabilities, label_names, count)
    listed = _largest_loss_order(labels, probabilities, count)  # the review index of each row
    wrong = [index for index, row in zip(listed, rows) if row["predicted"] != row["true"]]
    if explainer is not None and wrong:
        cells = iter(explainer([texts[index] for index in wrong], np.asarray(probabilities, dtype=np.float64)[wrong]))
        for row in rows:
            if row["predicted"] != row["true"]:
                row["top_words"] = next(cells)
    if not raw_csv:
        rows = [guard_row(row) for row in rows]
    with output_file(path) as handle:
        pd.DataFrame(rows, columns=ERROR_COLUMNS).to_csv(handle, index=False)
    return path


def _largest_loss_order(labels: Sequence[int], probabilities: Any, count: int) -> np.ndarray:
    """Review indices of the ``count`` largest losses, largest first (ties in input order)."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels)
    true_probability = probabilities[np.arange(len(labels)), labels]
    # A probability of exactly 0 would be an infinite loss; the order is what matters.
    losses = -np.log(np.clip(true_probability, 1e-12, None))
    return np.argsort(-losses, kind="stable")[:count]


# ------------------------------------------------------------- several tags per review

TAG_ERROR_COLUMNS = ["text", "true", "predicted", "missed", "extra", "wrong_tags", "loss"]
# How a set of tags is written in one cell of the errors file.
TAG_JOINER = "|"


def largest_tag_errors(
    texts: Sequence[str],
    labels: Any,
    probabilities: Any,
    thresholds: Any,
    tag_names: Sequence[str],
    count: int = LARGEST_LOSSES,
) -> list[dict[str, Any]]:
    """The ``count`` reviews whose predicted tags differ most from their true tags, most first, as CSV rows.

    Most first means the most tags wrong (missed plus extra), and among reviews
    with as many wrong, the largest loss (the binary cross-entropy summed over
    tags), so a confident mistake comes before a hesitant one. ``missed`` are the
    true tags not predicted, ``extra`` the predicted tags that are not true.
    """
    probabilities = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-12, 1 - 1e-12)
    truth = np.asarray(labels, dtype=np.float64).reshape(probabilities.shape) > 0.5
    guess = probabilities >= np.asarray(thresholds, dtype=np.float64)
    wrong = (truth != guess).sum(axis=1)
    losses = -np.where(truth, np.log(probabilities), np.log1p(-probabilities)).sum(axis=1)
    # lexsort sorts by its last key first: most tags wrong, then largest loss; ties keep input order.
    order = np.lexsort((np.arange(len(wrong)), -losses, -wrong))[:count]

    def named(row: np.ndarray) -> str:
        return TAG_JOINER.join(name for name, held in zip(tag_names, row) if held)

    return [
        {
            "text": texts[index],
            "true": named(truth[index]),
            "predicted": named(guess[index]),
            "missed": named(truth[index] & ~guess[index]),
            "extra": named(~truth[index] & guess[index]),
            "wrong_tags": int(wrong[index]),
            "loss": round(float(losses[index]), 6),
        }
        for index in order
    ]


def write_tag_errors(path: Path, rows: list[dict[str, Any]], raw_csv: bool = False) -> Path:
    """Write :func:`largest_tag_errors`' rows as CSV (``TAG_ERROR_COLUMNS``), formula-like cells guarded.

    As :func:`write_largest_losses`: a cell that a spreadsheet would run as a
    formula is written after a ``'``, unless ``raw_csv``.
    """
    import pandas as pd

    if not raw_csv:
        rows = [guard_row(row) for row in rows]
    with output_file(path) as handle:
        pd.DataFrame(rows, columns=TAG_ERROR_COLUMNS).to_csv(handle, index=False)
    return path
