"""Arrays cached under a key of everything that made them, each checked against its stored digest when read.

A cached array is trusted only if it is the one that was stored: ``KEY.npy``
holds the array and ``KEY.json`` beside it the key and the sha256 of the
``.npy``'s bytes. Reading checks the record, the digest (before ``np.load``
sees the bytes), the shape and that every value is finite; an array that fails
any check (changed values, a file cut short, empty or random bytes, no record)
is not used, and :meth:`ArrayCache.read` says why in a few words, so the caller
computes it again in one line instead of training on it or ending in a
traceback. Both files are written whole or not at all.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Part of every key: bump it when what is cached changes meaning, so older entries are not taken for new ones.
CACHE_FORMAT = 2


def cache_key(**inputs: Any) -> str:
    """The key of an array made from ``inputs`` (JSON-serialisable): a sha256, 32 hex digits of it."""
    text = json.dumps({"format": CACHE_FORMAT, **inputs}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class ArrayCache:
    """A folder of arrays, each ``KEY.npy`` beside its record ``KEY.json``."""

    folder: Path

    def path(self, key: str) -> Path:
        """Where the array of ``key`` is kept."""
        return self.folder / f"{key}.npy"

    def read(self, key: str, shape: tuple[int, ...]) -> tuple[np.ndarray | None, str | None]:
        """The array of ``key`` if it is the one stored, of ``shape`` and finite; else None and why not.

        Why not is None when nothing is cached under ``key`` (nothing to say),
        and a few words ("cannot be read: ...") when something is but fails a check.
        """
        array_path, record_path = self.path(key), self.path(key).with_suffix(".json")
        if not array_path.exists() and not record_path.exists():
            return None, None
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            data = array_path.read_bytes()
        except FileNotFoundError as error:
            return None, f"has no {Path(str(error.filename)).name} beside it (left by an older finetune or a kill)"
        except (OSError, ValueError) as error:
            return None, f"cannot be read ({_reason(error)})"
        if not isinstance(record, dict) or record.get("key") != key:
            return None, f"has a record {record_path.name} that is not its own"
        if hashlib.sha256(data).hexdigest() != record.get("sha256"):
            return None, f"does not match the digest in {record_path.name} beside it (changed or damaged)"
        try:
            values = np.load(io.BytesIO(data), allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:
            return None, f"cannot be read ({_reason(error)})"
        if values.shape != tuple(shape) or not np.issubdtype(values.dtype, np.number) or not np.isfinite(values).all():
            return None, f"is not a {'x'.join(map(str, shape))} array of finite numbers"
        return values, None

    def write(self, key: str, values: np.ndarray) -> str | None:
        """Store ``values`` under ``key`` with its record; None, or why it could not be (the cache is optional)."""
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        data = buffer.getvalue()
        record = {"key": key, "sha256": hashlib.sha256(data).hexdigest(), "shape": list(values.shape)}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # The array first: a record is never beside an array it does not describe for longer than a rename.
            _write_whole(self.path(key), data)
            _write_whole(self.path(key).with_suffix(".json"), (json.dumps(record) + "\n").encode())
        except OSError as error:
            return _reason(error)
        return None


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, sync it, and rename it over ``path``."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _reason(error: BaseException) -> str:
    """An error in a few words, on one line."""
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return " ".join(text.split())
