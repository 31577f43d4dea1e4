"""Run ``finetune train`` in this process and SIGKILL it at a chosen moment (for tests/test_resume.py).

    python tests/resume_worker.py RECIPE KILL_POINT STEP [--flag value ...]

KILL_POINT is one of:
- ``mid-window``: after the first micro-batch of update STEP + 1 (gradients half accumulated);
- ``mid-epoch``: right after update STEP, before anything else happens;
- ``after-save``: right after the checkpoint of update STEP is in place;
- ``during-save``: while the checkpoint of update STEP is being written (model saved, the rest not);
- ``during-background-write``: with background_checkpoint_saves, after update STEP + 2, while the
  background write of checkpoint STEP is held forever after its model files (training went on meanwhile).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from transformers import TrainerCallback

import finetune.commands.train
from finetune.training.checkpointing import CrashSafeCheckpoints


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(TrainerCallback):
    def __init__(self, point: str, step: int) -> None:
        self.point, self.step = point, step
        # Its on_save needs the checkpoint in place only to kill after or during a save; the other
        # kill points run with the default background saves.
        self.reads_checkpoint_on_save = point in ("after-save", "during-save")

    def on_substep_end(self, args, state, control, **kwargs):
        if self.point == "mid-window" and state.global_step == self.step:
            die()

    def on_step_end(self, args, state, control, **kwargs):
        if self.point == "mid-epoch" and state.global_step == self.step:
            die()

    def on_save(self, args, state, control, **kwargs):
        if self.point == "after-save" and state.global_step == self.step:
            die()


class KillWhileWriting(TrainerCallback):
    """Kills the run two updates after checkpoint STEP was saved, once its held background write has begun.

    No ``on_save``: a callback that has one gets its checkpoints written in place.
    """

    def __init__(self, step: int, writing: threading.Event) -> None:
        self.step, self.writing = step, writing

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step + 2:
            assert self.writing.wait(timeout=120), "the background write never started"
            die()


def hold_background_write(step: int) -> threading.Event:
    """The background write of checkpoint ``step`` writes the model files, then waits forever."""
    write, writing = CrashSafeCheckpoints._write_snapshot, threading.Event()

    def write_then_hang(self, snapshot, staging):
        if snapshot.global_step != step:
            return write(self, snapshot, staging)
        self._save(str(staging), state_dict=snapshot.model_state)
        writing.set()
        threading.Event().wait()

    CrashSafeCheckpoints._write_snapshot = write_then_hang
    return writing


def main() -> None:
    recipe, point, step, *overrides = sys.argv[1:]
    step = int(step)
    if point == "during-background-write":
        callback = KillWhileWriting(step, hold_background_write(step))
        finetune.commands.train.train(recipe, overrides, callbacks=[callback])
        return
    if point == "during-save":
        write = CrashSafeCheckpoints._write_checkpoint_files

        def write_then_die(self, staging):
            if self.state.global_step == step:
                self.save_model(str(staging), _internal_call=True)
                die()
            write(self, staging)

        CrashSafeCheckpoints._write_checkpoint_files = write_then_die
    finetune.commands.train.train(recipe, overrides, callbacks=[KillAt(point, step)])


if __name__ == "__main__":
    main()
