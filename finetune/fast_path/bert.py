"""The BERT family's readings (BERT and RoBERTa): first tokens only, and packed rows read per review.

**First tokens.** ``BertForSequenceClassification`` reads the encoder's
output at position 0 and nowhere else (its pooler takes ``[:, 0]``; the
mean-pooling layer of :mod:`..training.pooling` is a last layer like any
other, its first token holding the mean), and RoBERTa's head takes
``features[:, 0, :]``. So the last layer's queries, attention output and
feed-forward at every other token are computed to be thrown away: about a
sixth of a 6-layer model's work. :class:`LastLayerAtFirstTokens` computes that
layer's keys and values from every token, as before, and the rest at first
tokens only; its output is ``[reviews, 1, hidden]``, which the head reads as
it read the full one. The logits and every gradient are the same
(``tests/test_first_tokens.py``); hidden states or attentions of the last
layer, which a classifier's forward does not return by default, are not
computed. It reads padded batches (the attention mask's first row gives each
review's keys) and packed rows.

**Packed rows** (:mod:`..training.micro_batches`' layout, one row of reviews
end to end): every layer but attention works token by token, so attention is
the one change. :func:`packed_sdpa_attention`, registered with transformers'
``AttentionInterface``, gathers the row's queries, keys and values into padded
batches of reviews of like length, runs attention there with each review's key
mask, and puts the real tokens back in row order; the last layer then computes
first tokens only (:class:`PackedBertReading`). RoBERTa's layers are BERT's;
only its position ids differ (they start after its padding id).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from ..errors import FinetuneError
from .families import ModelFamily, count_after_padding, count_from_zero, register_family
from .mask_without_reads import sdpa_mask_without_reads
from .models import classifier_of
from .review_attention import attention, attention_per_review, first_token_attention_per_review, split_heads

PACKED_ATTENTION = "finetune_packed_sdpa"
# Per group of reviews of like length: the row position of each padded slot, which slots are real, and
# the real slots' flat indices (see micro_batches.attention_layout).
ReviewGroups = tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]


def packed_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    review_groups: ReviewGroups | None = None,
    review_order: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each review of a packed row (``review_groups`` given), else plain SDPA.

    ``query``, ``key`` and ``value`` are ``[1, heads, tokens, head_dim]``;
    returns ``[1, tokens, heads, head_dim]``, as transformers' SDPA function
    does. The layout (:func:`..micro_batches.attention_layout`) says which
    reviews share a call and where their tokens go.
    """
    if review_groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    # [1, heads, tokens, dim] -> [tokens, heads, dim]: a token's row of every head, to gather by token.
    per_token = [row[0].transpose(0, 1) for row in (query, key, value)]
    key_masks = [key_mask[:, None, None, :] for _, key_mask, _ in review_groups]
    output = attention_per_review(per_token, review_groups, key_masks, review_order, dropout, scaling)
    return output.unsqueeze(0), None


AttentionInterface.register(PACKED_ATTENTION, packed_sdpa_attention)
# Padded batches (validation inside a packed run) get SDPA's padding mask, as under "sdpa", without its host
# read; a packed row has no attention mask and gets none.
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask_without_reads)


class LastLayerAtFirstTokens:
    """``model``'s last encoder layer computing first tokens only, until :meth:`remove`."""

    reads_first_tokens = True  # evaluation inside a run that installed it needs nothing more (readings.py)

    def __init__(self, model: nn.Module) -> None:
        self.layer = classifier_of(model).base_model.encoder.layer[-1]
        self.layer.forward = _at_first_tokens(self.layer)

    def remove(self) -> None:
        """Give the layer its own forward back."""
        del self.layer.forward  # the instance attribute goes; the class's forward shows through again


