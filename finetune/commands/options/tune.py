"""``finetune tune RECIPE``: search a recipe's hyper-parameters with Optuna."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, option
from .values import positive_int


@dataclass(frozen=True)
class TuneOptions:
    """The options of ``finetune tune``; the recipe's fields travel in ``extra``."""

    recipe: str = argument(help="a recipe YAML file, e.g. recipes/drugscom.yaml")
    trials: int = option(10, type=positive_int, help="trials in all, finished ones included (default: 10)")
    output: str | None = option(metavar="DIR", help="where the trials go (default: runs/<recipe>-tune)")


def run(options: TuneOptions, extra: list[str]) -> None:
    """Run (or resume) the search."""
    from ..tune import tune

    tune(options.recipe, extra, trials=options.trials, output=options.output)


COMMAND = Command(
    "tune",
    help="search learning rate, epochs, warmup, weight decay and n_accumulate with Optuna (resumable)",
    options=TuneOptions,
    run=run,
    description="Recipe fields can be overridden after the options, e.g. --max_train_samples 2000.",
    takes_recipe_fields=True,
)
