"""What a run predicts for a review (its ``task``), and how a saved model says which one it was trained for.

The recipe's ``task`` field (:class:`~finetune.config.arguments.DataArguments`)
names it; a saved model's ``config.json`` carries it, so every command that
loads the folder reads its outputs the same way: transformers' own
``problem_type`` for tags and regression, and ``finetune_task`` for the
tasks transformers has no name for (ordinal).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SINGLE_LABEL = "single_label"
MULTI_LABEL = "multi_label"
REGRESSION = "regression"
ORDINAL = "ordinal"
# Tasks whose labels are ordered levels (star ratings): scored by MAE, off-by-one accuracy, weighted kappa.
ORDERED_TASKS = (REGRESSION, ORDINAL)
# The config.json key that names a task transformers' problem_type cannot.
CONFIG_TASK_KEY = "finetune_task"


def task_of_model(config: Any) -> str:
    """The task a model (its ``PretrainedConfig``, or config.json as a dict) was trained for."""

    def read(key: str) -> Any:
        return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

    named = read(CONFIG_TASK_KEY)
    if named in ORDERED_TASKS:
        return named
    problem_type = read("problem_type")
    if problem_type == "multi_label_classification":
        return MULTI_LABEL
    if problem_type == "regression":
        return REGRESSION
    return SINGLE_LABEL


def task_of_folder(folder: str | Path) -> str | None:
    """The task of the model saved in ``folder`` (its config.json); None without a readable config.

    None leaves the folder's own checks to say what is wrong with it.
    """
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return task_of_model(config) if isinstance(config, dict) else None


def head_size(task: str | None, label_count: int) -> int:
    """The classifier's outputs for ``label_count`` classes (tags, levels): one for regression, K-1 for ordinal."""
    if task == REGRESSION:
        return 1
    if task == ORDINAL:
        return label_count - 1  # one "above level k" output per level but the top one
    return label_count
