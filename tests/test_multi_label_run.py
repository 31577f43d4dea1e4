"""Several tags per review, end to end: ``finetune train`` on tag lists (or separated tags) to a plain HF folder.

The run's test scores are checked against an independent reading of the saved
folder: transformers' own model and a sigmoid, the saved per-tag thresholds,
and scikit-learn's F1. Bad tag data gets one line and exit 2.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from bad_input.common import run_cli
from sklearn.metrics import f1_score
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.cli import main
from finetune.evaluation.multi_label import MIN_POSITIVES_TO_TUNE

# Three tags, each with words that say it; a review has any set of them, none included.
TAG_WORDS = {
    "delivery": ["late", "courier", "shipping"],
    "price": ["cheap", "expensive", "bargain"],
    "size": ["small", "tight", "large"],
}
FILLER = ["the", "product", "was", "really", "okay", "and", "it"]


def tagged_reviews(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        tags = [tag for tag in TAG_WORDS if rng.random() < 0.4]
        words = [rng.choice(FILLER) for _ in range(4)] + [rng.choice(TAG_WORDS[tag]) for tag in tags]
        rows.append({"review": " ".join(words), "tags": tags})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def tag_recipe(folder: Path, model_dir: Path, **fields) -> Path:
    """A recipe of 3 epochs on 60 tagged reviews (validation 60, test 24), on the tiny BERT.

    Validation holds 20 `delivery`, 18 `price` and 26 `size` reviews: two tags
    are tuned, `price` is too rare to (MIN_POSITIVES_TO_TUNE is 20).
    """
    values = dict(
        model_name_or_path=str(model_dir),
        train_file=str(write_jsonl(folder / "train.jsonl", tagged_reviews(60, 1))),
        validation_file=str(write_jsonl(folder / "validation.jsonl", tagged_reviews(60, 2))),
        test_file=str(write_jsonl(folder / "test.jsonl", tagged_reviews(24, 3))),
        text_column="review",
        label_column="tags",
        output_dir=str(folder / "run"),
        max_length=32,
        per_device_train_batch_size=8,
        num_train_epochs=3,
        learning_rate=0.002,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="micro_f1",
        disable_tqdm=True,
        report_to="none",
    )
    values.update(fields)
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(values), encoding="utf-8")
    return recipe


@pytest.fixture(scope="module")
def tag_run(tmp_path_factory, tiny_model_dir) -> Path:
    folder = tmp_path_factory.mktemp("tags")
    assert main(["train", str(tag_recipe(folder, tiny_model_dir))]) == 0
    return folder / "run"


def test_the_run_is_a_plain_folder_scored_with_a_sigmoid_per_tag(tag_run):
    config = json.loads((tag_run / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert list(config["id2label"].values()) == ["delivery", "price", "size"]
    from transformers import pipeline

    scored = pipeline("text-classification", model=str(tag_run), top_k=None)("cheap but late")[0]
    model = AutoModelForSequenceClassification.from_pretrained(tag_run)
    tokenizer = AutoTokenizer.from_pretrained(tag_run)
    with torch.no_grad():
        sigmoid = torch.sigmoid(model(**tokenizer("cheap but late", return_tensors="pt")).logits[0])
    by_tag = {row["label"]: row["score"] for row in scored}
    assert by_tag == pytest.approx({name: float(sigmoid[int(index)]) for index, name in config["id2label"].items()})


def test_test_scores_equal_an_independent_reading_of_the_saved_folder(tag_run):
    """The saved model, its saved thresholds and scikit-learn give the report's micro- and macro-F1."""
    report = json.loads((tag_run / "test_report.json").read_text())
    thresholds = json.loads((tag_run / "tag_thresholds.json").read_text())
    assert thresholds["tuned_on"] == "validation"
    assert list(thresholds["thresholds"]) == ["delivery", "price", "size"]
    assert all(0 < value < 1 for value in thresholds["thresholds"].values())
    validation = [json.loads(line) for line in (tag_run.parent / "validation.jsonl").read_text().splitlines()]
    counts = {name: sum(name in row["tags"] for row in validation) for name in thresholds["thresholds"]}
    rare = {name: count for name, count in counts.items() if count < MIN_POSITIVES_TO_TUNE}
    assert thresholds["untuned"] == rare == {"price": 18}
    assert thresholds["thresholds"]["price"] == 0.5
    model = AutoModelForSequenceClassification.from_pretrained(tag_run).eval()
    tokenizer = AutoTokenizer.from_pretrained(tag_run)
    rows = [json.loads(line) for line in (tag_run.parent / "test.jsonl").read_text().splitlines()]
    with torch.no_grad():
        batch = tokenizer([row["review"] for row in rows], padding=True, return_tensors="pt")
        probabilities = torch.sigmoid(model(**batch).logits).numpy()
    names = list(thresholds["thresholds"])
    predicted = probabilities >= np.array([thresholds["thresholds"][name] for name in names])
    truth = np.array([[name in row["tags"] for name in names] for row in rows])
    assert report["micro_f1"] == pytest.approx(f1_score(truth, predicted, average="micro", zero_division=0), abs=1e-9)
    assert report["macro_f1"] == pytest.approx(f1_score(truth, predicted, average="macro", zero_division=0), abs=1e-9)
    assert report["num_samples"] == len(rows)
    low, high = report["intervals"]["micro_f1"]
    assert low <= report["micro_f1"] <= high


