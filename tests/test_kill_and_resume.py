"""Opt-in, slow: kill a real recipe's run at random moments, resume it each time, compare with an uninterrupted run.

    FINETUNE_KILL_AND_RESUME=recipes/quickstart.yaml python -m pytest -n 0 -s tests/test_kill_and_resume.py

Skipped unless ``FINETUNE_KILL_AND_RESUME`` names a recipe (it trains that
recipe twice, about 10 kills long; ``tests/test_resume.py`` does the same to a
tiny run at chosen moments in every suite run). ``FINETUNE_KILLS`` (default
10) and ``FINETUNE_KILL_SEED`` (default 0) set the kills; with
``FINETUNE_KILL_AND_RESUME_OUT=DIR`` the runs go to DIR instead of a temporary
folder, and a finished DIR/reference is reused by the next call.

Trains the recipe once without interruption (OUT/reference), then again
(OUT/interrupted), sending SIGKILL to the process at random moments
and resuming with ``--resume_from_checkpoint auto`` after each. A moment is
a random 0-6 s after the process has saved its first new checkpoint, so every
kill lands inside training (mid-window, mid-epoch, during a save...) and every
resumed process leaves something to compare. Both runs save
a checkpoint every 5 updates and keep them all, so each kill
gets its own verdict: the checkpoints the resumed process wrote are compared
bitwise (weights, and every logged loss so far) with the reference's of the
same update. At the end the final models are compared too. ``-s`` shows one line per kill.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

PROJECT = Path(__file__).parent.parent
RECIPE = os.environ.get("FINETUNE_KILL_AND_RESUME")

# Frequent, kept checkpoints; with saves every few steps, best-model reloading (which wants
# evaluation on the same schedule) is off, so the final model is the last weights.
CHECKPOINT_FLAGS = ("--save_strategy", "steps", "--save_total_limit", "1000", "--load_best_model_at_end", "false")


def train(recipe: str, output_dir: Path, *flags: str) -> subprocess.Popen:
    """Start ``finetune train recipe`` into ``output_dir`` in its own process, quietly."""
    command = [sys.executable, "-m", "finetune", "train", recipe, "--output_dir", str(output_dir), *flags]
    # From the project root, so a recipe's relative data paths resolve as in the README's commands.
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=PROJECT)


def checkpoint_steps(run_dir: Path) -> set[int]:
    """The update numbers of the checkpoints in ``run_dir``."""
    return {int(path.name.split("-")[1]) for path in run_dir.glob("checkpoint-*")}


def same_model(left: Path, right: Path) -> bool:
    """Weights bitwise equal and the same logged losses."""
    ours, theirs = load_file(left / "model.safetensors"), load_file(right / "model.safetensors")
    if ours.keys() != theirs.keys() or not all(bool((ours[name] == theirs[name]).all()) for name in ours):
        return False
    return logged_losses(left) == logged_losses(right)


def logged_losses(folder: Path) -> list[tuple]:
    """(update, loss) of every training-loss log line in ``folder``'s trainer_state.json."""
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    return [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]


@pytest.mark.slow
@pytest.mark.skipif(not RECIPE, reason="opt-in: set FINETUNE_KILL_AND_RESUME=recipes/quickstart.yaml")
def test_every_resume_after_a_random_kill_is_bitwise_equal(tmp_path):
    kills = int(os.environ.get("FINETUNE_KILLS", "10"))
    out = Path(os.environ.get("FINETUNE_KILL_AND_RESUME_OUT") or tmp_path)
    verdicts = kill_and_resume(
        str(Path(RECIPE).resolve()), kills, int(os.environ.get("FINETUNE_KILL_SEED", "0")), save_steps=5, out=out
    )
    assert verdicts == [True] * kills


def kill_and_resume(recipe: str, kills: int, seed: int, save_steps: int, out: Path) -> list[bool]:
    """Train ``recipe`` uninterrupted and killed ``kills`` times; one verdict per resume, True where bitwise equal."""
    reference = out / "reference"
    if not (reference / "model.safetensors").is_file():
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out / "interrupted", ignore_errors=True)
    flags = (*CHECKPOINT_FLAGS, "--save_steps", str(save_steps))
    moments = random.Random(seed)

    started = time.perf_counter()
    if (reference / "model.safetensors").is_file():
        print(f"uninterrupted run: reused from {reference}")
    else:
        assert train(recipe, reference, *flags).wait() == 0, "the uninterrupted run failed"
        print(f"uninterrupted run: {time.perf_counter() - started:.0f} s")
    print(f"reference checkpoints: {sorted(checkpoint_steps(reference))}")

    interrupted = out / "interrupted"
    verdicts: list[bool] = []
    resumed_from = None
    process = train(recipe, interrupted, *flags)
    try:
        for kill in range(1, kills + 1):
            before = checkpoint_steps(interrupted)
            delay = moments.uniform(0, 6)
            while process.poll() is None and checkpoint_steps(interrupted) <= before:
                time.sleep(0.2)
            try:
                process.wait(timeout=delay)
                pytest.fail(f"the run finished before kill {kill}; use a longer recipe or fewer kills")
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
            new = sorted(checkpoint_steps(interrupted) - before)
            if kill > 1:
                # The verdict on the previous resume: what that process saved equals the reference.
                equal = bool(new) and all(
                    same_model(interrupted / f"checkpoint-{step}", reference / f"checkpoint-{step}") for step in new
                )
                verdicts.append(equal)
                print(f"resume {kill - 1} (from checkpoint-{resumed_from}): saved {new}, bitwise equal: {equal}")
            resumed_from = max(checkpoint_steps(interrupted), default=None)
            print(
                f"kill {kill}: SIGKILL {delay:.1f} s after its first new checkpoint, latest checkpoint {resumed_from}"
            )
            flags_now = ("--resume_from_checkpoint", "auto") if resumed_from else ("--overwrite_output_dir",)
            process = train(recipe, interrupted, *flags, *flags_now)
        before = checkpoint_steps(interrupted)
        assert process.wait() == 0, "the last resumed run failed"
    finally:
        if process.poll() is None:  # a failed check leaves no training process behind
            process.kill()
            process.wait()
    new = sorted(checkpoint_steps(interrupted) - before)
    equal = all(same_model(interrupted / f"checkpoint-{step}", reference / f"checkpoint-{step}") for step in new)
    final_equal = same_model(interrupted, reference)
    verdicts.append(equal and final_equal)
    print(f"resume {kills} (from checkpoint-{resumed_from}): saved {new}, final model bitwise equal: {final_equal}")
    print(f"{sum(verdicts)} of {kills} resumed runs ended bitwise equal to the uninterrupted run")
    return verdicts
