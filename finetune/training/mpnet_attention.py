"""MPNet's attention through SDPA, its relative-position bias passed as the attention mask.

transformers 5.23 computes MPNet's attention eagerly and only so: each layer
materialises ``[reviews, heads, tokens, tokens]`` scores in the compute dtype,
adds a relative-position bias the encoder expanded to that shape in fp32, adds
the padding mask, and runs a softmax and a dropout over it, all memory traffic
that grows with the square of the length (on a GPU, long reviews ran at a
fifteenth of the matrix peak; docs/benchmarks/speed.md). The same attention
is SDPA's: ``softmax(q k^T / sqrt(d) + bias + mask) v``, with the bias and
the mask summed into one additive mask, once a forward, in the compute
dtype. SDPA's fused kernels then never write the scores out, and the bias
still learns (its gradient flows through the mask).

:class:`FusedMPNetAttention` installs this on a model's MPNet encoders for a
run or a prediction and removes it after; the weights, and so the saved folder,
are untouched. Asked for attention weights (``output_attentions``), a layer
computes eagerly as before: SDPA does not return them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .review_attention import biased_attention_with_dropout


def mpnet_encoders(model: nn.Module) -> list[nn.Module]:
    """The MPNet encoder stacks inside ``model`` (none for other architectures)."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    return [module for module in model.modules() if isinstance(module, MPNetEncoder)]


def fused_mpnet_self_attention(
    module: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    output_attentions: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, ...]:
    """``MPNetSelfAttention.forward`` through SDPA: the same output, the bias and mask added to the scores.

    ``position_bias`` is what the fused encoder passes: the bias and the padding
    mask summed, ``[reviews, heads, tokens, tokens]`` in the compute dtype.
    """
    from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

    if output_attentions:
        return MPNetSelfAttention.forward(module, hidden_states, attention_mask, position_bias, output_attentions)
    additive_mask = _summed_mask(position_bias, attention_mask)
    shape = (*hidden_states.shape[:-1], -1, module.attention_head_size)
    query, key, value = (
        projection(hidden_states).view(shape).transpose(1, 2) for projection in (module.q, module.k, module.v)
    )
    if additive_mask is not None:
        additive_mask = additive_mask.to(query.dtype)
    dropout = module.dropout.p if module.training else 0.0
    scaling = module.attention_head_size**-0.5
    if dropout > 0 and query.device.type == "cpu":
        # SDPA's CPU kernels do not take dropout: its unfused path would draw a float per weight.
        context = biased_attention_with_dropout(query, key, value, additive_mask, dropout, scaling)
    else:
        context = nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=additive_mask, dropout_p=dropout, scale=scaling
        )
    context = context.transpose(1, 2).reshape(*hidden_states.shape[:-1], module.all_head_size)
    return (module.o(context),)


def _summed_mask(position_bias: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The one additive mask SDPA takes: the bias plus the padding mask (whichever are given)."""
    if position_bias is None or attention_mask is None:
        return position_bias if attention_mask is None else attention_mask
    return position_bias + attention_mask


class FusedMPNetAttention:
    """MPNet's attention computed by SDPA on ``model`` until :meth:`remove` (nothing happens for other models)."""

    def __init__(self, model: nn.Module) -> None:
        from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

        # Encoders fused already (a validation pass inside a training run) are left to their installer.
        self._encoders = [encoder for encoder in mpnet_encoders(model) if "forward" not in vars(encoder)]
        self._attentions = [
            module
            for encoder in self._encoders
            for module in encoder.modules()
            if isinstance(module, MPNetSelfAttention)
        ]
        for encoder in self._encoders:
            encoder.forward = _fused_encoder_forward(encoder)
        for module in self._attentions:
            module.forward = _bound(fused_mpnet_self_attention, module)

    @property
    def installed(self) -> bool:
        """Whether the model had an MPNet encoder to change."""
        return bool(self._encoders)

    def remove(self) -> None:
        """Put transformers' eager attention back."""
        for module in [*self._encoders, *self._attentions]:
            del module.forward  # the instance attribute goes; the class's forward shows through again


def _bound(function: Any, module: nn.Module) -> Any:
    """``function`` with ``module`` as its first argument, to stand in for the module's forward."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return function(module, *args, **kwargs)

    return forward


def _fused_encoder_forward(encoder: nn.Module) -> Any:
    """The encoder's forward with the bias and padding mask summed once, in the compute dtype, for all its layers."""
    stock_forward = type(encoder).forward

    def forward(
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> Any:
        if output_attentions or output_hidden_states:
            return stock_forward(
                encoder, hidden_states, attention_mask, output_attentions, output_hidden_states, return_dict, **kwargs
            )
        from transformers.modeling_outputs import BaseModelOutput

        mask = _bias_and_padding_mask(encoder, hidden_states, attention_mask)
        for layer in encoder.layer:
            hidden_states = layer(hidden_states, None, mask, **kwargs)[0]
        return BaseModelOutput(last_hidden_state=hidden_states) if return_dict else (hidden_states,)

    return forward


def _bias_and_padding_mask(
    encoder: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """``[reviews, heads, tokens, tokens]``: MPNet's relative-position bias plus the padding mask.

    The bias is computed for one review (it depends on positions only) and
    broadcast against the mask; the sum is built in fp32 and stored in the
    compute dtype, with masked entries clamped to its lowest finite value
    (fp32's minimum would round to -inf in bf16).
    """
    length = hidden_states.shape[1]
    bias = encoder.compute_position_bias(hidden_states[:1])  # [1, heads, tokens, tokens], fp32
    summed = bias if attention_mask is None else bias + attention_mask
    device_type = hidden_states.device.type
    # Under autocast the layers' projections, and so SDPA's query, are in autocast's dtype.
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden_states.dtype
    summed = summed.clamp(min=torch.finfo(dtype).min).to(dtype)
    return summed.expand(hidden_states.shape[0], -1, length, length)
