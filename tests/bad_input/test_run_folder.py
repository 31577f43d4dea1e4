"""Bad input, the run folder: an earlier run kept, --overwrite_output_dir checked first, unusable or busy output_dir.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from .common import GOOD_ROWS, earlier_run, recipe_with, run_cli, snapshot, unwritable_folder, write_csv


def test_output_dir_holding_a_run_is_kept(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-5").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    (run_dir / "checkpoint-5" / "model.safetensors").write_bytes(b"weights")
    before = snapshot(run_dir)
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert "already holds a run; pass --overwrite_output_dir" in message
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    ("fields", "data", "message"),
    [
        ({}, None, "train file not found"),
        ({"text_column": "body"}, GOOD_ROWS, "has no column 'body'"),
        ({}, "review,stars\ngreat,7\n", "every row was dropped"),
        ({"model_name_or_path": "/nonexistent/model"}, GOOD_ROWS, "cannot load model '/nonexistent/model'"),
        ({"label_bins": "negative=1-2,positive=3-5"}, GOOD_ROWS, "has a classification head for 3 classes"),
        ({"max_length": 4096}, GOOD_ROWS, "positions model"),
        ({"resume_from_checkpoint": "auto"}, GOOD_ROWS, "no complete checkpoint to resume"),
    ],
    ids=["missing-data", "wrong-column", "every-row-dropped", "missing-model", "other-head", "max-length", "resume"],
)
def test_overwrite_checks_everything_before_deleting(tmp_path, tiny_model_dir, capsys, fields, data, message):
    if data is not None:
        write_csv(tmp_path / "train.csv", data)
    run_dir = tmp_path / "run"
    before = earlier_run(run_dir)
    recipe = recipe_with(tmp_path, tiny_model_dir, **fields)
    assert message in run_cli(["train", recipe, "--overwrite_output_dir"], capsys)
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("start_from", ["run", "run/checkpoint-5"])
def test_overwrite_never_deletes_the_model_the_run_starts_from(tmp_path, tiny_model_dir, capsys, start_from):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    run_dir = tmp_path / "run"
    # An earlier run whose final model (and checkpoint) this run fine-tunes further.
    shutil.copytree(tiny_model_dir, run_dir / "checkpoint-5")
    shutil.copytree(tiny_model_dir, run_dir, dirs_exist_ok=True)
    (run_dir / "finetune_run.json").write_text('{"recipe": "earlier"}')
    before = snapshot(run_dir)
    model = tmp_path / start_from
    recipe = recipe_with(tmp_path, tiny_model_dir, model_name_or_path=str(model))
    assert run_cli(["train", recipe, "--overwrite_output_dir"], capsys) == (
        f"error: output_dir {run_dir} holds the model this run starts from ({model}), which "
        "--overwrite_output_dir would delete; choose another --output_dir"
    )
    assert snapshot(run_dir) == before


def test_overwrite_keeps_a_base_model_it_would_not_delete(tmp_path):
    from finetune.training.runs import check_base_model_kept

    # Only the folder's own model files and its checkpoint-* folders are replaced; a model beside them is not.
    (tmp_path / "run" / "base").mkdir(parents=True)
    check_base_model_kept(str(tmp_path / "run"), str(tmp_path / "run" / "base"))


def test_output_dir_that_is_a_file(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "run").write_text("notes")
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys) == (
        f"error: output_dir {tmp_path / 'run'} is a file, not a folder; choose another --output_dir"
    )
    assert (tmp_path / "run").read_text() == "notes"


def test_output_dir_under_an_unwritable_folder(tmp_path, tiny_model_dir, capsys):
    output_dir = unwritable_folder(tmp_path) / "run"
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, output_dir=str(output_dir))], capsys)
    assert error.startswith(f"error: cannot create output_dir {output_dir} (")
    assert error.endswith("); choose a folder you can write to with --output_dir")


def test_a_second_run_on_the_same_folder_is_refused_at_once(tmp_path, tiny_model_dir, capsys):
    from finetune.training.runs import LOCK_FILE, output_dir_lock

    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    run_dir = tmp_path / "run"
    with output_dir_lock(str(run_dir)):  # the first run, still training
        started = time.perf_counter()
        error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
        assert time.perf_counter() - started < 5
        assert (run_dir / LOCK_FILE).is_file()
    assert error == (
        f"error: output_dir {run_dir} is in use by another finetune run (process {os.getpid()}); "
        "wait for it to finish, or choose another --output_dir"
    )
    assert not run_dir.exists()  # the first run's lock is gone, and so is the folder it made for nothing


@pytest.mark.parametrize("names", [["README.md"], ["notes.txt", "README.md", "train.csv", "test.csv"]])
def test_output_dir_of_someone_elses_files_is_refused(tmp_path, tiny_model_dir, capsys, names):
    # A run writes its model card as README.md: a dataset's or a notes folder's own README.md was replaced.
    folder = tmp_path / "notes"
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"my {name}\n", encoding="utf-8")
    before = snapshot(folder)
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir, output_dir=str(folder))], capsys) == (
        f"error: output_dir {folder} is not empty ({shown}) and holds no run; a run writes README.md, "
        "config.json and more into it, so choose a new or empty --output_dir, or pass --overwrite_output_dir "
        "to write there anyway (files of the same names are replaced)"
    )
    assert snapshot(folder) == before and sorted(path.name for path in folder.iterdir()) == sorted(names)
