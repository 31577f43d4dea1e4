"""The arithmetic of gradient accumulation, kept in one place.

Every count the trainer needs (updates per epoch, total updates, what a
micro-batch's loss averages over and so how much it weighs in its window) is
derived here and nowhere else, so the contract has one implementation to test.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch

# Transformers' label for "no target here": cross-entropy skips it, and so does the count of items.
IGNORED_LABEL = -100


def updates_per_epoch(micro_batches_per_epoch: int, accumulation_steps: int) -> int:
    """Optimizer updates in one epoch: every window, the trailing partial one included."""
    return math.ceil(micro_batches_per_epoch / accumulation_steps)


def total_updates(
    micro_batches_per_epoch: int, accumulation_steps: int, num_train_epochs: float, max_steps: int
) -> int:
    """Updates in the whole run: ``max_steps`` when it is set (> 0), else epochs x updates per epoch.

    A fractional ``num_train_epochs`` rounds up to a whole update, as stock
    ``Trainer`` does.
    """
    if max_steps > 0:
        return max_steps
    return math.ceil(num_train_epochs * updates_per_epoch(micro_batches_per_epoch, accumulation_steps))


def epochs_to_run(total: int, updates_in_epoch: int) -> int:
    """Epochs (whole or the last one cut short) needed to reach ``total`` updates."""
    return math.ceil(total / updates_in_epoch)


def loss_items(
    inputs: Mapping[str, Any],
    shifts_labels: bool = False,
    class_weights: torch.Tensor | None = None,
    tags_per_review: bool = False,
    ordinal_outputs: int | None = None,
) -> float | torch.Tensor:
    """What a micro-batch's loss averages over, counted: the unit in which a window's loss is shared out.

    - **Integer labels**: those other than ``IGNORED_LABEL``. That is one per
      review for a review classifier, one per labelled token for token
      classification or masked LM, and, when ``shifts_labels`` (a causal LM,
      whose loss predicts token i + 1 at token i), one per labelled next
      token: ``labels[..., 1:]``, or the batch's own ``shift_labels``.
      With ``class_weights`` (one per class) the labels' summed weights, which
      is what a class-weighted cross-entropy divides by.
    - **Float labels** (a rating), or rows of tags (``tags_per_review``,
      several tags per review, whatever their dtype): one per review, since
      such a loss is a mean per review.
    - **Ordinal levels** (``ordinal_outputs``, CORN's K-1 outputs): the
      (review, output) pairs its loss averages over, ``min(level + 1, K - 1)``
      per labelled review (:mod:`.ordered_heads`).
    - **No labels**: one per row of the batch's first tensor.

    These are the counts stock ``Trainer`` passes as ``num_items_in_batch``
    (it counts integer and float labels alike, and ignores class weights).
    A count of labels stays a tensor where the labels are (``class_weights``
    must be there too): reading it on a GPU would be a host sync per
    micro-batch, so the loop reads it once per update.
    """
    labels = inputs.get("shift_labels")
    if labels is None:
        labels = inputs.get("labels")
        if labels is not None and shifts_labels:
            labels = labels[..., 1:]
    if labels is None:
        first = next(value for value in inputs.values() if isinstance(value, torch.Tensor))
        return float(first.shape[0])
    if labels.is_floating_point() or tags_per_review:
        return float(labels.shape[0])
    counted = labels != IGNORED_LABEL
    if ordinal_outputs is not None:
        return torch.where(counted, (labels + 1).clamp(max=ordinal_outputs), 0).sum()
    if class_weights is None:
        return counted.sum()
    return torch.where(counted, class_weights[torch.where(counted, labels, 0)], 0.0).double().sum()


def share_of_window(micro_items: float | torch.Tensor, window_items: float | torch.Tensor) -> float | torch.Tensor:
    """The factor that turns a micro-batch's mean loss into its share of the window's mean loss.

    The window's full-batch loss is the mean over all its items, so a
    micro-batch of ``micro_items`` contributes ``micro_items / window_items``
    of it, never ``1 / n``. ``window_items`` is summed over every process; the
    caller undoes DDP's averaging of gradients over processes. A window
    without items (every label ignored) shares out nothing.
    """
    if isinstance(window_items, torch.Tensor):
        window_items = window_items.double()
        return torch.where(window_items > 0, micro_items / window_items.clamp(min=1e-30), 0.0)
    return micro_items / window_items if window_items else 0.0


def weighted_share(
    mean_loss: torch.Tensor, micro_items: float | torch.Tensor, window_items: float | torch.Tensor
) -> torch.Tensor:
    """A micro-batch's mean loss times its share of the window: its part of the window's mean loss.

    A micro-batch without items (every label ignored, or a stand-in weighted
    0) has a mean of 0 / 0; its part is 0, and so is the gradient that flows
    back through it.
    """
    share = share_of_window(micro_items, window_items)
    if not isinstance(micro_items, torch.Tensor):
        # Known on the host (no tensor is made or copied to a GPU): a product, its NaN (0 / 0 x 0) zeroed.
        # nan_to_num passes no gradient where its input is NaN, and 0 x the gradient elsewhere.
        return mean_loss * share if micro_items > 0 else torch.nan_to_num(mean_loss * 0.0, nan=0.0)
    # Where, not a product: NaN x 0 is NaN, while where's unselected side takes a zero gradient.
    return torch.where(micro_items > 0, mean_loss * share, 0.0)


def takes_item_count(loss_function: Any) -> bool:
    """Whether ``loss_function`` takes ``num_items_in_batch`` (by name, or through ``**kwargs``).

    Such a loss is given the window's item count, as stock ``Trainer`` gives
    it, and is taken to return its summed item losses over that count.
    """
    # A bound method is a new object at each access; its function is the same one, so the answer is cached.
    return _takes_item_count(getattr(loss_function, "__func__", loss_function))


@functools.lru_cache(maxsize=256)
def _takes_item_count(loss_function: Any) -> bool:
    try:
        parameters = inspect.signature(loss_function).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature cannot be read: as stock, pass the count
        return True
    return any(p.name == "num_items_in_batch" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
