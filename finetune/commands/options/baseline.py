"""``finetune baseline RECIPE``: the TF-IDF + logistic-regression baseline alone."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, option


@dataclass(frozen=True)
class BaselineOptions:
    """The options of ``finetune baseline``; the recipe's fields travel in ``extra``."""

    recipe: str = argument(help="a recipe YAML file, e.g. recipes/drugscom.yaml")
    output: str | None = option(help="also save the result as JSON here")


def run(options: BaselineOptions, extra: list[str]) -> None:
    """Fit and score the baseline on the recipe's data."""
    from ..baseline import baseline

    baseline(options.recipe, extra, output=options.output)


COMMAND = Command(
    "baseline",
    help="the TF-IDF + logistic-regression baseline alone on a recipe's data (seconds)",
    options=BaselineOptions,
    run=run,
    description="Recipe fields can be overridden after the options, e.g. --max_train_samples 2000.",
    takes_recipe_fields=True,
)
