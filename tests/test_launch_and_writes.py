"""Issue 29: a launch of several processes trains as one launch or is refused; a write the disk refuses is an error.

The cases, each a bad-input case in the sense of tests/test_bad_input.py (one
line naming the problem and the fix, exit status 2, nothing on disk lost):

- launching: the README's ``torchrun --nproc_per_node 2 -m finetune train`` and ``accelerate launch
  --multi_gpu --num_processes 2`` on a machine without a GPU and without use_cpu (they train as 2
  processes); a launch whose processes would each train alone (refused before any folder is made);
  a run folder locked by a process of the same launch (named as such, not as another run);
- writing: predict --output onto /dev/full (or a link to it) or with stdout on it; a full disk under
  evaluate's files, the run report, the model card, a --seeds summary, and any output file written
  through the shared writer, which keeps the earlier file whole.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import tiny_recipe
from test_distributed import LAUNCHERS, PROCESSES, free_port

from finetune.errors import FinetuneError

TRAIN_REVIEWS = 458  # data/reviews' train split, as tiny_recipe reads it


def launched(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a launcher's ``command`` and return what it did, output and all."""
    return subprocess.run(
        command, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300
    )


def launcher_command(launcher: str) -> list[str]:
    command = LAUNCHERS[launcher]
    return [*command, "--main_process_port", str(free_port())] if launcher == "accelerate" else command


# --------------------------------------------------------------------------- launching


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_readme_launch_on_cpu_without_use_cpu_trains_as_two_processes(tmp_path, tiny_model_dir, launcher):
    # Both processes once set themselves up as a lone process 0: the second met the first's folder
    # lock and was told "another finetune run" held it (before the lock, two trainings shared the folder).
    run_dir = tmp_path / "run"
    recipe = tiny_recipe(tmp_path, tiny_model_dir, run_dir, use_cpu=None, num_train_epochs=1, baseline="false")
    done = launched([*launcher_command(launcher), "-m", "finetune", "train", str(recipe)], cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert output.count("no GPU found: the 2 launched processes train together on the CPU") == 1  # rank 0 only
    state = json.loads((run_dir / "trainer_state.json").read_text())
    # n_accumulate 2, micro-batch 16 on each of 2 processes; one process alone would take 15 updates.
    assert state["global_step"] == math.ceil(math.ceil(TRAIN_REVIEWS / (PROCESSES * 16)) / 2) == 8
    assert json.loads((run_dir / "report" / "metrics.json").read_text())["batch"]["world_size"] == PROCESSES
    assert sorted(path.name for path in run_dir.glob("*.safetensors")) == ["model.safetensors"]


# Loaded by the launched processes: torch then claims an accelerator it cannot use for a distributed
# launch (as MPS on a Mac: accelerate runs one process per device only on CUDA, XPU, NPU and the like).
CLAIM_AN_ACCELERATOR = """
import torch

torch.accelerator.is_available = lambda: True
"""


def test_launch_whose_processes_would_train_alone_is_refused(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    recipe = tiny_recipe(tmp_path, tiny_model_dir, run_dir, use_cpu=None)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(CLAIM_AN_ACCELERATOR), encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))}
    done = launched([*LAUNCHERS["torchrun"], "-m", "finetune", "train", str(recipe)], cwd=tmp_path, env=env)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert (
        errors
        == [
            "error: 2 processes were launched, but this one is set up with world size 1, so they would not train "
            "together (each alone, into the same output_dir); launch one process per GPU, or pass --use_cpu true to "
            "train them together on the CPU"
        ]
        * PROCESSES
    )
    assert "another finetune run" not in done.stderr
    assert not run_dir.exists()  # refused before the folder was made


LAUNCH = {"WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_folder_locked_by_a_process_of_the_same_launch_says_so(tmp_path, monkeypatch):
    from finetune.training.runs import output_dir_lock

    run_dir = tmp_path / "run"
    for name, value in {**LAUNCH, "RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with output_dir_lock(str(run_dir)):  # rank 0 holds it
        monkeypatch.setenv("RANK", "1")
        with pytest.raises(FinetuneError) as sibling, output_dir_lock(str(run_dir)):
            pass
        monkeypatch.setenv("MASTER_PORT", "29501")  # another launch
        with pytest.raises(FinetuneError) as stranger, output_dir_lock(str(run_dir)):
            pass
    assert str(sibling.value) == (
        f"output_dir {run_dir} is locked by process {os.getpid()}, rank 0 of this same launch: more than one of the "
        "launched processes acts as the main one, so they would not train together; pass --use_cpu true on a "
        "machine without a GPU, or launch one process per GPU"
    )
    assert str(stranger.value) == (
        f"output_dir {run_dir} is in use by another finetune run (process {os.getpid()}); "
        "wait for it to finish, or choose another --output_dir"
    )
