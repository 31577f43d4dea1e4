"""Class weights for an imbalanced training set."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.utils.class_weight import compute_class_weight

from ..errors import FinetuneError


def balanced_class_weights(labels: Sequence[int], num_classes: int) -> list[float]:
    """``n_samples / (n_classes * n_in_class)`` per class id, as scikit-learn's ``'balanced'``.

    Every class must have training reviews: a weight for an absent class is undefined.
    """
    labels = np.asarray(labels)
    missing = sorted(set(range(num_classes)) - set(labels.tolist()))
    if missing:
        raise FinetuneError(
            f"class_weighting: balanced needs training reviews of every class; class ids {missing} have none. "
            "Add such reviews or set class_weighting: none"
        )
    return compute_class_weight("balanced", classes=np.arange(num_classes), y=labels).tolist()
