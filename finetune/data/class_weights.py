"""Class weights for an imbalanced training set."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.utils.class_weight import compute_class_weight

from ..errors import FinetuneError
from .columns import column_values

# What `class_weighting` may say: none, scikit-learn's 'balanced', or its square root.
CLASS_WEIGHTINGS = ("none", "balanced", "sqrt")


def balanced_class_weights(labels: Sequence[int], num_classes: int) -> list[float]:
    """``n_samples / (n_classes * n_in_class)`` per class id, as scikit-learn's ``'balanced'``.

    Every class must have training reviews: a weight for an absent class is undefined.
    """
    labels = np.asarray(labels)
    missing = sorted(set(range(num_classes)) - set(labels.tolist()))
    if missing:
        raise FinetuneError(
            f"class weighting needs training reviews of every class; class ids {missing} have none. "
            "Add such reviews or set class_weighting: none"
        )
    return compute_class_weight("balanced", classes=np.arange(num_classes), y=labels).tolist()


def class_weights_for(strategy: str, labels: Sequence[int], num_classes: int) -> list[float] | None:
    """The per-class loss weights ``class_weighting: strategy`` asks for, or None for ``none``.

    ``sqrt`` is the square root of ``balanced``: rare classes still count more,
    but a neutral review in drugscom weighs 2.7x a positive one, not 7.1x, so
    the model gives up less accuracy on the common classes for the rare one's recall.
    """
    if strategy == "none":
        return None
    if strategy not in CLASS_WEIGHTINGS:
        raise FinetuneError(f"class_weighting must be one of {', '.join(CLASS_WEIGHTINGS)} (got {strategy!r})")
    weights = balanced_class_weights(labels, num_classes)
    return [weight**0.5 for weight in weights] if strategy == "sqrt" else weights


def positive_weights_for(strategy: str, label_rows: Sequence[Sequence[float]], num_labels: int) -> list[float] | None:
    """Per-tag ``pos_weight`` for several tags per review, as ``class_weighting: strategy`` asks, or None for ``none``.

    Each tag is a yes/no question of its own, so ``balanced`` weighs a tag's
    positive reviews by its negatives over its positives (``pos_weight`` of
    ``torch.nn.BCEWithLogitsLoss``): a tag on one review in ten counts its
    positives 9x, so that both answers weigh alike. ``sqrt`` is its square root.
    """
    if strategy == "none":
        return None
    if strategy not in CLASS_WEIGHTINGS:
        raise FinetuneError(f"class_weighting must be one of {', '.join(CLASS_WEIGHTINGS)} (got {strategy!r})")
    rows = np.asarray(label_rows, dtype=np.float64).reshape(-1, num_labels)
    positives = (rows > 0.5).sum(axis=0)
    missing = [index for index in range(num_labels) if positives[index] == 0]
    if missing:
        raise FinetuneError(
            f"class weighting needs training reviews with every tag; tag ids {missing} are on none. "
            "Add such reviews or set class_weighting: none"
        )
    weights = (len(rows) - positives) / positives
    return [float(weight**0.5) if strategy == "sqrt" else float(weight) for weight in weights]


def training_label_rows(dataset: Any) -> list[list[float]]:
    """Every training example's tags as a row of 0s and 1s (several tags per review), for per-tag weights."""
    columns = getattr(dataset, "column_names", None)
    if columns is None or "labels" not in columns:
        raise FinetuneError(
            "class weighting counts each tag's training reviews, and this training set has no 'labels' column "
            "of tag rows; pass class_weights=[...] to ReviewTrainer or set class_weighting: none"
        )
    return [list(row) for row in column_values(dataset, "labels")]


def training_labels(dataset: Any) -> list[int]:
    """The class id of every training example, for class weights.

    A ``datasets.Dataset`` gives its ``labels`` (or ``label``) column; any other
    indexable dataset (a ``torch`` Dataset of dicts, a list) is read example by
    example. A streamed set is refused rather than read to its end.
    """
    import datasets
    import torch

    if isinstance(dataset, (datasets.IterableDataset, torch.utils.data.IterableDataset)) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise FinetuneError(
            "class weighting counts the training labels before training, and this training set is streamed "
            "(it cannot be indexed); pass class_weights=[...] to ReviewTrainer or set class_weighting: none"
        )
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        name = next((name for name in ("labels", "label") if name in columns), None)
        if name is None:
            raise FinetuneError(
                f"class weighting needs a labels column, and the training set has {columns}; "
                "name the label column 'labels' or set class_weighting: none"
            )
        return [int(label) for label in column_values(dataset, name)]
    labels = []
    for index in range(len(dataset)):
        example = dataset[index]
        label = example.get("labels", example.get("label")) if isinstance(example, Mapping) else None
        if label is None:
            raise FinetuneError(
                f"class weighting needs each training example's 'labels', and example {index} has none; "
                "add them or set class_weighting: none"
            )
        labels.append(int(label))
    return labels


def validate_class_weights(class_weights: Any, num_classes: int) -> list[float]:
    """``class_weights`` as a list of floats, one finite non-negative weight per class, not all zero.

    Checked when the trainer is built: a wrong length failed only inside
    ``train()`` (an IndexError, or torch's shape error), all zeros divided by
    zero, and NaN or negative weights trained on in silence.
    """
    import torch

    example = ", ".join(["1.0"] * max(num_classes, 2))
    if isinstance(class_weights, (str, bytes)):
        raise FinetuneError(
            f"class_weights must be a list of numbers, one per class (got {class_weights!r}); for a strategy "
            f"such as 'balanced' set class_weighting instead, or pass e.g. class_weights=[{example}]"
        )
    try:
        weights = torch.as_tensor(class_weights, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        weights = None
    if weights is None or weights.dim() != 1:
        raise FinetuneError(
            f"class_weights must be a flat list of numbers, one per class (got {class_weights!r}); "
            f"pass e.g. class_weights=[{example}]"
        )
    if weights.numel() != num_classes:
        raise FinetuneError(
            f"class_weights has {weights.numel()} weights and the model {num_classes} classes; give one weight "
            f"per class, in class id order, e.g. class_weights=[{example}]"
        )
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()) or not bool((weights > 0).any()):
        raise FinetuneError(
            f"class_weights must be finite numbers >= 0, not all 0 (got {weights.tolist()}); "
            f"e.g. class_weights=[{example}]"
        )
    return weights.tolist()
