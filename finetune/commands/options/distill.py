"""``finetune distill TEACHER_RUN RECIPE``: a small student trained on a teacher run's soft labels."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FinetuneError
from .fields import Command, argument, option
from .values import positive_int


@dataclass(frozen=True)
class DistillOptions:
    """The options of ``finetune distill``; the recipe's fields travel in ``extra``."""

    # Both optional to argparse, so that "finetune distill --help" reaches run, which prints the recipe's fields too.
    teacher: str | None = argument(None, nargs="?", help="a trained run folder, e.g. runs/drugscom-mpnet")
    recipe: str | None = argument(None, nargs="?", help="the student's recipe YAML file, e.g. recipes/drugscom.yaml")
    seeds: int | None = option(type=positive_int, help="one student per seed; report mean and standard deviation")


def run(options: DistillOptions, extra: list[str]) -> None:
    """Distill the teacher into the recipe's model, once or once per seed."""
    if options.teacher in ("-h", "--help") or "-h" in extra or "--help" in extra:
        _print_help()
        return
    if options.recipe is None:
        raise FinetuneError("finetune distill needs a teacher run and a recipe: finetune distill TEACHER_RUN RECIPE")
    from ..distill import distill

    distill(options.teacher, options.recipe, extra, options.seeds)


def _print_help() -> None:
    # distill's own arguments, then every recipe field (argparse knows only the first).
    from ...config.recipes import build_parser

    print("usage: finetune distill TEACHER_RUN RECIPE [--seeds N] [--field value ...]\n")
    print("  TEACHER_RUN  a run folder made by 'finetune train' (e.g. an MPNet run); it labels the recipe's")
    print("               training reviews (and unlabeled_file's, and with unlabeled_sentences their")
    print("               sentences) once, cached; the recipe's model learns from those probabilities")
    print("               (distill_alpha, distill_temperature) and the labels")
    print("  --seeds N    one student per seed (seed, seed+1, ...) into OUTPUT_DIR/seed-<seed>, as train --seeds\n")
    build_parser().print_help()


COMMAND = Command(
    "distill",
    help="train a small student from a trained teacher run's soft labels and the true labels",
    options=DistillOptions,
    run=run,
    add_help=False,
    takes_recipe_fields=True,
)