def test_the_run_says_its_tags_and_the_baseline_beside_them(tag_run):
    metrics = json.loads((tag_run / "report" / "metrics.json").read_text())
    assert "micro_f1" in metrics["baseline"]["scores"]["test"]
    assert set(metrics["vs_baseline"]) >= {"micro_f1", "macro_f1"}
    card = (tag_run / "README.md").read_text()
    assert "micro-F1" in card and "| tag | threshold |" in card and "one-vs-rest" in card
    assert "any of 3 tags: `delivery`, `price`, `size`." in card and "top_k=None)" in card
    assert "Too rare on validation to tune, so kept at 0.5: price (18 validation reviews)." in card


def independent_probabilities(run: Path, texts: list[str]) -> np.ndarray:
    """Each tag's probability as transformers' own model and a sigmoid give it."""
    model = AutoModelForSequenceClassification.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    with torch.no_grad():
        return torch.sigmoid(model(**tokenizer(texts, padding=True, return_tensors="pt")).logits).numpy()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_predict_gives_each_review_the_tags_at_or_above_their_thresholds(tag_run, tmp_path, suffix):
    output = tmp_path / f"predictions{suffix}"
    assert main(["predict", str(tag_run), "--input", str(tag_run.parent / "test.jsonl"), "--output", str(output)]) == 0
    thresholds = json.loads((tag_run / "tag_thresholds.json").read_text())["thresholds"]
    names = list(thresholds)
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in output.read_text().splitlines()]
        given = [row["labels"] for row in rows]
    else:
        import csv

        rows = list(csv.DictReader(output.open(encoding="utf-8")))
        given = [[tag for tag in row["labels"].split("|") if tag] for row in rows]
    probabilities = independent_probabilities(tag_run, [row["review"] for row in rows])
    expected = [[name for index, name in enumerate(names) if p[index] >= thresholds[name]] for p in probabilities]
    assert given == expected
    for row, p in zip(rows, probabilities):
        assert [float(row[f"prob_{name}"]) for name in names] == pytest.approx(p.tolist(), abs=1e-5)


