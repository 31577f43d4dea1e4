"""The arithmetic of gradient accumulation, kept in one place.

Every count the trainer needs (updates per epoch, total updates, how much a
micro-batch weighs in its window) is derived here and nowhere else, so the
contract in the README has one implementation to test.
"""

from __future__ import annotations

import math


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


def micro_batch_weight(micro_samples: int, window_samples: int, num_processes: int = 1) -> float:
    """The factor that turns a micro-batch's mean loss into its share of the window's loss.

    The window's full-batch loss is the mean over all its samples, so a
    micro-batch of ``micro_samples`` contributes ``micro_samples /
    window_samples`` of it, never ``1 / n``. ``window_samples`` is summed over
    every process; DDP then averages gradients over processes, which the
    ``num_processes`` factor undoes.
    """
    return micro_samples * num_processes / window_samples
