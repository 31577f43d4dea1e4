"""``finetune find-label-issues`` and ``train --drop_label_issues`` end to end, on reviews whose words say the class.

Every check reads the files the command wrote against an independent
reference: scikit-learn's own ``StratifiedKFold`` and ``cross_val_predict``
for the out-of-fold probabilities, transformers' model read from each fold's
folder, cleanlab called directly on the saved probabilities for the flagged
rows, and the labels read back from the CSV the test wrote.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from bad_input.common import run_cli, snapshot
from cleanlab.filter import find_label_issues
from cleanlab.rank import get_label_quality_scores
from sklearn.base import clone
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.cli import main
from finetune.evaluation.baseline import TfidfBaseline

CLASSES = ["negative", "neutral", "positive"]
STARS = {"negative": 1, "neutral": 3, "positive": 5}
WORDS = {
    "negative": ["awful", "broken", "terrible", "refund", "useless"],
    "neutral": ["okay", "average", "decent", "middling", "fair"],
    "positive": ["excellent", "perfect", "love", "superb", "brilliant"],
}
FILLER = ["the", "kettle", "arrived", "on", "monday", "and", "it", "was", "really", "quite"]
REVIEWS_PER_CLASS = 30
FLIPS = 9
SEED = 42


def noisy_reviews(seed: int = 0, reviews_per_class: int = REVIEWS_PER_CLASS) -> tuple[pd.DataFrame, set[int]]:
    """Reviews whose two cue words say the class, and the rows (FLIPS of them) whose stars were flipped."""
    rng = random.Random(seed)
    rows = []
    for name in CLASSES * reviews_per_class:
        words = [rng.choice(FILLER) for _ in range(5)] + rng.sample(WORDS[name], 2)
        rng.shuffle(words)
        rows.append({"review": " ".join(words), "stars": STARS[name], "class": name})
    flipped = set(rng.sample(range(len(rows)), FLIPS))
    for row in flipped:
        other = rng.choice([name for name in CLASSES if name != rows[row]["class"]])
        rows[row]["stars"], rows[row]["class"] = STARS[other], other
    return pd.DataFrame(rows), flipped


def write_recipe(folder: Path, model_dir: Path, table: pd.DataFrame, **fields) -> Path:
    """A recipe on the tiny BERT reading ``table`` (review, stars), no validation, 2 updates per run."""
    table[["review", "stars"]].to_csv(folder / "train.csv", index=False)
    values = dict(
        model_name_or_path=str(model_dir),
        train_file=str(folder / "train.csv"),
        text_column="review",
        label_column="stars",
        label_bins={"negative": [1, 2], "neutral": [3], "positive": [4, 5]},
        validation_split_percentage=0,
        max_length=32,
        output_dir=str(folder / "run"),
        per_device_train_batch_size=8,
        max_steps=2,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        baseline=False,
        disable_tqdm=True,
        report_to="none",
        use_cpu=True,
        seed=SEED,
    )
    values.update(fields)
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(values), encoding="utf-8")
    return recipe


def class_ids(table: pd.DataFrame) -> np.ndarray:
    return np.asarray([CLASSES.index(name) for name in table["class"]])


def expected_issues(labels: np.ndarray, probabilities: np.ndarray) -> tuple[list[int], np.ndarray]:
    """cleanlab itself on the saved probabilities: the flagged rows, lowest quality first, and every quality."""
    flagged = np.flatnonzero(find_label_issues(labels, probabilities))
    quality = get_label_quality_scores(labels, probabilities, method="normalized_margin")
    return sorted(flagged.tolist(), key=lambda row: (quality[row], row)), quality


@pytest.fixture(scope="module")
def tfidf_look(tmp_path_factory, tiny_model_dir):
    """find-label-issues --baseline_only --folds 3 on the noisy reviews: (folder, table, flipped rows, stdout)."""
    folder = tmp_path_factory.mktemp("label-issues")
    table, flipped = noisy_reviews()
    recipe = write_recipe(folder, tiny_model_dir, table)
    capture = folder / "stdout.txt"
    with capture.open("w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
        assert main(["find-label-issues", str(recipe), "--baseline_only", "--folds", "3"]) == 0
    return folder, table, flipped, capture.read_text(encoding="utf-8")


def test_tfidf_out_of_fold_probabilities_are_scikit_learns_cross_val_predict(tfidf_look):
    folder, table, _, _ = tfidf_look
    written = folder / "run" / "label_issues_tfidf"
    probabilities = np.load(written / "oof_probabilities.npy")
    assert np.load(written / "oof_row_ids.npy").tolist() == list(range(len(table)))
    # The baseline's own scikit-learn pipeline, unfitted, through scikit-learn's fold loop.
    texts, labels = table["review"].tolist(), class_ids(table)
    pipeline = clone(TfidfBaseline(len(CLASSES), seed=SEED).fit(texts, labels).pipeline)
    folds = StratifiedKFold(3, shuffle=True, random_state=SEED)
    reference = cross_val_predict(pipeline, texts, labels, cv=folds, method="predict_proba")
    np.testing.assert_allclose(probabilities, reference, rtol=1e-5, atol=1e-6)


def test_the_flagged_rows_are_cleanlabs_on_the_same_probabilities(tfidf_look):
    folder, table, _, _ = tfidf_look
    written = folder / "run" / "label_issues_tfidf"
    probabilities = np.load(written / "oof_probabilities.npy").astype(np.float64)
    flagged, quality = expected_issues(class_ids(table), probabilities)
    listed = pd.read_csv(written / "label_issues.csv", keep_default_na=False)
    assert listed["row_id"].tolist() == flagged
    assert listed["label_quality"].to_numpy() == pytest.approx(quality[flagged], abs=1e-5)
    assert listed["given_label"].tolist() == [table["class"][row] for row in flagged]
    assert listed["suggested_label"].tolist() == [CLASSES[int(np.argmax(probabilities[row]))] for row in flagged]
    assert listed["text"].tolist() == [table["review"][row] for row in flagged]
    digests = [hashlib.sha256(table["review"][row].encode()).hexdigest()[:16] for row in flagged]
    assert listed["text_sha256"].tolist() == digests


def test_the_words_find_most_flips_and_the_pairs_are_counted(tfidf_look):
    folder, table, flipped, printed = tfidf_look
    listed = pd.read_csv(folder / "run" / "label_issues_tfidf" / "label_issues.csv", keep_default_na=False)
    found = set(listed["row_id"]) & flipped
    # The cue words say the class, so the flipped reviews stand out: most are found, and most flagged are flips.
    assert len(found) >= FLIPS // 2, (sorted(found), sorted(flipped))
    assert len(found) >= len(listed) / 2, (sorted(listed["row_id"]), sorted(flipped))
    pairs = collections.Counter(zip(listed["given_label"], listed["suggested_label"]))
    for (given, suggested), count in pairs.items():
        assert f"| {given} | {suggested} | {count} |" in printed
    assert f"{len(listed)} of {len(table)} training reviews" in printed
    summary = json.loads((folder / "run" / "label_issues_tfidf" / "label_issues.json").read_text())
    assert summary["flagged"] == len(listed) and summary["folds"] == 3


def test_dropping_the_listed_rows_trains_without_them(tfidf_look, tmp_path, tiny_model_dir):
    from finetune.training.runs import load_run_data

    folder, table, _, _ = tfidf_look
    listed_path = tmp_path / "issues.csv"
    listed_path.write_bytes((folder / "run" / "label_issues_tfidf" / "label_issues.csv").read_bytes())
    listed = pd.read_csv(listed_path, keep_default_na=False)
    assert len(listed) > 0
    recipe = write_recipe(
        tmp_path, tiny_model_dir, table, drop_label_issues=str(listed_path), validation_split_percentage=20
    )
    assert main(["train", str(recipe)]) == 0
    run = tmp_path / "run"
    record = json.loads((run / "finetune_run.json").read_text())
    report = record["data_report"]
    assert report["label_issues_dropped"] == sorted(listed["row_id"])
    kept = table.drop(index=listed["row_id"])
    assert report["rows"]["train"] + report["rows"]["validation"] == len(kept)
    counts = collections.Counter(kept["class"])
    assert {
        name: report["class_counts"]["train"][name] + report["class_counts"]["validation"][name] for name in CLASSES
    } == {name: counts[name] for name in CLASSES}
    assert (run / "dropped_label_issues.csv").read_bytes() == listed_path.read_bytes()
    assert f"left out of training: {len(listed)} reviews" in (run / "README.md").read_text()
    # evaluate, export and distill read the run's splits back from its own record, not from the user's list.
    validation = list(load_run_data(record).splits["validation"]["text"])
    listed_path.unlink()
    again = load_run_data(record).splits
    assert list(again["validation"]["text"]) == validation
    assert sorted(list(again["train"]["text"]) + validation) == sorted(kept["review"])


def test_the_fine_tuned_folds_score_the_rows_they_did_not_train_on(tmp_path, tiny_model_dir):
    table, _ = noisy_reviews(seed=1, reviews_per_class=8)
    recipe = write_recipe(tmp_path, tiny_model_dir, table)
    assert main(["find-label-issues", str(recipe), "--folds", "2"]) == 0
    written = tmp_path / "run" / "label_issues"
    probabilities = np.load(written / "oof_probabilities.npy").astype(np.float64)
    texts, labels = table["review"].tolist(), class_ids(table)
    reference = np.zeros_like(probabilities)
    for fold, (_, held) in enumerate(StratifiedKFold(2, shuffle=True, random_state=SEED).split(texts, labels)):
        fold_dir = tmp_path / "run" / f"fold-{fold}"
        model = AutoModelForSequenceClassification.from_pretrained(fold_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(fold_dir)
        with torch.no_grad():
            batch = tokenizer([texts[row] for row in held], padding=True, return_tensors="pt")
            reference[held] = torch.softmax(model(**batch).logits.double(), dim=-1).numpy()
    np.testing.assert_allclose(probabilities, reference, atol=1e-5)
    # Ranked on the mean with the TF-IDF baseline's probabilities on the same folds (scikit-learn's own fold loop).
    pipeline = clone(TfidfBaseline(len(CLASSES), seed=SEED).fit(texts, labels).pipeline)
    folds = StratifiedKFold(2, shuffle=True, random_state=SEED)
    tfidf = cross_val_predict(pipeline, texts, labels, cv=folds, method="predict_proba")
    np.testing.assert_allclose(np.load(written / "oof_probabilities_tfidf.npy"), tfidf, rtol=1e-5, atol=1e-6)
    blended = (probabilities + tfidf) / 2
    flagged, quality = expected_issues(labels, blended)
    listed = pd.read_csv(written / "label_issues.csv", keep_default_na=False)
    assert listed["row_id"].tolist() == flagged
    assert listed["label_quality"].to_numpy() == pytest.approx(quality[flagged], abs=1e-5)
    assert listed["suggested_label"].tolist() == [CLASSES[int(np.argmax(blended[row]))] for row in flagged]
    summary = json.loads((written / "label_issues.json").read_text())
    assert summary["probabilities_from"] == "finetuned_and_tfidf_folds"
    assert (tmp_path / "run" / "folds.json").is_file()
    # --finetuned_only ranks the same folds' probabilities alone (the finished fold runs reused).
    (written / "label_issues.csv").unlink()
    again = ["find-label-issues", str(recipe), "--folds", "2", "--finetuned_only", "--resume_from_checkpoint", "auto"]
    assert main(again) == 0
    flagged, _ = expected_issues(labels, np.load(written / "oof_probabilities.npy").astype(np.float64))
    assert pd.read_csv(written / "label_issues.csv", keep_default_na=False)["row_id"].tolist() == flagged
    assert not (written / "oof_probabilities_tfidf.npy").exists()  # else a reader would blend it in
    assert json.loads((written / "label_issues.json").read_text())["probabilities_from"] == "finetuned_folds"


def test_tags_go_through_cleanlabs_multi_label_filter(tmp_path, tiny_model_dir):
    from cleanlab.multilabel_classification.filter import find_label_issues as find_tag_issues
    from cleanlab.multilabel_classification.rank import get_label_quality_scores as tag_quality
    from test_multi_label_run import tag_recipe

    recipe = tag_recipe(tmp_path, tiny_model_dir)
    assert main(["find-label-issues", str(recipe), "--baseline_only", "--folds", "3"]) == 0
    written = tmp_path / "run" / "label_issues_tfidf"
    probabilities = np.load(written / "oof_probabilities.npy").astype(np.float64)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    names = sorted({tag for row in rows for tag in row["tags"]})
    tags = [sorted(names.index(tag) for tag in row["tags"]) for row in rows]
    flagged = np.flatnonzero(find_tag_issues(tags, probabilities))
    quality = tag_quality(tags, probabilities)
    listed = pd.read_csv(written / "label_issues.csv", keep_default_na=False)
    assert listed["row_id"].tolist() == sorted(flagged.tolist(), key=lambda row: (quality[row], row))
    assert listed["given_label"].tolist() == ["; ".join(sorted(rows[row]["tags"])) for row in listed["row_id"]]


# Bad input: one line, exit 2, nothing on disk lost.


def test_two_only_sources_are_refused(tmp_path, tiny_model_dir, capsys):
    recipe = write_recipe(tmp_path, tiny_model_dir, noisy_reviews()[0])
    line = run_cli(["find-label-issues", recipe, "--baseline_only", "--finetuned_only"], capsys)
    assert line == "error: --baseline_only and --finetuned_only each name the only source to rank on: pass one"
    assert not (tmp_path / "run").exists()


def test_one_fold_is_refused(tmp_path, tiny_model_dir, capsys):
    recipe = write_recipe(tmp_path, tiny_model_dir, noisy_reviews()[0])
    line = run_cli(["find-label-issues", recipe, "--folds", "1", "--baseline_only"], capsys)
    assert line == "error: --folds must be >= 2 (got 1): one fold leaves no review unseen; e.g. --folds 5"
    assert not (tmp_path / "run").exists()


def test_a_class_smaller_than_the_folds_is_refused(tmp_path, tiny_model_dir, capsys):
    table, _ = noisy_reviews()
    table = pd.concat([table[table["class"] != "neutral"], table[table["class"] == "neutral"].head(3)])
    recipe = write_recipe(tmp_path, tiny_model_dir, table.reset_index(drop=True))
    line = run_cli(["find-label-issues", recipe, "--folds", "5"], capsys)
    assert line == (
        "error: class 'neutral' has 3 training reviews, fewer than --folds 5, so some fold would hold none of it; "
        "pass --folds 3 or fewer"
    )
    assert not (tmp_path / "run").exists()


def test_an_earlier_list_is_not_replaced(tfidf_look, capsys):
    folder, _, _, _ = tfidf_look
    before = snapshot(folder / "run")
    line = run_cli(["find-label-issues", folder / "recipe.yaml", "--baseline_only", "--folds", "3"], capsys)
    assert line.startswith("error: ") and "label_issues.csv already exists (perhaps edited)" in line
    assert snapshot(folder / "run") == before


def test_a_list_naming_rows_that_do_not_exist_is_refused(tfidf_look, tmp_path, tiny_model_dir, capsys):
    folder, table, _, _ = tfidf_look
    listed = pd.read_csv(folder / "run" / "label_issues_tfidf" / "label_issues.csv", keep_default_na=False)
    listed.loc[0, "row_id"] = len(table) + 7
    listed.to_csv(tmp_path / "issues.csv", index=False)
    recipe = write_recipe(tmp_path, tiny_model_dir, table, drop_label_issues=str(tmp_path / "issues.csv"))
    line = run_cli(["train", recipe], capsys)
    assert line == (
        f"error: {tmp_path / 'issues.csv'} lists row {len(table) + 7}, but this recipe's train split has "
        f"{len(table)} reviews (row ids 0 to {len(table) - 1}); it was written for other data: run finetune "
        "find-label-issues on this recipe"
    )
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_a_list_from_another_dataset_is_refused(tfidf_look, tmp_path, tiny_model_dir, capsys):
    folder, _, _, _ = tfidf_look
    listed_path = folder / "run" / "label_issues_tfidf" / "label_issues.csv"
    first = int(pd.read_csv(listed_path, keep_default_na=False)["row_id"].min())
    other, _ = noisy_reviews(seed=5)  # as many reviews, other words
    recipe = write_recipe(tmp_path, tiny_model_dir, other, drop_label_issues=str(listed_path))
    line = run_cli(["train", recipe], capsys)
    assert line == (
        f"error: {listed_path} row {first}: its text_sha256 does not match this recipe's review {first}; the file "
        "was written for other data (or another split_seed or max_train_samples): run finetune find-label-issues "
        "on this recipe"
    )
    assert not (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("row_id,text\n3,a review\n", "has no text_sha256 column; pass a label_issues.csv written by finetune "),
        ("row_id,text_sha256\nthree,0123456789abcdef\n", "line 2: row_id 'three' is not a whole number >= 0; "),
    ],
    ids=["no digest column", "a row id that is no number"],
)
def test_a_list_that_is_no_label_issues_csv_is_refused(tmp_path, tiny_model_dir, capsys, content, problem):
    listed_path = tmp_path / "issues.csv"
    listed_path.write_text(content, encoding="utf-8")
    recipe = write_recipe(tmp_path, tiny_model_dir, noisy_reviews()[0], drop_label_issues=str(listed_path))
    line = run_cli(["train", recipe], capsys)
    assert line.startswith(f"error: {listed_path} {problem}")
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_a_missing_list_is_refused(tmp_path, tiny_model_dir, capsys):
    listed_path = tmp_path / "gone.csv"
    recipe = write_recipe(tmp_path, tiny_model_dir, noisy_reviews()[0], drop_label_issues=str(listed_path))
    line = run_cli(["train", recipe], capsys)
    assert line == f"error: drop_label_issues not found: {listed_path}; check the path, or leave out drop_label_issues"


def test_the_folds_of_an_earlier_train_folds_are_reused(tmp_path, tiny_model_dir, capsys):
    table, _ = noisy_reviews(seed=2, reviews_per_class=8)
    recipe = write_recipe(tmp_path, tiny_model_dir, table)
    assert main(["train", str(recipe), "--folds", "2"]) == 0
    weights = {fold: (tmp_path / "run" / f"fold-{fold}" / "model.safetensors").read_bytes() for fold in (0, 1)}
    capsys.readouterr()
    assert main(["find-label-issues", str(recipe), "--folds", "2", "--resume_from_checkpoint", "auto"]) == 0
    said = capsys.readouterr().err
    assert said.count("finished before in") == 2, said
    assert {fold: (tmp_path / "run" / f"fold-{fold}" / "model.safetensors").read_bytes() for fold in (0, 1)} == weights
    assert (tmp_path / "run" / "label_issues" / "oof_probabilities.npy").is_file()
