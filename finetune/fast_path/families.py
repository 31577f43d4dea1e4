"""The model families the fast path reads, keyed by ``model_type``: each family's readings in one entry.

A family module (:mod:`.bert`, :mod:`.mpnet`) registers one
:class:`ModelFamily` per ``model_type`` it reads. Each reading is an object
installed on a model that puts the model back as it was with ``remove()``, so
that a saved folder stays a plain transformers folder. The rest of the
package never asks which family a model is: it enters
:func:`..readings.reading_for_scores` or :func:`..readings.reading_for_training`.
How to add a family: ``docs/development.md#adding-a-model-family``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import nn

from .models import classifier_name, classifier_of


class Reading(Protocol):
    """A change installed on a model for a while (a patched forward, an attention function)."""

    def remove(self) -> None:
        """Put the model back as it was before the reading was installed."""


@dataclass(frozen=True)
class ModelFamily:
    """How the fast path reads one family's classifier; every reading gives the stock model's logits."""

    name: str  # as a person writes it, for messages ("BERT")
    classifier: str  # the classifier class whose head reads the encoder's first token only
    # Logits alone (evaluation, predict, serve); given the model and ``fused_attention``. None: stock.
    scoring: Callable[[nn.Module, bool], Reading | None]
    # Training on padded micro-batches; given the model and ``fused_attention``. None: stock.
    padded_training: Callable[[nn.Module, bool], Reading | None]
    # Training on packed rows (padding_free): attention within each review, one output per review.
    packed_training: Callable[[nn.Module], Reading]
    # Where the family's position ids start (a packed row's positions restart there at each review).
    position_offset: Callable[[nn.Module], int]


FAMILIES: dict[str, ModelFamily] = {}


def register_family(model_type: str, family: ModelFamily) -> None:
    """Read classifiers of ``model_type`` (a transformers config's ``model_type``) through ``family``."""
    FAMILIES[model_type] = family


def family_of(model: nn.Module) -> ModelFamily | None:
    """``model``'s family, or None where the fast path does not know it (another type, another head, a decoder)."""
    config = getattr(classifier_of(model), "config", None)
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None or classifier_name(model) != family.classifier or getattr(config, "is_decoder", False):
        return None
    return family


def known_families() -> str:
    """The registered families, as a message names them: "BERT (bert), MPNet (mpnet) and ..."."""
    named = [f"{family.name} ({model_type})" for model_type, family in sorted(FAMILIES.items())]
    return " and ".join([", ".join(named[:-1]), named[-1]]) if len(named) > 1 else "".join(named)


def count_from_zero(model: nn.Module) -> int:
    """BERT's position ids: 0, 1, 2, ... from each row's start."""
    return 0


def count_after_padding(model: nn.Module) -> int:
    """RoBERTa's and MPNet's position ids: they start at the padding id + 1, as their embeddings count them."""
    return int(classifier_of(model).base_model.embeddings.padding_idx) + 1
