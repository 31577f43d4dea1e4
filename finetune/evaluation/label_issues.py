"""Likely label errors ranked with cleanlab's confident learning, from out-of-fold probabilities.

Each review's probabilities come from a model that never trained on it (one
per fold), so a review whose given label the other reviews do not support
stands out. cleanlab's ``find_label_issues`` (its default, prune by noise
rate) decides which reviews are flagged and ``get_label_quality_scores``
(normalized margin: the given label's probability less the likeliest other
class's) ranks them, worst first; with tags, cleanlab's multi-label versions of
both. Nothing of confident learning is written here: only the table around
cleanlab's answer, and the mean that blends two sources of probabilities.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config.csv_cells import guard_row
from ..config.output_files import output_file
from ..data.label_issue_rows import DIGEST_COLUMN, ROW_ID_COLUMN, text_digest

LABEL_ISSUES_FILE = "label_issues.csv"
LABEL_ISSUE_COLUMNS = [ROW_ID_COLUMN, "label_quality", "given_label", "suggested_label", "text", DIGEST_COLUMN]
# A tag is suggested where its out-of-fold probability reaches this (the runs' untuned threshold).
TAG_THRESHOLD = 0.5
# How the multi-label cell lists a review's tags.
TAG_SEPARATOR = "; "
# cleanlab's ranking for classes. Picked on flip seeds 77 and 78 of the quickstart reviews (never on the seeds
# docs/label-issues.md reports): precision at recall 0.5 of the fine-tuned and TF-IDF folds' mean was 0.742 and
# 0.767 ranked by normalized margin, 0.742 and 0.697 by self-confidence (cleanlab's default), 0.657 and 0.561 by
# confidence-weighted entropy; the fine-tuned folds alone by self-confidence 0.622 and 0.697.
CLASS_QUALITY_METHOD = "normalized_margin"


@dataclass
class LabelIssues:
    """cleanlab's answer: the flagged reviews' positions, worst first, and every review's label quality."""

    flagged: np.ndarray  # positions into the reviews given, lowest label quality first
    quality: np.ndarray  # every review's label quality score, 0 (surely wrong) to 1


def rank_label_issues(labels: Any, probabilities: np.ndarray, multi_label: bool = False) -> LabelIssues:
    """Flag and rank likely label errors with cleanlab; ``labels`` are class ids, or 0/1 rows per tag."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if multi_label:
        from cleanlab.multilabel_classification import filter as tag_filter
        from cleanlab.multilabel_classification import rank as tag_rank

        tag_lists = tag_ids(labels)
        # n_jobs=1: cleanlab's worker processes would compete with a training run for the cores.
        is_issue = tag_filter.find_label_issues(tag_lists, probabilities, n_jobs=1)
        quality = tag_rank.get_label_quality_scores(tag_lists, probabilities)
    else:
        from cleanlab.filter import find_label_issues
        from cleanlab.rank import get_label_quality_scores

        class_ids = np.asarray(labels, dtype=np.int64)
        is_issue = find_label_issues(class_ids, probabilities, n_jobs=1)
        quality = get_label_quality_scores(class_ids, probabilities, method=CLASS_QUALITY_METHOD)
    flagged = np.flatnonzero(is_issue)
    # Stable: reviews of equal quality keep their row order, so a rerun lists them the same way.
    flagged = flagged[np.argsort(quality[flagged], kind="stable")]
    return LabelIssues(flagged, np.asarray(quality, dtype=np.float64))


def blend_probabilities(finetuned: np.ndarray, tfidf: np.ndarray) -> np.ndarray:
    """The mean of two sources' out-of-fold probabilities for the same reviews (each row still sums to 1).

    The fine-tuned folds and the TF-IDF folds err on different reviews (the one reads
    meaning, the other words), so a label both doubt is more likely wrong than one
    either doubts alone: the mean found more flips at the same recall than either.
    """
    return (np.asarray(finetuned, dtype=np.float64) + np.asarray(tfidf, dtype=np.float64)) / 2


def tag_ids(rows: Any) -> list[list[int]]:
    """0/1 rows per tag as lists of the tags each review has (cleanlab's multi-label form)."""
    return [[int(tag) for tag in np.flatnonzero(np.asarray(row) > 0.5)] for row in rows]


def issue_rows(
    issues: LabelIssues,
    row_ids: Sequence[int],
    texts: Sequence[str],
    labels: Any,
    probabilities: np.ndarray,
    label_names: Sequence[str],
    multi_label: bool = False,
) -> list[dict[str, Any]]:
    """label_issues.csv's rows, worst first: row id, quality, given and suggested label, text, text digest."""
    rows = []
    for position in issues.flagged:
        given, suggested = _given_and_suggested(labels[position], probabilities[position], label_names, multi_label)
        rows.append(
            {
                ROW_ID_COLUMN: int(row_ids[position]),
                "label_quality": round(float(issues.quality[position]), 6),
                "given_label": given,
                "suggested_label": suggested,
                "text": texts[position],
                DIGEST_COLUMN: text_digest(texts[position]),
            }
        )
    return rows


def _given_and_suggested(
    label: Any, probabilities: np.ndarray, label_names: Sequence[str], multi_label: bool
) -> tuple[str, str]:
    """The review's given label and the one its out-of-fold probabilities suggest, as names."""
    if multi_label:
        given = [label_names[tag] for tag in tag_ids([label])[0]]
        suggested = [name for name, probability in zip(label_names, probabilities) if probability >= TAG_THRESHOLD]
        return TAG_SEPARATOR.join(given), TAG_SEPARATOR.join(suggested)
    return label_names[int(label)], label_names[int(np.argmax(probabilities))]


def pair_counts(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """How many flagged reviews each (given, suggested) pair has, most first."""
    counts = collections.Counter((row["given_label"], row["suggested_label"]) for row in rows)
    return [(given, suggested, count) for (given, suggested), count in counts.most_common()]


def write_label_issues(path: Path, rows: Sequence[dict[str, Any]], raw_csv: bool = False) -> Path:
    """Write label_issues.csv whole or not at all, every text cell guarded against spreadsheet formulas."""
    import pandas as pd

    if not raw_csv:
        rows = [guard_row(row) for row in rows]
    with output_file(path) as handle:
        pd.DataFrame(list(rows), columns=LABEL_ISSUE_COLUMNS).to_csv(handle, index=False)
    return path
