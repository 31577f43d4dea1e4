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

Called through MPNet's classifier, whose head reads each review's first token
and nothing else, the last layer computes that token only (queries, attention
output and feed-forward; keys and values from every token, as before): about
a twelfth of the model's work, with the same logits and gradients, as BERT's
last layer does in :mod:`.first_tokens`. The encoder then returns
``[reviews, 1, hidden]``; called directly, it returns every token as before.

Packed rows (``padding_free``, :mod:`.micro_batches`) read through the same
forward: each group of reviews of like length is gathered into a padded batch
(the layout the packer made, every review from slot 0), so one bias of the
group's width serves all its reviews, since MPNet's bias depends on the
distance between two tokens, which packing does not change. The last layer
computes each review's first token only, and the encoder returns those, all
MPNet's classification head reads.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from .families import ModelFamily, count_after_padding, register_family
from .models import classifier_name
from .review_attention import attention_per_review, first_token_attention_per_review, masked_attention, split_heads


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
    mask summed, ``[reviews, heads, tokens, tokens]`` in the compute dtype, or
    for a packed row its :class:`PackedGroups`.
    """
    if output_attentions:
        # Per layer and forward: the import only where it is needed, not on every fused call.
        from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

        return MPNetSelfAttention.forward(module, hidden_states, attention_mask, position_bias, output_attentions)
    dropout = module.dropout.p if module.training else 0.0
    if isinstance(position_bias, PackedGroups):
        return (module.o(_packed_row_attention(module, hidden_states, position_bias, dropout)),)
    additive_mask = _summed_mask(position_bias, attention_mask)
    heads = (module.num_attention_heads, module.attention_head_size)
    query, key, value = (
        split_heads(projection(hidden_states), *heads) for projection in (module.q, module.k, module.v)
    )
    context = masked_attention(query, key, value, additive_mask, dropout, module.attention_head_size**-0.5)
    context = context.transpose(1, 2).reshape(*hidden_states.shape[:-1], module.all_head_size)
    return (module.o(context),)


class PackedGroups(NamedTuple):
    """A packed row's groups of reviews (``micro_batches.attention_layout``), each with its additive mask."""

    review_groups: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]
    masks: tuple[torch.Tensor, ...]  # per group, [reviews, heads, width, width]: the bias plus the key mask
    review_order: torch.Tensor  # puts the groups' real tokens back in row order


def _packed_row_attention(
    module: nn.Module, hidden_states: torch.Tensor, packed: PackedGroups, dropout: float
) -> torch.Tensor:
    """Attention within each review of a packed row ``[1, tokens, hidden]``, group by group; ``[1, tokens, hidden]``."""
    heads, head_size = module.num_attention_heads, module.attention_head_size
    tokens = hidden_states[0]
    # [tokens, heads, dim]: one row per token, to gather by token.
    per_token = [projection(tokens).view(-1, heads, head_size) for projection in (module.q, module.k, module.v)]
    context = attention_per_review(
        per_token, packed.review_groups, list(packed.masks), packed.review_order, dropout, head_size**-0.5
    )
    return context.reshape(1, -1, heads * head_size)


