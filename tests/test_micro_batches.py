"""Cutting a window into pieces by tokens (finetune/training/micro_batches.py), checked against brute force."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithPadding

from finetune.training.micro_batches import cut_window, pack, plan_pieces


def padded_cost(lengths, piece):
    return len(piece) * max(lengths[index] for index in piece)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=24),
    budget=st.integers(min_value=1, max_value=400),
    packed=st.booleans(),
)
def test_every_sample_once_longest_first_and_within_the_budget(lengths, budget, packed):
    pieces = plan_pieces(lengths, budget, packed)
    assert sorted(index for piece in pieces for index in piece) == list(range(len(lengths)))
    in_order = [lengths[index] for piece in pieces for index in piece]
    assert in_order == sorted(lengths, reverse=True)
    for piece in pieces:
        cost = sum(lengths[index] for index in piece) if packed else padded_cost(lengths, piece)
        # Only a single review longer than the budget may exceed it.
        assert cost <= budget or len(piece) == 1
    for before, after in itertools.pairwise(pieces):
        # Greedy: the next piece's first review did not fit into the piece before it.
        grown = [*before, after[0]]
        cost = sum(lengths[index] for index in grown) if packed else padded_cost(lengths, grown)
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
