"""An ``--output`` file checked before the work that fills it: minutes of it must not end in a traceback."""

from __future__ import annotations

import tempfile
from pathlib import Path

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