def _summed_mask(position_bias: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The one additive mask SDPA takes: the bias plus the padding mask (whichever are given)."""
    if position_bias is None or attention_mask is None:
        return position_bias if attention_mask is None else attention_mask
    return position_bias + attention_mask


# What a packed row carries besides its tokens (see micro_batches.pack); MPNet's own forward drops these.
PACKED_LAYOUT_KEYS = ("review_groups", "review_order", "first_token_order")


class FusedMPNetAttention:
    """MPNet's attention computed by SDPA on ``model`` until :meth:`remove` (nothing happens for other models).

    With ``packed_rows``, a call to ``model`` with a packed row's layout
    (``review_groups``, ...) is read per review, and the encoder returns each
    review's first token; padded batches read as before.
    """

    # Its encoder hands MPNet's head first tokens only: evaluation inside a run needs nothing more (readings.py).
    reads_first_tokens = True

    def __init__(self, model: nn.Module, packed_rows: bool = False) -> None:
        from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

        self._encoders = mpnet_encoders(model)
        self._attentions = [
            module
            for encoder in self._encoders
            for module in encoder.modules()
            if isinstance(module, MPNetSelfAttention)
        ]
        # The classifier passes none of its extra keyword arguments down to the encoder, so the layout
        # of the call under way is taken from the call itself, and read by the encoder. Hooks on the
        # classifier also say when the encoder's output goes to its head, which reads first tokens only.
        self.packed_rows = packed_rows
        self.layout: dict[str, Any] | None = None
        self.head_reads_first_tokens = False
        self._hooks = []
        if self._encoders and classifier_name(model) == "MPNetForSequenceClassification":
            self._hooks = [
                model.register_forward_pre_hook(self._call_begins, with_kwargs=True),
                model.register_forward_hook(self._call_ends),
            ]
        for encoder in self._encoders:
            encoder.forward = _fused_encoder_forward(encoder, self)
        for module in self._attentions:
            module.forward = _bound(fused_mpnet_self_attention, module)

    def _call_begins(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        packed = self.packed_rows and kwargs.get("review_groups") is not None
        self.layout = {key: kwargs[key] for key in PACKED_LAYOUT_KEYS} if packed else None
        self.head_reads_first_tokens = True

    def _call_ends(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.layout, self.head_reads_first_tokens = None, False

    @property
    def installed(self) -> bool:
        """Whether the model had an MPNet encoder to change."""
        return bool(self._encoders)

    def remove(self) -> None:
        """Put transformers' eager attention back."""
        for module in [*self._encoders, *self._attentions]:
            del module.forward  # the instance attribute goes; the class's forward shows through again
        for hook in self._hooks:
            hook.remove()


def _bound(function: Any, module: nn.Module) -> Any:
    """``function`` with ``module`` as its first argument, to stand in for the module's forward."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return function(module, *args, **kwargs)

    return forward


def _fused_encoder_forward(encoder: nn.Module, installed: FusedMPNetAttention) -> Any:
    """The encoder's forward with the bias and padding mask summed once, in the compute dtype, for all its layers.

    A packed row (``installed.layout``) gets one mask per group of reviews, and
    its output is each review's first token, ``[reviews, 1, hidden]``.
    """
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
        layout = installed.layout
        if layout is not None:
            packed = _packed_groups(encoder, hidden_states, layout)
            for layer in encoder.layer[:-1]:
                hidden_states = layer(hidden_states, None, packed, **kwargs)[0]
            # The head reads position 0 of each row: one row per review, its first token.
            first_token_order = layout["first_token_order"].to(hidden_states.device, non_blocking=True)
            hidden_states = _packed_last_layer_at_first_tokens(
                encoder.layer[-1], hidden_states, packed, first_token_order
            )
        else:
            mask = _bias_and_padding_mask(encoder, hidden_states, attention_mask)
            first_tokens_only = installed.head_reads_first_tokens
            for layer in encoder.layer[:-1] if first_tokens_only else encoder.layer:
                hidden_states = layer(hidden_states, None, mask, **kwargs)[0]
            if first_tokens_only:
                hidden_states = _last_layer_at_first_tokens(encoder.layer[-1], hidden_states, mask)
        if not return_dict:
            return (hidden_states,)
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=hidden_states)

    return forward


def _last_layer_at_first_tokens(layer: nn.Module, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``MPNetLayer``'s output at each row's first token, ``[rows, 1, hidden]``: its query over every key."""
    self_attention = layer.attention.attn
    heads, head_size = self_attention.num_attention_heads, self_attention.attention_head_size
    first = hidden_states[:, :1]

    dropout = self_attention.dropout.p if self_attention.training else 0.0
    context = masked_attention(
        split_heads(self_attention.q(first), heads, head_size),
        split_heads(self_attention.k(hidden_states), heads, head_size),
        split_heads(self_attention.v(hidden_states), heads, head_size),
        mask[:, :, :1, :],  # the first query's row of the bias and padding mask
        dropout,
        head_size**-0.5,
    )
    return _layer_output(layer, first, context.transpose(1, 2).reshape(first.shape))


def _packed_last_layer_at_first_tokens(
    layer: nn.Module, hidden_states: torch.Tensor, packed: PackedGroups, first_token_order: torch.Tensor
) -> torch.Tensor:
    """``MPNetLayer``'s output at each review's first token of a packed row, ``[reviews, 1, hidden]``, in row order."""
    self_attention = layer.attention.attn
    dropout = self_attention.dropout.p if self_attention.training else 0.0
    first, context = first_token_attention_per_review(
        hidden_states[0],
        (self_attention.q, self_attention.k, self_attention.v),
        self_attention.num_attention_heads,
        packed.review_groups,
        [mask[:, :, :1, :] for mask in packed.masks],  # the first query's row of each group's mask
        first_token_order,
        dropout,
        self_attention.attention_head_size**-0.5,
    )
    return _layer_output(layer, first, context)


def _layer_output(layer: nn.Module, first: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """The rest of ``MPNetLayer`` at first tokens: output projection, residual, norm, feed-forward."""
    attention = layer.attention
    attention_output = attention.LayerNorm(attention.dropout(attention.attn.o(context)) + first)
    return layer.output(layer.intermediate(attention_output), attention_output)


def _packed_groups(encoder: nn.Module, hidden_states: torch.Tensor, layout: dict[str, Any]) -> PackedGroups:
    """Each group's additive mask: the bias for its width (reviews start at slot 0) plus its key mask."""
    device, dtype = hidden_states.device, _compute_dtype(hidden_states)
    groups = tuple(tuple(tensor.to(device, non_blocking=True) for tensor in group) for group in layout["review_groups"])
    masks = []
    for token_index, key_mask, _ in groups:
        width = token_index.shape[1]
        bias = encoder.compute_position_bias(hidden_states[:1, :width])  # [1, heads, width, width], fp32
        mask = bias.masked_fill(~key_mask[:, None, None, :], torch.finfo(bias.dtype).min)
        masks.append(mask.clamp(min=torch.finfo(dtype).min).to(dtype))
    return PackedGroups(groups, tuple(masks), layout["review_order"].to(device, non_blocking=True))


def _compute_dtype(hidden_states: torch.Tensor) -> torch.dtype:
    """The dtype of the layers' projections: autocast's where it is on, else the hidden states'."""
    device_type = hidden_states.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden_states.dtype


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
    dtype = _compute_dtype(hidden_states)
    summed = summed.clamp(min=torch.finfo(dtype).min).to(dtype)
    return summed.expand(hidden_states.shape[0], -1, length, length)


def _fused_unless_asked_not_to(model: nn.Module, fused_attention: bool) -> FusedMPNetAttention | None:
    """MPNet's attention through SDPA, unless ``fused_attention`` is false (then transformers' eager code)."""
    return FusedMPNetAttention(model) if fused_attention else None


register_family(
    "mpnet",
    ModelFamily(
        name="MPNet",
        classifier="MPNetForSequenceClassification",
        scoring=_fused_unless_asked_not_to,
        padded_training=_fused_unless_asked_not_to,
        # Attention per review group with MPNet's bias; the encoder returns each review's first token.
        packed_training=lambda model: FusedMPNetAttention(model, packed_rows=True),
        position_offset=count_after_padding,
    ),
)
