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

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import FinetuneError

# Batch keys that run along the tokens of each review; every other key holds one row per review.
SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")
# The keys transformers' FlashAttention path reads for variable-length sequences, reused for packed rows.
PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


class FeatureList(list):
    """A dataloader batch of unpadded features, collated only once the window is cut into pieces.

    A plain list subclass, so Accelerate's device placement leaves it alone
    (its items hold Python lists, not tensors).
    """


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


def plan_pieces(lengths: Sequence[int], token_budget: int, packed: bool) -> list[list[int]]:
    """Cut samples of ``lengths`` into pieces of at most ``token_budget`` tokens, longest first.

    Returns the samples' indices, piece by piece. A padded piece costs its
    rows times its longest review (the first, since they are sorted); a
    packed one the sum of its lengths. A review longer than the budget makes a
    piece of its own. Ties keep their window order, so a plan is reproducible.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1 (got {token_budget})")
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    pieces: list[list[int]] = []
    piece: list[int] = []
    tokens = 0
    for index in order:
        length = lengths[index]
        cost = tokens + length if packed else (len(piece) + 1) * max(length, lengths[piece[0]] if piece else 0)
        if piece and cost > token_budget:
            pieces.append(piece)
            piece, tokens = [], 0
        piece.append(index)
        tokens += length
    if piece:
        pieces.append(piece)
    return pieces


def cut_window(
    window: Sequence[FeatureList | None],
    token_budget: int | None,
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
    packed: bool,
    position_offset: int = 0,
) -> list[dict[str, Any]]:
    """The window's samples as collated pieces: by ``token_budget``, or one piece per micro-batch when it is None.

    ``None`` items (a rank's empty share of a global micro-batch) hold no
    samples; a window with none at all gives no pieces.
    """
    micro_batches = [list(features) for features in window if features]
    if token_budget is None:
        groups = micro_batches
    else:
        features = [feature for micro_batch in micro_batches for feature in micro_batch]
        lengths = [review_length(feature) for feature in features]
        groups = [[features[index] for index in piece] for piece in plan_pieces(lengths, token_budget, packed)]
    batches = [collate(group) for group in groups]
    return [pack(batch, position_offset) for batch in batches] if packed else batches


def pack(batch: dict[str, Any], position_offset: int = 0) -> dict[str, Any]:
    """A padded batch as one row without padding: its reviews end to end, positions restarting at each.

    ``cu_seq_lens_q`` (and ``_k``) holds where each review starts, plus the
    end; ``max_length_q`` (and ``_k``) the longest review. The attention mask
    goes: the boundaries say the same. Keys with one row per review
    (``labels``, a teacher's probabilities) stay as they are.
    ``position_offset`` is where the model's position ids start (0 for BERT).
    """
    input_ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    lengths = real.sum(dim=1)
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
    starts = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    starts[1:] = lengths.cumsum(dim=0)
    longest = int(lengths.max()) if len(lengths) else 0
    packed.update(cu_seq_lens_q=starts, cu_seq_lens_k=starts, max_length_q=longest, max_length_k=longest)
    return packed


def is_packed(inputs: dict[str, Any] | None) -> bool:
    """Whether ``inputs`` is a packed piece (one row of reviews end to end)."""
    return inputs is not None and "cu_seq_lens_q" in inputs


def computed_tokens(inputs: dict[str, Any]) -> int:
    """The tokens a forward pass over ``inputs`` computes, padding included (a packed piece has none)."""
    return int(inputs["input_ids"].numel())
