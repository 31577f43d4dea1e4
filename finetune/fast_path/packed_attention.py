"""Reading packed rows with a stock BERT or MPNet: attention within each review, one output per review.

A packed piece (see :mod:`.micro_batches`) is one row of reviews end to end.
Every layer but attention works token by token, so it computes the row as it
would the reviews apart, with no padding. What changes is installed on the
model for a run and removed after, so that the saved folder stays a plain
``BertForSequenceClassification``:

- **attention** is computed per review: an attention function registered with
  transformers' ``AttentionInterface`` gathers the row's queries, keys and
  values into padded batches of reviews of like length (the layout the
  packer made), runs attention there with each review's key mask, and puts
  the real tokens back in row order. Padding is paid only inside attention,
  and only up to the longest review of a group. Inputs without the layout
  (padded batches, evaluation) go to SDPA as before.
- **the last layer** computes each review's first token only
  (:mod:`.bert`): the head reads nothing else, and it turns the row
  into one output per review.
- **MPNet** reads packed rows through :mod:`.mpnet` instead (SDPA
  per group of reviews, its relative-position bias in each group's mask, each
  review's first token out of the encoder), with position ids counted from
  its padding id + 1, as MPNet counts them.
- **dropout on the CPU** draws its masks from 31 random bits per entry
  (:mod:`.review_attention`), several times cheaper than ``bernoulli_``; on a
  GPU the fused kernels stay.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import FinetuneError
from .bert import PACKED_ATTENTION, LastLayerAtFirstTokens, reads_first_token_only
from .dropout_masks import cheaper_dropout
from .models import classifier_of
from .mpnet import FusedMPNetAttention, classifier_name

# Model types whose layers are all token-wise but attention: BERT's attention goes through
# AttentionInterface with absolute positions from position_ids; MPNet's (a relative bias) through mpnet.py.
PACKABLE_MODEL_TYPES = ("bert", "mpnet")


def check_packable(model: nn.Module) -> None:
    """Refuse, with the fix, a model whose packed rows would not read as its padded batches."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type == "mpnet" and classifier_name(model) == "MPNetForSequenceClassification":
        return  # read through mpnet.py, whatever attention it was loaded with
    if model_type not in PACKABLE_MODEL_TYPES or not reads_first_token_only(model):
        raise FinetuneError(
            f"padding_free works with BERT and MPNet classifiers (model_type {', '.join(PACKABLE_MODEL_TYPES)}) "
            f"and this model is a {type(model).__name__} of type {model_type!r}; set padding_free: false "
            "(micro_batch_tokens alone still cuts padding by sorting)"
        )
    attention_implementation = model.config._attn_implementation
    # Padded batches (evaluation) keep going through SDPA, so the model must have been using it.
    if attention_implementation not in ("sdpa", PACKED_ATTENTION):
        raise FinetuneError(
            f"padding_free needs attn_implementation sdpa, and this model uses {attention_implementation!r}; "
            "load it with attn_implementation='sdpa' or set padding_free: false"
        )
    _encoder_of(model)


def packed_position_offset(model: nn.Module) -> int:
    """Where ``model``'s position ids start: MPNet (as RoBERTa) counts from its padding id + 1, BERT from 0."""
    embeddings = getattr(getattr(classifier_of(model), "base_model", None), "embeddings", None)
    if getattr(getattr(model, "config", None), "model_type", None) == "mpnet" and embeddings is not None:
        return int(embeddings.padding_idx) + 1
    return 0


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

    def __init__(self, model: nn.Module) -> None:
        check_packable(model)  # refused, with the fix, before anything is changed
        self.model = model
        self._mpnet: FusedMPNetAttention | None = None
        self._last_layer: LastLayerAtFirstTokens | None = None
        if model.config.model_type == "mpnet":
            # Attention per review group with MPNet's bias; the encoder returns each review's first token.
            self._mpnet = FusedMPNetAttention(model, packed_rows=True)
        else:
            self.original_attention = model.config._attn_implementation
            model.set_attn_implementation(PACKED_ATTENTION)
            # The last layer cuts a packed row to one output per review, the first tokens the head reads.
            self._last_layer = LastLayerAtFirstTokens(model)
        # The other dropouts draw their masks as attention's does (see dropout_keep): on the CPU,
        # bernoulli_ took 8% of a packed MiniLM step (docs/benchmarks/speed.md).
        self._dropouts = [module for module in model.modules() if isinstance(module, nn.Dropout)]
        for module in self._dropouts:
            module.forward = cheaper_dropout(module)

    def remove(self) -> None:
        """Put the model's own attention, last layer and dropout back."""
        if self._mpnet is not None:
            self._mpnet.remove()
        if self._last_layer is not None:
            self.model.set_attn_implementation(self.original_attention)
            self._last_layer.remove()
        for module in self._dropouts:
            del module.forward  # the instance attribute goes; the class's forward shows through again


def _encoder_of(model: nn.Module) -> nn.Module:
    """The encoder stack of a BERT classifier (inside a PEFT wrapper too)."""
    inner = classifier_of(model)
    encoder = getattr(getattr(inner, "base_model", None), "encoder", None)
    if encoder is None:
        raise FinetuneError(
            f"padding_free found no encoder in {type(inner).__name__}; set padding_free: false for this model"
        )
    return encoder
