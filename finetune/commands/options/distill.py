"""``finetune distill TEACHER_RUN RECIPE``: a small student trained on a teacher run's soft labels."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FinetuneError
from .fields import Command, argument, option
from .values import positive_int


@dataclass(frozen=True)
class DistillOptions:
    """The options of ``finetune distill``; the recipe's fields travel in ``extra``."""

    # Both optional to argparse, so that a missing one gets distill's own message (naming both).
    teacher: str | None = argument(
        None,
        nargs="?",
        help="a run folder made by 'finetune train' (e.g. runs/drugscom-mpnet); it labels the recipe's training "
        "reviews (and unlabeled_file's, and with unlabeled_sentences their sentences) once, cached; the recipe's "
        "model learns from those probabilities (distill_alpha, distill_temperature) and the labels",
    )
    recipe: str | None = argument(None, nargs="?", help="the student's recipe YAML file, e.g. recipes/drugscom.yaml")
    seeds: int | None = option(
        type=positive_int,
        metavar="N",
        help="one student per seed (seed, seed+1, ...) into OUTPUT_DIR/seed-<seed>, as train --seeds",
    )


def run(options: DistillOptions, extra: list[str]) -> None:
    """Distill the teacher into the recipe's model, once or once per seed."""
    if options.recipe is None:
        raise FinetuneError("finetune distill needs a teacher run and a recipe: finetune distill TEACHER_RUN RECIPE")
    from ..distill import distill

    distill(options.teacher, options.recipe, extra, options.seeds)


COMMAND = Command(
    "distill",
    help="train a small student from a trained teacher run's soft labels and the true labels",
    options=DistillOptions,
    run=run,
    usage="finetune distill TEACHER_RUN RECIPE [--seeds N] [--field value ...]",
    takes_recipe_fields=True,
)
