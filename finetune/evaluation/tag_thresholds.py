"""A multi_label run's per-tag thresholds as the commands that score with it read them.

Training tunes each tag's threshold on the validation split and saves them in
the run folder (``tag_thresholds.json``); ``predict``, ``serve`` and an int8
export read them from there, or a ``--threshold`` given for every tag.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FinetuneError

THRESHOLDS_FILE = "tag_thresholds.json"
# Where a tag has no tuned threshold on record (as multi_label.DEFAULT_THRESHOLD).
UNTUNED_THRESHOLD = 0.5


def is_tag_model(model: Any) -> bool:
    """Whether ``model`` (PyTorch, or an int8 export's stand-in) scores several tags per review (a sigmoid each)."""
    return getattr(model.config, "problem_type", None) == "multi_label_classification"


def check_threshold(threshold: float | None) -> None:
    """Refuse a ``--threshold`` outside (0, 1): at 0 every tag is given, at 1 none."""
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold < 1.0:
        raise FinetuneError(f"--threshold must be between 0 and 1 (got {threshold}); e.g. --threshold 0.5")


def thresholds_file(model_dir: Path) -> Path | None:
    """The run's ``tag_thresholds.json``: in ``model_dir``, or in the run folder above a checkpoint; None if neither."""
    for folder in (model_dir, model_dir.parent):
        if (folder / THRESHOLDS_FILE).is_file():
            return folder / THRESHOLDS_FILE
    return None


def tag_thresholds(model_dir: Path, tag_names: list[str], threshold: float | None = None) -> np.ndarray:
    """Each tag's threshold, in ``tag_names`` order: ``threshold`` for every tag, else the run's tuned ones.

    A tag the file does not name, or a folder without the file (said once on
    stderr), gets ``UNTUNED_THRESHOLD``; a file that cannot be read is refused in one line.
    """
    check_threshold(threshold)
    if threshold is not None:
        return np.full(len(tag_names), float(threshold))
    path = thresholds_file(model_dir)
    if path is None:
        print(f"note: no {THRESHOLDS_FILE} beside the model; every tag's threshold is 0.5", file=sys.stderr)
        return np.full(len(tag_names), UNTUNED_THRESHOLD)
    try:
        tuned = dict(json.loads(path.read_text(encoding="utf-8"))["thresholds"])
        return np.array([float(tuned.get(name, UNTUNED_THRESHOLD)) for name in tag_names])
    except (ValueError, KeyError, TypeError) as error:
        raise FinetuneError(
            f"{path} is damaged ({error}); pass --threshold 0.5 to give every tag one threshold"
        ) from None


def copy_tag_thresholds(model_dir: Path, destination: Path) -> None:
    """Copy the run's ``tag_thresholds.json`` (if any) into ``destination``, so a copy of the model keeps them."""
    path = thresholds_file(model_dir)
    if path is not None:
        shutil.copy2(path, destination / THRESHOLDS_FILE)
