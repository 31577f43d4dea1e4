"""The pipe tables of a Markdown page, read line by line as Python-Markdown's ``tables`` extension reads them.

A table is a block: a header row, a separator row (``| --- | --- |``) and
body rows, with a blank line above and below. Rows appended after a blank
line are a new block without a header, so they render as a paragraph of
pipes; a line written right under the last row, a provenance line say, is
taken into the table as one more row. Both are the mistakes these checks name
with the file and line, before the site is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEPARATOR_ROW = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$")


@dataclass
class Table:
    """One table of a page: the line of its header row (1-based), its column count and its rows' lines."""

    header_line: int
    columns: int
    body_lines: list[int]


def cells(row: str) -> list[str]:
    """The cells of a table row: split on pipes that are neither escaped (``\\|``) nor inside a code span."""
    row = row.strip()
    found: list[str] = []
    cell, fence, index = "", "", 0
    while index < len(row):
        char = row[index]
        if char == "\\" and index + 1 < len(row):
            cell, index = cell + row[index : index + 2], index + 2
            continue
        if char == "`":
            end = index
            while end < len(row) and row[end] == "`":
                end += 1
            ticks = row[index:end]
            # A code span closes at the same number of backticks that opened it.
            fence = ticks if not fence else ("" if ticks == fence else fence)
            cell, index = cell + ticks, end
            continue
        if char == "|" and not fence:
            found.append(cell)
            cell = ""
        else:
            cell += char
        index += 1
    found.append(cell)
    if row.startswith("|"):
        found = found[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        found = found[:-1]
    return found


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, stripped line)`` of every line outside fenced code blocks (fences read as blank)."""
    lines, in_code = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            lines.append((number, ""))
        else:
            lines.append((number, "" if in_code else line.strip()))
    return lines


def read_tables(name: str, text: str) -> tuple[list[Table], list[str]]:
    """The tables of page ``name``, and one ``name:line: ...`` message per table mistake found."""
    lines = _prose_lines(text)
    tables: list[Table] = []
    problems: list[str] = []
    table: Table | None = None
    orphans: list[int] = []  # pipe rows in a block with no header: they render as a paragraph
    for index, (number, line) in enumerate(lines):
        above = lines[index - 1][1] if index > 0 else ""
        below = lines[index + 1][1] if index + 1 < len(lines) else ""
        if not line.startswith("|"):
            if table is not None and line:
                problems.append(
                    f"{name}:{number}: this line is right under the table of line {table.header_line}, so it "
                    "renders as one more row of it; put a blank line above it"
                )
            if orphans:
                problems.append(_orphans_message(name, orphans, tables))
                orphans = []
            table = None
            continue
        if orphans:
            orphans.append(number)
        elif table is None and SEPARATOR_ROW.match(below):
            if above:
                problems.append(
                    f"{name}:{number}: this table starts right under a line of text, so it renders as text; "
                    "put a blank line above it"
                )
            table = Table(number, len(cells(line)), [])
            tables.append(table)
        elif table is None:
            orphans.append(number)
        elif not SEPARATOR_ROW.match(line):
            table.body_lines.append(number)
            if len(cells(line)) != table.columns:
                problems.append(
                    f"{name}:{number}: a row of {len(cells(line))} cells in the table of line {table.header_line}, "
                    f"which has {table.columns} columns"
                )
    if orphans:
        problems.append(_orphans_message(name, orphans, tables))
    return tables, problems


def _orphans_message(name: str, orphans: list[int], tables: list[Table]) -> str:
    if len(orphans) > 1:
        rows = f"{len(orphans)} table rows (lines {orphans[0]}-{orphans[-1]}) belong to no table and render"
    else:
        rows = "a table row belongs to no table and renders"
    message = f"{name}:{orphans[0]}: {rows} as a paragraph of pipes"
    if tables and tables[-1].body_lines and tables[-1].body_lines[-1] == orphans[0] - 2:  # one blank line between
        last_row = tables[-1].body_lines[-1]
        message += f"; move the blank line after line {last_row} below the rows, so they join the table above"
    return message
