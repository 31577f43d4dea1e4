"""Kill a real run at random moments, resume it each time, and compare with an uninterrupted run.

    python scripts/kill_and_resume.py recipes/quickstart.yaml --kills 10 --seed 0

Trains the recipe once without interruption (OUT/reference), then again
(OUT/interrupted), sending SIGKILL to the process at ``--kills`` random moments
and resuming with ``--resume_from_checkpoint auto`` after each. A moment is
a random 0-6 s after the process has saved its first new checkpoint, so every
kill lands inside training (mid-window, mid-epoch, during a save...) and every
resumed process leaves something to compare. Both runs save
a checkpoint every ``--save_steps`` updates and keep them all, so each kill
gets its own verdict: the checkpoints the resumed process wrote are compared
bitwise (weights, and every logged loss so far) with the reference's of the
same update. At the end the final models are compared too.

Prints one line per kill and a summary; exits 1 unless every comparison is equal.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

# Frequent, kept checkpoints; with saves every few steps, best-model reloading (which wants
# evaluation on the same schedule) is off, so the final model is the last weights.
CHECKPOINT_FLAGS = ("--save_strategy", "steps", "--save_total_limit", "1000", "--load_best_model_at_end", "false")


def train(recipe: str, output_dir: Path, *flags: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "finetune", "train", recipe, "--output_dir", str(output_dir), *flags]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def checkpoint_steps(run_dir: Path) -> set[int]:
    return {int(path.name.split("-")[1]) for path in run_dir.glob("checkpoint-*")}


def same_model(left: Path, right: Path) -> bool:
    """Weights bitwise equal and the same logged losses."""
    ours, theirs = load_file(left / "model.safetensors"), load_file(right / "model.safetensors")
    if ours.keys() != theirs.keys() or not all(bool((ours[name] == theirs[name]).all()) for name in ours):
        return False
    return logged_losses(left) == logged_losses(right)


def logged_losses(folder: Path) -> list[tuple]:
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    return [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    parser.add_argument("--save_steps", type=int, default=5)
    parser.add_argument("--out", default="runs/kill-and-resume")
    parser.add_argument("--keep_reference", action="store_true", help="reuse OUT/reference from an earlier call")
    options = parser.parse_args()
    out = Path(options.out)
    reference = out / "reference"
    if not (options.keep_reference and (reference / "model.safetensors").is_file()):
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out / "interrupted", ignore_errors=True)
    flags = (*CHECKPOINT_FLAGS, "--save_steps", str(options.save_steps))
    moments = random.Random(options.seed)

    started = time.perf_counter()
    if (reference / "model.safetensors").is_file():
        print(f"uninterrupted run: reused from {reference}")
    elif train(options.recipe, reference, *flags).wait() != 0:
        print("the uninterrupted run failed", file=sys.stderr)
        return 1
    else:
        print(f"uninterrupted run: {time.perf_counter() - started:.0f} s")
    print(f"reference checkpoints: {sorted(checkpoint_steps(reference))}")

    interrupted = out / "interrupted"
    verdicts: list[bool] = []
    resumed_from = None
    process = train(options.recipe, interrupted, *flags)
    for kill in range(1, options.kills + 1):
        before = checkpoint_steps(interrupted)
        delay = moments.uniform(0, 6)
        while process.poll() is None and checkpoint_steps(interrupted) <= before:
            time.sleep(0.2)
        try:
            process.wait(timeout=delay)
            print(f"the run finished before kill {kill}; use a longer recipe or fewer kills", file=sys.stderr)
            return 1
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
        print(f"kill {kill}: SIGKILL {delay:.1f} s after its first new checkpoint, latest checkpoint {resumed_from}")
        flags_now = ("--resume_from_checkpoint", "auto") if resumed_from else ("--overwrite_output_dir",)
        process = train(options.recipe, interrupted, *flags, *flags_now)
    before = checkpoint_steps(interrupted)
    if process.wait() != 0:
        print("the last resumed run failed", file=sys.stderr)
        return 1
    new = sorted(checkpoint_steps(interrupted) - before)
    equal = all(same_model(interrupted / f"checkpoint-{step}", reference / f"checkpoint-{step}") for step in new)
    final_equal = same_model(interrupted, reference)
    verdicts.append(equal and final_equal)
    last = f"resume {options.kills} (from checkpoint-{resumed_from})"
    print(f"{last}: saved {new}, final model bitwise equal: {final_equal}")
    print(f"{sum(verdicts)} of {options.kills} resumed runs ended bitwise equal to the uninterrupted run")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
