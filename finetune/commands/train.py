"""``finetune train``: load a recipe, train, evaluate on the test split, save, report."""

from __future__ import annotations

from typing import Any

from ..pipeline import run


def train(
    recipe: str | None,
    overrides: list[str] | None = None,
    callbacks: list[Any] | None = None,
    distillation: Any = None,
) -> dict[str, Any]:
    """Run one recipe end to end and return its metrics (also written to ``output_dir``).

    The run is the stages of :mod:`finetune.pipeline.run`: arguments checked, data read and
    tokenized, model and Trainer built, fit, test split scored, report and model card written.
    ``overrides`` are flags such as ``["--learning_rate", "3e-5"]``; they win over the recipe's
    values. ``callbacks`` are extra ``TrainerCallback``s. ``distillation`` (a
    :class:`finetune.pipeline.teacher.Distillation`) makes the run a student of a teacher run.
    """
    return run.train(recipe, overrides, callbacks, distillation)
