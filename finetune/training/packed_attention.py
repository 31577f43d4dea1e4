"""Reading packed rows with a stock BERT: attention within each review, one output per review.

A packed piece (see :mod:`.micro_batches`) is one row of reviews end to end.
Every layer but attention works token by token, so it computes the row as it
would the reviews apart, with no padding. Two things must change, and both
are installed on the model for a run and removed after, so that the saved
folder stays a plain ``BertForSequenceClassification``:

- **attention** is computed per review: an attention function registered with
  transformers' ``AttentionInterface`` lays the row's queries, keys and values
  out as one padded batch of reviews (a scatter), runs SDPA there with each
  review's key mask, and gathers the real tokens back. Padding is thus paid
  only inside attention, over reviews that a piece sorted by length keeps
  alike. Inputs without ``cu_seq_lens_q`` go to the model's own attention.
- **the encoder's output** is cut to each review's first token, so the
  pooler and the classifier, which read position 0 of every row, see one row
  per review. The mean-pooling layer (:mod:`.pooling`) lives inside the
  encoder, so its first token already holds its own review's mean.
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


def packed_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each review of a packed row (``cu_seq_lens_q`` given), else plain SDPA.

    ``query``, ``key`` and ``value`` are ``[1, heads, tokens, head_dim]``;
    returns ``[1, tokens, heads, head_dim]``, as transformers' SDPA function does.
    """
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling)
    tokens = query.shape[2]
    starts = cu_seq_lens_q.to(query.device, torch.long)
    lengths = starts[1:] - starts[:-1]
    reviews = lengths.shape[0]
    # Where each token of the row sits in a padded batch of its reviews; output_size spares a host sync.
    review_of_token = torch.repeat_interleave(torch.arange(reviews, device=query.device), lengths, output_size=tokens)
    position_in_review = torch.arange(tokens, device=query.device) - starts[review_of_token]

    def padded(row: torch.Tensor) -> torch.Tensor:
        # [1, heads, tokens, dim] -> [reviews, heads, max_length, dim], zeros past each review's end.
        per_token = row[0].transpose(0, 1)
        batch = per_token.new_zeros(reviews, max_length_q, *per_token.shape[1:])
        batch[review_of_token, position_in_review] = per_token
        return batch.transpose(1, 2)

    keep = torch.arange(max_length_q, device=query.device)[None, :] < lengths[:, None]
    output = nn.functional.scaled_dot_product_attention(
        padded(query),
        padded(key),
        padded(value),
        attn_mask=keep[:, None, None, :],
        dropout_p=dropout,
        scale=scaling,
    )
    # [reviews, heads, max_length, dim] -> the row's real tokens, [1, tokens, heads, dim].
    return output.transpose(1, 2)[review_of_token, position_in_review].unsqueeze(0), None


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

    def remove(self) -> None:
        """Put the model's own attention back and drop the hook."""
        self._hook.remove()
        self.model.set_attn_implementation(self.original_attention)


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
    if starts is None:
        return output
    hidden = output.last_hidden_state if isinstance(output, ModelOutput) else output[0]
    first_tokens = hidden[0, starts[:-1].to(hidden.device, torch.long)].unsqueeze(1)
    if isinstance(output, ModelOutput):
        output.last_hidden_state = first_tokens
        return output
    return (first_tokens, *output[1:])
