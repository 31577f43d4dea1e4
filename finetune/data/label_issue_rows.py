"""Row ids of the train split, each review's text digest, and leaving listed reviews out of training.

A row id is a review's position in the train split that cross-validation
divides: the source's train rows after bad rows are dropped and the test split
(if drawn from train) is held out, before validation, folds, ``extra_train_file``
and titles. The same recipe reads the same rows in the same order, so
``finetune find-label-issues`` and ``train --drop_label_issues`` agree on them;
the digest of each review's text, written beside its id, catches a file made
for other data, another ``split_seed`` or another ``max_train_samples``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import FinetuneError
from .columns import column_values

if TYPE_CHECKING:
    import datasets

# The columns of label_issues.csv that say which review a row is.
ROW_ID_COLUMN = "row_id"
DIGEST_COLUMN = "text_sha256"
# 16 hex digits (64 bits) of SHA-256: no two reviews of a real set share them by chance.
DIGEST_CHARS = 16
# A run trained with drop_label_issues keeps a copy of the list in its folder under this name.
DROPPED_LABEL_ISSUES = "dropped_label_issues.csv"


def text_digest(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of ``text`` (UTF-8): the review's fingerprint in label_issues.csv."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


def read_listed_rows(path: Path) -> dict[int, str]:
    """The row ids and text digests a label_issues.csv lists, ``{row id: digest}``; a broken file is one line."""
    import pandas as pd

    from ..config.csv_cells import unguard_cell

    if not path.is_file():
        raise FinetuneError(f"drop_label_issues not found: {path}; check the path, or leave out drop_label_issues")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as error:
        raise FinetuneError(f"{path} cannot be read as a CSV ({error}); pass a label_issues.csv") from None
    missing = [column for column in (ROW_ID_COLUMN, DIGEST_COLUMN) if column not in table.columns]
    if missing:
        raise FinetuneError(
            f"{path} has no {' or '.join(missing)} column; pass a label_issues.csv written by finetune "
            "find-label-issues (rows may be deleted, the columns kept)"
        )
    listed: dict[int, str] = {}
    for line, (row_id, digest) in enumerate(zip(table[ROW_ID_COLUMN], table[DIGEST_COLUMN]), start=2):
        row_id = unguard_cell(row_id).strip()
        if not row_id.isdigit():
            raise FinetuneError(f"{path} line {line}: row_id {row_id!r} is not a whole number >= 0; fix or delete it")
        listed[int(row_id)] = unguard_cell(digest).strip()
    return listed


def drop_listed_rows(train: datasets.Dataset, listed: dict[int, str], path: str) -> tuple[datasets.Dataset, list[int]]:
    """``train`` without the ``listed`` reviews (row id: text digest, read from ``path``), and their row ids, sorted.

    Refused where a row id is not in ``train`` or its review's digest is not the listed one.
    """
    beyond = sorted(row_id for row_id in listed if row_id >= len(train))
    if beyond:
        raise FinetuneError(
            f"{path} lists row {beyond[0]}, but this recipe's train split has {len(train)} reviews (row ids 0 to "
            f"{len(train) - 1}); it was written for other data: run finetune find-label-issues on this recipe"
        )
    texts = column_values(train.select(sorted(listed)), "text")
    for row_id, text in zip(sorted(listed), texts):
        if listed[row_id] != text_digest(text):
            raise FinetuneError(
                f"{path} row {row_id}: its {DIGEST_COLUMN} does not match this recipe's review {row_id}; the file "
                "was written for other data (or another split_seed or max_train_samples): run finetune "
                "find-label-issues on this recipe"
            )
    dropped = set(listed)
    kept = train.select([index for index in range(len(train)) if index not in dropped])
    return kept, sorted(listed)
