"""Reading packed rows with a stock BERT: attention within each review, one output per review.

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
- **the last layer** computes each review's first token only (keys and
  values still from every token): the pooler and the classifier read nothing
  else. The mean-pooling layer (:mod:`.pooling`) is a last layer like any
  other: its first token holds its own review's mean.
- **dropout on the CPU** draws its masks from 31 random bits per entry
  (``dropout_keep``), several times cheaper than ``bernoulli_``, which took
  about a third of a MiniLM step; on a GPU the fused kernels stay.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.utils import ModelOutput

from ..errors import FinetuneError

# Model types whose layers are all token-wise but attention, and whose attention goes through
# AttentionInterface with absolute positions from position_ids (MPNet's relative bias does not).
PACKABLE_MODEL_TYPES = ("bert",)
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
    outputs = []
    for token_index, key_mask, real_slots in review_groups:
        reviews, width = token_index.shape
        # [reviews, width, heads, dim] -> [reviews, heads, width, dim]. index_select, not indexing: its
        # backward (index_add_) is several times faster on the CPU than indexing's (index_put_).
        padded = [
            row.index_select(0, token_index.flatten()).view(reviews, width, *row.shape[1:]).transpose(1, 2)
            for row in per_token
        ]
        output = _attention(*padded, key_mask, dropout, scaling)
        # Back to one row per token, the padding slots left out.
        flat = output.transpose(1, 2).reshape(reviews * width, *output.shape[1::2])
        outputs.append(flat.index_select(0, real_slots))
    return torch.cat(outputs).index_select(0, review_order).unsqueeze(0), None


def _attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor, dropout: float, scaling: float
) -> torch.Tensor:
    """SDPA over a padded group of reviews, each attending to its own real keys (``key_mask``)."""
    if dropout > 0 and query.device.type == "cpu":
        return _attention_with_dropout(query, key, value, key_mask, dropout, scaling)
    return nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=key_mask[:, None, None, :], dropout_p=dropout, scale=scaling
    )


def _attention_with_dropout(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor, dropout: float, scaling: float
) -> torch.Tensor:
    """Attention with dropout on its probabilities, as SDPA computes it on the CPU, with a cheaper mask.

    With dropout, the CPU's SDPA takes its unfused path and draws the mask
    with ``bernoulli_``: a float per attention weight, half a training step
    of MiniLM on drugscom reviews. Here the mask comes from 31 random bits per
    weight, compared with ``dropout`` x 2^31: the same Bernoulli draw (its
    rate within 3e-10 of ``dropout``), several times cheaper. The 1 / (1 -
    dropout) rescaling is applied to the output, which is smaller than the weights.
    ``keep`` marks each review's real keys, ``[reviews, max_length]``.
    """
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))
    # In place: matmul's backward needs its inputs, not its output. Padding keys get no weight.
    padding_bias = torch.zeros(keep.shape, dtype=scores.dtype, device=scores.device)
    scores.add_(padding_bias.masked_fill_(~keep, torch.finfo(scores.dtype).min)[:, None, None, :])
    probabilities = torch.softmax(scores, dim=-1)
    # A float mask: multiplying by it is one pass each way, where a bool mask's where or masked_fill
    # takes several times as long on the CPU (measured, docs/benchmarks/speed.md).
    kept = dropout_keep(probabilities.shape, dropout, query.device).to(probabilities.dtype)
    return torch.matmul(probabilities * kept, value) * (1.0 / (1.0 - dropout))


def dropout_keep(shape: torch.Size, rate: float, device: torch.device) -> torch.Tensor:
    """Which entries dropout keeps (True); each is dropped independently with probability ``rate``.

    Drawn from the default generator, so a seeded (or resumed) run draws the same masks.
    """
    bits = torch.empty(shape, dtype=torch.int32, device=device).random_()  # uniform on [0, 2^31)
    return bits >= round(rate * 2**31)


AttentionInterface.register(PACKED_ATTENTION, packed_sdpa_attention)
# Padded batches get SDPA's padding mask, as under "sdpa"; a packed row has no padding and gets none.
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)


def check_packable(model: nn.Module) -> None:
    """Refuse, with the fix, a model whose packed rows would not read as its padded batches."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in PACKABLE_MODEL_TYPES:
        raise FinetuneError(
            f"padding_free works with BERT models (model_type {', '.join(PACKABLE_MODEL_TYPES)}) and this one is "
            f"{model_type!r}; set padding_free: false (micro_batch_tokens alone still cuts padding by sorting)"
        )


