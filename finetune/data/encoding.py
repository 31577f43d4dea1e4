"""How a review becomes model inputs, long reviews included.

A model reads at most ``max_length`` tokens. A longer review is either cut
(``truncation_side``):

- ``right``: keep the opening;
- ``left``: keep the end (where reviewers often give their verdict);
- ``head_tail``: keep the first ``head_tokens`` and the last ones. Sun et al.
  (2019, "How to Fine-Tune BERT for Text Classification?") found head + tail
  best on long IMDb reviews (128 + 382 of 512 tokens);

or, for scoring and prediction, read in overlapping windows (``sliding_window``):
``max_length``-token chunks that overlap by ``window_stride`` tokens, whose
logits are averaged into the review's (see ``evaluation/inference.py``). A
review that fits in one window gives exactly the single-pass logits.

Training, evaluation and prediction all encode through here, so a model is
scored on what it learned from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..errors import FinetuneError

TRUNCATION_SIDES = ("right", "left", "head_tail")


@dataclass(frozen=True)
class ReviewEncoding:
    """The settings that decide which tokens of a review the model sees."""

    max_length: int = 256
    truncation_side: str = "right"
    head_tokens: int | None = None
    sliding_window: bool = False
    window_stride: int = 64

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> ReviewEncoding:
        """From a recipe's data fields (``DataArguments`` as a dict, or a saved run's ``data``)."""
        known = {name: fields[name] for name in cls.__dataclass_fields__ if fields.get(name) is not None}
        return cls(**known)

    def head_and_tail(self, room: int) -> tuple[int, int]:
        """Tokens kept from the start and from the end of a cut review, out of ``room`` (special tokens excluded)."""
        head = self.head_tokens if self.head_tokens is not None else room // 4
        head = max(0, min(head, room))
        return head, room - head


def encode_reviews(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], encoding: ReviewEncoding
) -> dict[str, list[Any]]:
    """Token ids, attention masks (token type ids where the tokenizer makes them), ``length`` and ``truncated``.

    One row per text, cut to ``encoding.max_length`` on ``encoding.truncation_side``.
    """
    if encoding.truncation_side != "head_tail":
        tokenizer.truncation_side = encoding.truncation_side
        encoded = tokenizer(texts, truncation=True, max_length=encoding.max_length)
        if encoded.encodings is not None:
            # Fast tokenizers keep what truncation cut off; a non-empty remainder means cut.
            truncated = [bool(item.overflowing) for item in encoded.encodings]
        else:
            truncated = [len(ids) >= encoding.max_length for ids in encoded["input_ids"]]
        rows = {key: list(values) for key, values in encoded.items()}
    else:
        prefix, suffix = _special_tokens(tokenizer)
        head, tail = encoding.head_and_tail(encoding.max_length - len(prefix) - len(suffix))
        # Whole reviews first (verbose=False: a review longer than the model is expected here), then cut.
        pieces = tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        truncated = [len(ids) > head + tail for ids in pieces]
        kept = [ids[:head] + ids[len(ids) - tail :] if cut else ids for ids, cut in zip(pieces, truncated)]
        rows = _with_special_tokens(tokenizer, kept, prefix, suffix)
    rows["length"] = [len(ids) for ids in rows["input_ids"]]
    rows["truncated"] = truncated
    return rows


def encode_windows(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], encoding: ReviewEncoding
) -> tuple[dict[str, list[Any]], list[int]]:
    """Every review as overlapping ``max_length`` windows; returns the rows and each row's review index.

    Consecutive windows share ``window_stride`` tokens, so a sentence cut at
    one window's edge is whole in the next. A review that fits is one window.
    """
    prefix, suffix = _special_tokens(tokenizer)
    room = encoding.max_length - len(prefix) - len(suffix)
    if not 0 <= encoding.window_stride < room:
        raise FinetuneError(
            f"window_stride must be >= 0 and below the {room} tokens a window holds (got {encoding.window_stride}); "
            f"try --window_stride {room // 4}"
        )
    step = room - encoding.window_stride
    pieces = tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    windows: list[list[int]] = []
    owners: list[int] = []
    for index, ids in enumerate(pieces):
        start = 0
        while True:
            windows.append(ids[start : start + room])
            owners.append(index)
            if start + room >= len(ids):
                break
            start += step
    return _with_special_tokens(tokenizer, windows, prefix, suffix), owners


def _special_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a single review (``[CLS]`` and ``[SEP]`` for BERT)."""
    content = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for start in range(len(full) - len(content) + 1):
        if full[start : start + len(content)] == content:
            return list(full[:start]), list(full[start + len(content) :])
    raise FinetuneError(f"cannot tell {type(tokenizer).__name__}'s special tokens apart; use truncation_side right")


def _with_special_tokens(
    tokenizer: PreTrainedTokenizerBase, sequences: list[list[int]], prefix: list[int], suffix: list[int]
) -> dict[str, list[Any]]:
    """``prefix ids suffix`` rows with masks (and token types where the model takes them), as ``tokenizer(text)``."""
    rows: dict[str, list[Any]] = {"input_ids": [], "attention_mask": []}
    with_types = "token_type_ids" in tokenizer.model_input_names
    if with_types:
        rows["token_type_ids"] = []
    for ids in sequences:
        full = prefix + list(ids) + suffix
        rows["input_ids"].append(full)
        rows["attention_mask"].append([1] * len(full))
        if with_types:
            rows["token_type_ids"].append([0] * len(full))  # one segment
    return rows
