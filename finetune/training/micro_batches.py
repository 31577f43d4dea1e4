"""How one window's samples are cut into micro-batches: by a token budget, padded or packed.

The accumulation contract (line 9) makes an update independent of how its
window's samples are split, so the split is free to follow cost instead of a
sample count. With ``micro_batch_tokens`` the window's samples are sorted
longest first and cut greedily into **pieces** that each cost at most that many
tokens: a padded piece costs its rows times its longest review, a packed one
the sum of its reviews' lengths. Sorting puts reviews of like length together,
so little padding is left to compute, and short reviews share one large piece
instead of many small forward passes.

A **packed** piece (``padding_free``) is one row: the reviews end to end, with
position ids restarting at each and ``cu_seq_lens`` marking where each begins,
so that no padding token is computed at all (see :mod:`.packed_attention`).

Nothing here touches a model: planning is pure arithmetic on lengths, and
pieces are collated by the run's own data collator.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import FinetuneError

# Batch keys that run along the tokens of each review; every other key holds one row per review.
SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")
# The keys transformers' FlashAttention path reads for variable-length sequences, reused for packed rows.
PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
# A packed row's attention is computed per group of reviews of like length, each group padded to its
# longest review: a review joins the group while it has at least this share of the group's first
# (longest) review's tokens, so no attention weight in a group costs more than 1 / 0.8^2 = 1.56 of its own.
ATTENTION_GROUP_SHARE = 0.8


class FeatureList(list):
    """A dataloader batch of unpadded features, collated only once the window is cut into pieces.

    Its items hold Python lists, not tensors, so it stays on the host (``to``).
    """

    def to(self, *args: Any, **kwargs: Any) -> FeatureList:
        """Itself: Accelerate's device placement calls ``to`` on what has one, and would otherwise rebuild
        the batch one Python number at a time (3.5 ms a micro-batch of 8 short reviews, on the host)."""
        return self


def keep_features(features: list[dict[str, Any]]) -> FeatureList:
    """The collator of a token-budget run's dataloader: keep the features as they are."""
    return FeatureList(features)


def review_length(feature: dict[str, Any]) -> int:
    """Tokens in one review's features: the length of its ``input_ids``."""
    try:
        return len(feature["input_ids"])
    except (KeyError, TypeError):
        raise FinetuneError(
            "micro_batch_tokens and padding_free need tokenized reviews with input_ids; leave both out for this dataset"
        ) from None


