"""Run ``finetune train`` in this process and SIGKILL it at a chosen moment (for tests/test_resume.py).

    python tests/resume_worker.py RECIPE KILL_POINT STEP [--flag value ...]

KILL_POINT is one of:
- ``mid-window``: after the first micro-batch of update STEP + 1 (gradients half accumulated);
- ``mid-epoch``: right after update STEP, before anything else happens;
- ``after-save``: right after the checkpoint of update STEP is in place;
- ``during-save``: while the checkpoint of update STEP is being written (model saved, the rest not).
"""

from __future__ import annotations

import os
import signal
import sys

from transformers import TrainerCallback

import finetune.commands.train
from finetune.training.checkpointing import CrashSafeCheckpoints


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(TrainerCallback):
    def __init__(self, point: str, step: int) -> None:
        self.point, self.step = point, step

    def on_substep_end(self, args, state, control, **kwargs):
        if self.point == "mid-window" and state.global_step == self.step:
            die()

    def on_step_end(self, args, state, control, **kwargs):
        if self.point == "mid-epoch" and state.global_step == self.step:
            die()

    def on_save(self, args, state, control, **kwargs):
        if self.point == "after-save" and state.global_step == self.step:
            die()


def main() -> None:
    recipe, point, step, *overrides = sys.argv[1:]
    step = int(step)
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
