"""Bad input, resuming: inexact resumes refused, damaged checkpoints and run records named and kept.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from finetune.cli import main

from .common import damage, run_cli, snapshot, write_csv


def drop_rng_state_to_two_processes(checkpoint: Path) -> None:
    state = checkpoint / "rng_state.pth"
    shutil.copy(state, checkpoint / "rng_state_0.pth")
    state.rename(checkpoint / "rng_state_1.pth")
    marker = checkpoint / "finetune_checkpoint_complete.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "world_size": 2}))


@pytest.mark.parametrize(
    ("change", "flags", "message"),
    [
        (
            lambda checkpoint: (checkpoint / "optimizer.pt").unlink(),
            [],
            "it has no optimizer state (optimizer.pt); resume from a checkpoint saved without save_only_model, "
            "or pass --allow_inexact_resume to go on anyway",
        ),
        (lambda checkpoint: (checkpoint / "scheduler.pt").unlink(), [], "it has no scheduler state (scheduler.pt)"),
        (lambda checkpoint: (checkpoint / "rng_state.pth").unlink(), [], "it has no random state (rng_state*.pth)"),
        (
            None,
            ["--n_accumulate", "2"],
            "this run changes gradient_accumulation_steps 1 -> 2; resume with the settings it was saved with, "
            "or pass --allow_inexact_resume to go on anyway",
        ),
        (None, ["--per_device_train_batch_size", "2"], "this run changes per_device_train_batch_size 4 -> 2"),
        (drop_rng_state_to_two_processes, [], "this run changes world_size 2 -> 1"),
    ],
    ids=["no-optimizer", "no-scheduler", "no-rng-state", "other-n", "other-micro-batch", "other-world-size"],
)
def test_inexact_resume_is_refused(run_copy, capsys, change, flags, message):
    checkpoint = run_copy / "run" / "checkpoint-1"
    (run_copy / "run" / "checkpoint-2").rename(run_copy / "run" / ".checkpoint-2.old")  # auto takes checkpoint-1
    if change is not None:
        change(checkpoint)
    before = snapshot(run_copy / "run")
    error = run_cli(["train", run_copy / "recipe.yaml", "--resume_from_checkpoint", "auto", *flags], capsys)
    assert error.startswith(f"error: resuming {checkpoint} cannot equal an uninterrupted run: ")
    assert message in error
    assert snapshot(run_copy / "run") == before  # finetune_run.json included


def test_inexact_resume_goes_on_when_allowed_and_says_what_changes(run_copy, capsys):
    run_dir = run_copy / "run"
    shutil.rmtree(run_dir / "checkpoint-2")
    (run_dir / "checkpoint-1" / "optimizer.pt").unlink()
    flags = ["--resume_from_checkpoint", "auto", "--allow_inexact_resume"]
    assert main(["train", str(run_copy / "recipe.yaml"), *flags]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: resuming")]
    assert warnings == [
        f"warning: resuming {run_dir / 'checkpoint-1'} inexactly: it has no optimizer state (optimizer.pt) "
        "(the optimizer and the learning-rate schedule start afresh)"
    ]
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 2


def test_a_run_killed_before_its_first_checkpoint_starts_again_with_auto(run_copy, finished_run, capsys):
    from safetensors.torch import load_file

    # What a kill before the first save leaves: the run record, a checkpoint cut short, the lock file.
    run_dir = run_copy / "run"
    for path in run_dir.iterdir():
        if path.name != "finetune_run.json":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (run_dir / ".checkpoint-1.partial").mkdir()
    (run_dir / ".checkpoint-1.partial" / "model.safetensors").write_bytes(b"cut short")
    (run_dir / ".finetune.lock").write_text("")

    assert main(["train", str(run_copy / "recipe.yaml"), "--resume_from_checkpoint", "auto"]) == 0
    assert f"{run_dir}: the run there stopped before its first checkpoint" in capsys.readouterr().err
    # Trained from the beginning: the same weights as the uninterrupted run.
    weights, reference = load_file(run_dir / "model.safetensors"), load_file(finished_run / "run" / "model.safetensors")
    assert weights.keys() == reference.keys()
    assert all(weights[name].equal(reference[name]) for name in reference)


def test_resuming_on_edited_data_is_refused_unless_inexact_is_allowed(run_copy, capsys):
    run_dir = run_copy / "run"
    shutil.rmtree(run_dir / "checkpoint-2")
    train_csv = run_copy / "train.csv"
    train_csv.write_text(train_csv.read_text().replace("great", "grand"), encoding="utf-8")
    before = snapshot(run_dir)
    error = run_cli(["train", run_copy / "recipe.yaml", "--resume_from_checkpoint", "auto"], capsys)
    assert error == (
        f"error: resuming {run_dir / 'checkpoint-1'} cannot equal an uninterrupted run: the data files changed "
        "since the run began (train.csv); resume with the data it was trained on, train afresh with "
        "--overwrite_output_dir, or pass --allow_inexact_resume to go on anyway"
    )
    assert snapshot(run_dir) == before
    flags = ["--resume_from_checkpoint", "auto", "--allow_inexact_resume"]
    assert main(["train", str(run_copy / "recipe.yaml"), *flags]) == 0
    assert "warning: resuming" in capsys.readouterr().err
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 2


def test_evaluate_says_when_the_data_changed_since_training(run_copy, finished_run, capsys):
    # The copy's record points at the copy's data (same bytes), as a run trained there would.
    record = run_copy / "run" / "finetune_run.json"
    record.write_text(record.read_text().replace(str(finished_run), str(run_copy)), encoding="utf-8")
    train_csv = run_copy / "train.csv"
    assert main(["evaluate", str(run_copy / "run"), "--split", "train", "--no_baseline"]) == 0
    assert "changed since" not in capsys.readouterr().err
    train_csv.write_text(train_csv.read_text().replace("great", "grand"), encoding="utf-8")
    assert main(["evaluate", str(run_copy / "run"), "--split", "train", "--no_baseline"]) == 0
    assert (
        f"warning: train.csv changed since {run_copy / 'run'} was trained (other bytes than on record); "
        "the scores are on the files as they are now"
    ) in capsys.readouterr().err


def test_auto_without_a_checkpoint_beside_a_model_is_refused(run_copy, capsys):
    run_dir = run_copy / "run"
    for checkpoint in run_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    before = snapshot(run_dir)
    error = run_cli(["train", run_copy / "recipe.yaml", "--resume_from_checkpoint", "auto"], capsys)
    assert error == f"error: no complete checkpoint to resume in {run_dir}; drop --resume_from_checkpoint"
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        ("trainer_state.json", "trainer_state.json is damaged ("),
        ("model.safetensors", "model.safetensors is damaged or cut short ("),
        ("optimizer.pt", "optimizer.pt is damaged or cut short; resume from an earlier checkpoint"),
        ("rng_state.pth", "rng_state.pth is damaged or cut short"),
    ],
)
def test_damaged_checkpoint_is_refused_and_the_record_kept(run_copy, capsys, damaged, message):
    checkpoint = run_copy / "run" / "checkpoint-2"
    damage(checkpoint / damaged)
    before = snapshot(run_copy / "run")
    error = run_cli(["train", run_copy / "recipe.yaml", "--resume_from_checkpoint", str(checkpoint)], capsys)
    assert f"{checkpoint / damaged}" in error and message in error
    assert snapshot(run_copy / "run") == before


def test_optimizer_state_that_does_not_fit_is_refused_and_the_record_kept(run_copy, capsys):
    import torch

    # A well-formed file with the wrong content is found only when Trainer loads it: after the data
    # summary, but still before the run's record is rewritten or any update is made.
    checkpoint = run_copy / "run" / "checkpoint-2"
    torch.save({"state": {}, "param_groups": []}, checkpoint / "optimizer.pt")
    before = snapshot(run_copy / "run")
    assert main(["train", str(run_copy / "recipe.yaml"), "--resume_from_checkpoint", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot read checkpoint {checkpoint} (")
    assert last.endswith("it is damaged: resume from an earlier checkpoint, or drop --resume_from_checkpoint")
    assert snapshot(run_copy / "run") == before


def test_missing_checkpoint(run_copy, capsys):
    missing = run_copy / "run" / "checkpoint-99"
    error = run_cli(["train", run_copy / "recipe.yaml", "--resume_from_checkpoint", missing], capsys)
    assert error == f"error: checkpoint not found: {missing}; pass a checkpoint-* folder of the run, or auto"


@pytest.mark.parametrize("content", ['{"recipe_val', "[1, 2]"], ids=["cut-short", "not-an-object"])
@pytest.mark.parametrize("command", ["predict", "evaluate", "resume"])
def test_damaged_run_record_is_named(run_copy, capsys, command, content):
    # finetune_run.json says how the model reads reviews; damaged, it gave a JSONDecodeError traceback.
    run_dir = run_copy / "run"
    (run_dir / "finetune_run.json").write_text(content, encoding="utf-8")
    write_csv(run_copy / "in.csv", "review\ngreat\n")
    before = snapshot(run_dir)
    argv = {
        "predict": ["predict", run_dir, "--input", run_copy / "in.csv"],
        "evaluate": ["evaluate", run_dir],
        "resume": ["train", run_copy / "recipe.yaml", "--resume_from_checkpoint", "auto"],
    }[command]
    problem = "not a JSON object" if content.startswith("[") else "not JSON: "
    error = run_cli(argv, capsys)
    assert error.startswith(f"error: {run_dir / 'finetune_run.json'} is damaged or cut short ({problem}")
    assert error.endswith("restore it from a copy of the run, or train the run again")
    assert snapshot(run_dir) == before
