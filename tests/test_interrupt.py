"""Ctrl-C / SIGTERM: stop at the next update, save a checkpoint, say how to resume, exit 130 / 143."""

from __future__ import annotations

import json
import signal
import sys

import pytest
import warm_processes
from helpers import tiny_recipe


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_a_checkpoint_and_the_run_resumes(tmp_path, tiny_model_dir, signum, status):
    run_dir = tmp_path / "run"
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        run_dir,
        max_steps=40,
        per_device_train_batch_size=4,
        eval_strategy="no",
        save_strategy="no",
        load_best_model_at_end="false",
        logging_steps=1,
    )
    command = [sys.executable, "-m", "finetune", "train", str(recipe)]
    process = warm_processes.Popen(command, stdout=warm_processes.PIPE, stderr=warm_processes.PIPE, text=True)
    # With tqdm off, Trainer prints each log as a line on stdout: the first one means training runs.
    for line in process.stdout:
        if "'loss'" in line:
            process.send_signal(signum)
            break
    _, err = process.communicate(timeout=120)
    assert process.returncode == status, err
    last = err.strip().splitlines()[-1]
    assert f"stopped by {signal.Signals(signum).name} at update" in last
    assert f"resume with: finetune train {recipe} --resume_from_checkpoint auto" in last
    saved = sorted(run_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert len(saved) == 1 and str(saved[0]) in last
    stopped_at = int(saved[0].name.split("-")[1])
    assert 1 <= stopped_at < 40
    assert not (run_dir / "model.safetensors").exists()  # the run is not finished: no final model

    resumed = warm_processes.run([*command, "--resume_from_checkpoint", "auto"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 40
