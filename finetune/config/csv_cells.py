"""CSV cells safe to open in a spreadsheet: text that would start a formula is written after a ``'``, read back without.

A spreadsheet runs a cell that begins with ``=``, ``+``, ``-`` or ``@`` as a
formula, and some read a leading tab or carriage return the same way; a review
is untrusted text, so ``=HYPERLINK(...)`` or ``+1+cmd|' /C calc'!A0`` in a
review would run when someone opens the predictions. OWASP's advice is to write
such a cell after a single quote, which spreadsheets take as "this is text".

The rule here is wider than OWASP's list of first characters, because what a
spreadsheet evaluates is the cell as it reads it, not as the file holds it: a
cell is guarded when it begins with one of OWASP's starts (``= + - @``, tab,
carriage return), a newline or a NUL (ASVS 1.2.10), or when such a start (or
its fullwidth form ``＝ ＋ － ＠``, which East Asian input folds to ASCII)
follows characters a reader may trim or not show: any whitespace (a space,
a no-break or ideographic space), a byte-order mark, a zero-width character.
A guard too many costs a visible ``'``; one too few can run a formula.

Every CSV and TSV the project writes goes through :func:`guard_cell`, and every
one it reads back through :func:`unguard_cell`, so a round trip is lossless: a
cell that already begins with quotes before a formula start (``'=x``, which the
user wrote) gets one more, and loses exactly one on reading. ``--raw_csv``
turns both off. The page's CSV download (``serve/static/app.js``) applies the
same rule.
"""

from __future__ import annotations

import re
from typing import Any

# What makes a spreadsheet read a cell as a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# A cell beginning with a newline or a NUL is guarded too (OWASP ASVS 1.2.10 names the NUL).
CONTROL_STARTS = ("\n", "\x00")
# The signs of a formula, and their fullwidth forms (U+FF1D, U+FF0B, U+FF0D, U+FF20).
FORMULA_SIGNS = ("=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20")
# What may come before a formula's sign unseen or trimmed: whitespace (Python's str.isspace, listed so that
# app.js can use the same class), a byte-order mark, zero-width characters, NUL.
_HIDDEN_LEAD = re.compile(
    "[\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200d\u2028\u2029\u202f\u205f\u2060\u3000\ufeff\x00]*"
)
GUARD = "'"


def needs_guard(text: str) -> bool:
    """Whether ``text`` starts a formula, counting one behind leading quotes (so ``'=x`` keeps its own quote).

    A formula's sign counts after whitespace, a byte-order mark or a zero-width character, and in its
    fullwidth form (see the module's docstring).
    """
    unquoted = text.lstrip(GUARD)
    if unquoted.startswith(FORMULA_STARTS + CONTROL_STARTS):
        return True
    return unquoted[_HIDDEN_LEAD.match(unquoted).end() :].startswith(FORMULA_SIGNS)  # type: ignore[union-attr]


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
