"""How closely an int8 export of a multi_label or star-rating run gives what its fp32 model gives.

Int8 moves each probability a little; a tag changes only where its
probability sits near its threshold. The measure the issue asks for is per
review-tag pair: of every (review, tag) pair of a split, the share that both
models give or both withhold. Beside it, the share of reviews whose whole set
of tags is the same, and each tag's own share.

A ratings run's measure is per review: the share whose decoded level is the
same, and the mean absolute difference of the rating (a regression's unrounded
one; an ordinal run's, its level's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..training.ordered_heads import StarReader, from_outputs


def tag_agreement(
    fp32_probabilities: np.ndarray, int8_probabilities: np.ndarray, thresholds: np.ndarray, tag_names: list[str]
) -> dict[str, Any]:
    """Agreement of two models' tags (``[reviews, tags]`` probabilities, one threshold per tag) on the same reviews.

    A tag is given where its probability reaches its threshold, as ``predict`` gives it.
    """
    limits = np.asarray(thresholds, dtype=np.float64)
    fp32_given = np.asarray(fp32_probabilities, dtype=np.float64) >= limits
    int8_given = np.asarray(int8_probabilities, dtype=np.float64) >= limits
    same = fp32_given == int8_given
    return {
        "reviews": int(same.shape[0]),
        "pairs": int(same.size),
        "pair_agreement": float(same.mean()),
        "pairs_changed": int((~same).sum()),
        "review_agreement": float(same.all(axis=1).mean()),
        "per_tag": {name: float(same[:, index].mean()) for index, name in enumerate(tag_names)},
        "mean_probability_change": float(np.abs(fp32_probabilities - int8_probabilities).mean()),
    }


def rating_agreement(fp32_outputs: np.ndarray, int8_outputs: np.ndarray, stars: StarReader) -> dict[str, Any]:
    """Agreement of two ratings models' stars (their ``rating_outputs``, one row per review) on the same reviews.

    Both are decoded as ``predict`` decodes them (:func:`~finetune.training.ordered_heads.from_outputs`).
    """
    fp32_ratings, fp32_levels = from_outputs(fp32_outputs, stars.task, stars.scale)
    int8_ratings, int8_levels = from_outputs(int8_outputs, stars.task, stars.scale)
    same = fp32_levels == int8_levels
    return {
        "reviews": int(same.size),
        "level_agreement": float(same.mean()),
        "levels_changed": int((~same).sum()),
        "mean_absolute_rating_difference": float(np.abs(fp32_ratings - int8_ratings).mean()),
    }
