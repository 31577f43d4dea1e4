"""How N processes share each window's samples so that they train exactly as one process with N x b.

Accelerate shards a map-style training set by dealing out the micro-batches
of the one-process order round robin: rank r takes micro-batches r, N + r,
2N + r, ... So round k (global micro-batch k) holds exactly the samples of
micro-batch k of one process with micro-batch N x b, and a window of n rounds
holds exactly that process's window. Only the tail needs care: by default
(``even_batches``) Accelerate fills the last round up by repeating samples
from the start of the epoch, which would train those samples twice. Here the
last round is left short instead (some ranks get a short share or none), and
a rank with no share still runs the round, with weight 0, so that it joins the
window's one gradient all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch
from transformers.trainer_pt_utils import LengthGroupedSampler

T = TypeVar("T")


def with_empty_shares(micro_batches: Iterable[T], rounds: int) -> Iterator[T | None]:
    """This rank's micro-batches, then ``None`` for each remaining round, up to ``rounds`` in all.

    Every rank must take part in every round (DDP's all-reduce and buffer
    broadcasts are collective), but a rank whose share of the last round is
    empty has one micro-batch fewer than the others; ``None`` stands for that
    empty share.
    """
    taken = 0
    for micro_batch in micro_batches:
        yield micro_batch
        taken += 1
    for _ in range(rounds - taken):
        yield None


def stand_in_batch(dataloader: Any) -> dict[str, Any]:
    """The training set's first sample, collated: what a rank with an empty share forwards (with weight 0)."""
    return dataloader.collate_fn([dataloader.dataset[0]])


class SeedableLengthGroupedSampler(LengthGroupedSampler):
    """``LengthGroupedSampler`` whose order depends only on the seed and the epoch, so every rank draws the same one.

    Stock ``LengthGroupedSampler`` shuffles with the default torch generator,
    which drifts apart between ranks (their dropout draws differ), so ranks
    would shard different orders and some samples would train twice in an
    epoch and others not at all. Like Accelerate's ``SeedableRandomSampler``,
    this one reseeds with ``seed + epoch`` at each epoch.
    """

    def __init__(self, batch_size: int, lengths: list[int], seed: int) -> None:
        super().__init__(batch_size, lengths=lengths)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order on the next iteration (Accelerate's dataloader calls this each epoch)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return super().__iter__()
