"""The fast path's one interface: a model read more cheaply, for the same logits, while a block runs.

Training enters :func:`reading_for_training`, evaluation and every scoring
command (``predict``, ``serve``, ``evaluate``) :func:`reading_for_scores`,
each in one line; nothing else in the package asks which family a model is.
The family (:mod:`.families`) decides what is installed; a model of a family
the fast path does not know is read by transformers' own code, and the
process says so once. Either way, padded training batches get SDPA's padding
mask without transformers' host read (:mod:`.mask_without_reads`), for any
model using transformers' attention functions.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator

from torch import nn

from . import bert, mpnet  # noqa: F401  (each registers its families)
from .families import Reading, family_of, known_families
from .mask_without_reads import MaskWithoutReads
from .models import classifier_name, classifier_of
from .packed_attention import PackedReading

# The models already said to be read stock in this process, by class and model type.
_SAID_STOCK: set[tuple[str, str | None]] = set()
# The classifiers a training reading is installed on, and whether it reads the head's first tokens already
# (packed rows, MPNet's fused attention): evaluation inside the run then leaves it in charge.
_TRAINING: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def reading_for_scores(model: nn.Module, fused_attention: bool = True) -> Iterator[None]:
    """``model`` read for its classifier's logits alone while the block runs: the same logits, less work.

    A BERT or RoBERTa classifier's last layer computes its first tokens only;
    an MPNet classifier's attention goes through SDPA, its last layer at first
    tokens too (unless ``fused_attention`` is false).
    """
    family = _family_or_stock(model)
    in_charge = _TRAINING.get(classifier_of(model), False)  # evaluation inside a run that reads first tokens
    with _installed([family.scoring(model, fused_attention) if family and not in_charge else None]):
        yield


@contextlib.contextmanager
def reading_for_training(model: nn.Module, packed: bool, fused_attention: bool = True) -> Iterator[None]:
    """``model`` read for a training run while the block runs; the saved model stays stock.

    With ``packed`` (padding_free), packed rows are read per review (a model
    the fast path cannot pack is refused in one line, before anything
    changes); otherwise the family's padded reading (MPNet's attention through
    SDPA) and padding masks built without a host read.
    """
    if packed:
        readings: list[Reading | None] = [PackedReading(model)]
    else:
        family = _family_or_stock(model)
        readings = [family.padded_training(model, fused_attention) if family else None, MaskWithoutReads(model)]
    inner = classifier_of(model)
    _TRAINING[inner] = any(getattr(reading, "reads_first_tokens", False) for reading in readings)
    try:
        with _installed(readings):
            yield
    finally:
        del _TRAINING[inner]


def position_offset(model: nn.Module) -> int:
    """Where ``model``'s position ids start, for a packed row's positions (0 for a family not known)."""
    family = family_of(model)
    return family.position_offset(model) if family is not None else 0


@contextlib.contextmanager
def _installed(readings: list[Reading | None]) -> Iterator[None]:
    """Remove each reading when the block ends, however it ends."""
    try:
        yield
    finally:
        for reading in readings:
            if reading is not None:
                reading.remove()


def _family_or_stock(model: nn.Module):
    """``model``'s family; for a model the fast path does not know, None, and a note the first time."""
    family = family_of(model)
    if family is None:
        seen = (classifier_name(model), getattr(getattr(classifier_of(model), "config", None), "model_type", None))
        if seen not in _SAID_STOCK:
            _SAID_STOCK.add(seen)
            print(
                f"note: {seen[0]} (model_type {seen[1]!r}) is read by transformers' own code; the fast path "
                f"knows the sequence classifiers of {known_families()} (docs/development.md#adding-a-model-family)",
                file=sys.stderr,
            )
    return family
