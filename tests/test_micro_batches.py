"""Cutting a window into pieces by tokens (finetune/training/micro_batches.py), checked against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithPadding

from finetune.training.micro_batches import ATTENTION_GROUP_SHARE, attention_layout, cut_window, pack, plan_pieces


def padded_cost(lengths, piece, multiple=None):
    longest = max(lengths[index] for index in piece)
    if multiple:
        longest = math.ceil(longest / multiple) * multiple  # what DataCollatorWithPadding(pad_to_multiple_of) pads to
    return len(piece) * longest


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=24),
    budget=st.integers(min_value=1, max_value=400),
    packed=st.booleans(),
    multiple=st.sampled_from([None, 1, 8, 64]),
)
def test_every_sample_once_longest_first_and_within_the_budget(lengths, budget, packed, multiple):
    multiple = None if packed else multiple  # a packed row has no padding to round
    pieces = plan_pieces(lengths, budget, packed, multiple)
    assert sorted(index for piece in pieces for index in piece) == list(range(len(lengths)))
    in_order = [lengths[index] for piece in pieces for index in piece]
    assert in_order == sorted(lengths, reverse=True)
    for piece in pieces:
        cost = sum(lengths[index] for index in piece) if packed else padded_cost(lengths, piece, multiple)
        # Only a single review longer than the budget may exceed it.
        assert cost <= budget or len(piece) == 1
    for before, after in itertools.pairwise(pieces):
        # Greedy: the next piece's first review did not fit into the piece before it.
        grown = [*before, after[0]]
        cost = sum(lengths[index] for index in grown) if packed else padded_cost(lengths, grown, multiple)
        assert cost > budget


def test_a_budget_below_one_is_refused():
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        plan_pieces([3, 4], 0, packed=False)


def test_a_padded_piece_costs_rows_times_its_longest_review():
    # Sorted: 10, 6, 5, 2, 1. A budget of 20 holds 10+6 (2 x 10 = 20), then 5, 2, 1 (3 x 5 = 15).
    assert plan_pieces([5, 10, 1, 6, 2], 20, packed=False) == [[1, 3], [0, 4, 2]]
    # Packed, the same budget holds 10 + 6 (16), then 5 + 2 + 1.
    assert plan_pieces([5, 10, 1, 6, 2], 20, packed=True) == [[1, 3], [0, 4, 2]]
    assert plan_pieces([5, 10, 1, 6, 2], 21, packed=True) == [[1, 3, 0], [4, 2]]


def test_a_piece_padded_to_a_multiple_costs_its_padded_width():
    # Three reviews of 9 tokens: 27 tokens as they are, 3 x 16 = 48 padded to a multiple of 8.
    assert plan_pieces([9, 9, 9], 32, packed=False) == [[0, 1, 2]]
    assert plan_pieces([9, 9, 9], 32, packed=False, width_multiple=8) == [[0, 1], [2]]


def features(tokenizer, texts, labels):
    return [dict(tokenizer(text), labels=label) for text, label in zip(texts, labels)]


TEXTS = ["great", "this broke after two days and the refund took weeks", "ok then", "love it, five stars"]


def test_pieces_hold_the_window_s_samples_collated(tokenizer):
    window = [features(tokenizer, TEXTS[:2], [0, 1]), None, features(tokenizer, TEXTS[2:], [2, 0])]
    collator = DataCollatorWithPadding(tokenizer)
    pieces = cut_window(window, 24, collator, packed=False)
    labels = sorted(label for piece in pieces for label in piece["labels"].tolist())
    assert labels == [0, 0, 1, 2]
    for piece in pieces:
        assert piece["input_ids"].numel() <= 24 or len(piece["labels"]) == 1
    # No budget: one piece per micro-batch, the empty share dropped.
    assert [len(piece["labels"]) for piece in cut_window(window, None, collator, packed=False)] == [2, 2]
    assert cut_window([None, None], 24, collator, packed=False) == []


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=24),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=20_000)),
)
def test_attention_groups_hold_every_token_once_within_the_share_and_the_cap(lengths, cap):
    starts = [0, *itertools.accumulate(lengths)]
    layout = attention_layout(lengths, starts, cap)
    seen = []
    widths = []
    for token_index, key_mask, real_slots in layout["review_groups"]:
        reviews, width = token_index.shape
        group_lengths = key_mask.sum(dim=1).tolist()
        widths.append(width)
        assert group_lengths[0] == width  # padded to its longest review, the first
        assert all(length >= ATTENTION_GROUP_SHARE * width for length in group_lengths)
        # Only a review alone may hold more scores than the cap.
        assert cap is None or reviews * width * width <= cap or reviews == 1
        assert torch.equal(token_index.flatten()[real_slots], token_index[key_mask])
        seen += token_index[key_mask].tolist()
    # Longest first, group after group; the real slots in group order, put back in row order, are the row.
    assert widths == sorted(widths, reverse=True)
    assert sorted(seen) == list(range(sum(lengths)))
    assert torch.tensor(seen)[layout["review_order"]].tolist() == list(range(sum(lengths)))


def test_a_capped_group_is_cut_where_the_next_review_would_pass_the_cap():
    # Five reviews of 10 tokens: 100 scores each per head. A cap of 250 holds two of them.
    layout = attention_layout([10] * 5, [0, 10, 20, 30, 40, 50], max_group_scores=250)
    assert [tuple(group[0].shape) for group in layout["review_groups"]] == [(2, 10), (2, 10), (1, 10)]
    uncapped = attention_layout([10] * 5, [0, 10, 20, 30, 40, 50])
    assert [tuple(group[0].shape) for group in uncapped["review_groups"]] == [(5, 10)]


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_packed_row_holds_each_review_s_tokens_and_positions(tokenizer, side):
    collator = DataCollatorWithPadding(tokenizer)
    tokenizer.padding_side = side
    try:
        batch = collator(features(tokenizer, TEXTS, [0, 1, 2, 0]))
    finally:
        tokenizer.padding_side = "right"
    row = pack(batch, position_offset=2)
    assert pack(batch, [len(tokenizer(text)["input_ids"]) for text in TEXTS], position_offset=2).keys() == row.keys()
    encoded = [tokenizer(text)["input_ids"] for text in TEXTS]
    assert row["input_ids"].tolist() == [[token for ids in encoded for token in ids]]
    assert row["position_ids"].tolist() == [[2 + position for ids in encoded for position in range(len(ids))]]
    starts = [0]
    for ids in encoded:
        starts.append(starts[-1] + len(ids))
    assert row["cu_seq_lens_q"].tolist() == starts
    assert row["max_length_q"] == max(len(ids) for ids in encoded)
    assert row["labels"].tolist() == [0, 1, 2, 0]
    assert "attention_mask" not in row
    assert torch.equal(row["token_type_ids"], torch.zeros_like(row["input_ids"]))


def test_the_loader_s_unpadded_features_stay_as_they_are_on_their_way_to_the_device():
    """Accelerate places each loader batch on the device; a window's features are Python lists, left as they are."""
    from accelerate.utils import send_to_device

    from finetune.training.micro_batches import keep_features

    features = keep_features([{"input_ids": [101, 2307, 102], "labels": 1}, {"input_ids": [101, 102], "labels": 0}])
    assert send_to_device(features, torch.device("cpu"), non_blocking=True) is features
    assert send_to_device(features, "cpu") is features
