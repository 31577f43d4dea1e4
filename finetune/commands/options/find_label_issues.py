"""``finetune find-label-issues RECIPE``: the training reviews whose labels are likely wrong."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, as_keywords, option


@dataclass(frozen=True)
class FindLabelIssuesOptions:
    """The options of ``finetune find-label-issues``; the recipe's fields travel in ``extra``."""

    recipe: str = argument(help="a recipe YAML file, e.g. recipes/quickstart.yaml")
    folds: int = option(
        5,
        type=int,
        metavar="K",
        help="score every training review with a model trained on the other K-1 folds (default 5, at least 2)",
    )
    baseline_only: bool = option(
        False,
        help="score with the TF-IDF baseline fitted on the same folds instead of fine-tuning K runs (seconds)",
    )
    finetuned_only: bool = option(
        False,
        help="rank on the fine-tuned folds' probabilities alone; by default, with classes, they are averaged with "
        "the TF-IDF baseline's on the same folds, which found more flipped labels (docs/label-issues.md)",
    )


def run(options: FindLabelIssuesOptions, extra: list[str]) -> None:
    """Rank the recipe's likely label errors."""
    from ..find_label_issues import find_label_issues

    find_label_issues(options.recipe, extra, **as_keywords(options, leave_out=("recipe",)))


COMMAND = Command(
    "find-label-issues",
    help="rank the training reviews whose labels are likely wrong (cleanlab on out-of-fold probabilities)",
    options=FindLabelIssuesOptions,
    run=run,
    description=(
        "Writes OUTPUT_DIR/label_issues/label_issues.csv (label_issues_tfidf/ with --baseline_only); "
        "train --drop_label_issues FILE then trains without the rows you keep in it. "
        "Recipe fields can be overridden after the options."
    ),
    takes_recipe_fields=True,
)
