"""Why a text file (a recipe, a CSV of reviews) cannot be read as UTF-8, in words a user can act on.

Libraries report such a file as a ``UnicodeDecodeError`` at some offset, or as
a parse error far from the cause; the messages here name the encoding (UTF-16,
Latin-1) or say that the file is not text at all, and how to fix it.
"""

from __future__ import annotations

import codecs
from pathlib import Path

_SAMPLE_BYTES = 1 << 16
_CHUNK_BYTES = 1 << 20


def encoding_problem(data: bytes, at_end: bool = True) -> str | None:
    """What keeps ``data`` from being UTF-8 text, as ``'is ...; <fix>'``, or None when it is UTF-8.

    ``at_end=False`` means ``data`` is only the start of a file, so a character
    cut off at its end is not a problem.
    """
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or _looks_like_utf16(data):
        return "is UTF-16 text; save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 OLD > NEW)"
    if b"\x00" in data or _control_share(data) > 0.1:
        return "is binary data, not text; check that the path names the right file"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=at_end)
    except UnicodeDecodeError as error:
        return _not_utf8(data, error.start)
    return None


def file_encoding_problem(path: Path) -> str | None:
    """:func:`encoding_problem` for a whole file, read in chunks (a review dump may be gigabytes)."""
    with path.open("rb") as handle:
        sample = handle.read(_SAMPLE_BYTES)
        problem = encoding_problem(sample, at_end=False)
        if problem is not None:
            return problem
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        chunk = sample
        while chunk:
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                return _not_utf8(chunk, error.start, offset)
            offset += len(chunk)
            chunk = handle.read(_CHUNK_BYTES)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return "is not UTF-8 (it ends in the middle of a character); save it as UTF-8"
    return None


def _not_utf8(data: bytes, index: int, offset: int = 0) -> str:
    byte = data[index]
    return (
        f"is not UTF-8 (byte 0x{byte:02x} at offset {offset + index}, likely Latin-1 or Windows-1252); "
        "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 OLD > NEW)"
    )


def _looks_like_utf16(data: bytes) -> bool:
    # UTF-16 without a byte-order mark: mostly-ASCII text has a NUL in every other byte.
    sample = data[:4096]
    if len(sample) < 8:
        return False
    halves = (sample[0::2], sample[1::2])
    return any(half.count(0) > 0.8 * len(half) for half in halves) and not all(half.count(0) for half in halves)


def _control_share(data: bytes) -> float:
    """The share of bytes that are control characters other than tab, newline, carriage return, form feed."""
    sample = data[:4096]
    if not sample:
        return 0.0
    controls = sum(1 for byte in sample if byte < 32 and byte not in (9, 10, 12, 13))
    return controls / len(sample)
