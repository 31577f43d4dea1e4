"""Bad input, data: missing files and columns, broken CSV, bad encodings, no rows, unusable labels, caches.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import fcntl
import os
import time

import pytest

from finetune.cli import main
from finetune.errors import FinetuneError

from .common import GOOD_ROWS, recipe_with, run_cli, write_csv


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


def test_missing_extra_train_file(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tiny_model_dir, extra_train_file=tmp_path / "short.csv")
    message = run_cli(["train", recipe], capsys)
    assert f"extra_train_file not found: {tmp_path / 'short.csv'}; check the path" in message
    assert not (tmp_path / "run").exists()


def test_extra_train_file_without_the_label_column(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    write_csv(tmp_path / "short.csv", "review,rating\nlove it,5\n")
    recipe = recipe_with(tmp_path, tiny_model_dir, extra_train_file=tmp_path / "short.csv")
    message = run_cli(["train", recipe], capsys)
    assert "short.csv" in message and "has no column 'stars'" in message and "set label_column" in message
    assert not (tmp_path / "run").exists()


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
    from finetune.fetching.catalog import get_entry
    from finetune.fetching.dataset import fetch

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
