"""``finetune compare-tasks RECIPE``: a star column trained as classes, as a regression and as ordinal levels."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument


@dataclass(frozen=True)
class CompareTasksOptions:
    """The options of ``finetune compare-tasks``; the recipe's fields travel in ``extra``."""

    recipe: str = argument(help="a recipe YAML file whose label column holds star ratings")


def run(options: CompareTasksOptions, extra: list[str]) -> None:
    """Train the three tasks and print the table."""
    from ..compare_tasks import compare_tasks

    compare_tasks(options.recipe, extra)


COMMAND = Command(
    "compare-tasks",
    help="train a star column as single_label, regression and ordinal on one split; one table of MAE, QWK, ...",
    options=CompareTasksOptions,
    run=run,
    description="Recipe fields can be overridden after the recipe, e.g. --num_train_epochs 2.",
    takes_recipe_fields=True,
)
