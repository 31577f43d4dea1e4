"""The training progress bar: one tqdm bar per epoch, over micro-batches."""

from __future__ import annotations

from tqdm.auto import tqdm
from transformers import ProgressCallback


class EpochProgressBar:
    """A bar over one epoch's micro-batches showing ``Epoch``, ``Train_Loss`` and ``LR``.

    ``Train_Loss`` is the running per-sample mean of the unscaled loss over the
    epoch so far, so it reads the same whatever ``gradient_accumulation_steps`` is.
    """

    def __init__(self, epoch: int, num_epochs: int, micro_batches: int, disable: bool) -> None:
        self._bar = tqdm(
            total=micro_batches,
            desc=f"Epoch {epoch + 1}/{num_epochs}",
            unit="batch",
            disable=disable,
            dynamic_ncols=True,
        )
        self._epoch = epoch + 1

    def advance(self, micro_batches: int, train_loss: float, learning_rate: float) -> None:
        """Move by ``micro_batches`` and refresh the shown loss and learning rate."""
        self._bar.set_postfix(
            Epoch=self._epoch, Train_Loss=f"{train_loss:.4f}", LR=f"{learning_rate:.2e}", refresh=False
        )
        self._bar.update(micro_batches)

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
        return None

    def on_step_end(self, args, state, control, **kwargs):
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Training loss is on the bar; print evaluation results, which people wait for.
        if state.is_world_process_zero and logs and any(key.startswith("eval_") for key in logs):
            shown = ("eval_loss", "eval_accuracy", "eval_macro_f1")
            numbers = ", ".join(f"{key[5:]} {logs[key]:.4f}" for key in shown if key in logs)
            tqdm.write(f"update {state.global_step} (epoch {state.epoch or 0:.2f}): {numbers}")

    def on_train_end(self, args, state, control, **kwargs):
        return None
