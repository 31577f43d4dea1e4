"""Whole columns of a ``datasets.Dataset``, read in one Arrow query instead of row by row.

Since datasets 4, ``rows["labels"]`` is a lazy ``Column``: iterating it,
``list()``, ``.count()`` or ``np.asarray()`` on it formats one row at a time
(about 2 s per 40,000 rows, ``.count()`` 1.5 s per value asked for), where a
slice reads the whole column at once (about 0.1 s). On a large review file
those row-by-row reads cost more than tokenizing it (docs/benchmarks/speed.md,
"Whole columns").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets


def column_values(rows: Any, name: str) -> list:
    """Column ``name`` of ``rows`` (a ``datasets.Dataset`` or a mapping of lists) as a plain list."""
    values = rows[name][:]  # a datasets Column's slice is already a fresh list
    return values if isinstance(values, list) else list(values)


def token_counts(rows: datasets.Dataset, name: str = "input_ids") -> list[int]:
    """The length of each row's list in column ``name`` (its tokens), in row order, without decoding a row."""
    import pyarrow.compute as pc

    table = rows.select_columns([name]).with_format("arrow")[:]
    return pc.list_value_length(table.column(name)).to_pylist()
