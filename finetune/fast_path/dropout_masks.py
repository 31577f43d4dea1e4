"""Dropout masks that are cheap to draw on a CPU, for packed rows' attention and their other dropouts.

``bernoulli_`` draws a float per entry; a comparison of random bits with the
rate is the same Bernoulli draw several times cheaper. torch's CPU generator
(a Mersenne Twister) fills a tensor on one core, 32 bits at a time, so here
the bits come from numpy's PCG64DXSM, 64 at a time, and the mask is cut into
fixed chunks drawn side by side on the intra-op threads (numpy releases the
GIL), each compared with the rate where it is drawn, straight into the
mask's dtype. About 4x cheaper again than torch's own bits on 2 cores
(docs/benchmarks/speed.md).

Each mask takes one seed from torch's default generator, and each chunk's
generator is seeded from that seed and the chunk's place: a seeded or resumed
run draws the same masks, whatever the number of threads.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn

# Entries per chunk, each drawn by a generator of its own: small enough that a hidden state's mask
# (tokens x 384) splits over 2 threads, large enough that seeding (about 6 us) costs nothing.
CHUNK_ENTRIES = 1 << 18
# What numpy writes directly; other dtypes (bfloat16) are drawn as bool and converted.
_NUMPY_DTYPES = {torch.bool: np.bool_, torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}

_workers: ThreadPoolExecutor | None = None
_worker_count = 0  # the size _workers was made with (ThreadPoolExecutor keeps its own private)


def dropout_keep(shape: torch.Size | tuple[int, ...], rate: float, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """Which entries dropout keeps (1, or True), on the CPU; each is dropped independently with probability ``rate``.

    32 random bits per entry compared with ``rate`` x 2^32: the rate is kept
    to within 2e-10 (``bernoulli_`` compares a 24-bit uniform float).
    """
    count = math.prod(shape)
    mask = np.empty(count, dtype=_NUMPY_DTYPES.get(dtype, np.bool_))
    # One draw from the default generator: what makes seeded and resumed runs draw the same masks.
    seed = int(torch.empty((), dtype=torch.int64).random_())
    # Each 64-bit draw is two 32-bit lanes, uniform on [-2^31, 2^31); a lane at or above this is kept.
    threshold = -(2**31) + round(rate * 2**32)

    def draw(start: int) -> None:
        stop = min(start + CHUNK_ENTRIES, count)
        generator = np.random.PCG64DXSM(np.random.SeedSequence((seed, start // CHUNK_ENTRIES)))
        lanes = generator.random_raw((stop - start + 1) // 2).view(np.int32)[: stop - start]
        np.greater_equal(lanes, threshold, out=mask[start:stop], casting="unsafe")

    starts = range(0, count, CHUNK_ENTRIES)
    if len(starts) == 1:
        draw(0)
    else:
        # list() waits for every chunk and raises the first error, if any.
        list(_thread_pool().map(draw, starts))
    kept = torch.from_numpy(mask).view(shape)
    return kept if kept.dtype == dtype else kept.to(dtype)


def cheaper_dropout(module: nn.Dropout) -> Any:
    """``module``'s forward with its mask drawn by ``dropout_keep`` on the CPU (the stock kernel elsewhere)."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if not module.training or module.p == 0 or hidden.device.type != "cpu":
            return nn.functional.dropout(hidden, module.p, module.training, module.inplace)
        kept = dropout_keep(hidden.shape, module.p, hidden.dtype).mul_(1.0 / (1.0 - module.p))
        return hidden * kept

    return forward


def _thread_pool() -> ThreadPoolExecutor:
    """The threads that draw a mask's chunks: as many as torch's intra-op threads, which wait meanwhile."""
    global _workers, _worker_count
    threads = max(1, torch.get_num_threads())
    if _workers is None or _worker_count != threads:
        if _workers is not None:
            _workers.shutdown(wait=False)
        _workers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dropout-masks")
        _worker_count = threads
    return _workers


def _forget_thread_pool() -> None:
    """In a forked child (a DataLoader worker, a bench system): the parent's threads are not there."""
    global _workers
    _workers = None


os.register_at_fork(after_in_child=_forget_thread_pool)
