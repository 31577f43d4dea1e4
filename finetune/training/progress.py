"""The training progress bar: one tqdm bar per epoch, over micro-batches (or updates when the length is unknown)."""

from __future__ import annotations

from tqdm.auto import tqdm
from transformers import ProgressCallback


class EpochProgressBar:
    """A bar over one epoch showing ``Epoch``, ``Train_Loss`` and ``LR``.

    It counts the epoch's micro-batches, or, when the epoch's length is unknown
    (an ``IterableDataset``; ``micro_batches=None``), the run's updates out of
    ``max_steps``. ``Train_Loss`` is the running per-sample mean of the
    unscaled loss over the epoch so far, so it reads the same whatever
    ``gradient_accumulation_steps`` is. It is read once per update (a read
    per micro-batch would stall a GPU), so until the epoch's first update it
    shows ``-``: never a 0 that was not measured.
    """

    def __init__(
        self,
        epoch: int,
        num_epochs: int | None,
        micro_batches: int | None,
        disable: bool,
        max_steps: int = 0,
        updates_done: int = 0,
    ) -> None:
        self._counts_updates = micro_batches is None
        self._bar = tqdm(
            total=max_steps if self._counts_updates else micro_batches,
            initial=updates_done if self._counts_updates else 0,
            desc=f"Epoch {epoch + 1}" if num_epochs is None else f"Epoch {epoch + 1}/{num_epochs}",
            unit="update" if self._counts_updates else "batch",
            disable=disable,
            dynamic_ncols=True,
        )
        self._epoch = epoch + 1

    def advance(self, micro_batches: int, train_loss: float | None, learning_rate: float) -> None:
        """Count ``micro_batches`` more (when the bar counts micro-batches) and refresh the shown loss and rate."""
        self._refresh(micro_batches if not self._counts_updates else 0, train_loss, learning_rate)

    def finish_update(self, train_loss: float | None, learning_rate: float) -> None:
        """Count one update (when the bar counts updates) and refresh the shown loss and rate."""
        self._refresh(1 if self._counts_updates else 0, train_loss, learning_rate)

    def _refresh(self, steps: int, train_loss: float | None, learning_rate: float) -> None:
        shown_loss = "-" if train_loss is None else f"{train_loss:.4f}"
        self._bar.set_postfix(Epoch=self._epoch, Train_Loss=shown_loss, LR=f"{learning_rate:.2e}", refresh=False)
        self._bar.update(steps)

    def write(self, message: str) -> None:
        """Print a line above the bar without breaking it."""
        self._bar.write(message)

    def close(self) -> None:
        """Finish the bar."""
        self._bar.close()


class EvaluationProgressCallback(ProgressCallback):
    """Stock ``ProgressCallback`` minus its training bar, which ``EpochProgressBar`` replaces.

    Its evaluation and prediction bars are kept as they are.
    """

    def on_train_begin(self, args, state, control, **kwargs):
        """Open no training bar: ``EpochProgressBar`` shows training."""
        return None

    def on_step_end(self, args, state, control, **kwargs):
        """Advance no training bar: ``EpochProgressBar`` shows training."""
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Print evaluation results above the bars."""
        # Training loss is on the bar; print evaluation results, which people wait for.
        if state.is_world_process_zero and logs and any(key.startswith("eval_") for key in logs):
            shown = ("eval_loss", "eval_accuracy", "eval_macro_f1")
            numbers = ", ".join(f"{key[5:]} {logs[key]:.4f}" for key in shown if key in logs)
            tqdm.write(f"update {state.global_step} (epoch {state.epoch or 0:.2f}): {numbers}")

    def on_train_end(self, args, state, control, **kwargs):
        """Close no training bar: ``EpochProgressBar`` shows training."""
        return None
