"""Bad labels and classes: one line naming the problem and the fix, exit status 2, nothing on disk touched.

The cases: a recipe key that is not text, class_names naming a class twice,
a list or mapping where one label or review goes (JSON Lines), one class
(from label_bins, class_names or the data), text labels with stray spaces
(trimmed, as numbers are), a label_bins bound that is not finite or a range
written backwards, and an empty recipe. Each error comes before training.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_input.common import earlier_run, recipe_with, run_cli, snapshot, write_csv

from finetune.cli import main

# Labels as class names (no label_bins), three of each so a validation split can be stratified.
NAMED_ROWS = "review,stars\ngreat,pos\nawful,neg\nlovely,pos\nbad,neg\nnice,pos\nugly,neg\n"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the recipe


@pytest.mark.parametrize(("key", "shown"), [("1", "1"), ("null", "null"), ("true", "true")])
def test_recipe_key_that_is_not_text(tmp_path, tiny_model_dir, capsys, key, shown):
    recipe = recipe_with(tmp_path, tiny_model_dir, **{key: "x"})
    assert run_cli(["train", recipe], capsys) == (
        f"error: recipe {recipe} has the key {shown}, which is not a field name; recipe keys are field names "
        "such as learning_rate (run 'finetune train --help' for the valid keys)"
    )
    assert not (tmp_path / "run").exists()


def test_class_names_naming_a_class_twice(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", "review,stars\ngreat,1\nawful,0\nfine,2\nlovely,1\nbad,0\nokay,2\n")
    recipe = recipe_with(tmp_path, tiny_model_dir, label_bins="null", class_names="[neg, pos, neg]")
    assert run_cli(["train", recipe], capsys) == (
        "error: class_names names 'neg' twice; list each class once, in id order, "
        "e.g. class_names: [negative, positive]"
    )
    assert not (tmp_path / "run").exists()


def test_empty_recipe_names_no_stray_space(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text("", encoding="utf-8")
    assert run_cli(["train", "empty.yaml"], capsys) == (
        "error: no training data; set train_file, put a train.csv in dataset_dir, "
        "or name a dataset with dataset_name (see 'finetune data list')"
    )


# --------------------------------------------------------------------------- label_bins


@pytest.mark.parametrize(
    ("label_bins", "message"),
    [
        (
            "{negative: [.nan, 2], positive: [4, 5]}",
            "error: label_bins entry 'negative': [nan, 2] has a bound that is not a number (NaN); "
            "give ratings such as [1, 2] or 1-2",
        ),
        (
            # min/max alone would quietly turn this bin into [2, 2].
            "{negative: [2, .nan], positive: [4, 5]}",
            "error: label_bins entry 'negative': [2, nan] has a bound that is not a number (NaN); "
            "give ratings such as [1, 2] or 1-2",
        ),
        (
            "negative=5-1,positive=6",
            "error: label_bins entry 'negative': '5-1' is backwards; write the low end first, e.g. negative=1-5",
        ),
    ],
    ids=["nan", "nan-last", "backwards"],
)
def test_label_bins_bound_that_cannot_hold_a_rating(tmp_path, tiny_model_dir, capsys, label_bins, message):
    write_csv(tmp_path / "train.csv", "review,stars\ngreat,5\nawful,1\n")
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir, label_bins=label_bins)], capsys) == message
    assert not (tmp_path / "run").exists()


def test_label_bins_with_an_open_end_are_kept():
    # An infinite bound is an open end, which runs recorded before the NaN check use: it must still parse.
    from finetune.config.arguments import parse_label_bins

    bins = parse_label_bins({"negative": [float("-inf"), 2], "positive": [4, float("inf")]})
    assert bins == {"negative": [float("-inf"), 2.0], "positive": [4.0, float("inf")]}


# --------------------------------------------------------------------------- one class


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"label_bins": "all=1-5"},
            "error: label_bins has only the class 'all', and a classifier needs at least 2 classes; "
            "give two or more ranges, e.g. 'negative=1-2,positive=4-5'",
        ),
        (
            {"label_bins": "null", "class_names": "[only]"},
            "error: class_names names only 'only', and a classifier needs at least 2 classes; list every class, "
            "e.g. class_names: [negative, positive], or drop class_names to take them from the data",
        ),
    ],
    ids=["label-bins", "class-names"],
)
def test_one_class_in_the_recipe(tmp_path, tiny_model_dir, capsys, fields, message):
    write_csv(tmp_path / "train.csv", NAMED_ROWS)
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir, **fields)], capsys) == message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("label", "shown"), [("pos", "'pos'"), ("0", "'0'")], ids=["names", "ids"])
def test_one_class_in_the_data_leaves_an_earlier_run_alone(tmp_path, tiny_model_dir, capsys, label, shown):
    write_csv(tmp_path / "train.csv", "review,stars\n" + "".join(f"{word},{label}\n" for word in "abcdef"))
    before = earlier_run(tmp_path / "run")
    recipe = recipe_with(tmp_path, tiny_model_dir, label_bins="null")
    assert run_cli(["train", recipe, "--overwrite_output_dir"], capsys) == (
        f"error: {tmp_path / 'train.csv'}: every label in 'stars' is {shown}, and a classifier needs at least "
        "2 classes; check label_column, or set label_bins to group ratings into classes"
    )
    assert snapshot(tmp_path / "run") == before


# --------------------------------------------------------------------------- a list where one value goes


@pytest.mark.parametrize("label_bins", ["null", "negative=1-2,neutral=3,positive=4-5"], ids=["no-bins", "bins"])
@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"review": "great", "stars": [1]},
            "row 1: 'stars' holds a list ([1]); a label must be one number or word, e.g. 5 or positive: "
            "fix the row, or set label_column to another column",
        ),
        (
            {"review": "great", "stars": {"value": 1}},
            "row 1: 'stars' holds a mapping ({'value': 1}); a label must be one number or word, e.g. 5 or "
            "positive: fix the row, or set label_column to another column",
        ),
        (
            {"review": ["great"], "stars": 1},
            "row 1: 'review' holds a list (['great']); a review must be text: fix the row, "
            "or set text_column to another column",
        ),
    ],
    ids=["list-label", "mapping-label", "list-review"],
)
def test_a_list_or_mapping_where_one_value_goes(tmp_path, tiny_model_dir, capsys, label_bins, row, message):
    if isinstance(row["stars"], list) and label_bins == "null":
        # Without label_bins a list label is a review's tags (a multi_label run): [1] is a tag that is no word.
        message = (
            "row 1: 'stars' holds 1 among its tags; a review's tags are a list of words, e.g. [price, delivery]: "
            "write each tag as text"
        )
    train = write_jsonl(tmp_path / "train.jsonl", [row, {**row}])
    before = earlier_run(tmp_path / "run")
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file=str(train), label_bins=label_bins)
    assert run_cli(["train", recipe, "--overwrite_output_dir"], capsys) == f"error: {train} {message}"
    assert snapshot(tmp_path / "run") == before


def test_a_list_in_the_file_evaluate_scores(tmp_path, tiny_model_dir, capsys):
    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_labelled_file
    from finetune.errors import FinetuneError

    data = write_jsonl(tmp_path / "test.jsonl", [{"review": ["great"], "stars": "pos"}])
    data_args = DataArguments(text_column="review", label_column="stars")
    with pytest.raises(FinetuneError, match=r"test\.jsonl row 1: 'review' holds a list \(\['great'\]\); a review"):
        load_labelled_file(data, data_args, ["neg", "pos"])


# --------------------------------------------------------------------------- text labels with stray spaces


def _read_labels(tmp_path: Path, rows: str, **fields):
    """``rows`` (a CSV with review and stars) read as train and validation data, ``fields`` added."""
    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_review_data

    train = tmp_path / "train.csv"
    write_csv(train, rows)
    return load_review_data(
        DataArguments(
            train_file=str(train), text_column="review", label_column="stars", validation_file=str(train), **fields
        )
    )


def test_text_labels_are_trimmed_like_numbers(tmp_path):
    rows = "review,stars\ngreat,pos\nawful, neg\nfine,pos \nlovely,pos\nbad,neg\nokay,neg\n"
    data = _read_labels(tmp_path, rows)
    assert data.label_names == ["neg", "pos"]
    assert data.splits["train"]["labels"] == [1, 0, 1, 1, 0, 0]

    # Matched against the recipe's class names the same way.
    named = _read_labels(tmp_path, rows, class_names=["pos", "neg"])
    assert named.splits["train"]["labels"] == [0, 1, 0, 0, 1, 1]


def test_a_label_of_only_spaces_is_a_missing_label(tmp_path):
    from finetune.data.splits import MISSING_LABEL

    data = _read_labels(tmp_path, 'review,stars\ngreat,pos\nawful,neg\nhm,"  "\n')
    assert data.label_names == ["neg", "pos"]
    assert data.report.dropped["train"][MISSING_LABEL] == 1


def test_trimmed_text_labels_make_one_class_each_from_the_command_line(tmp_path, tiny_model_dir, capsys):
    # " neg", "neg", "pos" and "pos " are 2 classes, not 4, which the 3-class tiny model's head then disagrees with.
    write_csv(tmp_path / "train.csv", "review,stars\ngreat,pos\nawful, neg\nfine,pos \nlovely,pos\nbad,neg\nokay,neg\n")
    status = main(["train", str(recipe_with(tmp_path, tiny_model_dir, label_bins="null"))])
    err = capsys.readouterr().err
    assert status == 2 and "has a classification head for 3 classes and this recipe has 2" in err


def test_a_run_trained_on_untrimmed_labels_still_scores_its_data(tmp_path):
    # Runs trained before labels were trimmed recorded " neg" and " pos" as class names; evaluate passes the
    # model's names, so the trimmed labels of the same file must still find their classes.
    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_labelled_file

    scored = tmp_path / "test.csv"
    write_csv(scored, "review,stars\ngreat, pos\nawful, neg\nfine, pos\n")
    data_args = DataArguments(text_column="review", label_column="stars")
    assert load_labelled_file(scored, data_args, [" neg", " pos"])["labels"] == [1, 0, 1]
