"""``finetune train``: a recipe's run, once, once per seed (``--seeds``) or once per fold (``--folds``)."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FinetuneError
from .fields import Command, option
from .values import positive_int


@dataclass(frozen=True)
class TrainOptions:
    """The options of ``finetune train`` itself; the recipe and its fields travel in ``extra``."""

    seeds: int | None = option(
        type=positive_int,
        metavar="N",
        help="train once per seed (seed, seed+1, ...) into OUTPUT_DIR/seed-<seed>; report the mean and standard "
        "deviation of the test scores",
    )
    folds: int | None = option(
        type=positive_int,
        metavar="K",
        help="cross-validate on the train split: K runs into OUTPUT_DIR/fold-<k>, each scored on the fold it did "
        "not train on; the test split is not used",
    )


def run(options: TrainOptions, extra: list[str]) -> None:
    """Train the recipe (or the reviews the flags name) once, per seed or per fold."""
    # The recipe is the first word that is not a flag; without one, the flags name the data
    # (argparse would take the first flag's value, "reviews.csv" in "--train_file reviews.csv", as it).
    recipe = extra[0] if extra and not extra[0].startswith("-") else None
    extra = extra[1:] if recipe is not None else extra
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


COMMAND = Command(
    "train",
    help="train from a recipe; any recipe field can be overridden with --field value",
    options=TrainOptions,
    run=run,
    usage=(
        "finetune train RECIPE [--seeds N | --folds K] [--field value ...]\n"
        "       finetune train --train_file FILE --text_column TEXT --label_column LABEL [--field value ...]"
    ),
    takes_recipe_fields=True,
)
