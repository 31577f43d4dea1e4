"""Output files: an ``--output`` checked before the work that fills it, and every output written whole or not at all.

Minutes of work must not end in a traceback, nor in a message that says a
file was written when the disk refused it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
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
    if is_stream(path):
        return  # written in place: nothing is replaced, and its folder (/dev) need not be writable
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


def is_stream(path: str | Path) -> bool:
    """Whether ``path`` (links followed) is a pipe or a character device, which an output streams into."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


# The errors of a write the disk refused: full, over quota, over the file-size limit.
_DISK_REFUSED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# What to choose instead when a file cannot be written: by default another folder; an --output for a named file.
OUTPUT_FLAG = "--output"


@contextlib.contextmanager
def output_file(
    path: str | Path, binary: bool = False, instead: str = "folder", replace: bool = True
) -> Iterator[IO[Any]]:
    """Open ``path`` to be written whole or not at all; a failed write, flush, sync or close is a one-line error.

    A regular file (or a new one) is written as a hidden ``.NAME.<unique>.partial``
    beside it (unique, so that two processes writing the same output never
    write into one file), flushed, synced and closed, then renamed over it: a failure at
    any of those steps (a full disk often says so only at the flush or the
    close) leaves the earlier file whole and raises :class:`FinetuneError`
    naming ``path`` and the fix: free disk space, or choose another
    ``instead`` ("folder", or :data:`OUTPUT_FLAG` for a file the user named).
    Links are followed, so the file a link names is replaced, not the link.
    What is not a regular file (``/dev/stdout``, a pipe, ``/dev/full``) is
    written in place: renaming over it would replace the device or the link
    instead of writing to it.

    With ``replace=False`` the file must still not exist when the work is
    done: one that another process finished meanwhile is kept and the write
    is refused in one line (``--overwrite`` is the caller's fix to name).
    """
    # Asked of the path as given (stat follows links): /dev/stdout resolves to a name like "pipe:[7]" that is no path.
    in_place = Path(path).exists() and not Path(path).is_file()
    target = Path(path) if in_place else Path(path).resolve()
    # The process id and a random part: two commands writing one output each write their own file.
    written = target if in_place else target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    mode, encoding = ("wb", None) if binary else ("w", "utf-8")
    try:
        # "x" for the temporary file: never opened onto one that is there already.
        open_mode = mode if in_place else mode.replace("w", "x")
        # newline="": the text is written as given (csv writes its own \r\n line ends).
        handle = written.open(open_mode, encoding=encoding, newline=None if binary else "")
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
                _publish(written, target, replace, path)
        except OSError as error:
            raise _write_error(path, error, instead) from None
    except BaseException:
        with contextlib.suppress(OSError):
            handle.close()  # already failing: the error being raised says why, a second one would not
        if not in_place:
            written.unlink(missing_ok=True)
        raise


def _publish(written: Path, target: Path, replace: bool, path: str | Path) -> None:
    """Rename ``written`` to ``target``; without ``replace``, only if ``target`` does not exist (checked atomically)."""
    if replace:
        os.replace(written, target)
        return
    try:
        # A hard link fails if the name exists, where a rename would replace what another process wrote there.
        os.link(written, target)
    except FileExistsError:
        raise _written_meanwhile(path) from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # A file system without hard links (FAT, some network mounts): the check and the rename are not one step.
        if target.exists():
            raise _written_meanwhile(path) from None
        os.replace(written, target)
        return
    written.unlink()


def _written_meanwhile(path: str | Path) -> FinetuneError:
    return FinetuneError(
        f"{path} was written by another process while this one worked, and is kept; "
        "choose another --output, or pass --overwrite to replace it"
    )


def write_output_text(path: str | Path, text: str, instead: str = "folder") -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all, as :func:`output_file` does."""
    with output_file(path, instead=instead) as handle:
        handle.write(text)


def _write_error(path: str | Path, error: OSError, instead: str) -> FinetuneError:
    free_space = "free disk space or " if error.errno in _DISK_REFUSED else ""
    return FinetuneError(f"cannot write {path} ({error.strerror or error}); {free_space}choose another {instead}")
