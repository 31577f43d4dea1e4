"""``finetune train``: a recipe's run, once, once per seed (``--seeds``) or once per fold (``--folds``)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FinetuneError
from .fields import Command, option
from .values import positive_int


@dataclass(frozen=True)
class TrainOptions:
    """The options of ``finetune train`` itself; the recipe and its fields travel in ``extra``."""

    seeds: int | None = option(type=positive_int, help="train once per seed and report mean and standard deviation")
    folds: int | None = option(
        type=positive_int, help="cross-validate on the train split in K folds (the test split is not used)"
    )


def run(options: TrainOptions, extra: list[str]) -> None:
    """Train the recipe (or the reviews the flags name) once, per seed or per fold."""
    # The recipe is the first word that is not a flag; without one, the flags name the data
    # (argparse would take the first flag's value, "reviews.csv" in "--train_file reviews.csv", as it).
    recipe = extra[0] if extra and not extra[0].startswith("-") else None
    extra = extra[1:] if recipe is not None else extra
    if "-h" in extra or "--help" in extra:
        _print_help()
        return
    if options.seeds is not None and options.folds is not None:
        raise FinetuneError("--seeds and --folds cannot be combined; cross-validate with --folds, then --seeds")
    from ...pipeline.own_reviews import flags_without_recipe, needs_no_recipe, refuse_data_file_as_recipe

    refuse_data_file_as_recipe(recipe)
    if needs_no_recipe(recipe, extra):
        extra = flags_without_recipe(extra)
    if options.seeds is not None:
        from ..seeds import train_seeds

        train_seeds(recipe, extra, options.seeds)
        return
    if options.folds is not None:
        from ..folds import train_folds

        train_folds(recipe, extra, options.folds)
        return
    from ..train import train

    train(recipe, extra)


def _print_help() -> None:
    # train's own two flags, then every recipe field (argparse knows only the first).
    from ...config.recipes import build_parser

    print("usage: finetune train RECIPE [--seeds N | --folds K] [--field value ...]")
    print("       finetune train --train_file FILE --text_column TEXT --label_column LABEL [--field value ...]\n")
    print("  --seeds N  train once per seed (seed, seed+1, ...) into OUTPUT_DIR/seed-<seed>;")
    print("             report the mean and standard deviation of the test scores")
    print("  --folds K  cross-validate on the train split: K runs into OUTPUT_DIR/fold-<k>, each scored on")
    print("             the fold it did not train on; the test split is not used\n")
    build_parser().print_help()


COMMAND = Command(
    "train",
    help="train from a recipe; any recipe field can be overridden with --field value",
    options=TrainOptions,
    run=run,
    add_help=False,
    takes_recipe_fields=True,
)