def test_predict_threshold_flag_gives_every_tag_one_threshold(tag_run, tmp_path, capsys):
    output = tmp_path / "p.jsonl"
    test_file = tag_run.parent / "test.jsonl"
    argv = ["predict", str(tag_run), "--input", str(test_file), "--output", str(output), "--threshold", "0.5"]
    assert main(argv) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    names = list(json.loads((tag_run / "tag_thresholds.json").read_text())["thresholds"])
    assert [row["labels"] for row in rows] == [[n for n in names if row[f"prob_{n}"] >= 0.5] for row in rows]
    assert "--threshold must be between 0 and 1 (got 1.0)" in run_cli(["predict", tag_run, "--threshold", "1"], capsys)


def test_tags_separated_in_a_csv_and_a_review_with_none_train(tmp_path, tiny_model_dir):
    rows = tagged_reviews(40, 4)
    lines = ["review,tags", *(f"{row['review']},{'|'.join(row['tags'])}" for row in rows)]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    recipe = tag_recipe(
        tmp_path,
        tiny_model_dir,
        train_file=str(tmp_path / "train.csv"),
        label_separator="|",
        max_steps=2,
        eval_strategy="no",
        save_strategy="no",
        load_best_model_at_end=False,
    )
    assert main(["train", str(recipe)]) == 0
    run = json.loads((tmp_path / "run" / "finetune_run.json").read_text())
    assert run["class_names"] == ["delivery", "price", "size"]
    # An empty cell is a missing label (dropped); a review with tags [] in JSON Lines is kept.
    report = json.loads((tmp_path / "run" / "test_report.json").read_text())
    assert report["num_samples"] == 24


BAD_TAGS = {
    "list-with-single-label": (
        [{"review": "late", "tags": ["delivery"]}, {"review": "cheap", "tags": ["price"]}],
        {"task": "single_label"},
        "holds a list (['delivery']); a label must be one number or word, e.g. 5 or positive (task is "
        "single_label; for several tags per review set task: multi_label)",
    ),
    "tag-not-in-class-names": (
        [{"review": "late", "tags": ["delivery"]}, {"review": "tight", "tags": ["size"]}],
        {"class_names": ["delivery", "price", "fit"]},
        "tag 'size' is not in class_names",
    ),
    "lists-and-single-labels": (
        [{"review": "late", "tags": "delivery"}, {"review": "cheap", "tags": ["price"]}],
        {},
        "'tags' holds 'delivery' where other rows hold lists of tags",
    ),
    "tags-that-are-no-words": (
        [{"review": "late", "tags": ["delivery", 3]}, {"review": "cheap", "tags": ["price"]}],
        {},
        "'tags' holds 3 among its tags",
    ),
    "separator-that-splits-nothing": (
        [{"review": "late", "tags": "delivery"}, {"review": "cheap", "tags": "price"}],
        {"label_separator": ";"},
        "label_separator ';' splits no label in 'tags'",
    ),
}


@pytest.mark.parametrize(("rows", "fields", "message"), BAD_TAGS.values(), ids=BAD_TAGS.keys())
def test_bad_tags_are_one_line_naming_the_fix(tmp_path, tiny_model_dir, capsys, rows, fields, message):
    train = write_jsonl(tmp_path / "bad.jsonl", rows * 5)
    recipe = tag_recipe(tmp_path, tiny_model_dir, train_file=str(train), **fields)
    error = run_cli(["train", recipe], capsys)
    assert message in error
    assert not (tmp_path / "run").exists()


def test_label_bins_with_tags_is_refused(tmp_path, tiny_model_dir, capsys):
    recipe = tag_recipe(tmp_path, tiny_model_dir, label_separator="|", label_bins="low=1-2,high=3-5")
    assert "label_bins groups ratings into one class per review" in run_cli(["train", recipe], capsys)