def _at_first_tokens(layer: nn.Module) -> Any:
    """``layer``'s forward for a padded batch or a packed row, computed at first tokens only."""

    def forward(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args: Any, **kwargs: Any):
        self_attention = layer.attention.self
        dropout = self_attention.dropout.p if self_attention.training else 0.0
        heads = (self_attention.num_attention_heads, self_attention.attention_head_size)

        groups = kwargs.get("review_groups")
        if groups is None:
            # A padded batch: each row's first query over its keys, the mask's first row saying which.
            first = hidden_states[:, :1]
            key_mask = _key_mask(attention_mask, hidden_states)
            context = attention(
                split_heads(self_attention.query(first), *heads),
                split_heads(self_attention.key(hidden_states), *heads),
                split_heads(self_attention.value(hidden_states), *heads),
                key_mask,
                dropout,
                self_attention.scaling,
            )
            context = context.transpose(1, 2).reshape(first.shape)
        else:
            first, context = _packed_first_tokens(layer, hidden_states[0], groups, kwargs["first_token_order"], dropout)
        attention_output = layer.attention.output(context, first)
        return layer.feed_forward_chunk(attention_output)

    return forward


def _key_mask(attention_mask: torch.Tensor | None, hidden_states: torch.Tensor) -> torch.Tensor:
    """Each row's real keys, ``[rows, tokens]``, from the mask the model made for its layers (None: all real)."""
    if attention_mask is None:
        return torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
    first_row = attention_mask[:, 0, 0, :]  # [rows, 1, queries, keys]: the first query's keys
    return first_row if first_row.dtype == torch.bool else first_row == 0  # an additive mask: 0 where kept


def _packed_first_tokens(
    layer: nn.Module, tokens: torch.Tensor, groups: Any, first_token_order: torch.Tensor, dropout: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed row's first tokens and their attention context, ``[reviews, 1, hidden]`` each, in review order."""
    self_attention = layer.attention.self
    projections = (self_attention.query, self_attention.key, self_attention.value)
    key_masks = [key_mask[:, None, None, :] for _, key_mask, _ in groups]
    return first_token_attention_per_review(
        tokens,
        projections,
        self_attention.num_attention_heads,
        groups,
        key_masks,
        first_token_order,
        dropout,
        self_attention.scaling,
    )


class PackedBertReading:
    """Packed rows read per review on a BERT or RoBERTa classifier until :meth:`remove`; padded batches as before.

    Attention goes through :func:`packed_sdpa_attention` (per review where a
    row's layout is given, SDPA otherwise), and the last layer cuts a packed
    row to one output per review, the first tokens the head reads.
    """

    reads_first_tokens = True

    def __init__(self, model: nn.Module) -> None:
        self.original_attention = model.config._attn_implementation
        # Padded batches (evaluation) keep going through SDPA, so the model must have been using it.
        if self.original_attention not in ("sdpa", PACKED_ATTENTION):
            raise FinetuneError(
                f"padding_free needs attn_implementation sdpa, and this model uses {self.original_attention!r}; "
                "load it with attn_implementation='sdpa' or set padding_free: false"
            )
        self.model = model
        model.set_attn_implementation(PACKED_ATTENTION)
        self._last_layer = LastLayerAtFirstTokens(model)

    def remove(self) -> None:
        """Put the model's own attention and last layer back."""
        self.model.set_attn_implementation(self.original_attention)
        self._last_layer.remove()


def _bert_family(name: str, classifier: str, position_offset: Any) -> ModelFamily:
    """A family read as BERT is: its layers, attention and head are BERT's, whatever its positions."""
    return ModelFamily(
        name=name,
        classifier=classifier,
        scoring=lambda model, fused_attention: LastLayerAtFirstTokens(model),
        # Padded training batches read as stock; their masks skip transformers' host read (readings.py).
        padded_training=lambda model, fused_attention: None,
        packed_training=PackedBertReading,
        position_offset=position_offset,
    )


register_family("bert", _bert_family("BERT", "BertForSequenceClassification", count_from_zero))
# RoBERTa's layers are BERT's; its positions start after its padding id and its head reads the first token.
register_family("roberta", _bert_family("RoBERTa", "RobertaForSequenceClassification", count_after_padding))
