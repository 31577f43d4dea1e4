"""Issue 29: a launch of several processes trains as one launch or is refused; a write the disk refuses is an error.

The cases, each a bad-input case in the sense of tests/bad_input/ (one
line naming the problem and the fix, exit status 2, nothing on disk lost):

- launching (the README's launches on a machine without a GPU train as 2 processes: in
  tests/test_distributed.py, with what each rank writes): a launch whose processes would each train
  alone (refused before any folder is made);
  a run folder locked by a process of the same launch (named as such, not as another run);
  ``--seeds`` under torchrun (rank 0 alone writes and prints the summary);
- writing: predict --output onto /dev/full (through a link); evaluate under a file-size limit (the
  earlier results kept whole); evaluate's files, the run report and the model card onto /dev/full;
  the shared writer when the sync fails (earlier file kept) and through a link.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm_processes
from helpers import tiny_recipe
from test_distributed import LAUNCHERS, PROCESSES

from finetune.errors import FinetuneError


def launched(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a launcher's ``command`` and return what it did, output and all."""
    return subprocess.run(
        command, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300
    )


# --------------------------------------------------------------------------- launching


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


# --------------------------------------------------------------------------- writing


def full_device_link(folder: Path, name: str) -> Path:
    """``folder/name`` as a link to /dev/full, where every write fails with ENOSPC.

    A link, never /dev/full itself: the code this guards once renamed its output over the target, and
    run as root without the fix that would replace the machine's /dev/full with a plain file.
    """
    link = folder / name
    link.symlink_to("/dev/full")
    return link


