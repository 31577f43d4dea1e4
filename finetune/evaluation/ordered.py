"""Scores for ordered labels (star ratings): how far off, not only whether right, each with a 95% interval.

MAE and RMSE are in stars, on the ratings as predicted (a regression run's
unrounded, clipped to the scale; an ordinal or classification run's levels).
Off-by-one accuracy (the predicted level at most one level from the true
one), quadratic weighted kappa (scikit-learn's ``cohen_kappa_score(...,
weights="quadratic")``: agreement beyond chance, a miss costing the square of
its distance), accuracy and macro-F1 are on the predicted levels. Intervals
are percentile bootstraps over reviews on the same seeded resamples as every
other score here (:mod:`.bootstrap`), counted per resample with numpy, so
memory stays flat however many resamples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.tasks import REGRESSION
from .bootstrap import CONFIDENCE, RESAMPLES, SEED, percentile_interval, resample_indices, resampled_scores

if TYPE_CHECKING:
    from ..data.ratings import RatingScale

# The scores of a ratings report, in the order tables show them; "lower" ones are better when smaller.
ORDERED_SCORES = ("mae", "rmse", "off_by_one_accuracy", "quadratic_weighted_kappa", "accuracy", "macro_f1")
LOWER_IS_BETTER = ("mae", "rmse")


def ordered_scores(
    true_ratings: Any, predicted_ratings: Any, true_levels: Any, predicted_levels: Any, num_levels: int
) -> dict[str, float]:
    """The six scores of :data:`ORDERED_SCORES` on every review (sklearn's, for the kappa and F1)."""
    from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score

    errors = np.asarray(predicted_ratings, dtype=np.float64) - np.asarray(true_ratings, dtype=np.float64)
    true_levels, predicted_levels = np.asarray(true_levels), np.asarray(predicted_levels)
    levels = list(range(num_levels))
    return {
        "mae": float(np.abs(errors).mean()),
        "rmse": float(np.sqrt((errors**2).mean())),
        "off_by_one_accuracy": float((np.abs(true_levels - predicted_levels) <= 1).mean()),
        "quadratic_weighted_kappa": float(
            cohen_kappa_score(true_levels, predicted_levels, labels=levels, weights="quadratic")
        ),
        "accuracy": float(accuracy_score(true_levels, predicted_levels)),
        "macro_f1": float(f1_score(true_levels, predicted_levels, labels=levels, average="macro", zero_division=0)),
    }


def ordered_intervals(
    true_ratings: Any,
    predicted_ratings: Any,
    true_levels: Any,
    predicted_levels: Any,
    num_levels: int,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Percentile bootstrap intervals of the six scores, over reviews, on seeded resamples."""
    errors = np.asarray(predicted_ratings, dtype=np.float64) - np.asarray(true_ratings, dtype=np.float64)
    truth, guess = np.asarray(true_levels, dtype=np.int64), np.asarray(predicted_levels, dtype=np.int64)
    blocks: dict[str, list[np.ndarray]] = {name: [] for name in ORDERED_SCORES}
    for indices in resample_indices(len(truth), resamples, seed):
        blocks["mae"].append(np.abs(errors[indices]).mean(axis=1))
        blocks["rmse"].append(np.sqrt((errors[indices] ** 2).mean(axis=1)))
        blocks["off_by_one_accuracy"].append((np.abs(truth[indices] - guess[indices]) <= 1).mean(axis=1))
        blocks["quadratic_weighted_kappa"].append(_kappas(truth[indices], guess[indices], num_levels))
        classes = resampled_scores(guess, truth, num_levels, indices, range(0))
        blocks["accuracy"].append(classes["accuracy"])
        blocks["macro_f1"].append(classes["macro_f1"])
    intervals: dict[str, Any] = {
        "method": "percentile bootstrap",
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
    }
    for name, values in blocks.items():
        scores = np.concatenate(values)
        # A resample whose reviews all sit at one level has no kappa (0 / 0): left out of its interval.
        intervals[name] = percentile_interval(scores[np.isfinite(scores)], confidence)
    return intervals


def _kappas(truth: np.ndarray, guess: np.ndarray, num_levels: int) -> np.ndarray:
    """Quadratic weighted kappa of each row (a resample): 1 - sum(w O) / sum(w E), as scikit-learn computes it."""
    rows, reviews = truth.shape
    cells = num_levels * num_levels
    pairs = truth * num_levels + guess + (np.arange(rows) * cells)[:, None]
    observed = np.bincount(pairs.ravel(), minlength=rows * cells).reshape(rows, num_levels, num_levels)
    expected = observed.sum(axis=2)[:, :, None] * observed.sum(axis=1)[:, None, :] / reviews
    distance = np.arange(num_levels)
    weights = (distance[:, None] - distance[None, :]) ** 2
    disagreement = (weights * expected).sum(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 - (weights * observed).sum(axis=(1, 2)) / disagreement


def ordered_report(
    true_ratings: Any,
    predicted_ratings: Any,
    true_levels: Any,
    predicted_levels: Any,
    level_names: Sequence[str],
    task: str,
) -> dict[str, Any]:
    """A ratings run's test report: the six scores and their intervals, plus the levels' classification report.

    The classification part (per-level precision/recall/F1, the confusion matrix of the rounded stars) is
    what a classification run's report holds, so reports and pictures read alike.
    """
    from .metrics import classification_report

    report = classification_report(predicted_levels, true_levels, list(level_names))
    args = (true_ratings, predicted_ratings, true_levels, predicted_levels, len(level_names))
    report.update(ordered_scores(*args))
    report["task"] = task
    report["intervals"] = ordered_intervals(*args)
    return report


def ordered_reading(
    predicted_levels: Any, true_levels: Any, level_names: Sequence[str], levels: Sequence[float]
) -> dict[str, Any]:
    """A classifier's predictions on star classes read as stars: the six scores and their intervals."""
    ratings = np.asarray(levels, dtype=np.float64)
    true_levels, predicted_levels = np.asarray(true_levels), np.asarray(predicted_levels)
    args = (ratings[true_levels], ratings[predicted_levels], true_levels, predicted_levels, len(level_names))
    return {**ordered_scores(*args), "intervals": ordered_intervals(*args)}


def paired_mae_difference(
    best_errors: Any, other_errors: Any, resamples: int = RESAMPLES, seed: int = SEED, confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """Other minus best MAE on the same seeded resamples of the same reviews (positive: the best is closer).

    ``*_errors`` are each review's absolute error in stars. ``distinguishable`` is True only when the
    interval of the difference excludes 0.
    """
    best, other = np.asarray(best_errors, dtype=np.float64), np.asarray(other_errors, dtype=np.float64)
    differences = [
        other[indices].mean(axis=1) - best[indices].mean(axis=1)
        for indices in resample_indices(len(best), resamples, seed)
    ]
    low, high = percentile_interval(np.concatenate(differences), confidence)
    return {
        "method": "paired bootstrap",
        "confidence": confidence,
        "resamples": resamples,
        "mae_difference": float(other.mean() - best.mean()),
        "mae_interval": [low, high],
        "distinguishable": bool(low > 0 or high < 0),
    }


def with_star_scores(
    compute_metrics: Callable[[Any], dict[str, float]], levels: Sequence[float]
) -> Callable[[Any], dict[str, float]]:
    """A classifier's ``compute_metrics`` on star classes, plus the ordered scores of its argmax (``mae``, ...).

    So ``metric_for_best_model: mae`` picks a classifier's checkpoint as it picks a ratings run's.
    """
    ratings = np.asarray(levels, dtype=np.float64)

    def with_stars(eval_prediction: Any) -> dict[str, float]:
        logits = eval_prediction.predictions
        predicted = np.asarray(logits[0] if isinstance(logits, tuple) else logits).argmax(axis=-1)
        truth = np.asarray(eval_prediction.label_ids, dtype=np.int64)
        stars = ordered_scores(ratings[truth], ratings[predicted], truth, predicted, len(ratings))
        return {**stars, **compute_metrics(eval_prediction)}

    return with_stars


def build_rating_metrics(task: str, scale: RatingScale) -> Callable[[Any], dict[str, float]]:
    """A ``compute_metrics`` for ``Trainer`` in a ratings run: outputs decoded to stars, then the six scores.

    ``mae`` is what ``metric_for_best_model`` names to keep the checkpoint closest to the stars.
    """

    def compute_metrics(eval_prediction: Any) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return _rating_metrics(np.asarray(logits), eval_prediction.label_ids, task, scale)

    return compute_metrics


def _rating_metrics(logits: np.ndarray, labels: Any, task: str, scale: RatingScale) -> dict[str, float]:
    """The ordered scores of a ratings run's evaluation; a regression run's labels are standardised ratings."""
    from ..training.ordered_heads import decode

    levels = np.asarray(scale.levels)
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    if task == REGRESSION:
        # Back to stars, then the nearest level (the standardised float is the level's rating up to rounding).
        true_ratings = scale.mean + scale.std * labels
        true_levels = np.abs(true_ratings[:, None] - levels[None, :]).argmin(axis=1)
    else:
        true_levels = labels.astype(np.int64)
    predicted_ratings, predicted_levels = decode(logits, task, scale)
    return ordered_scores(levels[true_levels], predicted_ratings, true_levels, predicted_levels, len(levels))
