"""Fake PyPI wheels for the fetch tests: ``pip download --no-index --find-links`` takes them offline."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

WHEEL = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def sha256(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def zip_bytes(files: dict[str, bytes]) -> bytes:
    """A zip of ``files`` whose bytes depend on nothing else (a fixed timestamp), so a rebuilt wheel is the same."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def write_wheel(folder: Path, package: str, files: dict[str, bytes]) -> bytes:
    """``<package>-0.1-py3-none-any.whl`` in ``folder`` holding ``files`` and valid metadata; returns its bytes."""
    module = package.replace("-", "_")
    files = {
        **files,
        f"{module}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n".encode(),
        f"{module}-0.1.dist-info/WHEEL": WHEEL,
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    files[f"{module}-0.1.dist-info/RECORD"] = (record + f"{module}-0.1.dist-info/RECORD,,\n").encode()
    wheel = zip_bytes(files)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}-0.1-py3-none-any.whl").write_bytes(wheel)
    return wheel
