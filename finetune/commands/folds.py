"""``finetune train RECIPE --folds K``: cross-validate a recipe on its train split, never touching the test split.

Choosing a recipe by its test score spends the test split: the winner's
score is then biased upwards, and with a few hundred test reviews a 2-point
difference is mostly which reviews happened to be drawn. Cross-validation
splits the train split into K stratified folds (drawn with the recipe's seed)
and trains K runs, each on all folds but one and scored on that one, so every
training review is scored once by a model that did not train on it. The
TF-IDF baseline is fitted and scored on the same folds, so the recipe's lead
over it is paired fold by fold. Runs go to ``OUTPUT_DIR/fold-<k>``; the
summary to ``OUTPUT_DIR/folds.json`` and ``folds.md`` (see :mod:`finetune.pipeline.repeats`).
"""

from __future__ import annotations

from typing import Any

from ..pipeline.repeats import fold_repeats, run_repeats


def train_folds(recipe: str | None, overrides: list[str] | None, folds: int) -> dict[str, Any]:
    """Train ``recipe`` once per fold of its train split; returns (and writes) each fold's scores and their summary."""
    overrides = list(overrides or [])
    return run_repeats(recipe, overrides, fold_repeats(recipe, overrides, folds))
