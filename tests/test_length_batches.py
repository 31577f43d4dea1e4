"""Inference batches cut by length: every row once, at most batch_size a batch, and the cheapest cuts."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from finetune.data.length_batches import length_batches


def brute_force_least_cost(lengths: list[int], max_batch_size: int, pass_cost: float) -> float:
    """Try every way of cutting the sorted lengths into runs (2^(n-1) of them) and keep the cheapest."""
    ordered = sorted(lengths)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        runs, run = [], [ordered[0]]
        for length, cut_here in zip(ordered[1:], cuts):
            if cut_here:
                runs.append(run)
                run = []
            run.append(length)
        runs.append(run)
        if any(len(run) > max_batch_size for run in runs):
            continue
        best = min(best, sum(pass_cost + len(run) * max(run) for run in runs))
    return best


def cost_of(batches: list[np.ndarray], lengths: list[int], pass_cost: float) -> float:
    return sum(pass_cost + len(batch) * max(lengths[row] for row in batch) for batch in batches)


@pytest.mark.parametrize("seed", range(12))
def test_the_cuts_cost_what_the_best_of_every_cut_costs(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(3, 128) for _ in range(rng.randint(1, 11))]
    max_batch_size = rng.choice([1, 2, 4, 8, 32])
    pass_cost = rng.choice([0.0, 10.0, 40.0, 500.0])
    batches = length_batches(lengths, max_batch_size, pass_cost)
    assert sorted(int(row) for batch in batches for row in batch) == list(range(len(lengths)))
    assert all(1 <= len(batch) <= max_batch_size for batch in batches)
    least = brute_force_least_cost(lengths, max_batch_size, pass_cost)
    assert cost_of(batches, lengths, pass_cost) == pytest.approx(least)


def test_a_mixed_batch_is_split_where_padding_costs_more_than_a_pass():
    # 7 short reviews and 1 long: padding all 8 to 120 costs 960 tokens; split, 7 x 20 + 120 + one pass more.
    lengths = [20, 120, 20, 20, 20, 20, 20, 20]
    batches = length_batches(lengths, 32, 40)
    assert [sorted(int(row) for row in batch) for batch in batches] == [[0, 2, 3, 4, 5, 6, 7], [1]]


def test_with_a_costly_pass_the_fewest_batches_of_sorted_rows():
    lengths = [5, 9, 1, 7, 3, 8, 2]
    batches = length_batches(lengths, 3, 10_000)
    assert len(batches) == 3
    assert [lengths[row] for batch in batches for row in batch] == sorted(lengths)


def test_without_a_pass_cost_the_batches_are_plain_runs_of_sorted_rows():
    lengths = [5, 9, 1, 7, 3, 8, 2]
    batches = length_batches(lengths, 3, None)
    assert [[lengths[row] for row in batch] for batch in batches] == [[1, 2, 3], [5, 7, 8], [9]]


def test_no_rows_no_batches():
    assert length_batches([], 32, 40) == []