def test_the_report_pictures_each_tag_and_the_tags_that_come_together(tag_run):
    report = json.loads((tag_run / "test_report.json").read_text())
    rows = [json.loads(line) for line in (tag_run.parent / "test.jsonl").read_text().splitlines()]
    names = list(report["per_class"])
    truth = np.array([[name in row["tags"] for name in names] for row in rows], dtype=int)
    assert report["cooccurrence"] == (truth.T @ truth).tolist()
    metrics = json.loads((tag_run / "report" / "metrics.json").read_text())
    for picture in ("tag_f1_test.png", "tag_cooccurrence_test.png"):
        assert (tag_run / "report" / picture).stat().st_size > 10_000
        assert picture in metrics["pictures"]
        assert f"(report/{picture})" in (tag_run / "README.md").read_text()
    assert not (tag_run / "report" / "confusion_matrix_test.png").exists()


@pytest.fixture(scope="module")
def tag_evaluation(tag_run):
    assert main(["evaluate", str(tag_run), "--resamples", "200"]) == 0
    return json.loads((tag_run / "evaluation_test.json").read_text())


def test_evaluate_scores_every_checkpoint_on_micro_f1_as_an_independent_reading_does(tag_run, tag_evaluation):
    models = [report for report in tag_evaluation if report.get("kind") != "baseline"]
    assert [report["step"] for report in models][-1] is None and len(models) == 4  # 3 checkpoints and the final
    thresholds = json.loads((tag_run / "tag_thresholds.json").read_text())["thresholds"]
    rows = [json.loads(line) for line in (tag_run.parent / "test.jsonl").read_text().splitlines()]
    names = list(thresholds)
    truth = np.array([[name in row["tags"] for name in names] for row in rows])
    for report in models:
        probabilities = independent_probabilities(Path(report["model"]), [row["review"] for row in rows])
        predicted = probabilities >= np.array([thresholds[name] for name in names])
        expected = f1_score(truth, predicted, average="micro", zero_division=0)
        assert report["micro_f1"] == pytest.approx(expected, abs=1e-9), report["model"]
    best = max(models, key=lambda report: report["micro_f1"])
    assert best["best"] and sum(report["best"] for report in models) == 1
    assert all("vs_best" in report for report in tag_evaluation if not report.get("best"))


def test_evaluate_puts_the_one_vs_rest_baseline_beside_with_a_paired_test(tag_evaluation):
    baseline = tag_evaluation[-1]
    assert baseline["kind"] == "baseline" and "one-vs-rest" in baseline["description"]
    best = next(report for report in tag_evaluation if report.get("best"))
    lead = baseline["best_vs_baseline"]["micro_f1"]
    assert lead == pytest.approx(best["micro_f1"] - baseline["micro_f1"], abs=1e-4)
    comparison = baseline["vs_best"]
    assert comparison["micro_f1_difference"] == pytest.approx(lead, abs=1e-4)
    low, high = comparison["micro_f1_interval"]
    assert low <= comparison["micro_f1_difference"] <= high


def test_evaluate_lists_the_reviews_whose_tags_are_most_wrong(tag_run, tag_evaluation):
    import pandas as pd

    errors = pd.read_csv(tag_run / "errors_test.csv", keep_default_na=False)
    assert list(errors.columns) == ["text", "true", "predicted", "missed", "extra", "wrong_tags", "loss"]
    assert list(errors["wrong_tags"]) == sorted(errors["wrong_tags"], reverse=True)
    for row in errors.itertuples():
        true, predicted = set(filter(None, row.true.split("|"))), set(filter(None, row.predicted.split("|")))
        assert set(filter(None, row.missed.split("|"))) == true - predicted
        assert set(filter(None, row.extra.split("|"))) == predicted - true
        assert row.wrong_tags == len(true ^ predicted)
    for picture in ("tag_f1_test.png", "tag_cooccurrence_test.png", "evaluation_test.md"):
        assert (tag_run / picture).is_file()


def test_evaluate_refuses_calibrating_tags_and_mixing_kinds(tag_run, finished_run, capsys):
    assert "leave out --calibrate" in run_cli(["evaluate", tag_run, "--calibrate"], capsys)
    assert "compare runs of one kind" in run_cli(["evaluate", tag_run, finished_run / "run"], capsys)
