"""Reviews read from a file or stdin as ``finetune predict`` reads them: CSV, TSV or JSON Lines, in batches.

``export --calibration FILE`` reads its reviews the same way (:func:`read_model_inputs`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import re
import select
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..config.csv_cells import unguard_row
from ..data.bad_text import find_bad_text, repair_value
from ..errors import FinetuneError

_TEXT_COLUMN_GUESSES = ("text", "review", "content", "body", "sentence")
# Rows read, scored and written at a time: large enough to keep length-sorted batches full,
# small enough that memory does not grow with the input.
READ_ROWS = 1024
# The model reads a few hundred tokens; a "review" of more characters than this is a broken
# file or an endless stream (predict < /dev/zero), not a review.
MAX_REVIEW_CHARS = 100_000
# A JSON escape of a surrogate code unit (\ud800-\udfff): how a lone surrogate gets into a UTF-8 file.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def read_model_inputs(
    model_dir: Path, input_path: str, text_column: str | None = None, limit: int | None = None
) -> list[str]:
    """The first ``limit`` reviews of ``input_path`` as ``predict`` feeds them to ``model_dir``'s model.

    Read as predict reads them (CSV, TSV or JSONL; the recipe's text column or a
    guessed one; cleaned and joined to the title as in training).
    """
    from ..training.runs import find_run_config

    data_fields = (find_run_config(model_dir) or {}).get("data", {})
    rows, _ = _open_rows(input_path)
    if rows.is_stdin:
        raise FinetuneError("reviews to read must come from a file; pass a .csv, .tsv or .jsonl path")
    with rows:
        taken = list(itertools.islice(rows.rows, limit))
    if not taken:
        raise FinetuneError(f"{input_path} has no rows; give it at least one review")
    column = text_column or _guess_text_column(taken, data_fields.get("text_column"), input_path)
    return _model_inputs(
        taken, column, data_fields.get("title_column"), data_fields.get("clean_text", True), input_path
    )


class _Rows:
    """The input's rows, handed out in batches; a context manager that closes the file."""

    def __init__(
        self, rows: Iterator[dict[str, Any]], handle: IO[str], is_stdin: bool, repaired_lines: list[int] | None = None
    ) -> None:
        self.rows = rows
        self.handle = handle
        self.is_stdin = is_stdin
        # The lines whose text was read with U+FFFD in place of what is not Unicode (--on_bad_text replace).
        self.repaired_lines = repaired_lines if repaired_lines is not None else []

    def __enter__(self) -> _Rows:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.is_stdin:
            self.handle.close()

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        """Up to ``READ_ROWS`` rows at a time; from stdin, only the rows already waiting after the first."""
        while True:
            batch = list(itertools.islice(self.rows, 1))
            if not batch:
                return
            # A stream answers each line as it comes: the batch stops where the waiting input does.
            while len(batch) < READ_ROWS and (not self.is_stdin or _input_waiting(self.handle)):
                more = list(itertools.islice(self.rows, READ_ROWS - len(batch) if not self.is_stdin else 1))
                if not more:
                    break
                batch += more
            yield batch


def _input_waiting(handle: IO[str]) -> bool:
    """True when reading ``handle`` would not block (always, for a file or a StringIO)."""
    try:
        ready, _, _ = select.select([handle], [], [], 0)
    except (OSError, ValueError, io.UnsupportedOperation):
        return True
    return bool(ready)


