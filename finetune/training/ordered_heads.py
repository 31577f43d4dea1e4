"""The heads of a star-rating run (``regression``, ``ordinal``): their outputs, their losses, their decoding.

**regression**: one output, the rating standardised with the train split's
mean and deviation (:class:`~finetune.data.ratings.RatingScale`), trained
with mean squared error or Huber; mapped back, clipped to the levels' range.

**ordinal** is CORN (Shi, Cao and Raschka, "Deep neural networks for rank-consistent
ordinal regression based on conditional probabilities", 2021; their
``coral_pytorch.losses.corn_loss``): K-1 outputs, output k the logit of
P(rating > level k | rating > level k-1). Output k is trained, by binary
cross-entropy, only on the reviews above level k-1 (every review for k = 0),
and the loss is the mean over those (review, output) pairs, as the reference
divides by their count. P(rating > level k) is the product of the first k+1
sigmoids, which cannot rise with k: the predicted level (how many of those
products exceed 0.5) is rank-consistent with a plain linear head, so the saved
folder is a stock ``BertForSequenceClassification``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..config.tasks import CONFIG_TASK_KEY, ORDERED_TASKS, ORDINAL, REGRESSION, task_of_model
from ..errors import FinetuneError

if TYPE_CHECKING:
    from ..data.ratings import RatingScale

# How a saved ordinal model's outputs become a level: written into its config.json for any reader.
CORN_DECODING = (
    "corn: P(rating > level k) = prod_{j<=k} sigmoid(logit_j); the level index is the number of k with "
    "P(rating > level k) > 0.5, and rating_levels[index] the rating"
)
REGRESSION_DECODING = "rating = clip(rating_mean + rating_std * logit, min(rating_levels), max(rating_levels))"


def head_labels(task: str, level_names: Sequence[str]) -> dict[int, str]:
    """The outputs' names (``id2label``): ``rating`` for regression, ``above <level>`` for each ordinal output."""
    if task == REGRESSION:
        return {0: "rating"}
    return {index: f"above {name}" for index, name in enumerate(level_names[:-1])}


def describe_head(config: Any, task: str, scale: RatingScale, level_names: Sequence[str]) -> None:
    """Write into a model's config what a reader needs: the task, the levels, the scale, how outputs decode."""
    setattr(config, CONFIG_TASK_KEY, task)
    config.rating_level_names = list(level_names)
    for key, value in scale.config_fields().items():
        setattr(config, key, value)
    config.rating_decoding = CORN_DECODING if task == ORDINAL else REGRESSION_DECODING


def regression_loss(outputs: torch.Tensor, targets: torch.Tensor, kind: str = "mse") -> torch.Tensor:
    """The mean over reviews of the squared (or Huber, delta 1 deviation) error of the standardised rating."""
    outputs, targets = outputs.float().view(-1), targets.float().view(-1)
    if kind == "huber":
        return nn.functional.huber_loss(outputs, targets, delta=1.0)
    return nn.functional.mse_loss(outputs, targets)


