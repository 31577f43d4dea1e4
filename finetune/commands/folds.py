"""``finetune train RECIPE --folds K``: cross-validate a recipe on its train split, never touching the test split.

Choosing a recipe by its test score spends the test split: the winner's
score is then biased upwards, and with a few hundred test reviews a 2-point
difference is mostly which reviews happened to be drawn. Cross-validation
splits the train split into K stratified folds (drawn with the recipe's seed)
and trains K runs, each on all folds but one and scored on that one, so every
training review is scored once by a model that did not train on it. The
TF-IDF baseline is fitted and scored on the same folds, so the recipe's lead
over it is paired fold by fold. Runs go to ``OUTPUT_DIR/fold-<k>``; the
summary to ``OUTPUT_DIR/folds.json`` and ``folds.md`` (see :mod:`.repeats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import FinetuneError
from ..pipeline.repeats import Repeat, run_repeats


def train_folds(recipe: str | None, overrides: list[str] | None, folds: int) -> dict[str, Any]:
    """Train ``recipe`` once per fold of its train split; returns (and writes) each fold's scores and their summary."""
    from ..config.recipes import load_recipe

    if folds < 2:
        raise FinetuneError(f"--folds must be >= 2 (got {folds}); e.g. --folds 5")
    overrides = list(overrides or [])
    from ..config.recipes import flag_names, read_recipe_file

    named = (set(read_recipe_file(recipe)) if recipe else set()) | flag_names(overrides)
    if named & {"cross_validation_folds", "cross_validation_fold"}:
        # --folds sets both for every fold it runs; the recipe's or flags' own would be overridden unseen.
        raise FinetuneError(
            f"--folds {folds} runs every fold itself, so cross_validation_folds and cross_validation_fold must not "
            "be set too; drop them, or leave out --folds to train one fold"
        )
    # Every flag checked (the fold flags too) before the first run starts.
    run = load_recipe(recipe, [*overrides, *_fold_flags(folds, 0)])
    folder = Path(run.training.output_dir)
    repeats = [Repeat(fold, _fold_flags(folds, fold), folder / f"fold-{fold}") for fold in range(folds)]
    return run_repeats(
        recipe, overrides, repeats, folder, "fold", "fold", run.training.overwrite_output_dir, ["--folds", str(folds)]
    )


def _fold_flags(folds: int, fold: int) -> list[str]:
    return ["--cross_validation_folds", str(folds), "--cross_validation_fold", str(fold)]