def _open_rows(input_path: str | None, raw_csv: bool = False, on_bad_text: str = "refuse") -> tuple[_Rows, str]:
    """The rows of ``input_path`` (stdin when None or '-') as a lazy reader, and the output format they suggest.

    A CSV or TSV file's cells lose the ``'`` that guards a formula (:mod:`finetune.config.csv_cells`),
    unless ``raw_csv``.
    """
    from ..config.text_files import file_encoding_problem

    if input_path in (None, "-"):
        with contextlib.suppress(AttributeError, io.UnsupportedOperation):
            sys.stdin.reconfigure(encoding="utf-8")  # the locale's encoding is not the file's
        return _Rows(_stdin_rows(sys.stdin), sys.stdin, is_stdin=True), "csv"
    path = Path(input_path)
    if path.is_dir():
        raise FinetuneError(f"--input {input_path} is a folder; pass a CSV, TSV or JSONL file in it")
    if not path.is_file():
        raise FinetuneError(f"input file not found: {input_path}; check the path")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".jsonl", ".json"):
        raise FinetuneError(f"{input_path}: unsupported input type; use .csv, .tsv or .jsonl (or stdin)")
    # Read in chunks, so a huge file costs a pass over its bytes, not its size in memory.
    problem = file_encoding_problem(path)
    if problem is not None:
        raise FinetuneError(f"{input_path} {problem}")
    if suffix in (".csv", ".tsv"):
        handle = path.open(newline="", encoding="utf-8-sig")
        delimiter = "\t" if suffix == ".tsv" else ","
        rows = _csv_rows(handle, input_path, delimiter)
        return _Rows(rows if raw_csv else map(unguard_row, rows), handle, False), suffix.lstrip(".")
    if on_bad_text == "refuse":
        _refuse_bad_text_before_reading(path, input_path)
    # utf-8-sig: a byte-order mark (Windows editors write one) is read past, as for CSV and TSV.
    handle = path.open(encoding="utf-8-sig")
    repaired: list[int] = []
    return _Rows(_jsonl_rows(handle, input_path, on_bad_text, repaired), handle, False, repaired), "jsonl"


def _refuse_bad_text_before_reading(path: Path, input_path: str) -> None:
    """Refuse a JSON Lines file holding a lone surrogate before the model loads, so nothing is written.

    A file decoded as UTF-8 holds one only as a JSON escape (``\\ud800``): the
    bytes are searched for such an escape (a pass like the encoding check's),
    and only a file that has one is read through as JSON.
    """
    with path.open("rb") as handle:
        tail = b""
        while True:
            chunk = handle.read(1 << 20)
            if not chunk:
                return
            if _SURROGATE_ESCAPE.search(tail + chunk):
                break
            tail = chunk[-5:]  # an escape cut by the chunk's end
    with path.open(encoding="utf-8-sig") as handle:
        for _ in _jsonl_rows(handle, input_path, "refuse", []):
            pass


def _stdin_rows(handle: IO[str]) -> Iterator[dict[str, Any]]:
    for line_number, line in enumerate(_capped_lines(handle, "stdin"), start=1):
        # A NUL is valid UTF-8, so the decoder lets it through; a file holding one is refused as binary
        # (config/text_files.py), and scored it would put a raw NUL in the output.
        if "\x00" in line:
            raise FinetuneError(
                f"stdin is binary data, not text (a NUL byte in line {line_number}); check what is piped in"
            )
        if line.strip():
            yield {"text": line.strip()}


