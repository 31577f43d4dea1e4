"""tools/tag_lead.py: micro-F1 from per-tag counts, against scikit-learn's on the same predictions."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import load_tool
from sklearn.metrics import f1_score, precision_recall_fscore_support


@pytest.mark.parametrize("leave_out", [(), ("b",), ("a", "c")])
def test_micro_f1_from_per_tag_counts_is_scikit_learns(leave_out):
    rng = np.random.default_rng(0)
    truth = rng.random((200, 3)) < [0.5, 0.3, 0.05]
    predicted = np.where(rng.random((200, 3)) < 0.8, truth, ~truth)
    names = ["a", "b", "c"]
    precision, recall, _, support = precision_recall_fscore_support(truth, predicted, zero_division=0)
    per_tag = {
        name: {"precision": p, "recall": r, "support": int(s)}
        for name, p, r, s in zip(names, precision, recall, support)
    }
    silenced = predicted.copy()
    silenced[:, [names.index(name) for name in leave_out]] = False  # never predicted
    assert load_tool("tag_lead").micro_f1(per_tag, leave_out) == pytest.approx(
        f1_score(truth, silenced, average="micro")
    )
