"""Dropout masks drawn from numpy's generators in chunks: the Bernoulli draw they stand for, reproducibly."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from finetune.fast_path import dropout_masks
from finetune.fast_path.dropout_masks import CHUNK_ENTRIES, dropout_keep

ENTRIES = 4_000_000  # over 15 chunks


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_masks_drop_each_entry_at_the_rate_independently(rate):
    torch.manual_seed(0)
    kept = dropout_keep(torch.Size([ENTRIES]), rate).double()
    standard_error = (rate * (1 - rate) / kept.numel()) ** 0.5
    assert abs((1 - kept.mean().item()) - rate) < 6 * standard_error
    # Neighbours are independent (the two lanes of one 64-bit draw among them): kept pairs are (1 - rate)^2.
    both = (kept[:-1] * kept[1:]).mean().item()
    assert abs(both - (1 - rate) ** 2) < 6 * (both * (1 - both) / kept.numel()) ** 0.5


def test_chunks_are_drawn_independently_of_each_other():
    """Each chunk has a generator of its own; seeded alike, they would repeat one another's mask."""
    torch.manual_seed(0)
    kept = dropout_keep(torch.Size([4 * CHUNK_ENTRIES]), 0.5).view(4, CHUNK_ENTRIES)
    for other in range(1, 4):
        agree = (kept[0] == kept[other]).double().mean().item()
        assert abs(agree - 0.5) < 6 * (0.25 / CHUNK_ENTRIES) ** 0.5


def test_a_seeded_draw_is_the_same_whatever_the_threads():
    threads = torch.get_num_threads()
    try:
        masks = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            torch.manual_seed(7)
            masks.append(dropout_keep((3, 5, CHUNK_ENTRIES // 4 + 11), 0.1))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])
    # The next draw from the same generator is another mask.
    assert not torch.equal(masks[2], dropout_keep((3, 5, CHUNK_ENTRIES // 4 + 11), 0.1))


def test_the_restored_generator_state_draws_the_same_mask():
    """What exact resume relies on: the masks follow torch's default generator, whose state a checkpoint keeps."""
    torch.manual_seed(3)
    dropout_keep((1000,), 0.1)
    state = torch.get_rng_state()
    first = dropout_keep((2 * CHUNK_ENTRIES + 5,), 0.1)
    torch.set_rng_state(state)
    assert torch.equal(first, dropout_keep((2 * CHUNK_ENTRIES + 5,), 0.1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_a_mask_in_a_float_dtype_is_the_bool_mask_as_ones_and_zeros(dtype):
    torch.manual_seed(5)
    kept = dropout_keep((7, CHUNK_ENTRIES // 3), 0.3)
    torch.manual_seed(5)
    as_dtype = dropout_keep((7, CHUNK_ENTRIES // 3), 0.3, dtype)
    assert as_dtype.dtype == dtype and as_dtype.shape == kept.shape
    assert torch.equal(as_dtype, kept.to(dtype))


def test_cheaper_dropout_is_dropout_with_that_mask():
    """Forward and backward: the hidden states times the kept mask over 1 - p, zeros where dropped."""
    from torch import nn

    from finetune.fast_path.dropout_masks import cheaper_dropout

    module = nn.Dropout(0.25).train()
    forward = cheaper_dropout(module)
    hidden = torch.randn(6, 40, 384, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(11)
    out = forward(hidden)
    torch.manual_seed(11)
    expected = hidden.detach() * dropout_keep(hidden.shape, 0.25).double() / 0.75
    assert torch.allclose(out, expected, rtol=1e-15, atol=0)
    out.sum().backward()
    assert torch.allclose(hidden.grad, (expected != 0).double() / 0.75, rtol=1e-15, atol=0)
    module.eval()
    assert torch.equal(forward(hidden), hidden)


def _draw_in_child(queue):
    # Counted by numpy: a torch reduction this size runs on OpenMP threads, which hang in a child forked
    # from a parent that had used them (the case under -n 0, with two torch threads), whatever the mask.
    queue.put(int(dropout_keep((3 * CHUNK_ENTRIES,), 0.5).numpy().sum()))


def test_a_forked_process_draws_masks_with_threads_of_its_own():
    """A DataLoader worker or a bench system is forked; the parent's pool threads do not exist there."""
    dropout_keep((3 * CHUNK_ENTRIES,), 0.5)  # the parent's pool is running
    assert dropout_masks._workers is not None
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_draw_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's draw did not finish: it waited on the parent's threads")
    assert child.exitcode == 0
    assert abs(queue.get(timeout=5) - 1.5 * CHUNK_ENTRIES) < 6 * (0.75 * CHUNK_ENTRIES) ** 0.5
