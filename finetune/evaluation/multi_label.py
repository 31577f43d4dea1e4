"""Scores for several tags per review: per-tag thresholds, the scores people read, and their intervals.

A multi-label model gives each review a probability per tag (a sigmoid each,
not a softmax over them), so a tag is predicted where its probability reaches
that tag's threshold. One threshold for every tag (0.5) suits few real sets:
a rare tag's probabilities rarely climb that high, and its recall is lost.
:func:`tune_thresholds` picks each tag's own threshold on the validation
split, the one that gives the tag its best F1 there, as simpletransformers
users ask for (its issues 252 and 1562) and scikit-learn's
``TunedThresholdClassifierCV`` does for one binary label.

The headline score is micro-F1 (every review-tag pair counted once, so common
tags weigh more), with macro-F1 (the mean over tags), per-tag precision,
recall and F1, subset accuracy (the whole set right) and Hamming loss (the
share of review-tag pairs wrong). :func:`tag_score_intervals` gives 95%
bootstrap intervals over reviews, in memory bounded by the number of tags.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bootstrap import paired_record

# Where a tag cannot be tuned (no validation split, or too few validation reviews with the tag).
DEFAULT_THRESHOLD = 0.5
# Fewer validation reviews with a tag than this and its threshold stays at DEFAULT_THRESHOLD. Below it,
# one review moves the tag's F1 by five points or more, and a tag the model cannot read is tuned to a
# threshold low enough to give it to many reviews (any F1 beats the 0 of giving it to none):
# clothing-tags' `trend`, tuned on 9 reviews to 0.06, was given to about 600 of 2,000 test reviews.
MIN_POSITIVES_TO_TUNE = 20
# Resamples drawn at once: memory is this many rows of one weight per review.
RESAMPLES_AT_ONCE = 64


def tune_thresholds(
    probabilities: np.ndarray, labels: np.ndarray, min_positives: int = MIN_POSITIVES_TO_TUNE
) -> np.ndarray:
    """Each tag's threshold with the best F1 on these reviews; ``DEFAULT_THRESHOLD`` for a tag too rare here.

    ``probabilities`` and ``labels`` are ``[reviews, tags]``. A tag held by fewer
    than ``min_positives`` of the reviews keeps ``DEFAULT_THRESHOLD`` (see
    ``MIN_POSITIVES_TO_TUNE``; :func:`too_rare_to_tune` names them). A tag's
    candidates are the midpoints between its sorted distinct probabilities (and
    the ends), so the threshold separates reviews rather than sitting on one.
    Ties keep the candidate nearest ``DEFAULT_THRESHOLD``, so a threshold moves
    from 0.5 only as far as the data asks.
    """
    probabilities, labels = _as_rows(probabilities), _as_rows(labels).astype(bool)
    thresholds = np.full(probabilities.shape[1], DEFAULT_THRESHOLD)
    for tag in np.flatnonzero(_enough_to_tune(labels, min_positives)):
        thresholds[tag] = _best_threshold(probabilities[:, tag], labels[:, tag])
    return thresholds


def too_rare_to_tune(
    labels: np.ndarray, tag_names: list[str], min_positives: int = MIN_POSITIVES_TO_TUNE
) -> dict[str, int]:
    """The tags :func:`tune_thresholds` leaves at ``DEFAULT_THRESHOLD`` on these ``labels``, with their counts."""
    labels = _as_rows(labels).astype(bool)
    counts, tunable = labels.sum(axis=0), _enough_to_tune(labels, min_positives)
    return {name: int(count) for name, count, tuned in zip(tag_names, counts, tunable) if not tuned}


def _enough_to_tune(labels: np.ndarray, min_positives: int) -> np.ndarray:
    """Per tag, whether enough of these reviews hold it to tune its threshold on (at least one, always)."""
    return labels.sum(axis=0) >= max(min_positives, 1)


def _best_threshold(scores: np.ndarray, truth: np.ndarray) -> float:
    """The threshold on one tag's ``scores`` with the best F1 against ``truth`` (see :func:`tune_thresholds`)."""
    values = np.unique(scores)
    candidates = np.concatenate(([values[0] / 2], (values[:-1] + values[1:]) / 2, [(values[-1] + 1) / 2]))
    predicted = scores[None, :] >= candidates[:, None]
    true_positives = (predicted & truth).sum(axis=1)
    # F1 = 2 TP / (predicted + actual positives); 0 where nothing is predicted and nothing is there.
    denominators = predicted.sum(axis=1) + truth.sum()
    f1 = np.divide(2 * true_positives, denominators, out=np.zeros(len(candidates)), where=denominators > 0)
    best = np.flatnonzero(f1 >= f1.max() - 1e-12)
    return float(candidates[best[np.argmin(np.abs(candidates[best] - DEFAULT_THRESHOLD))]])