def _capped_lines(handle: IO[str], name: str) -> Iterator[str]:
    """Lines of ``handle``, refusing one longer than ``MAX_REVIEW_CHARS`` before it is read whole."""
    line_number = 0
    while True:
        try:
            line = handle.readline(MAX_REVIEW_CHARS + 1)
        except UnicodeDecodeError as error:
            from ..config.text_files import encoding_problem

            # The chunk the decoder read ahead: binary data or UTF-16 is named as such, not as Latin-1.
            problem = encoding_problem(bytes(error.object), at_end=False)
            if problem is not None and not problem.startswith("is not UTF-8"):
                # The file check's fix speaks of a path; what was piped in has none.
                problem = problem.replace("check that the path names the right file", "check what is piped in")
                raise FinetuneError(f"{name} {problem}") from None
            raise FinetuneError(
                # The decoder reads ahead in chunks, so the line it failed on is not known.
                f"{name} is not UTF-8 (byte 0x{error.object[error.start]:02x}, likely Latin-1 or Windows-1252); "
                "convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
        if not line:
            return
        line_number += 1
        if len(line) > MAX_REVIEW_CHARS and not line.endswith("\n"):
            raise FinetuneError(
                f"{name} line {line_number} is longer than {MAX_REVIEW_CHARS:,} characters, too long for a "
                "review; check the input (one review per line) or shorten that line"
            )
        yield line


def _csv_rows(handle: IO[str], input_path: str, delimiter: str) -> Iterator[dict[str, Any]]:
    limit = csv.field_size_limit()
    csv.field_size_limit(MAX_REVIEW_CHARS)
    try:
        # CSV is strict: an unclosed quote is an error, not a field that swallows every row after it.
        # TSV files are often written without quoting, so a review that opens with a quoted word
        # ("Best" buy ever) is read as before rather than refused.
        reader = csv.DictReader(handle, delimiter=delimiter, strict=delimiter == ",")
        # DictReader keeps the last of two same-named columns; which one was meant is not knowable.
        header = reader.fieldnames or []
        twice = next((name for index, name in enumerate(header) if name and name in header[:index]), None)
        if twice is not None:
            raise FinetuneError(f"{input_path} has two columns named '{twice}'; rename one in its header row")
        row_number = 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                if "field limit" in str(error):
                    raise FinetuneError(
                        f"{input_path} row {row_number + 1}: {error}; a field may hold at most "
                        f"{MAX_REVIEW_CHARS:,} characters (check for an unclosed quote)"
                    )
                raise FinetuneError(
                    f"{input_path} row {row_number + 1}: {error}; check that row's quotes (a field holding quotes "
                    'is quoted whole, its quotes doubled: "a ""quoted"" word")'
                )
            row_number += 1
            if None in row:  # DictReader files surplus fields under None
                raise FinetuneError(
                    f"{input_path} row {row_number} has more fields than the header; quote texts that contain commas"
                )
            yield row
    finally:
        csv.field_size_limit(limit)


def _jsonl_rows(
    handle: IO[str], input_path: str, on_bad_text: str = "refuse", repaired: list[int] | None = None
) -> Iterator[dict[str, Any]]:
    """The objects of a JSON Lines file; one holding text that is not Unicode is refused or repaired (``on_bad_text``).

    The line numbers of repaired rows are added to ``repaired``.
    """
    for line_number, line in enumerate(_capped_lines(handle, input_path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise FinetuneError(f"{input_path} is not JSON Lines (line {line_number}); write one object per line")
        if not isinstance(row, dict):
            raise FinetuneError(f"{input_path} line {line_number} is not a JSON object; write one object per line")
        bad = find_bad_text(row, "")
        if bad is not None and on_bad_text == "replace":
            row = repair_value(row)
            if repaired is not None:
                repaired.append(line_number)
        elif bad is not None:
            where, problem = bad
            raise FinetuneError(
                f"{input_path} line {line_number}: '{where}' {problem}; fix that line (often an emoji cut in half), "
                "or pass --on_bad_text replace to read it as U+FFFD"
            )
        yield row


def _guess_text_column(rows: list[dict[str, Any]], recipe_column: str | None, input_path: str | None) -> str:
    columns = list(rows[0])
    for candidate in (recipe_column, *_TEXT_COLUMN_GUESSES):
        if candidate and candidate in columns:
            return candidate
    raise FinetuneError(f"{input_path} has no text column (columns: {', '.join(columns)}); pass --text_column NAME")


def _model_inputs(
    rows: list[dict[str, Any]],
    column: str,
    title_column: str | None,
    clean: bool,
    source: str | None = None,
    first_row: int = 1,
) -> list[str]:
    """Each row's text cleaned and joined to its title as in training, so the model sees what it learned from.

    A row whose text is empty (after cleaning) gives ``""`` even with a title, as training drops it.
    A text or title that is a JSON list or mapping is refused as training refuses it, naming the row
    of ``source`` (rows numbered from ``first_row``).
    """
    from ..data.cleaning import clean_texts, join_title

    if any(column not in row for row in rows):
        raise FinetuneError(f"a row has no '{column}' column; pass --text_column NAME")
    _refuse_nested_text(rows, column, "fix the row, or pass --text_column with another column", source, first_row)
    if title_column:
        _refuse_nested_text(rows, title_column, "fix the row", source, first_row)
    bodies = [str(row[column] or "") for row in rows]
    titles = [str(row.get(title_column) or "") if title_column else "" for row in rows]
    if clean:
        bodies, titles = clean_texts(bodies), clean_texts(titles)
    return [join_title(title.strip(), body.strip()) if body.strip() else "" for title, body in zip(titles, bodies)]


def _refuse_nested_text(rows: list[dict[str, Any]], column: str, fix: str, source: str | None, first_row: int) -> None:
    """A list or mapping (from JSON Lines) where a review goes: its str() would be scored as if it were text."""
    for index, row in enumerate(rows):
        value = row.get(column)
        if isinstance(value, (list, dict)):
            kind = "list" if isinstance(value, list) else "mapping"
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            where = f"{source or 'the input'} row {first_row + index}"
            raise FinetuneError(f"{where}: '{column}' holds a {kind} ({shown}); a review must be text: {fix}")
