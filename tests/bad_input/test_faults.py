"""Bad input, faults while training: a full disk at a save, non-finite weights, SIGTERM during an evaluation.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import warm_processes
from transformers import TrainerCallback

from finetune.errors import FinetuneError, TrainingInterrupted

from .common import run_recipe, snapshot


def train_with_file_size_limit(recipe: Path, limit_bytes: int, *flags: str) -> subprocess.CompletedProcess:
    """``finetune train`` in a process that may write no file larger than ``limit_bytes`` (a full disk, in effect)."""
    return warm_processes.run(
        [sys.executable, "-m", "finetune", "train", str(recipe), *flags],
        capture_output=True,
        text=True,
        preexec_fn=functools.partial(resource.setrlimit, resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes)),
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit_bytes", "reason"),
    # The tiny model's safetensors is 4 MB, its optimizer state 8 MB.
    [(1_000_000, "File too large"), (6_000_000, "a file was cut short: the disk is full or a file-size limit")],
    ids=["safetensors-fails", "torch-save-fails"],
)
def test_failed_checkpoint_save_keeps_the_previous_one(run_copy, limit_bytes, reason):
    run_dir = run_copy / "run"
    shutil.rmtree(run_dir / "checkpoint-2")
    kept = snapshot(run_dir / "checkpoint-1")
    result = train_with_file_size_limit(run_copy / "recipe.yaml", limit_bytes, "--resume_from_checkpoint", "auto")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot save {run_dir / 'checkpoint-2'} ({reason}")
    assert last.endswith(
        f"; the previous checkpoint {run_dir / 'checkpoint-1'} is kept; free disk space or choose another output_dir"
    )
    assert sorted(path.name for path in run_dir.glob("*checkpoint-*")) == ["checkpoint-1"]  # no .partial left
    assert snapshot(run_dir / "checkpoint-1") == kept


@pytest.mark.slow
def test_failed_final_save_leaves_no_half_model(tmp_path, tiny_model_dir):
    recipe = run_recipe(tmp_path, tiny_model_dir, save_strategy="no")
    result = train_with_file_size_limit(recipe, 1_000_000)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot save the final model in {tmp_path / 'run'} (File too large); "
        "no checkpoint was saved; free disk space or choose another output_dir and train again"
    )
    assert not (tmp_path / "run" / "model.safetensors").exists()
    assert not (tmp_path / "run" / ".final-model.partial").exists()


class PoisonWeightsAtTheEnd(TrainerCallback):
    """Puts a NaN into the weights once training has ended, as a diverged run would leave them."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        import torch

        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = float("nan")


def test_non_finite_weights_are_never_saved(tmp_path, tiny_model_dir):
    from finetune.commands.train import train

    recipe = run_recipe(tmp_path, tiny_model_dir)
    with pytest.raises(FinetuneError) as refused:
        train(str(recipe), callbacks=[PoisonWeightsAtTheEnd()])
    run_dir = tmp_path / "run"
    assert str(refused.value) == (
        f"the weights hold NaN or inf at update 2, so the final model in {run_dir} is not saved; "
        f"the last good checkpoint is {run_dir / 'checkpoint-2'}; lower learning_rate"
    )
    assert not (run_dir / "model.safetensors").exists()


class SignalDuringFirstEvaluation(TrainerCallback):
    """Sends this process SIGTERM while the first evaluation runs, as a cluster's scheduler might."""

    sent = False

    def on_prediction_step(self, args, state, control, **kwargs):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_an_evaluation_stops_at_that_update(tmp_path, tiny_model_dir):
    from finetune.commands.train import train

    recipe = run_recipe(tmp_path, tiny_model_dir, max_steps=6, eval_strategy="steps", eval_steps=2, save_steps=100)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(str(recipe), callbacks=[SignalDuringFirstEvaluation()])
    run_dir = tmp_path / "run"
    assert stopped.value.exit_status == 143
    assert str(stopped.value).startswith("stopped by SIGTERM at update 2 (epoch ")
    assert f"checkpoint saved in {run_dir / 'checkpoint-2'};" in str(stopped.value)
    assert [path.name for path in run_dir.glob("checkpoint-*")] == ["checkpoint-2"]
