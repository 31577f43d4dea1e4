"""Inference batches cut where padding costs more than another forward pass.

A batch pads every review to its longest, and on a CPU a padded token costs
as much as a real one. Cutting reviews sorted by length into fixed runs of
``batch_size`` pads little when there are thousands of them (neighbours are
of nearly the same length), but a server's batch of 8 reviews of any length
pads most of them to the longest: 8 reviews of 20 to 120 tokens cost 960
tokens padded against 465 real. Each forward pass also has a fixed cost,
so one pass per review is no answer either. :func:`length_batches` chooses
the cuts that minimise (fixed cost x passes + padded tokens), exactly, by
dynamic programming over the sorted lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# A forward pass's fixed cost in tokens' worth of compute: timing the packaged MiniLM's passes over
# n x L tokens (n 1 to 32, L 16 to 128) on 2 CPU cores gave ~3.5 ms a pass and ~0.09 ms a token.
# Larger models cost more per token and so less, relatively, per pass: 40 errs towards fuller batches.
CPU_PASS_COST_TOKENS = 40


def length_batches(lengths: Sequence[int], max_batch_size: int, pass_cost_tokens: float | None) -> list[np.ndarray]:
    """Row indices of each batch: rows sorted by length, cut to minimise passes x cost + padded tokens.

    Every batch holds at most ``max_batch_size`` rows of neighbouring lengths.
    ``pass_cost_tokens`` None (a device or backend whose pass cost was not
    measured) gives plain runs of ``max_batch_size`` sorted rows.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 (got {max_batch_size})")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    if pass_cost_tokens is None:
        return [order[start : start + max_batch_size] for start in range(0, len(order), max_batch_size)]
    sorted_lengths = np.asarray(lengths, dtype=np.float64)[order]
    count = len(order)
    # best[i]: the least cost of the first i sorted rows; cut[i]: where their last batch starts.
    best = np.zeros(count + 1)
    cut = np.zeros(count + 1, dtype=np.int64)
    for end in range(1, count + 1):
        starts = np.arange(max(0, end - max_batch_size), end)
        # Sorted ascending, so a batch ending at row end-1 pads to that row's length.
        costs = best[starts] + pass_cost_tokens + (end - starts) * sorted_lengths[end - 1]
        chosen = int(np.argmin(costs))
        best[end], cut[end] = costs[chosen], starts[chosen]
    batches: list[np.ndarray] = []
    end = count
    while end > 0:
        batches.append(order[cut[end] : end])
        end = int(cut[end])
    return batches[::-1]
