"""Int8 with an fp32 second look at its close calls (for tags: a tag near its threshold).

Int8 moves a review's class probabilities by about 0.01 on average (drugscom,
``finetune bench``), so it changes a label almost only where the two likeliest
classes are nearly tied: on the three drugscom seed models, static int8 kept
97.4-99.2% of fp32's labels, and most of the changed ones had fp32's top two
within 0.1 of each other. An export made with ``--fp32_fallback MARGIN`` also
keeps the fp32 model (``fp32/``, safetensors); predictions whose int8 top two
are within ``MARGIN`` are scored again by it, and its probabilities replace
int8's. At 0.1 that re-scored 3-4% of the test reviews and kept at least 99.2%
of the labels on every seed, for about a tenth of the int8 speed-up (README,
"Fast prediction").

A multi_label run's tags change where a tag's probability crosses its
threshold, so there a close call is a review with any tag whose int8
probability is within ``MARGIN`` of that tag's threshold. A ratings run's level
changes where a P(rating > level) crosses 0.5 (ordinal) or the rating crosses
halfway between two levels (regression): there a close call is within ``MARGIN``
of either (for regression, ``MARGIN`` is in stars).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..config.output_files import write_output_text
from ..config.tasks import MULTI_LABEL, ORDINAL, REGRESSION, SINGLE_LABEL
from ..errors import FinetuneError
from .common import EXPORT_RECORD, read_export_record

FALLBACK_FOLDER = "fp32"
# What a close call is, by the task of the model (its export.json's rule says it).
CLOSE_CALLS = {
    SINGLE_LABEL: "reviews whose int8 top-two class probabilities differ by less than margin",
    MULTI_LABEL: "reviews with a tag whose int8 probability is within margin of the tag's threshold "
    "(tag_thresholds.json)",
    ORDINAL: "reviews with an int8 P(rating > level) within margin of 0.5, where the level is counted",
    REGRESSION: "reviews whose int8 rating is within margin stars of halfway between two levels",
}
# The margin finetune bench's fallback row uses, and the one the README suggests.
DEFAULT_FALLBACK_MARGIN = 0.1


def check_fallback_margin(margin: float) -> None:
    """Refuse a margin outside (0, 1]: a gap between two probabilities is never more than 1."""
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin <= 1:
        raise FinetuneError(
            f"--fp32_fallback must be a probability gap in (0, 1] (got {margin!r}); pass e.g. --fp32_fallback 0.1"
        )


def add_fp32_fallback(export_dir: Path, model: Any, margin: float, task: str = SINGLE_LABEL) -> None:
    """Save ``model`` (fp32) into ``export_dir``/fp32 and record ``margin`` in the export's ``export.json``.

    ``task`` (the model's) says what a close call is (:data:`CLOSE_CALLS`): two classes near a tie, a tag
    near its threshold, a rating near a change of level.
    """
    check_fallback_margin(margin)
    model.float().save_pretrained(export_dir / FALLBACK_FOLDER, safe_serialization=True)
    record = read_export_record(export_dir)
    replaced = "outputs" if task in (ORDINAL, REGRESSION) else "probabilities"
    record["fp32_fallback"] = {
        "margin": float(margin),
        "folder": FALLBACK_FOLDER,
        "rule": f"{CLOSE_CALLS[task]} are scored by the fp32 model in folder, whose {replaced} replace int8's",
    }
    write_output_text(export_dir / EXPORT_RECORD, json.dumps(record, indent=2) + "\n")


def top_two_gap(probabilities: np.ndarray) -> np.ndarray:
    """How far apart each row's two largest probabilities are (1.0 for a single class)."""
    if probabilities.shape[-1] < 2:
        return np.ones(probabilities.shape[0])
    top_two = np.sort(probabilities, axis=-1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0]


def near_a_threshold(probabilities: np.ndarray, thresholds: np.ndarray, margin: float) -> np.ndarray:
    """Row indices with any tag whose probability is within ``margin`` of its threshold (one per column)."""
    distance = np.abs(np.asarray(probabilities, dtype=np.float64) - np.asarray(thresholds, dtype=np.float64))
    return np.flatnonzero((distance < margin).any(axis=1))


class Int8WithFallback:
    """An int8 classifier and the fp32 model that scores its close calls again.

    With ``tag_thresholds`` (a multi_label model, one per tag) a close call is a tag near its
    threshold; with ``stars`` (a ratings model's :class:`~finetune.training.ordered_heads.StarReader`)
    a rating near a change of level; else two classes near a tie. ``rescored`` counts the reviews
    the fp32 model has scored.
    """

    def __init__(
        self, int8: Any, fp32: Any, margin: float, tag_thresholds: np.ndarray | None = None, stars: Any = None
    ) -> None:
        check_fallback_margin(margin)
        self.int8, self.fp32, self.margin = int8, fp32, float(margin)
        self.tag_thresholds = tag_thresholds
        self.stars = stars
        self.config = int8.config
        self.rescored = 0

    def close_calls(self, probabilities: np.ndarray) -> np.ndarray:
        """Row indices whose two likeliest classes are within the margin (tags: any tag near its threshold)."""
        if self.stars is not None:
            return self.stars.close_calls(probabilities, self.margin)
        if self.tag_thresholds is not None:
            return near_a_threshold(probabilities, self.tag_thresholds, self.margin)
        return np.flatnonzero(top_two_gap(probabilities) < self.margin)


def read_fallback(folder: Path) -> tuple[Path, float] | None:
    """The fp32 model's folder and the margin, when the export in ``folder`` was made with a fallback."""
    fallback = read_export_record(folder).get("fp32_fallback")
    if not fallback:
        return None
    fp32_dir = folder / fallback.get("folder", FALLBACK_FOLDER)
    if not (fp32_dir / "model.safetensors").is_file():
        raise FinetuneError(
            f"{folder}'s export.json asks for an fp32 fallback but {fp32_dir}/model.safetensors is missing; "
            "export again with --fp32_fallback, or remove 'fp32_fallback' from export.json to use int8 alone"
        )
    return fp32_dir, fallback["margin"]
