"""Attention over padded groups of reviews, and dropout masks that are cheap to draw on a CPU.

Packed rows (:mod:`.packed_attention`) and the last layer read at first tokens
(:mod:`.bert`, :mod:`.mpnet`) compute attention on a padded batch of reviews of
like length, each review attending to its own real keys. On a GPU that is
SDPA, dropout included. On a CPU SDPA takes its unfused path as soon as
attention has dropout and draws the mask with ``bernoulli_``: a float per
attention weight, about a third of a MiniLM training step on drugscom
reviews. Here the mask comes from :mod:`.dropout_masks` instead, the same
Bernoulli draw several times cheaper (docs/benchmarks/speed.md).
"""

from __future__ import annotations

import torch
from torch import nn

from .dropout_masks import dropout_keep


def split_heads(states: torch.Tensor, heads: int, head_size: int) -> torch.Tensor:
    """Projections ``[reviews, tokens, heads x size]`` as SDPA takes them: ``[reviews, heads, tokens, size]``."""
    return states.view(*states.shape[:2], heads, head_size).transpose(1, 2)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor,
    dropout: float,
    scaling: float,
) -> torch.Tensor:
    """SDPA of ``[reviews, heads, queries, dim]`` over each review's real keys (``key_mask``, ``[reviews, keys]``)."""
    return masked_attention(query, key, value, key_mask[:, None, None, :], dropout, scaling)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: float,
    scaling: float,
) -> torch.Tensor:
    """SDPA with ``mask`` (bool, True where a key is read; or float, added to the scores), cheaper dropout on a CPU."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(query.dtype)  # SDPA takes an additive mask in the query's dtype only
    if dropout > 0 and query.device.type == "cpu":
        # SDPA's CPU kernels take no dropout: its unfused path would draw a float per weight.
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
                ~mask, torch.finfo(query.dtype).min
            )
        return biased_attention_with_dropout(query, key, value, mask, dropout, scaling)
    return nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )


def attention_per_review(
    per_token: list[torch.Tensor],
    review_groups: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...],
    masks: list[torch.Tensor],
    review_order: torch.Tensor,
    dropout: float,
    scaling: float,
) -> torch.Tensor:
    """Attention within each review of a packed row: ``per_token`` query, key, value ``[tokens, heads, dim]``.

    Each group of reviews (``micro_batches.attention_layout``) is gathered into a
    padded ``[reviews, heads, width, dim]`` batch and read with its mask (see
    :func:`masked_attention`); the real tokens come back in row order,
    ``[tokens, heads, dim]``.
    """
    outputs = []
    for (token_index, _, real_slots), mask in zip(review_groups, masks, strict=True):
        reviews, width = token_index.shape
        # index_select, not indexing: its backward (index_add_) is several times faster on the CPU than
        # indexing's (index_put_).
        padded = [
            row.index_select(0, token_index.flatten()).view(reviews, width, *row.shape[1:]).transpose(1, 2)
            for row in per_token
        ]
        output = masked_attention(*padded, mask, dropout, scaling)
        # Back to one row per token, the padding slots left out.
        flat = output.transpose(1, 2).reshape(reviews * width, *output.shape[1::2])
        outputs.append(flat.index_select(0, real_slots))
    return torch.cat(outputs).index_select(0, review_order)


def first_token_attention_per_review(
    tokens: torch.Tensor,
    projections: tuple[nn.Module, nn.Module, nn.Module],
    heads: int,
    review_groups: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...],
    masks: list[torch.Tensor],
    first_token_order: torch.Tensor,
    dropout: float,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each review's first token of a packed row ``[tokens, hidden]`` and its attention context over the review.

    ``projections`` are the layer's query, key and value; ``masks`` one per group
    (see :func:`masked_attention`), for the first query's row. Both outputs
    are ``[reviews, 1, hidden]``, in the row's review order (``first_token_order``).
    """
    query_projection, key_projection, value_projection = projections
    keys, values = (
        projection(tokens).view(tokens.shape[0], heads, -1) for projection in (key_projection, value_projection)
    )
    head_size = keys.shape[-1]
    firsts, contexts = [], []
    for (token_index, _, _), mask in zip(review_groups, masks, strict=True):
        reviews, width = token_index.shape
        first = tokens.index_select(0, token_index[:, 0])  # a review's first slot is its first token
        query = query_projection(first).view(reviews, heads, 1, head_size)
        padded = [
            row.index_select(0, token_index.flatten()).view(reviews, width, heads, head_size).transpose(1, 2)
            for row in (keys, values)
        ]
        context = masked_attention(query, *padded, mask, dropout, scaling)
        firsts.append(first)
        contexts.append(context.reshape(reviews, heads * head_size))
    first = torch.cat(firsts).index_select(0, first_token_order).unsqueeze(1)
    return first, torch.cat(contexts).index_select(0, first_token_order).unsqueeze(1)


def biased_attention_with_dropout(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    additive_mask: torch.Tensor | None,
    dropout: float,
    scaling: float,
) -> torch.Tensor:
    """``softmax(q k^T * scaling + additive_mask)`` with dropout, times ``v``: SDPA's unfused path, a cheaper mask.

    The 1 / (1 - dropout) rescaling is applied to the output, which is
    smaller than the weights.
    """
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))
    if additive_mask is not None:
        # In place: matmul's backward needs its inputs, not its output. Masked keys get no weight.
        scores.add_(additive_mask)
    probabilities = torch.softmax(scores, dim=-1)
    # A float mask: multiplying by it is one pass each way, where a bool mask's where or masked_fill
    # took several times as long on the CPU.
    kept = dropout_keep(probabilities.shape, dropout, probabilities.dtype)
    return torch.matmul(probabilities * kept, value) * (1.0 / (1.0 - dropout))
