"""Flags two commands share, each command saying in its own words what the flag acts on."""

from __future__ import annotations

from typing import Any

from ...data.bad_text import ON_BAD_TEXT
from .fields import option


def on_bad_text_option(what: str, refused: str) -> Any:
    """``--on_bad_text``: what to do with ``what`` holding text that is not Unicode (a lone surrogate)."""
    return option(
        "refuse",
        choices=ON_BAD_TEXT,
        help=f"{what} holding text that is not Unicode (a lone surrogate such as \\ud800, which the tokenizer "
        f"cannot encode) is {refused} (refuse, the default) or read with U+FFFD in its place (replace)",
    )


def raw_csv_option(written: str, read: str) -> Any:
    """``--raw_csv``: CSV cells as they are, without the ``'`` that keeps a spreadsheet from running them."""
    return option(
        False,
        help=f"write {written} CSV/TSV cells and read {read}'s as they are; by default a cell starting with "
        "= + - @, a tab or a carriage return is written after a ' (so a spreadsheet shows it, not runs it) "
        "and that ' is removed on reading",
    )
