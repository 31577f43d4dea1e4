"""Columns a catalog entry writes that its source table does not hold as such, computed from a row's own values.

A rule reads one source row (every value as text) and returns the cell to write. Only
the source's own columns go in: a label made here is as real as the columns it is
made of, never a model's guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

DerivedColumn = Callable[[Mapping[str, str]], str]

# The clothing retailer files each garment under one department; "General Petite" is its
# division for petite sizes, and "Recommended IND" is the shopper's own "I recommend this" box.
_PETITE_DIVISION = "General Petite"


def clothing_tags(row: Mapping[str, str]) -> str:
    """A clothing review's tags joined by ``|``: its department, ``petite`` and ``recommended`` where they hold.

    E.g. ``dresses|petite|recommended``. A row with no department (a few) gets only the
    other two tags, and possibly none: an empty cell is a review with no tag.
    """
    tags = []
    department = row.get("Department Name", "").strip().lower()
    if department:
        tags.append(department)
    if row.get("Division Name", "").strip() == _PETITE_DIVISION:
        tags.append("petite")
    if row.get("Recommended IND", "").strip() == "1":
        tags.append("recommended")
    return "|".join(tags)
