"""Star ratings as ordered levels (a ``regression`` or ``ordinal`` run): the levels, each review's, the train scale.

A rating is read as a number (``4``, ``"4.5"``); the levels are the distinct
ratings of the train split in increasing order, and a review's ``labels`` is
the index of its level, so splits are stratified and counted as classes are.
An ordinal run given ``label_bins`` or ``class_names`` takes those classes,
in the order given, as its levels instead. A regression run trains on the
rating standardised with the train split's mean and standard deviation
(:class:`RatingScale`), which the model's config keeps to map every output back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import datasets

from ..config.arguments import DataArguments
from ..config.tasks import ORDINAL, REGRESSION
from ..errors import FinetuneError
from .columns import column_values

# The fewest levels an ordinal run can rank: with two it is a yes/no classifier.
MIN_ORDINAL_LEVELS = 3


def reads_numbers(data_args: DataArguments) -> bool:
    """Whether the labels are read as numeric ratings: always for regression, for ordinal without named classes."""
    named = bool(data_args.class_names) or data_args.label_bins is not None
    return data_args.task == REGRESSION or (data_args.task == ORDINAL and not named)


def _read_rating(raw: Any) -> tuple[float | None, str | None]:
    """A label cell as a rating and what is wrong with it: ``(None, None)`` when missing, a problem for text or NaN."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None, None
    if isinstance(raw, bool):
        return None, "true/false"
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        return None, "not a number"
    return (value, None) if math.isfinite(value) else (None, "not a finite number")


def rating_value(raw: Any, where: str, column: str, task: str) -> float | None:
    """A label cell as a rating, or None for a missing one (dropped and counted); refuses text and NaN."""
    value, problem = _read_rating(raw)
    if problem is not None:
        raise FinetuneError(
            f"{where}: rating {raw!r} in '{column}' is {problem}, and task: {task} reads each rating as a number "
            "(e.g. 4 or 4.5); fix the row, or set task: single_label for text classes"
        )
    return value


def check_given_rating(raw: Any, where: str, column: str, levels: Sequence[float], fix: str) -> None:
    """Refuse a rating given with reviews to rate (``predict --check_ratings``) that the model cannot give.

    A rating that is not a number, NaN, or outside ``levels``' range is refused in one line naming
    ``where`` and ``fix``; an empty cell is a review without a rating and passes.
    """
    value, problem = _read_rating(raw)
    low, high = min(levels), max(levels)
    if problem is None and value is not None and not low <= value <= high:
        problem = f"outside the model's levels, {low:g} to {high:g} (rating_levels in its config.json)"
    if problem is not None:
        raise FinetuneError(f"{where}: rating {raw!r} in '{column}' is {problem}; {fix}")


def level_name(value: float) -> str:
    """A rating level as a class name: ``4.0`` -> ``"4"``, ``4.5`` -> ``"4.5"``."""
    return f"{value:g}"


def rating_levels(
    train: datasets.Dataset, origin: str, data_args: DataArguments, row_name: Callable[[int], str]
) -> list[str]:
    """The train split's distinct ratings in increasing order, as level names; refuses too few for the task."""
    column = data_args.label_column
    values = {
        value
        for index, raw in enumerate(column_values(train, column))
        if (value := rating_value(raw, row_name(index), column, str(data_args.task))) is not None
    }
    if not values:
        raise FinetuneError(f"{origin} has no ratings in '{column}'; check label_column")
    names = [level_name(value) for value in sorted(values)]
    check_level_count(names, origin, str(data_args.task))
    return names


def star_levels(class_names: Sequence[str]) -> list[float] | None:
    """The classes as ratings when they read as a star column (3 or more numbers, not class ids 0..K-1); else None.

    A classifier trained on such classes is scored as the ratings tasks are too, so the three compare.
    """
    try:
        levels = [float(name) for name in class_names]
    except ValueError:
        return None
    ids = [float(index) for index in range(len(class_names))]
    return levels if len(levels) >= MIN_ORDINAL_LEVELS and levels != ids else None


def check_level_count(names: Sequence[str], origin: str, task: str) -> None:
    """Refuse a ratings run with too few levels: regression needs 2, ordinal 3 (two are a yes/no classifier)."""
    needed = MIN_ORDINAL_LEVELS if task == ORDINAL else 2
    if len(names) < needed:
        fix = "use task: single_label for two classes" if task == ORDINAL else "check label_column"
        raise FinetuneError(
            f"{origin}: task: {task} needs at least {needed} rating levels, and the training reviews have "
            f"{len(names)} ({', '.join(names)}); {fix}"
        )


@dataclass(frozen=True)
class RatingScale:
    """The rating of each level, and the train split's mean and standard deviation of the ratings.

    Levels named by numbers are those numbers; levels named otherwise (an
    ordinal run's ``label_bins``) are ranked 1, 2, ...: scores such as MAE
    are then in levels.
    """

    levels: tuple[float, ...]
    mean: float
    std: float

    @classmethod
    def of_train(cls, level_names: Sequence[str], train_level_ids: Sequence[int]) -> RatingScale:
        """The scale of ``level_names`` over the train split's reviews (their level ids)."""
        import numpy as np

        try:
            levels = tuple(float(name) for name in level_names)
        except ValueError:
            levels = tuple(float(rank) for rank in range(1, len(level_names) + 1))
        ratings = np.asarray(levels)[np.asarray(train_level_ids, dtype=np.int64)]
        # At least two levels have reviews (each level has one), so the deviation is above 0.
        return cls(levels, float(ratings.mean()), float(ratings.std()))

    def standardised(self, level_ids: Sequence[int]) -> list[float]:
        """The regression targets of reviews at these levels: (rating - mean) / std."""
        return [(self.levels[index] - self.mean) / self.std for index in level_ids]

    def config_fields(self) -> dict[str, Any]:
        """What a saved model's config.json keeps of the scale."""
        return {"rating_levels": list(self.levels), "rating_mean": self.mean, "rating_std": self.std}

    @classmethod
    def from_config(cls, config: Any) -> RatingScale | None:
        """The scale a model's config (or config.json as a dict) keeps; None for a model of another task."""

        def read(key: str) -> Any:
            return config.get(key) if isinstance(config, dict) else getattr(config, key, None)

        if read("rating_levels") is None:
            return None
        return cls(tuple(float(level) for level in read("rating_levels")), read("rating_mean"), read("rating_std"))


def with_standardised_targets(encoded: datasets.DatasetDict, scale: RatingScale) -> datasets.DatasetDict:
    """The encoded splits with ``labels`` replaced by each review's standardised rating (a regression run's target)."""

    def targets(batch: dict[str, list]) -> dict[str, list]:
        return {"target": scale.standardised(batch["labels"])}

    mapped = encoded.map(targets, batched=True, desc="Standardising ratings")
    mapped = mapped.remove_columns("labels").rename_column("target", "labels")
    return mapped.cast_column("labels", datasets.Value("float32"))
