"""CSV cells safe to open in a spreadsheet: text that would start a formula is written after a ``'``, read back without.

A spreadsheet runs a cell that begins with ``=``, ``+``, ``-`` or ``@`` as a
formula, and some read a leading tab or carriage return the same way; a review
is untrusted text, so ``=HYPERLINK(...)`` or ``+1+cmd|' /C calc'!A0`` in a
review would run when someone opens the predictions. OWASP's advice is to write
such a cell after a single quote, which spreadsheets take as "this is text".

Every CSV and TSV the project writes goes through :func:`guard_cell`, and every
one it reads back through :func:`unguard_cell`, so a round trip is lossless: a
cell that already begins with quotes before a formula start (``'=x``, which the
user wrote) gets one more, and loses exactly one on reading. ``--raw_csv``
turns both off. The page's CSV download (``serve/static/app.js``) applies the
same rule.
"""

from __future__ import annotations

from typing import Any

# What makes a spreadsheet read a cell as a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
GUARD = "'"


def needs_guard(text: str) -> bool:
    """Whether ``text`` starts a formula, counting one behind leading quotes (so ``'=x`` keeps its own quote)."""
    return text.lstrip(GUARD).startswith(FORMULA_STARTS)


def guard_cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet runs: text that :func:`needs_guard` gets a leading ``'``.

    Anything but text (a probability, None) is returned as it is: the project's
    own numbers are written as numbers.
    """
    if isinstance(value, str) and needs_guard(value):
        return GUARD + value
    return value


def unguard_cell(value: Any) -> Any:
    """The cell :func:`guard_cell` wrote, as it was before: one leading ``'`` removed where the guard put it."""
    if isinstance(value, str) and value.startswith(GUARD) and needs_guard(value[1:]):
        return value[1:]
    return value


def guard_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of cells with every value guarded (:func:`guard_cell`); the column names are written by the caller."""
    return {name: guard_cell(value) for name, value in row.items()}


def unguard_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row read from a CSV, names and values unguarded (:func:`unguard_cell`)."""
    return {unguard_cell(name): unguard_cell(value) for name, value in row.items()}


def unguard_columns(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A batch of columns (``datasets.map(batched=True)``) with every text cell unguarded."""
    return {name: [unguard_cell(value) for value in values] for name, values in batch.items()}