def plan_pieces(
    lengths: Sequence[int], token_budget: int, packed: bool, width_multiple: int | None = None
) -> list[list[int]]:
    """Cut samples of ``lengths`` into pieces of at most ``token_budget`` tokens, longest first.

    Returns the samples' indices, piece by piece. A padded piece costs its
    rows times its longest review (the first, since they are sorted), rounded
    up to ``width_multiple`` where the collator pads to one; a packed one the
    sum of its lengths. A review longer than the budget makes a piece of its
    own. Ties keep their window order, so a plan is reproducible.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1 (got {token_budget})")
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    pieces: list[list[int]] = []
    piece: list[int] = []
    tokens = 0
    for index in order:
        length = lengths[index]
        if packed:
            cost = tokens + length
        else:
            cost = (len(piece) + 1) * padded_width(max(length, lengths[piece[0]] if piece else 0), width_multiple)
        if piece and cost > token_budget:
            pieces.append(piece)
            piece, tokens = [], 0
        piece.append(index)
        tokens += length
    if piece:
        pieces.append(piece)
    return pieces


def padded_width(longest: int, width_multiple: int | None) -> int:
    """The width a collator padding to ``width_multiple`` (None or 1: no rounding) gives a piece of ``longest``."""
    if not width_multiple or width_multiple < 2:
        return longest
    return -(-longest // width_multiple) * width_multiple


def cut_window(
    window: Sequence[FeatureList | None],
    token_budget: int | None,
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
    packed: bool,
    position_offset: int = 0,
    max_group_scores: int | None = None,
    width_multiple: int | None = None,
) -> list[dict[str, Any]]:
    """The window's samples as collated pieces: by ``token_budget``, or one piece per micro-batch when it is None.

    ``None`` items (a rank's empty share of a global micro-batch) hold no
    samples; a window with none at all gives no pieces. ``max_group_scores``
    caps a packed piece's attention groups (see :func:`attention_layout`);
    ``width_multiple`` is the multiple ``collate`` pads to, counted in the budget.
    """
    micro_batches = [list(features) for features in window if features]
    if token_budget is None:
        groups = micro_batches
    else:
        features = [feature for micro_batch in micro_batches for feature in micro_batch]
        lengths = [review_length(feature) for feature in features]
        plan = plan_pieces(lengths, token_budget, packed, width_multiple)
        groups = [[features[index] for index in piece] for piece in plan]
    if not packed:
        return [collate(group) for group in groups]
    # The lengths come from the features, not from the collated tensors: no tensor is read here.
    return [
        pack(collate(group), [review_length(feature) for feature in group], position_offset, max_group_scores)
        for group in groups
    ]


def pack(
    batch: dict[str, Any],
    lengths: Sequence[int] | None = None,
    position_offset: int = 0,
    max_group_scores: int | None = None,
) -> dict[str, Any]:
    """A padded batch as one row without padding: its reviews end to end, positions restarting at each.

    ``cu_seq_lens_q`` (and ``_k``) holds where each review starts, plus the
    end; ``max_length_q`` (and ``_k``) the longest review. The attention mask
    goes: the boundaries say the same. Keys with one row per review
    (``labels``, a teacher's probabilities) stay as they are. ``lengths``
    are the reviews' token counts, when the caller knows them (else they are
    read from the mask). ``position_offset`` is where the model's position
    ids start (0 for BERT). ``max_group_scores`` caps the attention groups
    (see :func:`attention_layout`).
    """
    input_ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    if lengths is None:
        lengths = real.sum(dim=1).tolist()
    lengths = list(lengths)
    packed: dict[str, Any] = {}
    for key, value in batch.items():
        if key == "attention_mask":
            continue
        if key in SEQUENCE_KEYS:
            # Boolean indexing walks rows in order and keeps each row's real tokens in order,
            # whichever side the collator padded.
            packed[key] = value[real].unsqueeze(0)
        else:
            packed[key] = value
    # Counting real tokens along each row numbers them from 0, whichever side holds the padding.
    positions = real.long().cumsum(dim=1) - 1
    packed["position_ids"] = (positions[real] + position_offset).unsqueeze(0)
    starts = [0, *itertools.accumulate(lengths)]
    cu_seq_lens = torch.tensor(starts, dtype=torch.int32)
    longest = max(lengths, default=0)
    packed.update(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=longest, max_length_k=longest)
    packed.update(attention_layout(lengths, starts, max_group_scores))
    return packed


def attention_layout(
    lengths: Sequence[int], starts: Sequence[int], max_group_scores: int | None = None
) -> dict[str, Any]:
    """Where each token of a packed row sits when its attention is computed, group by group.

    Reviews are sorted longest first and grouped by ``ATTENTION_GROUP_SHARE``;
    a group of n reviews, the longest of w tokens, is computed as an ``[n, w]``
    padded batch, with n * w * w attention scores per head. ``max_group_scores``
    (None: no cap) closes a group before it would hold more than that many
    (a review alone may); the next group is padded to its own longest review.

    ``review_groups`` holds, per group, ``token_index`` (the
    row position of each slot; padding slots point at position 0),
    ``key_mask`` (which slots are real) and ``real_slots`` (their flat
    indices); ``review_order`` puts the groups' real tokens back in row
    order, and ``first_token_order`` the groups' reviews (one row each) back
    in the row's review order. All index tensors are made here, on the CPU,
    so that the model reads no tensor to find them; with numpy, a group at a
    time (a few torch calls per review took 1 ms a window of 16 on the host).
    """
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    grouped: list[list[int]] = []
    for index in order:
        if grouped and _joins(lengths, grouped[-1], lengths[index], max_group_scores):
            grouped[-1].append(index)
        else:
            grouped.append([index])
    review_lengths = np.asarray(lengths, dtype=np.int64)
    review_starts = np.asarray(starts[: len(lengths)], dtype=np.int64)
    groups = []
    tokens_in_group_order = []
    for group in grouped:
        group_lengths = review_lengths[group]
        columns = np.arange(group_lengths[0])
        positions = review_starts[group][:, None] + columns
        key_mask = columns < group_lengths[:, None]
        # Row-major, as the real slots are read: each review's tokens in order, review after review.
        tokens_in_group_order.append(positions[key_mask])
        token_index = np.where(key_mask, positions, 0)
        real_slots = np.flatnonzero(key_mask).astype(np.int64, copy=False)
        groups.append((torch.from_numpy(token_index), torch.from_numpy(key_mask), torch.from_numpy(real_slots)))
    reviews_in_group_order = np.fromiter(itertools.chain.from_iterable(grouped), dtype=np.int64, count=len(lengths))
    tokens = np.concatenate(tokens_in_group_order) if tokens_in_group_order else np.zeros(0, dtype=np.int64)
    return {
        "review_groups": tuple(groups),
        "review_order": _inverse(tokens),
        "first_token_order": _inverse(reviews_in_group_order),
    }


def _joins(lengths: Sequence[int], group: list[int], length: int, max_group_scores: int | None) -> bool:
    """Whether a review of ``length`` tokens joins ``group`` (longest first) rather than starting the next one."""
    width = lengths[group[0]]
    if length < ATTENTION_GROUP_SHARE * width:
        return False
    return max_group_scores is None or (len(group) + 1) * width * width <= max_group_scores


def _inverse(permutation: np.ndarray) -> torch.Tensor:
    """The permutation that undoes ``permutation`` (``x[permutation][inverse] == x``)."""
    # Sorting a permutation's values (no two alike) gives the position each value came from.
    return torch.from_numpy(np.argsort(permutation).astype(np.int64, copy=False))


def is_packed(inputs: dict[str, Any] | None) -> bool:
    """Whether ``inputs`` is a packed piece (one row of reviews end to end)."""
    return inputs is not None and "cu_seq_lens_q" in inputs


def computed_tokens(inputs: dict[str, Any]) -> int:
    """The tokens a forward pass over ``inputs`` computes, padding included (a packed piece has none)."""
    return int(inputs["input_ids"].numel())
