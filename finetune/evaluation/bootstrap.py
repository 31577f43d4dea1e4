"""How sure a score is: percentile bootstrap intervals, and a paired test of two models on the same reviews.

With a test set of a hundred or a few hundred reviews, accuracy moves by a
few points from one sample to the next; these say by how much. Every
resample draws review indices with replacement from
``numpy.random.default_rng(seed).integers(0, n, size=(resamples, n))``, so a
seed gives the same interval every time, and two models compared on the same
seed are compared on the same resamples (a paired bootstrap).

Scores per resample come from one confusion matrix per resample (numpy
``bincount``), the same accuracy and F1 as scikit-learn's (an F1 with no
predicted and no true review of a class counts 0, as scikit-learn's
``zero_division`` default does).
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
# Indices are drawn and scored this many (resample, review) cells at a time (64 MiB of int64
# indices; with the gathered labels and cells about 300 MiB at the peak), so memory stays flat
# however many resamples or reviews; the draws are the same as in one block.
CHUNK_CELLS = 8_000_000


def resample_indices(num_samples: int, resamples: int = RESAMPLES, seed: int = SEED) -> Iterator[np.ndarray]:
    """Review indices drawn with replacement, seeded: ``(rows, num_samples)`` blocks, ``resamples`` rows in all.

    The blocks together are ``default_rng(seed).integers(0, num_samples, size=(resamples, num_samples))``.
    """
    rng = np.random.default_rng(seed)
    rows_per_block = max(1, CHUNK_CELLS // max(num_samples, 1))
    for start in range(0, resamples, rows_per_block):
        yield rng.integers(0, num_samples, size=(min(rows_per_block, resamples - start), num_samples))


def bootstrap_scores(
    predictions: Sequence[Any], labels: Any, num_labels: int, resamples: int = RESAMPLES, seed: int = SEED
) -> list[dict[str, np.ndarray]]:
    """:func:`resampled_scores` of each of ``predictions`` (one per model) on the same seeded resamples."""
    if resamples < 1:
        raise FinetuneError(f"resamples must be >= 1 (got {resamples}); the default is {RESAMPLES}")
    blocks: list[list[dict[str, np.ndarray]]] = [[] for _ in predictions]
    for indices in resample_indices(len(labels), resamples, seed):
        for scores, model_predictions in zip(blocks, predictions):
            scores.append(resampled_scores(model_predictions, labels, num_labels, indices))
    return [{name: np.concatenate([block[name] for block in scores]) for name in scores[0]} for scores in blocks]


def resampled_scores(predictions: Any, labels: Any, num_labels: int, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Accuracy, macro-F1 and per-class F1 (``(resamples, num_labels)``) on each resample of ``indices``."""
    predictions, labels = np.asarray(predictions, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    resamples = indices.shape[0]
    # One confusion matrix per resample: cell (true, predicted), offset by the resample's number.
    cells = labels[indices] * num_labels + predictions[indices]
    cells += (np.arange(resamples) * num_labels * num_labels)[:, None]
    confusion = np.bincount(cells.ravel(), minlength=resamples * num_labels * num_labels)
    confusion = confusion.reshape(resamples, num_labels, num_labels).astype(np.float64)
    true_positives = np.diagonal(confusion, axis1=1, axis2=2)
    true_counts, predicted_counts = confusion.sum(axis=2), confusion.sum(axis=1)
    # F1 = 2 TP / (true + predicted); 0 where a class is neither true nor predicted in the resample.
    denominator = true_counts + predicted_counts
    per_class_f1 = np.divide(2 * true_positives, denominator, out=np.zeros_like(denominator), where=denominator > 0)
    return {
        "accuracy": true_positives.sum(axis=1) / indices.shape[1],
        "macro_f1": per_class_f1.mean(axis=1),
        "per_class_f1": per_class_f1,
    }


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
    """Percentile bootstrap intervals of accuracy, macro-F1 and each class's F1, with how they were made."""
    (scores,) = bootstrap_scores([predictions], labels, len(label_names), resamples, seed)
    return {
        "method": "percentile bootstrap",
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
        "accuracy": percentile_interval(scores["accuracy"], confidence),
        "macro_f1": percentile_interval(scores["macro_f1"], confidence),
        "per_class_f1": {
            name: percentile_interval(scores["per_class_f1"][:, index], confidence)
            for index, name in enumerate(label_names)
        },
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
    from scipy.stats import binomtest

    labels = np.asarray(labels)
    best, other = bootstrap_scores([best_predictions, other_predictions], labels, num_labels, resamples, seed)
    best_right = np.asarray(best_predictions) == labels
    other_right = np.asarray(other_predictions) == labels
    # McNemar: only the reviews exactly one of the two gets right say anything about which is better.
    only_best, only_other = int(np.sum(best_right & ~other_right)), int(np.sum(~best_right & other_right))
    mcnemar_p = binomtest(only_best, only_best + only_other).pvalue if only_best + only_other else 1.0
    # The point differences: the scores on the reviews as they are (one "resample" that is all of them).
    everything = np.arange(len(labels))[None, :]
    best_point = resampled_scores(best_predictions, labels, num_labels, everything)
    other_point = resampled_scores(other_predictions, labels, num_labels, everything)
    result: dict[str, Any] = {"method": "paired bootstrap", "confidence": confidence, "resamples": resamples}
    for metric in ("accuracy", "macro_f1"):
        result[f"{metric}_difference"] = float(best_point[metric][0] - other_point[metric][0])
        result[f"{metric}_interval"] = percentile_interval(best[metric] - other[metric], confidence)
    low, high = result["macro_f1_interval"]
    result["distinguishable"] = bool(low > 0 or high < 0)
    result["mcnemar"] = {"only_best_right": only_best, "only_other_right": only_other, "p_value": float(mcnemar_p)}
    return result


def describe_comparison(comparison: dict[str, Any]) -> str:
    """``'not distinguishable'`` or ``'best better'``, with the macro-F1 difference interval and McNemar's p."""
    low, high = comparison["macro_f1_interval"]
    verdict = "not distinguishable" if not comparison["distinguishable"] else "best better" if low > 0 else "best worse"
    return f"{verdict} (macro-F1 diff [{low:+.3f}, {high:+.3f}], McNemar p={comparison['mcnemar']['p_value']:.2g})"
