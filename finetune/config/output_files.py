"""Output files: an ``--output`` checked before the work that fills it, and every output written whole or not at all.

Minutes of work must not end in a traceback, nor in a message that says a
file was written when the disk refused it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import FinetuneError


def check_output_file(output: str, replace: bool = False) -> None:
    """Refuse ``output`` if it is a folder, exists (unless ``replace``), or its folder is missing or unwritable.

    Raises a one-line :class:`FinetuneError` that names the fix.
    """
    path = Path(output)
    if path.is_dir():
        raise FinetuneError(f"--output {output} is a folder; give a file name in it")
    if path.exists() and not replace:
        raise FinetuneError(f"{output} already exists; choose another --output or remove it")
    folder = path.parent
    if not folder.is_dir():
        raise FinetuneError(f"--output {output}: folder {folder} does not exist; create it or choose another --output")
    try:
        # Trying is the only sure test: permission bits do not bind root, nor tell of a read-only mount.
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise FinetuneError(
            f"--output {output}: cannot write in {folder} ({error.strerror or error}); choose another --output"
        )


# The errors of a write the disk refused: full, over quota, over the file-size limit.
_DISK_REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# What to choose instead when a file cannot be written: by default another folder; an --output for a named file.
OUTPUT_FLAG = "--output"


@contextlib.contextmanager
def output_file(path: str | Path, binary: bool = False, instead: str = "folder") -> Iterator[IO[Any]]:
    """Open ``path`` to be written whole or not at all; a failed write, flush, sync or close is a one-line error.

    A regular file (or a new one) is written as a hidden ``.NAME.partial``
    beside it, flushed, synced and closed, then renamed over it: a failure at
    any of those steps (a full disk often says so only at the flush or the
    close) leaves the earlier file whole and raises :class:`FinetuneError`
    naming ``path`` and the fix: free disk space, or choose another
    ``instead`` ("folder", or :data:`OUTPUT_FLAG` for a file the user named).
    Links are followed, so the file a link names is replaced, not the link.
    What is not a regular file (``/dev/stdout``, a pipe, ``/dev/full``) is
    written in place: renaming over it would replace the device or the link
    instead of writing to it.
    """
    # Asked of the path as given (stat follows links): /dev/stdout resolves to a name like "pipe:[7]" that is no path.
    in_place = Path(path).exists() and not Path(path).is_file()
    target = Path(path) if in_place else Path(path).resolve()
    written = target if in_place else target.with_name(f".{target.name}.partial")
    mode, encoding = ("wb", None) if binary else ("w", "utf-8")
    try:
        # newline="": the text is written as given (csv writes its own \r\n line ends).
        handle = written.open(mode, encoding=encoding, newline=None if binary else "")
    except OSError as error:
        raise _write_error(path, error, instead) from None
    try:
        try:
            yield handle
        except OSError as error:
            # A full disk met by the caller's own writes names no file; any other error is not ours to rename.
            if error.filename is None and error.errno in _DISK_REFUSED:
                raise _write_error(path, error, instead) from None
            raise
        try:
            try:
                handle.flush()
                if not in_place:
                    os.fsync(handle.fileno())
            finally:
                handle.close()  # raises what the flush left unsaid
            if not in_place:
                os.replace(written, target)
        except OSError as error:
            raise _write_error(path, error, instead) from None
    except BaseException:
        with contextlib.suppress(OSError):
            handle.close()  # already failing: the error being raised says why, a second one would not
        if not in_place:
            written.unlink(missing_ok=True)
        raise


def write_output_text(path: str | Path, text: str, instead: str = "folder") -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all, as :func:`output_file` does."""
    with output_file(path, instead=instead) as handle:
        handle.write(text)


def _write_error(path: str | Path, error: OSError, instead: str) -> FinetuneError:
    free_space = "free disk space or " if error.errno in _DISK_REFUSED else ""
    return FinetuneError(f"cannot write {path} ({error.strerror or error}); {free_space}choose another {instead}")
