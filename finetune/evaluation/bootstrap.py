"""How sure a score is: percentile bootstrap intervals, and a paired test of two models on the same reviews.

With a test set of a hundred or a few hundred reviews, accuracy moves by a
few points from one sample to the next; these say by how much. Every
resample draws review indices with replacement from
``numpy.random.default_rng(seed).integers(0, n, size=(resamples, n))``, so a
seed gives the same interval every time, and two models compared on the same
seed are compared on the same resamples (a paired bootstrap).

Scores per resample come from each class's true, predicted and right counts
in the resample (numpy ``bincount``; never a class-by-class confusion matrix,
which grows with the square of the classes), the same accuracy and F1 as
scikit-learn's (an F1 with no predicted and no true review of a class counts
0, as scikit-learn's ``zero_division`` default does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import FinetuneError

RESAMPLES = 1000
# Past a million resamples a 95% interval's ends stop moving; the flag is refused above it.
MAX_RESAMPLES = 1_000_000
CONFIDENCE = 0.95
SEED = 0
# Indices are drawn and scored in blocks of about this many cells, counting a block's (resample, review)
# indices and its (resample, class) counts alike (64 MiB a block of int64; with the counts, F1s and
# gathered labels a few hundred MiB at the peak), so memory stays flat however many resamples,
# reviews or classes; the draws are the same as in one block. No (class, class) confusion matrix is
# built: 10,000 classes once asked for 745 GiB of them.
CHUNK_CELLS = 8_000_000
# What one block's scoring holds per (resample, class) cell: true, predicted and right counts, and F1s.
CLASS_CELL_ARRAYS = 4


def resample_indices(
    num_samples: int, resamples: int = RESAMPLES, seed: int = SEED, cells_per_resample: int | None = None
) -> Iterator[np.ndarray]:
    """Review indices drawn with replacement, seeded: ``(rows, num_samples)`` blocks, ``resamples`` rows in all.

    The blocks together are ``default_rng(seed).integers(0, num_samples, size=(resamples, num_samples))``.
    A block holds about ``CHUNK_CELLS`` cells, a resample counting ``cells_per_resample`` (by default its indices).
    """
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, CHUNK_CELLS // max(cells_per_resample or num_samples, 1))
    for start in range(0, resamples, rows_per_block):
        yield rng.integers(0, num_samples, size=(min(rows_per_block, resamples - start), num_samples))


def bootstrap_scores(
    predictions: Sequence[Any],
    labels: Any,
    num_labels: int,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    classes: range = range(0),
) -> list[dict[str, np.ndarray]]:
    """:func:`resampled_scores` of each of ``predictions`` (one per model) on the same seeded resamples.

    ``per_class_f1`` holds the F1 of ``classes`` only (``(resamples, len(classes))``): every class of
    every resample would not fit in memory with thousands of classes (see :func:`score_intervals`).
    """
    if resamples < 1:
        raise FinetuneError(f"resamples must be >= 1 (got {resamples}); the default is {RESAMPLES}")
    blocks: list[list[dict[str, np.ndarray]]] = [[] for _ in predictions]
    cells_per_resample = len(labels) + CLASS_CELL_ARRAYS * (num_labels + 1)
    for indices in resample_indices(len(labels), resamples, seed, cells_per_resample):
        for scores, model_predictions in zip(blocks, predictions):
            scores.append(resampled_scores(model_predictions, labels, num_labels, indices, classes))
    return [{name: np.concatenate([block[name] for block in scores]) for name in scores[0]} for scores in blocks]


def resampled_scores(
    predictions: Any, labels: Any, num_labels: int, indices: np.ndarray, classes: range | None = None
) -> dict[str, np.ndarray]:
    """Accuracy, macro-F1 and the F1 of ``classes`` (all by default; ``(resamples, len(classes))``) on each resample.

    Counted per class (true, predicted, right), never as a class-by-class confusion matrix.
    """
    predictions, labels = np.asarray(predictions, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    true, predicted = labels[indices], predictions[indices]
    right = true == predicted
    # A review predicted wrongly adds to no class's true positives: it is counted in a bin past the last class.
    true_positives = _counts_per_resample(np.where(right, true, num_labels), num_labels)
    denominator = _counts_per_resample(true, num_labels) + _counts_per_resample(predicted, num_labels)
    # F1 = 2 TP / (true + predicted); 0 where a class is neither true nor predicted in the resample.
    per_class_f1 = np.divide(2 * true_positives, denominator, out=np.zeros(denominator.shape), where=denominator > 0)
    chosen = classes if classes is not None else range(num_labels)
    return {
        "accuracy": right.sum(axis=1) / indices.shape[1],
        "macro_f1": per_class_f1.mean(axis=1),
        "per_class_f1": per_class_f1[:, chosen.start : chosen.stop],
    }


def _counts_per_resample(classes: np.ndarray, num_labels: int) -> np.ndarray:
    """How many reviews of each class ``0 .. num_labels - 1`` each row of ``classes`` holds (``num_labels`` dropped)."""
    rows, bins = classes.shape[0], num_labels + 1
    # One bincount for the block: a row's classes offset by the row's number.
    counts = np.bincount((classes + (np.arange(rows) * bins)[:, None]).ravel(), minlength=rows * bins)
    return counts.reshape(rows, bins)[:, :num_labels]


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> list[float]:
    """The central ``confidence`` share of ``values`` (along the first axis): ``[low, high]``."""
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail], axis=0)
    return [float(low), float(high)]


def score_intervals(
    predictions: Any,
    labels: Any,
    label_names: Sequence[str],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Percentile bootstrap intervals of accuracy, macro-F1 and each class's F1, with how they were made.

    The classes' F1s are kept for a block of classes at a time (about ``CHUNK_CELLS`` values), each
    block on the same seeded resamples drawn again, so memory stays flat with thousands of classes.
    """
    num_labels = len(label_names)
    classes_per_pass = max(1, CHUNK_CELLS // max(resamples, 1))
    passes = [
        range(start, min(start + classes_per_pass, num_labels)) for start in range(0, num_labels, classes_per_pass)
    ]
    per_class_f1: dict[str, list[float]] = {}
    for number, classes in enumerate(passes or [range(0)]):
        (scores,) = bootstrap_scores([predictions], labels, num_labels, resamples, seed, classes)
        if number == 0:
            accuracy, macro_f1 = scores["accuracy"], scores["macro_f1"]
        tail = (1 - confidence) / 2 * 100
        lows, highs = np.percentile(scores["per_class_f1"], [tail, 100 - tail], axis=0)
        for index, low, high in zip(classes, lows, highs):
            per_class_f1[label_names[index]] = [float(low), float(high)]
    return {
        "method": "percentile bootstrap",
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "accuracy": percentile_interval(accuracy, confidence),
        "macro_f1": percentile_interval(macro_f1, confidence),
        "per_class_f1": per_class_f1,
    }


def paired_comparison(
    best_predictions: Any,
    other_predictions: Any,
    labels: Any,
    num_labels: int,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """Best minus other on the same resamples of the same reviews, and McNemar's exact test on accuracy.

    ``distinguishable`` is True only when the interval of the macro-F1
    difference (the metric the best is chosen by) excludes 0.
    """
    labels = np.asarray(labels)
    best, other = bootstrap_scores([best_predictions, other_predictions], labels, num_labels, resamples, seed)
    # The point differences: the scores on the reviews as they are (one "resample" that is all of them).
    everything = np.arange(len(labels))[None, :]
    best_point = resampled_scores(best_predictions, labels, num_labels, everything)
    other_point = resampled_scores(other_predictions, labels, num_labels, everything)
    metrics = ("accuracy", "macro_f1")
    return paired_record(
        {metric: float(best_point[metric][0] - other_point[metric][0]) for metric in metrics},
        {metric: best[metric] - other[metric] for metric in metrics},
        "macro_f1",
        np.asarray(best_predictions) == labels,
        np.asarray(other_predictions) == labels,
        confidence,
        resamples,
    )


def paired_record(
    differences: dict[str, float],
    resampled_differences: dict[str, np.ndarray],
    deciding_metric: str,
    best_right: np.ndarray,
    other_right: np.ndarray,
    confidence: float,
    resamples: int,
) -> dict[str, Any]:
    """A paired comparison as it is written down: each metric's difference and interval, and McNemar's test.

    ``distinguishable`` is True only when the interval of ``deciding_metric``'s
    difference excludes 0; McNemar's exact test counts the cases exactly one of
    the two gets right (``best_right``, ``other_right``: one boolean per case).
    """
    from scipy.stats import binomtest

    result: dict[str, Any] = {"method": "paired bootstrap", "confidence": confidence, "resamples": resamples}
    for metric, difference in differences.items():
        result[f"{metric}_difference"] = difference
        result[f"{metric}_interval"] = percentile_interval(resampled_differences[metric], confidence)
    low, high = result[f"{deciding_metric}_interval"]
    result["distinguishable"] = bool(low > 0 or high < 0)
    # Only the cases exactly one of the two gets right say anything about which is better.
    only_best, only_other = int(np.sum(best_right & ~other_right)), int(np.sum(~best_right & other_right))
    mcnemar_p = binomtest(only_best, only_best + only_other).pvalue if only_best + only_other else 1.0
    result["mcnemar"] = {"only_best_right": only_best, "only_other_right": only_other, "p_value": float(mcnemar_p)}
    return result


def describe_comparison(comparison: dict[str, Any]) -> str:
    """``'not distinguishable'`` or ``'best better'``, with the macro-F1 difference interval and McNemar's p."""
    low, high = comparison["macro_f1_interval"]
    verdict = "not distinguishable" if not comparison["distinguishable"] else "best better" if low > 0 else "best worse"
    return f"{verdict} (macro-F1 diff [{low:+.3f}, {high:+.3f}], McNemar p={comparison['mcnemar']['p_value']:.2g})"
