"""Pieces reach a GPU without a host sync: pinned host memory, non-blocking copies.

On the CPU the copies are checked by what they are asked to do (every host
tensor of a packed piece pinned, then copied with ``non_blocking=True``,
everything else left as it is); with ``FINETUNE_TEST_DEVICE=cuda`` by what
CUDA reports: no synchronizing call while a piece is moved, against at least
one per tensor for Trainer's own ``_prepare_input`` (the negative control),
the same values as Trainer's copy, and at most one sync per update in a
packed ReviewTrainer run (issue 47: "no host sync per micro-batch, one per
update at most").
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import TEST_ON_CPU, quiet_args, review_dataset
from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer

from finetune import ReviewTrainer
from finetune.bench.host_syncs import CudaSyncWarnings, HostReadsWindow
from finetune.training.device_copies import to_device_without_waiting
from finetune.training.micro_batches import cut_window

on_cuda_only = pytest.mark.skipif(TEST_ON_CPU, reason="needs CUDA (FINETUNE_TEST_DEVICE=cuda)")


def _packed_piece(tokenizer):
    features = list(review_dataset(tokenizer, 12, max_words=30))
    (piece,) = cut_window([features], 100_000, DataCollatorWithPadding(tokenizer), packed=True)
    return piece


def _leaves(data):
    """The tensors and other values of a nested batch, in a fixed order, with the path to each."""
    if isinstance(data, dict):
        return [(f"{key}.{path}", leaf) for key, value in data.items() for path, leaf in _leaves(value)]
    if isinstance(data, (tuple, list)):
        return [(f"{index}.{path}", leaf) for index, value in enumerate(data) for path, leaf in _leaves(value)]
    return [("", data)]


def test_every_host_tensor_is_pinned_then_copied_without_blocking(tokenizer, monkeypatch):
    piece = _packed_piece(tokenizer)
    tensors = [leaf for _, leaf in _leaves(piece) if isinstance(leaf, torch.Tensor)]
    assert len(tensors) >= 8  # ids, types, positions, labels, boundaries, the groups' indices, the orders
    pinned_copies, copies = [], []

    def pin_memory(tensor):
        pinned = tensor.clone()
        pinned_copies.append(pinned)
        return pinned

    def to(tensor, device, non_blocking=False):
        copies.append((tensor, torch.device(device), non_blocking))
        return tensor.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    moved = to_device_without_waiting(piece, torch.device("cuda"))
    monkeypatch.undo()

    assert len(pinned_copies) == len(tensors)
    assert len(copies) == len(tensors)
    # Each copy reads a pinned tensor (not the pageable original), goes to the GPU and does not block.
    assert all(any(source is pinned for pinned in pinned_copies) for source, _, _ in copies)
    assert all(device.type == "cuda" and non_blocking for _, device, non_blocking in copies)
    # The structure and every value come through; ints (the longest review) stay ints.
    assert [path for path, _ in _leaves(moved)] == [path for path, _ in _leaves(piece)]
    assert type(moved["review_groups"]) is tuple and type(moved["review_groups"][0]) is tuple
    for (path, before), (_, after) in zip(_leaves(piece), _leaves(moved)):
        if isinstance(before, torch.Tensor):
            assert after.dtype == before.dtype and torch.equal(after, before), path
        else:
            assert after == before and type(after) is type(before), path


def test_on_the_cpu_pieces_are_left_where_they_are(tokenizer):
    piece = _packed_piece(tokenizer)
    moved = to_device_without_waiting(piece, torch.device("cpu"))
    assert all(
        after is before or not isinstance(before, torch.Tensor)
        for (_, before), (_, after) in zip(_leaves(piece), _leaves(moved))
    )


@on_cuda_only
def test_a_packed_piece_reaches_the_gpu_with_no_sync_and_the_values_of_trainers_copy(tokenizer, tmp_path):
    piece = _packed_piece(tokenizer)
    stock = Trainer(model=torch.nn.Linear(1, 1), args=quiet_args(tmp_path))
    syncs = CudaSyncWarnings()
    with syncs.recording():
        syncs.counting = True
        moved = to_device_without_waiting(piece, torch.device("cuda"))
        syncs.counting = False
        ours = syncs.count
        syncs.counting = True
        reference = stock._prepare_input(piece)
        syncs.counting = False
    assert ours == 0
    assert syncs.count - ours >= 8  # the negative control: a blocking copy per tensor
    for (path, expected), (_, actual) in zip(_leaves(reference), _leaves(moved)):
        if isinstance(expected, torch.Tensor):
            assert actual.device == expected.device and torch.equal(actual, expected), path
        else:
            assert actual == expected, path


@on_cuda_only
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded-by-tokens"])
def test_a_review_trainer_run_cut_by_tokens_syncs_at_most_once_per_update(tiny_model_dir, tokenizer, tmp_path, packed):
    """Pieces copied without waiting, and (padded) masked without transformers' read: the update's read alone."""
    micro_batch, accumulation_steps, updates = 4, 3, 3
    args = quiet_args(
        tmp_path,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation_steps,
        max_steps=updates,
        max_grad_norm=1.0,
        padding_free=packed,
        micro_batch_tokens=64,
    )
    syncs = CudaSyncWarnings()
    with syncs.recording():
        trainer = ReviewTrainer(
            model=copy.deepcopy(BertForSequenceClassification.from_pretrained(tiny_model_dir)),
            args=args,
            train_dataset=review_dataset(tokenizer, micro_batch * accumulation_steps * updates),
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[HostReadsWindow(syncs)],
        )
        assert trainer.train().global_step == updates
    assert syncs.count / updates <= 1


def test_review_trainer_sends_each_tensor_of_a_piece_through_once_on_cuda(tokenizer, tiny_model_dir, tmp_path):
    # On the CPU the trainer's device is made to read "cuda" and the copy is recorded, not made: Trainer's own
    # walk of the piece brings every tensor to the copy once, and nothing else (ints stay as they are).
    from unittest import mock

    from finetune.training import trainer as trainer_module

    piece = _packed_piece(tokenizer)
    tensors = [leaf for _, leaf in _leaves(piece) if isinstance(leaf, torch.Tensor)]
    trainer = ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir), args=quiet_args(tmp_path)
    )
    copied = []
    with (
        mock.patch.object(type(trainer.args), "device", torch.device("cuda")),
        mock.patch.object(trainer_module, "to_device_without_waiting", lambda t, device: copied.append(t) or t),
        mock.patch.object(torch.Tensor, "to", lambda tensor, *args, **kwargs: tensor),
    ):
        moved = trainer._prepare_inputs(piece)
    assert len(copied) == len(tensors) and all(any(t is c for c in copied) for t in tensors)
    assert [path for path, _ in _leaves(moved)] == [path for path, _ in _leaves(piece)]
