"""What the fast path needs to know of a model, whatever wraps it."""

from __future__ import annotations

from torch import nn


def classifier_of(model: nn.Module) -> nn.Module:
    """The classifier itself: the model inside a PEFT wrapper, else ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def classifier_name(model: nn.Module) -> str:
    """The class name of the classifier itself (inside a PEFT wrapper too): what a family is recognised by."""
    return type(classifier_of(model)).__name__
