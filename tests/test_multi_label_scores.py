"""Scores for several tags per review, each checked against scikit-learn or a brute-force search written here."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, hamming_loss, precision_score, recall_score

from finetune.evaluation.multi_label import (
    DEFAULT_THRESHOLD,
    MIN_POSITIVES_TO_TUNE,
    predicted_tags,
    tag_score_intervals,
    tag_scores,
    too_rare_to_tune,
    tune_thresholds,
)


def random_tags(reviews: int, tags: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tag rows (a rare last tag) and probabilities that lean towards them."""
    rng = np.random.default_rng(seed)
    rates = np.linspace(0.5, 0.08, tags)
    truth = rng.random((reviews, tags)) < rates
    probabilities = np.clip(0.3 * truth + rng.random((reviews, tags)) * 0.7, 0, 1)
    return truth, probabilities


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_equal_scikit_learns(seed):
    truth, probabilities = random_tags(60, 4, seed)
    guess = predicted_tags(probabilities, 0.5)
    scores = tag_scores(truth, guess, ["price", "delivery", "size", "service"])
    assert scores["micro_f1"] == pytest.approx(f1_score(truth, guess, average="micro", zero_division=0))
    assert scores["macro_f1"] == pytest.approx(f1_score(truth, guess, average="macro", zero_division=0))
    assert scores["subset_accuracy"] == pytest.approx(accuracy_score(truth, guess))
    assert scores["hamming_loss"] == pytest.approx(hamming_loss(truth, guess))
    per_tag_f1 = f1_score(truth, guess, average=None, zero_division=0)
    precision = precision_score(truth, guess, average=None, zero_division=0)
    recall = recall_score(truth, guess, average=None, zero_division=0)
    for index, name in enumerate(["price", "delivery", "size", "service"]):
        row = scores["per_tag"][name]
        assert (row["f1"], row["precision"], row["recall"]) == pytest.approx(
            (per_tag_f1[index], precision[index], recall[index])
        )
        assert row["support"] == truth[:, index].sum()