class PackedReading:
    """Packed rows read per review on ``model`` until :meth:`remove`; padded batches read as before."""

    def __init__(self, model: nn.Module) -> None:
        check_packable(model)
        self.model = model
        self.original_attention = model.config._attn_implementation
        # Padded batches (evaluation) keep going through SDPA, so the model must have been using it.
        if self.original_attention not in ("sdpa", PACKED_ATTENTION):
            raise FinetuneError(
                f"padding_free needs attn_implementation sdpa, and this model uses "
                f"{self.original_attention!r}; load it with attn_implementation='sdpa' or set padding_free: false"
            )
        model.set_attn_implementation(PACKED_ATTENTION)
        encoder = _encoder_of(model)
        self._hook = encoder.register_forward_hook(_first_token_of_each_review, with_kwargs=True)
        # The other dropouts draw their masks as attention's does (see dropout_keep): on the CPU,
        # bernoulli_ took 8% of a packed MiniLM step (docs/benchmarks/speed.md).
        self._dropouts = [module for module in model.modules() if isinstance(module, nn.Dropout)]
        for module in self._dropouts:
            module.forward = _cheaper_dropout(module)
        # Only each review's first token leaves the encoder, so the last layer computes only those.
        self._last_layer = encoder.layer[-1]
        self._last_layer.forward = _first_tokens_only(self._last_layer)

    def remove(self) -> None:
        """Put the model's own attention and dropout back and drop the hook."""
        self._hook.remove()
        self.model.set_attn_implementation(self.original_attention)
        for module in (*self._dropouts, self._last_layer):
            del module.forward  # the instance attribute goes; the class's forward shows through again


def _cheaper_dropout(module: nn.Dropout) -> Any:
    """``module``'s forward with its mask drawn by ``dropout_keep`` on the CPU (the stock kernel elsewhere)."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if not module.training or module.p == 0 or hidden.device.type != "cpu":
            return nn.functional.dropout(hidden, module.p, module.training, module.inplace)
        kept = dropout_keep(hidden.shape, module.p, hidden.device).to(hidden.dtype).mul_(1.0 / (1.0 - module.p))
        return hidden * kept

    return forward


def _first_tokens_only(layer: nn.Module) -> Any:
    """``layer``'s forward, computing a packed row's outputs at each review's first token only.

    The pooler and the classifier read nothing else, so the rest of the last
    layer's outputs (their queries, attention output and feed-forward) would
    be computed to be thrown away: about a sixth of a 6-layer model's work.
    Keys and values still come from every token. Returns ``[reviews, 1, hidden]``
    in the row's review order; padded batches take the layer's own forward.
    """
    own_forward = layer.forward

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        groups = kwargs.get("review_groups")
        if groups is None:
            return own_forward(hidden_states, *args, **kwargs)
        attention = layer.attention.self
        heads, head_size = attention.num_attention_heads, attention.attention_head_size
        tokens = hidden_states[0]
        keys = attention.key(tokens).view(-1, heads, head_size)
        values = attention.value(tokens).view(-1, heads, head_size)
        firsts, contexts = [], []
        dropout = attention.dropout.p if attention.training else 0.0
        for token_index, key_mask, _ in groups:
            reviews, width = token_index.shape
            first = tokens.index_select(0, token_index[:, 0])  # a review's first slot is its first token
            query = attention.query(first).view(reviews, heads, 1, head_size)
            padded = [
                row.index_select(0, token_index.flatten()).view(reviews, width, heads, head_size)
                for row in (keys, values)
            ]
            context = _attention(query, *(row.transpose(1, 2) for row in padded), key_mask, dropout, attention.scaling)
            firsts.append(first)
            contexts.append(context.reshape(reviews, heads * head_size))
        order = kwargs["first_token_order"]
        first = torch.cat(firsts).index_select(0, order)
        attention_output = layer.attention.output(torch.cat(contexts).index_select(0, order), first)
        return layer.feed_forward_chunk(attention_output).unsqueeze(1)

    return forward


def _encoder_of(model: nn.Module) -> nn.Module:
    """The encoder stack of a BERT classifier (inside a PEFT wrapper too)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    encoder = getattr(getattr(inner, "base_model", None), "encoder", None)
    if encoder is None:
        raise FinetuneError(
            f"padding_free found no encoder in {type(inner).__name__}; set padding_free: false for this model"
        )
    return encoder


def _first_token_of_each_review(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
    """For a packed row, the encoder's output cut to each review's first token: ``[reviews, 1, hidden]``."""
    starts = kwargs.get("cu_seq_lens_q")
    hidden = output.last_hidden_state if isinstance(output, ModelOutput) else output[0]
    if starts is None or hidden.shape[1] == 1:
        return output  # a padded batch, or a packed row already cut by the last layer (_first_tokens_only)
    first_tokens = hidden[0, starts[:-1].to(hidden.device, torch.long)].unsqueeze(1)
    if isinstance(output, ModelOutput):
        output.last_hidden_state = first_tokens
        return output
    return (first_tokens, *output[1:])
