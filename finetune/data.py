"""Load review files into a ``DatasetDict`` of text and class ids, then tokenize.

Every problem a user can cause with their files (a missing file, a wrong
column, a label the recipe does not know) stops here with a message naming
the file, the row and the fix, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from .arguments import DataArguments
from .errors import FinetuneError

SPLITS = ("train", "validation", "test")
# File names accepted for each split inside dataset_dir, in order of preference.
_SPLIT_STEMS = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def resolve_data_files(data_args: DataArguments) -> dict[str, Path]:
    """The file of each split, from ``dataset_dir`` and the per-split overrides."""
    files: dict[str, Path] = {}
    if data_args.dataset_dir is not None:
        folder = Path(data_args.dataset_dir)
        if not folder.is_dir():
            raise FinetuneError(f"dataset_dir not found: {folder}; check the path or set train_file")
        for split, stems in _SPLIT_STEMS.items():
            for stem in stems:
                matches = [folder / f"{stem}{suffix}" for suffix in _BUILDERS if (folder / f"{stem}{suffix}").is_file()]
                if matches:
                    files[split] = matches[0]
                    break
    for split, override in (
        ("train", data_args.train_file),
        ("validation", data_args.validation_file),
        ("test", data_args.test_file),
    ):
        if override is not None:
            files[split] = Path(override)
    if "train" not in files:
        where = f"in {data_args.dataset_dir} " if data_args.dataset_dir else ""
        raise FinetuneError(f"no training data {where}; set train_file or put a train.csv in dataset_dir")
    for split, path in files.items():
        if not path.is_file():
            raise FinetuneError(f"{split} file not found: {path}; check train_file/validation_file/test_file")
        if path.suffix.lower() not in _BUILDERS:
            raise FinetuneError(f"{path}: unsupported file type; use one of {', '.join(sorted(_BUILDERS))}")
    return files


def read_table(path: Path) -> datasets.Dataset:
    """One file as a ``datasets.Dataset``, whatever its supported format."""
    suffix = path.suffix.lower()
    kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
    # Reading a file takes a blink; its "Generating train split" bar is noise (tokenizing keeps its bar).
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(_BUILDERS[suffix], data_files=str(path), split="train", **kwargs)
    except Exception as error:  # datasets raises many types for a malformed file
        if "corresponds to no data" in str(error):  # a header and no rows
            raise FinetuneError(f"{path} has no rows; give it at least one review")
        raise FinetuneError(f"cannot read {path}: {str(error).strip().splitlines()[0][:200]}; check its format")
    finally:
        datasets.enable_progress_bars()
    if len(table) == 0:
        raise FinetuneError(f"{path} has no rows; give it at least one review")
    return table


def load_review_splits(data_args: DataArguments, seed: int = 42) -> tuple[datasets.DatasetDict, list[str]]:
    """Read every split and return ``{"text", "labels"}`` rows plus the class names in id order."""
    files = resolve_data_files(data_args)
    raw = {split: read_table(path) for split, path in files.items()}
    for split, table in raw.items():
        _check_columns(table, files[split], data_args)

    label_names = data_args.class_names or _infer_label_names(raw["train"][data_args.label_column], files["train"])
    splits = datasets.DatasetDict(
        {split: _to_text_and_labels(table, files[split], data_args, label_names) for split, table in raw.items()}
    )
    if "validation" not in splits:
        splits = _hold_out_validation(splits, data_args.validation_split_percentage, label_names, seed)
    return splits, label_names


def load_labelled_file(path: Path, data_args: DataArguments, label_names: list[str]) -> datasets.Dataset:
    """One labelled file as ``{"text", "labels"}`` rows, for scoring a trained model.

    The title column is optional here: a file without it is scored on review bodies.
    """
    table = read_table(path)
    if data_args.title_column and data_args.title_column not in table.column_names:
        data_args = dataclasses.replace(data_args, title_column=None)
    _check_columns(table, path, data_args)
    return _to_text_and_labels(table, path, data_args, label_names)


def tokenize_splits(
    splits: datasets.DatasetDict, tokenizer: PreTrainedTokenizerBase, max_length: int
) -> datasets.DatasetDict:
    """Tokenize every split without padding (the collator pads each batch to its own longest review).

    A ``length`` column is kept for ``train_sampling_strategy: group_by_length``.
    """

    def encode(batch: dict[str, list]) -> dict[str, list]:
        encoded = tokenizer(batch["text"], truncation=True, max_length=max_length)
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    return splits.map(encode, batched=True, remove_columns=["text"], desc="Tokenizing")


def _check_columns(table: datasets.Dataset, path: Path, data_args: DataArguments) -> None:
    wanted = [data_args.text_column, data_args.label_column]
    if data_args.title_column:
        wanted.append(data_args.title_column)
    for option, column in zip(("text_column", "label_column", "title_column"), wanted):
        if column not in table.column_names:
            raise FinetuneError(
                f"{path} has no column '{column}' (columns: {', '.join(table.column_names)}); "
                f"set {option} in the recipe or pass --{option} NAME"
            )


def _infer_label_names(values: list, path: Path) -> list[str]:
    present = {value for value in values if value is not None}
    if all(isinstance(value, str) for value in present):
        return sorted(present)
    if all(isinstance(value, int) and not isinstance(value, bool) for value in present):
        if sorted(present) == list(range(len(present))):
            return [str(value) for value in sorted(present)]
        raise FinetuneError(
            f"{path}: integer labels {sorted(present)[:10]} are not 0..K-1; "
            "set class_names, or label_bins to group ratings into classes"
        )
    raise FinetuneError(f"{path}: labels mix numbers and text; set label_bins or class_names in the recipe")


def _to_text_and_labels(
    table: datasets.Dataset, path: Path, data_args: DataArguments, label_names: list[str]
) -> datasets.Dataset:
    texts = table[data_args.text_column]
    titles = table[data_args.title_column] if data_args.title_column else [None] * len(texts)
    raw_labels = table[data_args.label_column]
    rows: dict[str, list] = {"text": [], "labels": []}
    for row_number, (text, title, raw_label) in enumerate(zip(texts, titles, raw_labels), start=2):
        # row_number counts the header as row 1, matching what a spreadsheet shows.
        if text is None or not str(text).strip():
            raise FinetuneError(f"{path} row {row_number}: empty '{data_args.text_column}'; fill it or remove the row")
        if raw_label is None or (isinstance(raw_label, str) and not raw_label.strip()):
            raise FinetuneError(f"{path} row {row_number}: no label; fill '{data_args.label_column}' or remove the row")
        rows["labels"].append(_label_id(raw_label, data_args, label_names, f"{path} row {row_number}"))
        body = str(text).strip()
        rows["text"].append(f"{str(title).strip()}. {body}" if title and str(title).strip() else body)
    return datasets.Dataset.from_dict(
        rows,
        features=datasets.Features(
            {"text": datasets.Value("string"), "labels": datasets.ClassLabel(names=label_names)}
        ),
    )


def _label_id(raw_label: object, data_args: DataArguments, label_names: list[str], where: str) -> int:
    bins = data_args.label_bins
    if bins is not None:
        try:
            rating = float(raw_label)
        except (TypeError, ValueError):
            raise FinetuneError(f"{where}: label {raw_label!r} is not a number, but label_bins expects ratings")
        for index, (low, high) in enumerate(bins.values()):
            if low <= rating <= high:
                return index
        raise FinetuneError(f"{where}: rating {raw_label!r} is outside label_bins {_describe_bins(bins)}; widen a bin")
    if isinstance(raw_label, str):
        if raw_label in label_names:
            return label_names.index(raw_label)
        raise FinetuneError(
            f"{where}: unknown label {raw_label!r} (known: {', '.join(label_names)}); fix the row or set class_names"
        )
    if isinstance(raw_label, int) and not isinstance(raw_label, bool):
        if 0 <= raw_label < len(label_names):
            return raw_label
        raise FinetuneError(
            f"{where}: label {raw_label} is out of range for {len(label_names)} classes (0..{len(label_names) - 1}); "
            "fix the row or set class_names"
        )
    raise FinetuneError(f"{where}: label {raw_label!r} is neither a class name nor a class id")


def _describe_bins(bins: dict[str, list[float]]) -> str:
    return ", ".join(
        f"{name}={low:g}-{high:g}" if low != high else f"{name}={low:g}" for name, (low, high) in bins.items()
    )


def _hold_out_validation(
    splits: datasets.DatasetDict, percentage: int, label_names: list[str], seed: int
) -> datasets.DatasetDict:
    train = splits["train"]
    counts = [train["labels"].count(index) for index in range(len(label_names))]
    # Stratify when every class can give at least one review to each side.
    stratify = "labels" if min(counts) >= 2 else None
    parted = train.train_test_split(test_size=percentage / 100, seed=seed, stratify_by_column=stratify)
    result = datasets.DatasetDict({"train": parted["train"], "validation": parted["test"]})
    if "test" in splits:
        result["test"] = splits["test"]
    return result