def test_a_tag_never_predicted_counts_against_macro_f1():
    truth = np.array([[1, 1], [1, 0], [0, 1]], dtype=bool)
    guess = np.array([[1, 0], [1, 0], [0, 0]], dtype=bool)
    scores = tag_scores(truth, guess)
    assert scores["per_tag"]["1"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert scores["macro_f1"] == pytest.approx(0.5)


def brute_force_threshold(scores: np.ndarray, truth: np.ndarray) -> float:
    """The best F1 over every threshold that changes a prediction (each score itself), for comparison."""
    best = 0.0
    for threshold in [*scores, 1.0001]:
        predicted = scores >= threshold
        found = (predicted & truth).sum()
        best = max(best, 2 * found / (predicted.sum() + truth.sum()))
    return best


@pytest.mark.parametrize("seed", [0, 3])
def test_tuned_thresholds_reach_each_tags_best_f1(seed):
    truth, probabilities = random_tags(50, 3, seed)
    # The search itself, on every tag (a real run leaves tags under MIN_POSITIVES_TO_TUNE at 0.5).
    thresholds = tune_thresholds(probabilities, truth, min_positives=1)
    for tag in range(3):
        tuned_f1 = f1_score(truth[:, tag], probabilities[:, tag] >= thresholds[tag], zero_division=0)
        assert tuned_f1 == pytest.approx(brute_force_threshold(probabilities[:, tag], truth[:, tag]))


def test_a_tag_on_no_review_keeps_the_default_threshold_and_ties_stay_near_it():
    probabilities = np.array([[0.9, 0.2], [0.1, 0.3], [0.8, 0.1]])
    truth = np.array([[1, 0], [0, 0], [1, 0]], dtype=bool)
    thresholds = tune_thresholds(probabilities, truth, min_positives=1)
    assert thresholds[1] == DEFAULT_THRESHOLD
    # The first tag is separated perfectly by the midpoint of 0.1 and 0.8 (0.45), the candidate nearest 0.5.
    assert thresholds[0] == pytest.approx(0.45)


def test_a_tag_on_too_few_reviews_keeps_the_default_threshold_and_is_named():
    # A tag the model cannot read: its probabilities are noise, and F1 alone would pick the threshold that
    # gives it to most reviews (any F1 beats none). One review short of the minimum it stays at 0.5.
    rng = np.random.default_rng(7)
    probabilities = rng.random((400, 2)) * 0.6
    truth = np.zeros((400, 2), dtype=bool)
    truth[: MIN_POSITIVES_TO_TUNE - 1, 0] = True
    truth[:MIN_POSITIVES_TO_TUNE, 1] = True
    thresholds = tune_thresholds(probabilities, truth)
    assert thresholds[0] == DEFAULT_THRESHOLD
    assert thresholds[1] == pytest.approx(tune_thresholds(probabilities, truth, min_positives=1)[1])
    assert thresholds[1] < 0.5
    assert too_rare_to_tune(truth, ["trend", "petite"]) == {"trend": MIN_POSITIVES_TO_TUNE - 1}


def test_intervals_hold_the_scores_and_narrow_with_more_reviews():
    truth, probabilities = random_tags(400, 3, 5)
    guess = predicted_tags(probabilities)
    scores = tag_scores(truth, guess)
    wide = tag_score_intervals(truth[:100], guess[:100], resamples=300)
    narrow = tag_score_intervals(truth, guess, resamples=300)
    low, high = narrow["micro_f1"]
    assert low < scores["micro_f1"] < high
    assert narrow["macro_f1"][0] < scores["macro_f1"] < narrow["macro_f1"][1]
    assert high - low < wide["micro_f1"][1] - wide["micro_f1"][0]
    for tag, (tag_low, tag_high) in enumerate(narrow["per_tag_f1"]):
        assert tag_low <= scores["per_tag"][str(tag)]["f1"] <= tag_high


def test_intervals_of_many_tags_stay_small_in_memory():
    # 2,000 tags x 1,000 reviews x 1,000 resamples as an index table would be 2e9 entries; counts are not.
    import tracemalloc

    rng = np.random.default_rng(0)
    truth = rng.random((1000, 2000)) < 0.01
    tracemalloc.start()
    tag_score_intervals(truth, truth, resamples=200)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 200 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_a_paired_comparison_of_two_tag_models_against_scikit_learn():
    from finetune.evaluation.multi_label import paired_tag_comparison

    rng = np.random.default_rng(5)
    truth = rng.random((200, 4)) < 0.3
    good = truth ^ (rng.random(truth.shape) < 0.05)  # 5% of review-tag pairs flipped
    poor = truth ^ (rng.random(truth.shape) < 0.30)
    comparison = paired_tag_comparison(good, poor, truth, resamples=300, seed=1)
    for metric in ("micro", "macro"):
        expected = f1_score(truth, good, average=metric, zero_division=0) - f1_score(
            truth, poor, average=metric, zero_division=0
        )
        assert comparison[f"{metric}_f1_difference"] == pytest.approx(expected, abs=1e-12)
        low, high = comparison[f"{metric}_f1_interval"]
        assert 0 < low <= expected <= high
    assert comparison["distinguishable"]
    # McNemar counts the review-tag pairs exactly one of the two gets right.
    only_good = int(((good == truth) & (poor != truth)).sum())
    only_poor = int(((good != truth) & (poor == truth)).sum())
    assert comparison["mcnemar"]["only_best_right"] == only_good
    assert comparison["mcnemar"]["only_other_right"] == only_poor
    assert comparison["mcnemar"]["p_value"] < 1e-6

    same = paired_tag_comparison(good, good, truth, resamples=50, seed=1)
    assert same["micro_f1_interval"] == [0.0, 0.0] and not same["distinguishable"]
    assert same["mcnemar"]["p_value"] == 1.0


def test_the_tag_errors_list_puts_the_most_tags_wrong_first():
    from finetune.evaluation.errors import largest_tag_errors

    names = ["price", "size", "delivery"]
    labels = [[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 0, 0]]
    probabilities = [
        [0.9, 0.1, 0.2],  # right
        [0.2, 0.1, 0.9],  # all three wrong
        [0.6, 0.1, 0.8],  # one extra, confident
        [0.55, 0.1, 0.1],  # one extra, hesitant
    ]
    rows = largest_tag_errors(["a", "b", "c", "d"], labels, probabilities, [0.5, 0.5, 0.5], names, count=3)
    assert [row["text"] for row in rows] == ["b", "c", "d"]
    assert rows[0] == {
        "text": "b",
        "true": "price|size",
        "predicted": "delivery",
        "missed": "price|size",
        "extra": "delivery",
        "wrong_tags": 3,
        # -log(0.2) - log(0.1) - log(1 - 0.9), computed by hand
        "loss": round(-np.log(0.2) - np.log(0.1) - np.log(0.1), 6),
    }
    assert rows[1]["extra"] == "price" and rows[1]["missed"] == "" and rows[1]["loss"] > rows[2]["loss"]
