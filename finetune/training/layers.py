"""Where each parameter sits in a BERT-family classifier: the head, an encoder layer, or the embeddings.

Three recipe options need it:

- ``layerwise_lr_decay`` (Sun et al. 2019; ULMFiT's discriminative fine-tuning):
  the head learns at ``learning_rate`` (or ``head_learning_rate``), the top
  encoder layer at ``learning_rate x decay``, the one below at ``x decay^2``
  and so on down to the embeddings, so the general features of the lower
  layers move least;
- ``freeze_encoder_updates`` (a head warm-up, as in LP-FT, Kumar et al. 2022):
  for the first updates only the head learns, so the random head does not
  send large, noisy gradients into the pretrained encoder;
- ``trainable_layers``: only the top layers and the head learn, for the whole
  run (the lower layers are frozen, so backward stops above them).

Depth: embeddings 0, encoder layer i is i + 1, the head (pooler, classifier
and anything outside the base model) num_layers + 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from torch import nn

_LAYER_INDEX = re.compile(r"\.layers?\.(\d+)\.")


def parameter_depth(name: str, base_prefix: str, num_layers: int) -> int:
    """Depth of the parameter called ``name`` (0 embeddings ... ``num_layers + 1`` head)."""
    if not name.startswith(f"{base_prefix}.") or ".pooler." in name:
        return num_layers + 1
    match = _LAYER_INDEX.search(name)
    if match:
        return int(match.group(1)) + 1
    if "embeddings" in name:
        return 0
    return num_layers + 1  # e.g. a final layer norm after the encoder: as near the head as it gets


def model_depths(model: nn.Module) -> dict[str, int]:
    """``{parameter name: depth}`` for every parameter of ``model`` (a ``PreTrainedModel``, maybe wrapped)."""
    model = getattr(model, "module", model)  # DDP / DataParallel
    base_prefix = getattr(model, "base_model_prefix", "")
    num_layers = int(getattr(model.config, "num_hidden_layers", 0))
    return {name: parameter_depth(name, base_prefix, num_layers) for name, _ in model.named_parameters()}


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that learn during a head warm-up: the pooler, the classifier and anything outside the encoder."""
    depths = model_depths(model)
    top = max(depths.values())
    return [parameter for name, parameter in model.named_parameters() if depths[_unwrapped(name)] == top]


def encoder_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter that is not the head: the embeddings and the encoder layers."""
    head = {id(parameter) for parameter in head_parameters(model)}
    return [parameter for parameter in model.parameters() if id(parameter) not in head]


def freeze_lower_layers(model: nn.Module, trainable_layers: int) -> int:
    """Freeze the embeddings and every encoder layer below the top ``trainable_layers``; return how many were frozen.

    The head always learns. A model with fewer layers than asked keeps all of them trainable.
    """
    depths = model_depths(model)
    num_layers = max(depths.values()) - 1
    lowest_trained = max(num_layers - trainable_layers + 1, 0)
    frozen = 0
    for name, parameter in model.named_parameters():
        if depths[_unwrapped(name)] < lowest_trained:
            parameter.requires_grad_(False)
            frozen += 1
    return frozen


def layerwise_parameter_groups(
    model: nn.Module,
    learning_rate: float,
    decay: float,
    head_learning_rate: float | None,
    weight_decay: float,
    decay_parameter_names: Iterable[str],
) -> list[dict[str, Any]]:
    """Optimizer parameter groups, one per (depth, weight decay), head first.

    The head's group comes first because Trainer logs the first group's
    learning rate: the one the recipe set (with a ``head_learning_rate``,
    ``ReviewTrainer._get_learning_rate`` scales it back to ``learning_rate``'s).
    """
    depths = model_depths(model)
    top = max(depths.values())
    with_decay = set(decay_parameter_names)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        depth = depths[_unwrapped(name)]
        decays = name in with_decay
        if (depth, decays) not in groups:
            rate = head_learning_rate if depth == top and head_learning_rate is not None else learning_rate
            groups[(depth, decays)] = {
                "params": [],
                "lr": rate * decay ** (top - depth),
                "weight_decay": weight_decay if decays else 0.0,
                "depth": depth,
            }
        groups[(depth, decays)]["params"].append(parameter)
    return [groups[key] for key in sorted(groups, key=lambda key: (-key[0], not key[1]))]


def _unwrapped(name: str) -> str:
    return name[len("module.") :] if name.startswith("module.") else name
