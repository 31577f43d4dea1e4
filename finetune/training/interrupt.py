"""Stop cleanly on Ctrl-C or a scheduler's SIGTERM: finish the update, save, say how to resume.

The first signal asks the run to stop at the next update boundary, where a
checkpoint is exact (no half-accumulated window to lose); one that comes
during an evaluation stops at the boundary the evaluation was made at. A
second signal stops at once, as a user pressing Ctrl-C twice expects.
:meth:`StopOnSignal.held` keeps the handlers past the end of training, so a
signal during the final save lets that save finish.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import torch
from transformers import TrainerCallback

# The shell's convention: a process ended by signal N exits with 128 + N.
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopOnSignal(TrainerCallback):
    """Turns SIGINT / SIGTERM into "save at the next update and stop"."""

    # Its on_save only notes the update: a checkpoint may still be written in the background
    # (training waits for that write before it ends).
    reads_checkpoint_on_save = False

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._saved_after_signal: int | None = None  # the update whose checkpoint the stop saved
        self._held = False

    @contextlib.contextmanager
    def held(self) -> Iterator[StopOnSignal]:
        """Catch SIGINT / SIGTERM for the whole block, training and the final save after it, not training alone.

        Killed part-way through the final save, a run would leave neither a
        model nor, with ``save_strategy: no``, any checkpoint: the caller looks
        at :attr:`received` after the save instead.
        """
        self._held = True
        self.install()
        try:
            yield self
        finally:
            self._held = False
            self.restore()

    def install(self) -> None:
        """Install the SIGINT / SIGTERM handlers (once; a signal already received leaves them uninstalled)."""
        # Handlers can only be set from the main thread (a notebook's worker thread cannot).
        if self._previous or self.received is not None or threading.current_thread() is not threading.main_thread():
            return
        for signum in EXIT_STATUS:
            self._previous[signum] = signal.signal(signum, self._handle)

    @property
    def stopped_training(self) -> bool:
        """Whether a signal stopped training early, with a checkpoint of the update it stopped at."""
        return self._saved_after_signal is not None

    def on_train_begin(self, args, state, control, **kwargs):
        """Install the SIGINT / SIGTERM handlers for the length of training."""
        self.install()

    def on_step_end(self, args, state, control, **kwargs):
        """After a signal, save this update's checkpoint and stop."""
        if self._any_process_received(args):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_evaluate(self, args, state, control, **kwargs):
        """After a signal during an evaluation, save and stop at the update it was made at."""
        # A signal that came during an evaluation: the weights are still those of this update's
        # boundary, so save and stop here rather than after one more update.
        if self._any_process_received(args):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        """Note the update whose checkpoint was saved after a signal, and stop there."""
        if self.received is not None:
            self._saved_after_signal = state.global_step
            # A signal during a scheduled save: that checkpoint is this update's, so stop at it
            # rather than train one more update to save another.
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        """Skip the epoch-end evaluation and save when a signal stopped the run mid-epoch."""
        # Stopped part-way through an epoch, with this update's checkpoint saved: the epoch-end
        # evaluation and save would only delay the exit (the resumed run makes them when the epoch
        # really ends). At a true epoch end they stay, so the resumed run's history is the same.
        mid_epoch = state.epoch is not None and not float(state.epoch).is_integer()
        if self._saved_after_signal == state.global_step and mid_epoch:
            control.should_evaluate = False
            control.should_save = False
        return control

    def _any_process_received(self, args: Any) -> bool:
        stop = self.received is not None
        if args.world_size > 1 and torch.distributed.is_initialized():
            # All processes must stop at the same update, or the others would wait forever
            # in the next all-reduce; one small all-reduce per update agrees on it.
            flag = torch.tensor(float(stop), device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
            if stop and self.received is None:
                self.received = signal.SIGTERM  # a launcher signals every process; this one's came late
        return stop

    def on_train_end(self, args, state, control, **kwargs):
        """Put the previous signal handlers back, unless :meth:`held` keeps them for the final save."""
        if not self._held:
            self.restore()

    def restore(self) -> None:
        """Put back the handlers that were there before training."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @property
    def exit_status(self) -> int:
        """130 for SIGINT, 143 for SIGTERM."""
        return EXIT_STATUS[self.received] if self.received is not None else 0

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)
        # A second signal is not caught: it stops the process at once.
        self.restore()
