"""``finetune check RECIPE DATASET``: a recipe's settings trained on a dataset no recipe was tuned on."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, option
from .values import positive_int


@dataclass(frozen=True)
class CheckOptions:
    """The options of ``finetune check``; the recipe's fields travel in ``extra``."""

    recipe: str = argument(help="a recipe YAML file, e.g. recipes/quickstart.yaml")
    dataset: str = argument(help="a check dataset from 'finetune data list', e.g. clothing_reviews")
    seeds: int = option(1, type=positive_int, help="seeds to train, from the recipe's (default: 1)")
    teacher: str | None = option(
        None,
        metavar="RUN",
        help=(
            "for a distillation recipe: a teacher run trained on DATASET (made by 'finetune check TEACHER_RECIPE "
            "DATASET'); every seed is its student, on its draw"
        ),
    )


def run(options: CheckOptions, extra: list[str]) -> None:
    """Train the recipe's settings on the check dataset (as a teacher's student, with one)."""
    from ..check import check

    check(options.recipe, options.dataset, extra, seeds=options.seeds, teacher=options.teacher)


COMMAND = Command(
    "check",
    help="train a recipe's settings on a check dataset no recipe was tuned on: does its lead hold?",
    options=CheckOptions,
    run=run,
    description="Recipe fields can be overridden after the arguments, e.g. --output_dir runs/check.",
    takes_recipe_fields=True,
)
