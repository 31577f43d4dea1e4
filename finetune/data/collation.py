"""Padding a batch of tokenized reviews: transformers' ``DataCollatorWithPadding``, without its Python loops.

``DataCollatorWithPadding`` pads through ``tokenizer.pad``, which extends every
review's Python lists one padding token at a time and then walks each nested
list again (``flatten``) before building a tensor: about 3.5 ms for 16 short
reviews on one CPU core, on the host between two forward passes, where a GPU
waits for it. :class:`PaddingCollator` gives the same batch (keys, order,
values, dtypes) by filling one numpy array per key, about 0.1 ms. Whatever it
does not handle the same way for certain (numpy or torch features, padding
to ``max_length``, values that are not Python ints)
goes to transformers' own code, so every batch is the batch
``DataCollatorWithPadding`` makes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from transformers import BatchEncoding, DataCollatorWithPadding
from transformers.utils import PaddingStrategy

# The token-aligned keys tokenizer.pad pads, with what it pads them with (input_ids: the tokenizer's pad id).
_PADDED_KEYS = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask")


class PaddingCollator(DataCollatorWithPadding):
    """``DataCollatorWithPadding`` padding to each batch's longest review with numpy: the same batches, faster."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """The padded batch, as ``DataCollatorWithPadding`` makes it."""
        batch = self._pad_fast(features)
        return super().__call__(features) if batch is None else batch

    def _pads_like_transformers(self, features: Sequence[Mapping[str, Any]]) -> bool:
        """Whether these settings and features are ones whose padded batch is certain to be transformers' own."""
        tokenizer = self.tokenizer
        # PaddingStrategy is a str: "longest" matches it; any other value (a typo too) is transformers' to judge.
        longest = self.padding is True or self.padding == PaddingStrategy.LONGEST
        if (
            self.return_tensors not in ("pt", "np")
            or not longest
            or not features
            or getattr(tokenizer, "model_input_names", [None])[0] != "input_ids"
            or tokenizer.padding_side not in ("left", "right")
            or tokenizer.pad_token_id is None
        ):
            return False
        return "input_ids" in features[0] and all(
            isinstance(feature, Mapping) and feature.keys() == features[0].keys() for feature in features
        )

    def _pad_fast(self, features: Sequence[Mapping[str, Any]]) -> BatchEncoding | None:
        """The batch, or None where transformers' own padding must decide (anything but plain lists of ints)."""
        tokenizer = self.tokenizer
        if not self._pads_like_transformers(features):
            return None
        keys = list(features[0].keys())
        lengths = np.array([_length(feature["input_ids"]) for feature in features], dtype=np.int64)
        if lengths.min() < 0:
            return None
        width = int(lengths.max())
        if self.pad_to_multiple_of and width % self.pad_to_multiple_of:
            width = (width // self.pad_to_multiple_of + 1) * self.pad_to_multiple_of
        columns = np.arange(width)
        if tokenizer.padding_side == "right":
            real = columns[None, :] < lengths[:, None]
        else:
            real = columns[None, :] >= (width - lengths)[:, None]

        pad_values = {
            "input_ids": tokenizer.pad_token_id,
            "token_type_ids": tokenizer.pad_token_type_id,
            "attention_mask": 0,
            "special_tokens_mask": 1,
        }
        padded: dict[str, Any] = {}
        for key in keys:
            if key in _PADDED_KEYS:
                column = _padded_column([feature[key] for feature in features], lengths, real, pad_values[key])
                if column is None:
                    return None
                padded[key] = torch.from_numpy(column) if self.return_tensors == "pt" else column
            else:
                padded[key] = [feature[key] for feature in features]
        # As tokenizer.pad: a mask is added (last) where the tokenizer's model takes one and the features have none.
        if "attention_mask" not in padded and "attention_mask" in tokenizer.model_input_names:
            mask = real.astype(np.int64)
            padded["attention_mask"] = torch.from_numpy(mask) if self.return_tensors == "pt" else mask
        others = [key for key in padded if key not in _PADDED_KEYS]
        if others:
            # Labels and the like: small, and converted by transformers' own code, dtypes and errors included.
            converted = BatchEncoding({key: padded[key] for key in others}, tensor_type=self.return_tensors)
            padded.update(converted.data)
        batch = BatchEncoding(padded)
        # As DataCollatorWithPadding: "label" and "label_ids" become "labels" (moved last).
        for name in ("label", "label_ids"):
            if name in batch:
                batch["labels"] = batch.pop(name)
        return batch


def _length(values: Any) -> int:
    """The length of a feature's token list, or -1 where it is not a plain list or tuple."""
    return len(values) if isinstance(values, (list, tuple)) else -1


def _padded_column(rows: list[Any], lengths: np.ndarray, real: np.ndarray, pad_value: int) -> np.ndarray | None:
    """One key's rows padded into an int64 array, or None unless every row is a list of Python ints."""
    if any(_length(row) != length for row, length in zip(rows, lengths.tolist())):
        return None
    # Python ints only (transformers refuses numpy scalars there, and makes bool or float tensors of bools and
    # floats): anything else is for its code to convert. An empty batch of tokens is int64 there too.
    if any(row and type(row[0]) is not int for row in rows):
        return None
    values = np.array(list(itertools.chain.from_iterable(rows)))
    if values.size and values.dtype != np.int64:
        return None
    column = np.full(real.shape, pad_value, dtype=np.int64)
    column[real] = values
    return column


def faster_collator(collator: Any) -> Any:
    """``collator`` as a :class:`PaddingCollator` where it is a plain ``DataCollatorWithPadding``, else unchanged."""
    if type(collator) is DataCollatorWithPadding:
        # Its settings as they are (dataclasses.asdict would deep-copy the tokenizer).
        return PaddingCollator(**{setting.name: getattr(collator, setting.name) for setting in fields(collator)})
    return collator
