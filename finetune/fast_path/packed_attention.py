"""Packed rows read by a stock classifier of a known family: which models can be packed, and how it is installed.

A packed piece (see :mod:`..training.micro_batches`) is one row of reviews
end to end. Every layer but attention works token by token, so it computes
the row as it would the reviews apart, with no padding. Each family gives its
own packed reading (:mod:`.families`: BERT's and RoBERTa's in :mod:`.bert`,
MPNet's in :mod:`.mpnet`): attention within each review, and the last layer
at each review's first token, which turns the row into one output per review.
What changes is installed for a run and removed after, so that the saved
folder stays a plain transformers folder. On the CPU, dropout draws its masks
from 31 random bits per entry (:mod:`.dropout_masks`), several times cheaper
than ``bernoulli_``; on a GPU the fused kernels stay.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import FinetuneError
from .dropout_masks import cheaper_dropout
from .families import ModelFamily, family_of, known_families
from .models import classifier_name, classifier_of


def packable_family(model: nn.Module) -> ModelFamily:
    """``model``'s family; a model the fast path cannot pack is refused, with the fix."""
    family = family_of(model)
    if family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise FinetuneError(
            f"padding_free works with the sequence classifiers of {known_families()} "
            f"and this model is a {classifier_name(model)} of type {model_type!r}; "
            "set padding_free: false (micro_batch_tokens alone still cuts padding by sorting)"
        )
    encoder = getattr(getattr(classifier_of(model), "base_model", None), "encoder", None)
    if encoder is None:
        raise FinetuneError(
            f"padding_free found no encoder in {classifier_name(model)}; set padding_free: false for this model"
        )
    return family


# On a CPU, each layer's attention allocates several tensors the size of a group's scores (scores,
# dropout mask, probabilities, their gradients). glibc serves a block above its mmap threshold (at most
# 32 MiB) with fresh pages, zero-filled by the kernel a page fault at a time, and unmaps it on free, so such
# blocks are faulted in again at every step: 8 reviews of 512 tokens in one group (100 MB of scores) took
# 149,000 faults and 1.7x the time of the same scores in groups of 2 (docs/benchmarks/speed.md). A GPU's
# allocator caches blocks and its kernels never hold the scores, so groups there stay as their lengths say.
CPU_ATTENTION_GROUP_BYTES = 24 * 2**20


def attention_group_limit(model: nn.Module, device: torch.device) -> int | None:
    """The most attention scores per head a packed row's group of reviews may hold on ``device``; None: no cap."""
    if device.type != "cpu":
        return None
    heads = int(model.config.num_attention_heads)
    return max(1, CPU_ATTENTION_GROUP_BYTES // (heads * torch.float32.itemsize))


class PackedReading:
    """Packed rows read per review on ``model`` until :meth:`remove`; padded batches read as before."""

    reads_first_tokens = True  # every family's packed reading computes the head's first tokens only

    def __init__(self, model: nn.Module) -> None:
        # Refused, with the fix, before anything is changed (the family's reading checks its own needs first).
        self._family_reading = packable_family(model).packed_training(model)
        # The other dropouts draw their masks as attention's does (see dropout_keep): on the CPU,
        # bernoulli_ took 8% of a packed MiniLM step (docs/benchmarks/speed.md).
        self._dropouts = [module for module in model.modules() if isinstance(module, nn.Dropout)]
        for module in self._dropouts:
            module.forward = cheaper_dropout(module)

    def remove(self) -> None:
        """Put the model's own attention, last layer and dropout back."""
        self._family_reading.remove()
        for module in self._dropouts:
            del module.forward  # the instance attribute goes; the class's forward shows through again