def predicted_tags(probabilities: np.ndarray, thresholds: np.ndarray | float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Which tags each review is given: its probability at or above the tag's threshold (``[reviews, tags]``)."""
    return _as_rows(probabilities) >= np.asarray(thresholds, dtype=np.float64)


def tag_scores(labels: np.ndarray, predicted: np.ndarray, tag_names: list[str] | None = None) -> dict[str, Any]:
    """Micro- and macro-F1, subset accuracy, Hamming loss, and per tag its precision, recall, F1 and support.

    A tag never predicted has precision 0, and one on no review recall 0 (as
    scikit-learn's ``zero_division=0``), so a tag the model ignores counts
    against macro-F1 instead of dropping out of it.
    """
    truth, guess = _as_rows(labels).astype(bool), _as_rows(predicted).astype(bool)
    true_positives, false_positives, false_negatives = _pair_counts(truth, guess, np.ones((1, len(truth))))
    per_tag_f1 = _f1(true_positives[0], false_positives[0], false_negatives[0])
    names = tag_names or [str(tag) for tag in range(truth.shape[1])]
    per_tag = {
        name: {
            "precision": _ratio(true_positives[0, tag], true_positives[0, tag] + false_positives[0, tag]),
            "recall": _ratio(true_positives[0, tag], true_positives[0, tag] + false_negatives[0, tag]),
            "f1": float(per_tag_f1[tag]),
            "support": int(truth[:, tag].sum()),
        }
        for tag, name in enumerate(names)
    }
    return {
        "micro_f1": float(_f1(true_positives.sum(), false_positives.sum(), false_negatives.sum())),
        "macro_f1": float(per_tag_f1.mean()),
        "subset_accuracy": float((truth == guess).all(axis=1).mean()),
        "hamming_loss": float((truth != guess).mean()),
        "per_tag": per_tag,
    }


def tag_score_intervals(
    labels: np.ndarray, predicted: np.ndarray, resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict[str, Any]:
    """Percentile bootstrap intervals (over reviews) of micro-F1, macro-F1, subset accuracy and each tag's F1.

    Each resample is a count per review (how often it was drawn), so the
    counts of true and false positives are one product of those counts with
    the review-tag table: memory is ``RESAMPLES_AT_ONCE`` x reviews plus
    resamples x tags, never resamples x reviews x tags.
    """
    truth, guess = _as_rows(labels).astype(bool), _as_rows(predicted).astype(bool)
    rng = np.random.default_rng(seed)
    reviews = len(truth)
    micro, macro, per_tag, subset = [], [], [], []
    whole_set_right = (truth == guess).all(axis=1).astype(np.float64)
    for start in range(0, resamples, RESAMPLES_AT_ONCE):
        draws = min(RESAMPLES_AT_ONCE, resamples - start)
        weights = rng.multinomial(reviews, np.full(reviews, 1.0 / reviews), size=draws).astype(np.float64)
        true_positives, false_positives, false_negatives = _pair_counts(truth, guess, weights)
        micro.append(_f1(true_positives.sum(axis=1), false_positives.sum(axis=1), false_negatives.sum(axis=1)))
        tag_f1 = _f1(true_positives, false_positives, false_negatives)
        macro.append(tag_f1.mean(axis=1))
        per_tag.append(tag_f1)
        subset.append(weights @ whole_set_right / reviews)
    tail = (1.0 - confidence) / 2 * 100
    bounds = (tail, 100 - tail)
    return {
        "resamples": resamples,
        "seed": seed,
        "micro_f1": np.percentile(np.concatenate(micro), bounds).tolist(),
        "macro_f1": np.percentile(np.concatenate(macro), bounds).tolist(),
        "subset_accuracy": np.percentile(np.concatenate(subset), bounds).tolist(),
        "per_tag_f1": np.percentile(np.concatenate(per_tag), bounds, axis=0).T.tolist(),
    }


def multi_label_report(
    test_probabilities: np.ndarray,
    test_labels: np.ndarray,
    tag_names: list[str],
    validation: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """A multi_label run's test report: thresholds tuned on ``validation`` (probabilities, labels), then the scores.

    Without a validation split every threshold is ``DEFAULT_THRESHOLD``; with
    one, ``thresholds_untuned`` names the tags too rare there to tune (and their
    validation counts). See :func:`tag_report` for what the rest holds.
    """
    if validation is None:
        thresholds = np.full(len(tag_names), DEFAULT_THRESHOLD)
        return tag_report(test_probabilities, test_labels, tag_names, thresholds, "none (0.5 for every tag)")
    report = tag_report(test_probabilities, test_labels, tag_names, tune_thresholds(*validation), "validation")
    report["thresholds_untuned"] = too_rare_to_tune(validation[1], tag_names)
    return report


def tag_report(
    probabilities: np.ndarray,
    labels: np.ndarray,
    tag_names: list[str],
    thresholds: np.ndarray,
    tuned_on: str,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The scores of tags predicted at ``thresholds``, with 95% bootstrap intervals, as a report dict.

    The report keeps the single-label report's keys where they mean the same:
    ``accuracy`` is subset accuracy (the whole set of tags right, scikit-learn's
    ``accuracy_score`` on tag rows), ``per_class`` is per tag; ``micro_f1`` is the
    headline. ``cooccurrence`` counts the reviews that truly hold each pair of tags
    (its diagonal: each tag's reviews), for the co-occurrence picture.
    """
    truth = _as_rows(labels).astype(bool)
    predicted = predicted_tags(probabilities, thresholds)
    scores = tag_scores(truth, predicted, tag_names)
    intervals = tag_score_intervals(truth, predicted, resamples, seed)
    return {
        "task": "multi_label",
        "micro_f1": scores["micro_f1"],
        "macro_f1": scores["macro_f1"],
        "accuracy": scores["subset_accuracy"],
        "hamming_loss": scores["hamming_loss"],
        "per_class": scores["per_tag"],
        "support": [row["support"] for row in scores["per_tag"].values()],
        "num_samples": len(truth),
        "thresholds": dict(zip(tag_names, (float(value) for value in thresholds))),
        "thresholds_tuned_on": tuned_on,
        "cooccurrence": (truth.T.astype(np.int64) @ truth.astype(np.int64)).tolist(),
        "intervals": {
            "resamples": intervals["resamples"],
            "seed": intervals["seed"],
            "micro_f1": intervals["micro_f1"],
            "macro_f1": intervals["macro_f1"],
            "accuracy": intervals["subset_accuracy"],
            "per_class_f1": dict(zip(tag_names, intervals["per_tag_f1"])),
        },
    }


def paired_tag_comparison(
    best_predicted: np.ndarray,
    other_predicted: np.ndarray,
    labels: np.ndarray,
    resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Best minus other in micro- and macro-F1 on the same resamples of the same reviews, and McNemar's test.

    The paired bootstrap draws each resample's review counts once and scores
    both models on them; ``distinguishable`` is True only when the interval of
    the micro-F1 difference (what the best is chosen by) excludes 0. McNemar's
    exact test counts the review-tag pairs exactly one of the two gets right
    (written down by :func:`.bootstrap.paired_record`, as for single labels).
    """
    truth = _as_rows(labels).astype(bool)
    best, other = _as_rows(best_predicted).astype(bool), _as_rows(other_predicted).astype(bool)
    rng = np.random.default_rng(seed)
    reviews = len(truth)
    micro, macro = [], []
    for start in range(0, resamples, RESAMPLES_AT_ONCE):
        draws = min(RESAMPLES_AT_ONCE, resamples - start)
        weights = rng.multinomial(reviews, np.full(reviews, 1.0 / reviews), size=draws).astype(np.float64)
        best_counts, other_counts = _pair_counts(truth, best, weights), _pair_counts(truth, other, weights)
        micro.append(_micro_f1(best_counts) - _micro_f1(other_counts))
        macro.append(_f1(*best_counts).mean(axis=1) - _f1(*other_counts).mean(axis=1))
    whole = np.ones((1, reviews))
    best_whole, other_whole = _pair_counts(truth, best, whole), _pair_counts(truth, other, whole)
    differences = {
        "micro_f1": float(_micro_f1(best_whole)[0] - _micro_f1(other_whole)[0]),
        "macro_f1": float(_f1(*best_whole).mean(axis=1)[0] - _f1(*other_whole).mean(axis=1)[0]),
    }
    resampled = {"micro_f1": np.concatenate(micro), "macro_f1": np.concatenate(macro)}
    # McNemar over review-tag pairs: each pair one case.
    return paired_record(differences, resampled, "micro_f1", best == truth, other == truth, confidence, resamples)


def describe_tag_comparison(comparison: dict[str, Any]) -> str:
    """``'not distinguishable'`` or ``'best better'``, with the micro-F1 difference interval and McNemar's p."""
    low, high = comparison["micro_f1_interval"]
    verdict = "not distinguishable" if not comparison["distinguishable"] else "best better" if low > 0 else "best worse"
    return f"{verdict} (micro-F1 diff [{low:+.3f}, {high:+.3f}], McNemar p={comparison['mcnemar']['p_value']:.2g})"


def _micro_f1(counts: tuple[np.ndarray, ...]) -> np.ndarray:
    """Micro-F1 per resample from per-tag (true positive, false positive, false negative) counts."""
    return _f1(*(count.sum(axis=1) for count in counts))


def _pair_counts(truth: np.ndarray, guess: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """True positives, false positives and false negatives per resample and tag: ``weights`` [resamples, reviews]."""
    return (
        weights @ (truth & guess).astype(np.float64),
        weights @ (~truth & guess).astype(np.float64),
        weights @ (truth & ~guess).astype(np.float64),
    )


def _f1(true_positives: np.ndarray, false_positives: np.ndarray, false_negatives: np.ndarray) -> np.ndarray:
    """F1 from its counts, 0 where there is nothing to find and nothing found."""
    denominator = np.asarray(2 * true_positives + false_positives + false_negatives, dtype=np.float64)
    numerator = np.asarray(2 * true_positives, dtype=np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(denominator), where=denominator > 0)


def _ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, 0 where the denominator is 0."""
    return float(numerator / denominator) if denominator else 0.0


def _as_rows(values: Any) -> np.ndarray:
    """``values`` as a 2-D array of reviews by tags."""
    array = np.asarray(values)
    return array.reshape(len(array), -1)
