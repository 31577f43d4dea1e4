"""Scores for ordered labels against scikit-learn, review by review and resample by resample."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score, mean_absolute_error, mean_squared_error

from finetune.evaluation.ordered import ORDERED_SCORES, ordered_intervals, ordered_scores


def rated(seed: int, reviews: int = 60, levels: int = 5) -> tuple[np.ndarray, ...]:
    """True levels, predicted levels a step or two off now and then, and unrounded ratings near the predictions."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, levels, reviews)
    guess = np.clip(truth + rng.choice([-2, -1, 0, 0, 0, 1], reviews), 0, levels - 1)
    ratings = np.clip(guess + 1 + rng.normal(0, 0.3, reviews), 1, levels)
    return truth + 1.0, ratings, truth, guess


def sklearn_scores(true_ratings, predicted_ratings, truth, guess, levels: int) -> dict[str, float]:
    labels = list(range(levels))
    return {
        "mae": mean_absolute_error(true_ratings, predicted_ratings),
        "rmse": float(np.sqrt(mean_squared_error(true_ratings, predicted_ratings))),
        "off_by_one_accuracy": float(np.mean([abs(a - b) <= 1 for a, b in zip(truth, guess)])),
        "quadratic_weighted_kappa": cohen_kappa_score(truth, guess, labels=labels, weights="quadratic"),
        "accuracy": accuracy_score(truth, guess),
        "macro_f1": f1_score(truth, guess, labels=labels, average="macro", zero_division=0),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_equal_scikit_learns(seed):
    data = rated(seed)
    assert ordered_scores(*data, 5) == pytest.approx(sklearn_scores(*data, 5), abs=1e-12)


def test_intervals_are_percentiles_of_scikit_learns_scores_on_the_same_resamples():
    data = rated(3, reviews=40)
    ours = ordered_intervals(*data, 5, resamples=200, seed=7)
    # The resamples as bootstrap.py draws them: default_rng(seed).integers(0, n, size=(resamples, n)).
    indices = np.random.default_rng(7).integers(0, 40, size=(200, 40))
    per_resample = [sklearn_scores(*(values[rows] for values in data), 5) for rows in indices]
    for name in ORDERED_SCORES:
        values = np.array([scores[name] for scores in per_resample])
        expected = np.percentile(values[np.isfinite(values)], [2.5, 97.5])
        assert ours[name] == pytest.approx(expected.tolist(), abs=1e-9), name
    assert ours["resamples"] == 200 and ours["seed"] == 7


def test_a_miss_by_two_costs_the_kappa_more_than_two_misses_by_one():
    """Quadratic weights: what makes the kappa fit stars (a 1 for a 5 is worse than a 4)."""
    truth = np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    near = truth.copy()
    near[[0, 1]] = [1, 2]  # two reviews a star off
    far = truth.copy()
    far[0] = 2  # one review two stars off
    near_kappa = ordered_scores(truth + 1.0, near + 1.0, truth, near, 5)["quadratic_weighted_kappa"]
    far_kappa = ordered_scores(truth + 1.0, far + 1.0, truth, far, 5)["quadratic_weighted_kappa"]
    assert near_kappa > far_kappa
