"""Several tags per review (a ``multi_label`` run): whether a run is one, its tag names, and rows of 0/1 per tag.

A review's tags come as a JSON list (``["price", "delivery"]``, in JSON Lines
or Parquet) or as text split at ``label_separator`` (``price|delivery`` in a
CSV). Each becomes a row of floats, 1.0 for a tag the review has, in tag-id
order: what ``BCEWithLogitsLoss`` reads. An empty list is a review with no
tag, a valid row; a missing label (an empty cell, a null) is dropped and
counted, as for one label per review.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import datasets

from ..config.arguments import DataArguments
from ..errors import FinetuneError
from .columns import column_values

MULTI_LABEL = "multi_label"
# What a label cell of a multi_label run must hold, for the messages.
_TAGS = "a review's tags are a list of words, e.g. [price, delivery]"


def is_multi_label(train: datasets.Dataset, data_args: DataArguments) -> bool:
    """Whether the run has several tags per review: ``task`` says so, or a ``label_separator``, or a list column."""
    if data_args.task is not None:
        return data_args.task == MULTI_LABEL
    if data_args.label_bins is not None:
        return False  # ratings grouped into classes: one class per review
    return data_args.label_separator is not None or holds_lists(train, data_args.label_column)


def holds_lists(table: datasets.Dataset, column: str) -> bool:
    """Whether ``column`` holds lists: a list column, or a JSON column (mixed types) with a list in it."""
    feature = table.features[column]
    if _is_list_column(feature):
        return True
    json_feature = getattr(datasets, "Json", None)
    return (
        json_feature is not None
        and isinstance(feature, json_feature)
        and any(isinstance(value, list) for value in column_values(table, column))
    )


def _is_list_column(feature: Any) -> bool:
    list_types = tuple(kind for kind in (datasets.Sequence, getattr(datasets, "List", None)) if kind is not None)
    return isinstance(feature, (*list_types, datasets.LargeList))


def tag_names(
    train: datasets.Dataset, origin: str, data_args: DataArguments, row_name: Callable[[int], str]
) -> list[str]:
    """The tag names in id order: ``class_names``, else every tag on a training review, sorted.

    ``row_name(index)`` names a training row in messages, as the source numbers its rows.
    """
    column = data_args.label_column
    lists = holds_lists(train, column)
    if data_args.task == "single_label" and lists:
        raise FinetuneError(
            f"{origin}: '{column}' holds lists of tags and task is single_label; set task: multi_label "
            "(or drop task), or give one label per review"
        )
    seen: set[str] = set()
    split_any = False
    for index, raw in enumerate(column_values(train, column)):
        tags = review_tags(raw, data_args.label_separator, row_name(index), column, lists)
        if tags is not None:
            seen.update(tags)
            separator = data_args.label_separator
            split_any = split_any or (isinstance(raw, str) and separator is not None and separator in raw)
    if data_args.label_separator is not None and not split_any and not lists:
        raise FinetuneError(
            f"{origin}: label_separator {data_args.label_separator!r} splits no label in '{column}'; "
            "set the separator the labels use, or drop label_separator for one label per review"
        )
    if data_args.class_names:
        unknown = sorted(seen - set(data_args.class_names))
        if unknown:
            named = (
                f"tags {', '.join(repr(tag) for tag in unknown[:5])} are"
                if len(unknown) > 1
                else (f"tag {unknown[0]!r} is")
            )
            raise FinetuneError(
                f"{origin}: {named} not in class_names; add them to class_names, or drop class_names to take "
                "the tags from the data"
            )
        return list(data_args.class_names)
    if not seen:
        raise FinetuneError(f"{origin}: no review in '{column}' has a tag; check label_column and label_separator")
    return sorted(seen)


def review_tags(raw: Any, separator: str | None, where: str, column: str, lists: bool = False) -> list[str] | None:
    """A label cell's tags, or None for a missing label (dropped and counted); refuses a cell that is no tag list.

    ``lists``: the column holds lists, so a cell of text among them is refused as a column mixing the two.
    """
    if raw is None:
        return None
    if isinstance(raw, str) and not lists:
        if separator is None:
            return [raw.strip()] if raw.strip() else None
        parts = [part.strip() for part in raw.split(separator)]
        tags = [part for part in parts if part]
        return tags if tags else None
    if isinstance(raw, (list, tuple)):
        strange = next((tag for tag in raw if not isinstance(tag, str)), None)
        if strange is not None:
            raise FinetuneError(
                f"{where}: '{column}' holds {strange!r} among its tags; {_TAGS}: write each tag as text"
            )
        return [tag.strip() for tag in raw if tag.strip()]
    raise FinetuneError(
        f"{where}: '{column}' holds {raw!r} where other rows hold lists of tags; {_TAGS}: "
        "write every row's label as a list (or [] for none)"
    )


def tag_counts(label_rows: Sequence[Sequence[float]], num_tags: int) -> list[int]:
    """How many reviews carry each tag, in tag-id order."""
    counts: collections.Counter = collections.Counter()
    for row in label_rows:
        counts.update(index for index, value in enumerate(row) if value > 0.5)
    return [counts[index] for index in range(num_tags)]


def tag_features() -> datasets.Features:
    """The clean rows' columns for a multi_label run: ``labels`` a row of floats per review."""
    return datasets.Features(
        {
            "text": datasets.Value("string"),
            "labels": datasets.Sequence(datasets.Value("float32")),
            "problem": datasets.Value("string"),
            "title": datasets.Value("string"),
        }
    )