def _corn_pairs(logits: torch.Tensor, level_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which (review, output) pairs train (``level > k - 1``), and their 0/1 targets (``level > k``)."""
    thresholds = torch.arange(logits.shape[-1], device=logits.device)
    levels = level_ids.view(-1, 1)
    # An ignored label (-100) is below every threshold: none of its pairs trains.
    return levels >= thresholds, (levels > thresholds).to(logits.dtype)


def corn_loss(logits: torch.Tensor, level_ids: torch.Tensor) -> torch.Tensor:
    """CORN's loss: binary cross-entropy over the conditional (review, output) pairs, their mean."""
    logits = logits.float()
    trains, targets = _corn_pairs(logits, level_ids)
    each = nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    # At least 1: a piece with no pair (every label ignored) is a loss of 0, not 0 / 0.
    return torch.where(trains, each, 0.0).sum() / trains.sum().clamp(min=1)


def rating_outputs(logits: np.ndarray, task: str) -> np.ndarray:
    """What a rating model says of each review: ordinal, P(rating > level k) per output; regression, its output."""
    logits = np.asarray(logits, dtype=np.float64)
    if task == ORDINAL:
        return np.cumprod(1.0 / (1.0 + np.exp(-logits)), axis=1)
    return logits


def from_outputs(outputs: np.ndarray, task: str, scale: RatingScale) -> tuple[np.ndarray, np.ndarray]:
    """Each review's rating (a float, in the levels' range) and level index, from :func:`rating_outputs`."""
    levels = np.asarray(scale.levels, dtype=np.float64)
    outputs = np.asarray(outputs, dtype=np.float64)
    if task == ORDINAL:
        index = (outputs > 0.5).sum(axis=1)
        return levels[index], index
    ratings = np.clip(scale.mean + scale.std * outputs[:, 0], levels.min(), levels.max())
    return ratings, np.abs(ratings[:, None] - levels[None, :]).argmin(axis=1)


def decode(logits: np.ndarray, task: str, scale: RatingScale) -> tuple[np.ndarray, np.ndarray]:
    """Each review's rating (a float, in the levels' range) and level index, from the model's logits."""
    return from_outputs(rating_outputs(logits, task), task, scale)


@dataclass(frozen=True)
class StarRating:
    """One review's stars, as predict, serve and an export's agreement give them."""

    label: str  # the level's name
    rating: float  # a regression's clipped rating (4 decimals), an ordinal run's level
    prob_above: dict[str, float] | None  # ordinal only: P(rating > level), per level but the top one (6 decimals)


@dataclass(frozen=True)
class StarReader:
    """How a star-rating model's outputs become stars: its task, its scale and its levels' names.

    The one decoding every command that rates reviews goes through (:func:`from_outputs`), so
    predict's columns and serve's answers cannot drift apart.
    """

    task: str
    scale: RatingScale
    level_names: tuple[str, ...]

    @classmethod
    def of_config(cls, config: Any, folder: str | Path) -> StarReader | None:
        """The reader of a regression or ordinal model's config (or config.json as a dict); None for another task.

        A ratings model whose config lost its ``rating_levels`` is refused in one line: its outputs
        cannot be mapped back to stars.
        """
        from ..data.ratings import RatingScale, level_name

        task = task_of_model(config)
        if task not in ORDERED_TASKS:
            return None
        scale = RatingScale.from_config(config)
        if scale is None:
            raise FinetuneError(
                f"{Path(folder) / 'config.json'} has no rating_levels, which a {task} model is read by; "
                "restore config.json from a copy of the run or one of its checkpoint-* folders"
            )
        names = config.get("rating_level_names") if isinstance(config, dict) else None
        names = names or getattr(config, "rating_level_names", None) or [level_name(value) for value in scale.levels]
        return cls(task, scale, tuple(names))

    def rate(self, outputs: np.ndarray) -> list[StarRating]:
        """Each review's stars from its :func:`rating_outputs` (one row per review)."""
        outputs = np.asarray(outputs, dtype=np.float64)
        ratings, levels = from_outputs(outputs, self.task, self.scale)
        below_top = self.level_names[:-1]  # output k says "above level k"
        return [
            StarRating(
                label=self.level_names[int(level)],
                rating=round(float(rating), 4),
                prob_above=(
                    {name: round(float(p), 6) for name, p in zip(below_top, row)} if self.task == ORDINAL else None
                ),
            )
            for rating, level, row in zip(ratings, levels, outputs)
        ]

    def close_calls(self, outputs: np.ndarray, margin: float) -> np.ndarray:
        """Rows whose level a small nudge of the outputs could change (an int8 export's fp32 fallback).

        Ordinal: a P(rating > level k) within ``margin`` of 0.5, where the level is counted. Regression: a
        rating within ``margin`` stars of halfway between two levels, where the nearest level changes.
        """
        outputs = np.asarray(outputs, dtype=np.float64)
        if self.task == ORDINAL:
            return np.flatnonzero((np.abs(outputs - 0.5) < margin).any(axis=1))
        levels = np.asarray(self.scale.levels, dtype=np.float64)
        halfway = (levels[1:] + levels[:-1]) / 2
        ratings = self.scale.mean + self.scale.std * outputs[:, 0]
        return np.flatnonzero((np.abs(ratings[:, None] - halfway[None, :]) < margin).any(axis=1))
