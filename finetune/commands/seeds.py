"""``finetune train RECIPE --seeds N``: the recipe once per seed, then the mean and spread of its test scores.

Fine-tuning on a few hundred reviews varies a lot with the seed (the new
head's initialisation, dropout, the order, the held-out validation reviews),
so one run's score says little. Seeds ``seed, seed + 1, ...`` each train into
``OUTPUT_DIR/seed-<seed>``; ``OUTPUT_DIR/seeds.json`` and ``seeds.md`` hold
every run's test scores beside the baseline's (see :mod:`finetune.pipeline.repeats`).
"""

from __future__ import annotations

from typing import Any

from ..pipeline.repeats import run_repeats, seed_repeats


def train_seeds(recipe: str | None, overrides: list[str] | None, seeds: int, teacher: Any = None) -> dict[str, Any]:
    """Train ``recipe`` with ``seeds`` consecutive seeds; returns (and writes) the per-run figures and their summary.

    With ``teacher`` (a :class:`finetune.pipeline.teacher.TeacherRun`), each seed is a student of it.
    """
    overrides = list(overrides or [])
    return run_repeats(recipe, overrides, seed_repeats(recipe, overrides, seeds), teacher=teacher)
