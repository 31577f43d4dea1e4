"""Short reviews: titles and extra_train_file as training one-liners, and the one-liner check set kept apart."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from finetune.config.arguments import DataArguments
from finetune.data.splits import load_review_data
from finetune.errors import FinetuneError

PROJECT = Path(__file__).parent.parent
REVIEWS = PROJECT / "data" / "reviews"
QUICKSTART_DATA = dict(
    dataset_dir=str(REVIEWS),
    text_column="review",
    title_column="title",
    label_column="stars",
    label_bins={"negative": [1, 2], "neutral": [3], "positive": [4, 5]},
)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_titles_train_as_short_reviews_with_their_reviews_label():
    plain = load_review_data(DataArguments(**QUICKSTART_DATA))
    data = load_review_data(DataArguments(**QUICKSTART_DATA, title_as_review=True))
    train_rows = _rows(REVIEWS / "train.csv")
    titled = [row for row in train_rows if row["title"].strip()]
    assert data.report.title_reviews == len(titled) > 0
    assert len(data.splits["train"]) == len(plain.splits["train"]) + len(titled)
    # Held-out splits are untouched: no title of theirs trains, none is added to them.
    for split in ("validation", "test"):
        assert list(data.splits[split]["text"]) == list(plain.splits[split]["text"])
    # Each title row carries its review's class ("Fell apart", 1 star: negative).
    added = dict(
        zip(
            data.splits["train"]["text"][len(plain.splits["train"]) :],
            data.splits["train"]["labels"][len(plain.splits["train"]) :],
        )
    )
    names = data.label_names
    for row in titled:
        stars = int(row["stars"])
        expected = "negative" if stars <= 2 else "neutral" if stars == 3 else "positive"
        assert names[added[row["title"].strip()]] == expected
    assert "title" not in data.splits["train"].column_names


def test_extra_training_reviews_train_and_are_never_held_out():
    plain = load_review_data(DataArguments(**QUICKSTART_DATA))
    data = load_review_data(DataArguments(**QUICKSTART_DATA, extra_train_file=str(REVIEWS / "short.csv")))
    short = _rows(REVIEWS / "short.csv")
    assert data.report.extra_train_reviews == len(short) == 520
    assert list(data.splits["train"]["text"]) == list(plain.splits["train"]["text"]) + [row["review"] for row in short]
    stars = [int(row["stars"]) for row in short]
    expected = ["negative" if s <= 2 else "neutral" if s == 3 else "positive" for s in stars]
    assert [data.label_names[label] for label in list(data.splits["train"]["labels"])[-len(short) :]] == expected
    for split in ("validation", "test"):
        assert list(data.splits[split]["text"]) == list(plain.splits[split]["text"])
    # Cross-validation draws its test fold from the train split before the extra reviews join it.
    texts = {row["review"] for row in short}
    for fold in range(5):
        folds = dict(extra_train_file=str(REVIEWS / "short.csv"), cross_validation_folds=5, cross_validation_fold=fold)
        held_out = load_review_data(DataArguments(**QUICKSTART_DATA, **folds)).splits["test"]["text"]
        assert not texts & set(held_out)


def test_bad_rows_of_the_extra_file_are_dropped_and_said(tmp_path, capsys):
    extra = tmp_path / "short.csv"
    extra.write_text("review,stars\nLove it,5\n   ,4\nrated zero,0\n", encoding="utf-8")
    data = load_review_data(DataArguments(**QUICKSTART_DATA, extra_train_file=str(extra)))
    assert data.report.extra_train_reviews == 1 and data.splits["train"]["text"][-1] == "Love it"
    said = f"extra_train_file {extra}: dropped 2 rows (1 empty text, 1 label outside label_bins)"
    assert said in capsys.readouterr().err


def test_title_as_review_needs_a_title_column():
    with pytest.raises(FinetuneError, match="title_as_review trains on each review's title, and no title_column"):
        DataArguments(**{**QUICKSTART_DATA, "title_column": None}, title_as_review=True)


@pytest.mark.parametrize(("name", "size"), [("check", 40), ("holdout", 60), ("holdout2", 52), ("holdout3", 52)])
def test_the_one_liner_check_sets_are_kept_apart_from_the_training_data(name: str, size: int):
    """No check review is a review or title of the project's data, nor of the dev set used to choose settings."""
    check = {row["review"].strip().lower() for row in _rows(PROJECT / "data" / "one_liners" / f"{name}.csv")}
    dev = {row["review"].strip().lower() for row in _rows(PROJECT / "data" / "one_liners" / "dev.csv")}
    seen = set(dev)
    for split in ("train", "validation", "test", "short"):
        for row in _rows(REVIEWS / f"{split}.csv"):
            seen |= {row["review"].strip().lower(), row["title"].strip().lower()}
    assert len(check) == size and not check & seen
    labels = [row["label"] for row in _rows(PROJECT / "data" / "one_liners" / f"{name}.csv")]
    assert labels.count("positive") == labels.count("negative") == size // 2


@pytest.mark.parametrize(
    ("name", "earlier"),
    [
        ("holdout", ["check"]),
        ("holdout2", ["check", "holdout"]),
        ("holdout3", ["check", "holdout", "holdout2"]),
    ],
)
def test_each_holdout_shares_nothing_with_the_sets_read_before_it(name: str, earlier: list[str]):
    """A holdout checks a model after the sets before it were read, so it must be new reviews."""
    holdout = {row["review"].strip().lower() for row in _rows(PROJECT / "data" / "one_liners" / f"{name}.csv")}
    for before in earlier:
        check = {row["review"].strip().lower() for row in _rows(PROJECT / "data" / "one_liners" / f"{before}.csv")}
        assert not holdout & check
