"""The baseline of a ratings run (``regression``, ``ordinal``): the same TF-IDF features into a ridge regression.

The ridge predicts the rating as a number, clipped to the levels' range; a
regression run is compared with that, an ordinal run with the same ridge
rounded to the nearest level (what an ordinal model predicts: a level). Both
are scored by :mod:`.ordered` on the same splits as the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.tasks import ORDINAL
from .baseline import DESCRIPTION, BaselineResult, TfidfBaseline

if TYPE_CHECKING:
    from ..data.ratings import RatingScale

# Ridge's default strength; the TF-IDF rows are unit length, so it needs no scaling of its own.
RIDGE_ALPHA = 1.0


def ridge_description(task: str) -> str:
    """What the ratings baseline is, in words (the classification baseline's features, a ridge instead)."""
    description = DESCRIPTION.replace("logistic regression, class-balanced", "ridge regression on the rating")
    return description + (", rounded to the nearest level" if task == ORDINAL else "")


class RidgeRatings(TfidfBaseline):
    """TF-IDF + ridge regression on the rating; predicts ratings clipped to the levels' range."""

    def __init__(self, levels: Sequence[float], seed: int = 42) -> None:
        super().__init__(len(levels), seed=seed)
        self.levels = np.asarray(levels, dtype=np.float64)

    def _classifier(self) -> Any:
        from sklearn.linear_model import Ridge

        return Ridge(alpha=RIDGE_ALPHA)

    def ratings_and_levels(self, texts: Sequence[str], task: str) -> tuple[np.ndarray, np.ndarray]:
        """Each text's rating (clipped; for ordinal, its level's) and its nearest level's index."""
        ratings = np.clip(self.pipeline.predict(list(texts)), self.levels.min(), self.levels.max())
        nearest = np.abs(ratings[:, None] - self.levels[None, :]).argmin(axis=1)
        return (self.levels[nearest] if task == ORDINAL else ratings), nearest


def run_rating_baseline(
    train_texts: Sequence[str],
    train_levels: Sequence[int],
    to_score: dict[str, tuple[Sequence[str], Sequence[int]]],
    level_names: list[str],
    scale: RatingScale,
    task: str,
    seed: int = 42,
) -> BaselineResult:
    """Fit the ridge on the train split's ratings and score it on each of ``to_score`` (split -> texts, levels)."""
    from .ordered import ordered_report

    levels = np.asarray(scale.levels)
    started = time.perf_counter()
    baseline = RidgeRatings(scale.levels, seed=seed).fit(train_texts, levels[np.asarray(train_levels)])
    fit_seconds = time.perf_counter() - started
    scores = {}
    for split, (texts, true_levels) in to_score.items():
        predicted_ratings, predicted_levels = baseline.ratings_and_levels(texts, task)
        true_levels = np.asarray(true_levels)
        scores[split] = ordered_report(
            levels[true_levels], predicted_ratings, true_levels, predicted_levels, level_names, task
        )
    return BaselineResult(
        description=ridge_description(task),
        train_reviews=baseline.train_reviews,
        features=baseline.features,
        fit_seconds=round(fit_seconds, 2),
        scores=scores,
        note=baseline.note,
    )