def one_error_line(status: int, capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_predict_onto_a_full_device_fails_and_never_says_it_wrote(tiny_model_dir, tmp_path, capsys):
    # predict once wrote a .partial beside the target, renamed it over the target (the device, or a link
    # to it) and printed "wrote 2 predictions to /dev/full" with exit status 0.
    from finetune.cli import main

    (tmp_path / "in.csv").write_text("review\ngreat\nawful\n", encoding="utf-8")
    output = full_device_link(tmp_path, "predictions.csv")
    status = main(
        ["predict", str(tiny_model_dir), "--input", str(tmp_path / "in.csv"), "--output", str(output), "--overwrite"]
    )
    assert one_error_line(status, capsys) == (
        f"error: cannot write {output} (No space left on device); free disk space or choose another --output"
    )
    assert output.is_symlink() and os.readlink(output) == "/dev/full"  # written through, not replaced
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.csv", "predictions.csv"]  # no .partial left


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 2-update run (tests/bad_input's), evaluated once on its train split; each test works on a copy."""
    from bad_input.common import run_recipe

    from finetune.cli import main

    folder = tmp_path_factory.mktemp("trained")
    assert main(["train", str(run_recipe(folder, tiny_model_dir, baseline="true"))]) == 0
    assert main(["evaluate", str(folder / "run"), *EVALUATE_FLAGS]) == 0
    return folder / "run"


EVALUATE_FLAGS = ["--split", "train", "--no_baseline", "--resamples", "10"]


@pytest.fixture
def run_dir(trained_run, tmp_path) -> Path:
    import shutil

    shutil.copytree(trained_run, tmp_path / "run")
    return tmp_path / "run"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_evaluate_on_a_full_disk_keeps_the_earlier_results(run_dir):
    # evaluate once opened each file in place: the disk refusing a write (here: the file-size limit)
    # left the earlier errors_train.csv cut to nothing, and the message named no file.
    before = snapshot(run_dir)
    limit = len(before["errors_train.csv"]) // 2

    done = warm_processes.run(
        [sys.executable, "-m", "finetune", "evaluate", str(run_dir), *EVALUATE_FLAGS],
        capture_output=True,
        text=True,
        preexec_fn=functools.partial(resource.setrlimit, resource.RLIMIT_FSIZE, (limit, limit)),
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot write {run_dir / 'errors_train.csv'} (File too large); free disk space or choose another folder"
    )
    assert "saved to" not in done.stderr and "also wrote" not in done.stderr
    assert snapshot(run_dir) == before  # every earlier result whole, no .partial left


@pytest.mark.parametrize(
    "name", ["evaluation_train.json", "evaluation_train.md", "errors_train.csv", "reliability_train.png"]
)
def test_evaluate_onto_a_full_device_names_the_file(run_dir, capsys, name):
    from finetune.cli import main

    (run_dir / name).unlink()
    link = full_device_link(run_dir, name)
    status = main(["evaluate", str(run_dir), *EVALUATE_FLAGS])
    assert one_error_line(status, capsys) == (
        f"error: cannot write {link} (No space left on device); free disk space or choose another folder"
    )


@pytest.mark.parametrize("name", ["README.md", "report/metrics.json", "report/history.csv", "report/loss.png"])
def test_run_report_and_model_card_onto_a_full_device(run_dir, name):
    from transformers import TrainerState

    from finetune.evaluation.model_card import write_model_card
    from finetune.evaluation.report import write_run_report
    from finetune.training.runs import find_run_config

    (run_dir / name).unlink()
    link = full_device_link(run_dir / Path(name).parent, Path(name).name)
    with pytest.raises(FinetuneError) as refused:
        if name == "README.md":
            write_model_card(run_dir)
        else:
            state = TrainerState.load_from_json(str(run_dir / "trainer_state.json"))
            recipe = find_run_config(run_dir)["recipe"]
            write_run_report(run_dir, quiet_run_args(run_dir), state, [], recipe, train_metrics={})
    assert (
        str(refused.value) == f"cannot write {link} (No space left on device); free disk space or choose another folder"
    )


def quiet_run_args(run_dir: Path):
    from helpers import quiet_args

    return quiet_args(run_dir, per_device_train_batch_size=4)


def test_output_file_keeps_the_earlier_file_when_the_sync_fails(tmp_path, monkeypatch):
    # Some disks (network, quota) refuse a write only at the sync or the close.
    from finetune.config.output_files import write_output_text

    earlier = tmp_path / "metrics.json"
    earlier.write_text("earlier\n", encoding="utf-8")

    def disk_full(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(FinetuneError, match=r"^cannot write .*metrics.json \(No space left on device\); free disk"):
        write_output_text(earlier, "new\n")
    assert earlier.read_text(encoding="utf-8") == "earlier\n"
    assert [path.name for path in tmp_path.iterdir()] == ["metrics.json"]


def test_output_file_through_a_link_replaces_the_file_it_names(tmp_path):
    from finetune.config.output_files import write_output_text

    (tmp_path / "real.json").write_text("earlier\n", encoding="utf-8")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    write_output_text(tmp_path / "link.json", "new\n")
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text(encoding="utf-8") == "new\n"


@pytest.mark.slow
def test_launched_seeds_summary_is_written_and_printed_by_rank_0_only(tmp_path, tiny_model_dir):
    # Every process once wrote seeds.json and seeds.md into the same folder and printed the table.
    from test_distributed import recording_writes

    run_dir = tmp_path / "run"
    recipe = tiny_recipe(tmp_path, tiny_model_dir, run_dir, num_train_epochs=1, baseline="false")
    hooks, env = recording_writes(tmp_path, run_dir)
    command = [*LAUNCHERS["torchrun"], "-m", "finetune", "train", str(recipe), "--seeds", "1"]
    done = launched(command, cwd=tmp_path, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert json.loads((run_dir / "seeds.json").read_text())["seeds"] == [42]
    assert done.stdout.count("| seed |") == 1  # the table, printed once
    rank_1_log = hooks / "writes-rank1.txt"
    rank_1 = rank_1_log.read_text().splitlines() if rank_1_log.exists() else []
    assert [line for line in rank_1 if "seeds." in line] == []
