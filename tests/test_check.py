"""``finetune check RECIPE DATASET``: a recipe's settings trained and scored on a check dataset, on the tiny model.

The check dataset here is a fake catalog entry (a project folder in tmp_path)
with its own column names, so the test sees the recipe's columns replaced.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from helpers import PROJECT, tiny_recipe

from finetune.cli import main
from finetune.commands.check import CHECK_RECIPE, check_label_bins
from finetune.errors import FinetuneError
from finetune.fetching.catalog import CATALOG, CatalogEntry

REVIEWS = PROJECT / "data" / "reviews"
THREE_CLASSES = {"negative": (1, 2), "neutral": (3, 3), "positive": (4, 5)}
TWO_CLASSES = {"negative": (1, 2), "positive": (4, 5)}


def copy_rows(source: Path, target: Path, rows: int | None, columns: dict[str, str]) -> None:
    """The first ``rows`` rows of a data/reviews file, with ``columns`` (old name -> new name) kept."""
    with source.open(newline="", encoding="utf-8") as handle:
        kept = list(csv.DictReader(handle))[:rows]
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(columns.values())
        writer.writerows([row[name] for name in columns] for row in kept)


def check_entry(folder: Path, **fields) -> CatalogEntry:
    """A check entry for the reviews in ``folder`` (columns body, headline, rating)."""
    values = {
        "name": "fakecheck",
        "task": "check only",
        "source": "project",
        "recipe": "",
        "card": "data/cards/fakecheck.md",
        "path": str(folder),
        "purpose": "check",
        "check_columns": {"text_column": "body", "title_column": "headline", "label_column": "rating"},
        "check_label_bins": (THREE_CLASSES, TWO_CLASSES),
    }
    return CatalogEntry(**{**values, **fields})


@pytest.fixture
def own_data(tmp_path) -> Path:
    """The recipe's own data: 60 train reviews (6 held out for validation) and 20 test reviews."""
    columns = {"review": "review", "title": "title", "stars": "stars"}
    copy_rows(REVIEWS / "validation.csv", tmp_path / "own" / "train.csv", 60, columns)
    copy_rows(REVIEWS / "test.csv", tmp_path / "own" / "test.csv", 20, columns)
    return tmp_path / "own"


@pytest.fixture
def fake_check(tmp_path, monkeypatch) -> CatalogEntry:
    """A check dataset of 458 reviews under other column names, in the catalog for the test."""
    columns = {"review": "body", "title": "headline", "stars": "rating"}
    copy_rows(REVIEWS / "train.csv", tmp_path / "check" / "train.csv", None, columns)
    entry = check_entry(tmp_path / "check")
    monkeypatch.setitem(CATALOG, entry.name, entry)
    return entry


def recipe_for(tmp_path: Path, tiny_model_dir: Path, own_data: Path, **fields) -> Path:
    return tiny_recipe(
        tmp_path, tiny_model_dir, tmp_path / "runs", dataset_dir=own_data, num_train_epochs=1, seed=7, **fields
    )


def test_check_trains_the_recipes_settings_on_the_check_data_beside_the_baseline(
    tmp_path, tiny_model_dir, own_data, fake_check, capsys
):
    recipe = recipe_for(tmp_path, tiny_model_dir, own_data, max_length=48)
    flags = ["--save_strategy", "no", "--load_best_model_at_end", "false"]
    assert main(["check", str(recipe), "fakecheck", *flags]) == 0

    folder = tmp_path / "runs-check-fakecheck"
    # The recipe's settings, the check data's fields, and a draw the size of the recipe's own data
    # (54 train + 6 validation + 20 test = 80), held out in its shares (20 / 80 test, 6 / 80 validation).
    values = yaml.safe_load((folder / CHECK_RECIPE).read_text())
    assert values["model_name_or_path"] == str(tiny_model_dir) and values["max_length"] == 48
    assert values["dataset_name"] == "fakecheck" and "dataset_dir" not in values
    assert (values["text_column"], values["title_column"], values["label_column"]) == ("body", "headline", "rating")
    assert values["label_bins"] == {"negative": [1, 2], "neutral": [3, 3], "positive": [4, 5]}
    assert values["max_train_samples"] == 80
    assert (values["test_split_percentage"], values["validation_split_percentage"]) == (25, 8)

    summary = json.loads((folder / "seeds.json").read_text())
    assert summary["seeds"] == [7] and summary["recipe"] == str(folder / CHECK_RECIPE)
    for entry in summary["runs"]:
        run = json.loads((Path(entry["output_dir"]) / "finetune_run.json").read_text())
        assert run["data"]["dataset_name"] == "fakecheck"
        report = json.loads((Path(entry["output_dir"]) / "test_report.json").read_text())
        assert report["num_samples"] == 20 and entry["test accuracy"] == report["accuracy"]
        # The baseline is fitted on the same draw and scored on the same test reviews.
        assert entry["baseline accuracy"] is not None
        assert entry["accuracy vs baseline"] == pytest.approx(entry["test accuracy"] - entry["baseline accuracy"])
    assert "| mean ± sd |" in capsys.readouterr().out


def test_the_recipes_classes_pick_the_bins_in_the_recipes_order(tmp_path):
    entry = check_entry(tmp_path)
    assert check_label_bins(entry, ["positive", "negative"], "r.yaml") == {"positive": [4, 5], "negative": [1, 2]}
    assert list(check_label_bins(entry, ["neutral", "positive", "negative"], "r.yaml")) == [
        "neutral",
        "positive",
        "negative",
    ]
    with pytest.raises(FinetuneError) as caught:
        check_label_bins(entry, ["bad", "good"], "r.yaml")
    assert str(caught.value) == (
        "r.yaml has the classes (bad, good), which fakecheck cannot be mapped onto: its ratings map to "
        "(negative, neutral, positive) or (negative, positive); check a recipe with one of those class sets"
    )


def test_a_check_entry_needs_its_columns_and_bins(tmp_path):
    with pytest.raises(ValueError, match="a check entry needs check_columns"):
        check_entry(tmp_path, check_label_bins=())


def one_line_error(argv: list[str], capsys) -> str:
    status = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2 and captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0].removeprefix("error: ")


def test_bad_checks_are_one_line_errors_and_write_nothing(tmp_path, tiny_model_dir, own_data, fake_check, capsys):
    recipe = recipe_for(tmp_path, tiny_model_dir, own_data)
    assert one_line_error(["check", str(recipe), "fakechek"], capsys) == (
        "unknown dataset 'fakechek'; did you mean 'fakecheck'? see 'finetune data list'"
    )
    assert one_line_error(["check", str(recipe), "drugscom"], capsys).startswith(
        "drugscom is a dataset recipes are tuned on, not a check dataset; check a recipe on one no recipe was "
        "tuned on: clothing_reviews, fakecheck"
    )
    assert one_line_error(["check", str(recipe), "fakecheck", "--label_column", "stars"], capsys) == (
        "finetune check reads the reviews, columns and classes from fakecheck, so --label_column cannot be given; "
        f"drop it (to train on other data, use 'finetune train {recipe} --label_column ...')"
    )
    two_bins = "{bad: [1, 2], good: [4, 5]}"
    other_classes = recipe_for(tmp_path, tiny_model_dir, own_data, label_bins=two_bins)
    assert one_line_error(["check", str(other_classes), "fakecheck"], capsys).startswith(
        f"{other_classes} has the classes (bad, good), which fakecheck cannot be mapped onto"
    )
    assert not (tmp_path / "runs-check-fakecheck").exists()


def test_a_recipe_trained_on_titles_is_refused_on_check_data_without_them(
    tmp_path, tiny_model_dir, own_data, fake_check, capsys, monkeypatch
):
    columns = {"text_column": "body", "label_column": "rating"}
    monkeypatch.setitem(CATALOG, "fakecheck", check_entry(Path(str(fake_check.path)), check_columns=columns))
    recipe = recipe_for(tmp_path, tiny_model_dir, own_data, title_as_review="true")
    assert one_line_error(["check", str(recipe), "fakecheck"], capsys) == (
        "the recipe trains on titles (title_as_review) and fakecheck has none; pass --title_as_review false"
    )
    assert not (tmp_path / "runs-check-fakecheck").exists()


def test_an_earlier_check_with_other_settings_is_kept(tmp_path, tiny_model_dir, own_data, fake_check, capsys):
    recipe = recipe_for(tmp_path, tiny_model_dir, own_data)
    folder = tmp_path / "runs-check-fakecheck"
    folder.mkdir()
    (folder / CHECK_RECIPE).write_text("# another check\n")
    assert one_line_error(["check", str(recipe), "fakecheck"], capsys) == (
        f"{folder / CHECK_RECIPE} holds another check's settings (another recipe, dataset or recipe version); pass "
        "--overwrite_output_dir to check again, or choose another --output_dir"
    )
    assert (folder / CHECK_RECIPE).read_text() == "# another check\n"


# ------------------------------------------------ a distillation recipe: checked as a student of a checked teacher

QUICK = ["--save_strategy", "no", "--load_best_model_at_end", "false", "--eval_strategy", "no"]


def test_a_distillation_recipe_is_checked_as_students_of_a_teacher_trained_on_the_check_data(
    tmp_path, tiny_model_dir, own_data, fake_check, capsys
):
    from finetune.training.runs import load_run_data

    # The teacher: the teacher recipe's own check, seed 7, on the check data's draw.
    teacher_recipe = recipe_for(tmp_path, tiny_model_dir, own_data)
    assert main(["check", str(teacher_recipe), "fakecheck", "--output_dir", str(tmp_path / "teacher"), *QUICK]) == 0
    teacher = tmp_path / "teacher" / "seed-7"

    # The student recipe takes its unlabelled reviews from a file of its own domain; the check takes them from
    # the check data's reviews outside the draw (458 - 80 = 378 of them, 30 drawn) instead.
    unlabeled = tmp_path / "own-unlabeled.csv"
    unlabeled.write_text("review\nA kettle that whistles too early.\n", encoding="utf-8")
    (tmp_path / "student").mkdir()
    student_recipe = recipe_for(
        tmp_path / "student", tiny_model_dir, own_data, unlabeled_file=unlabeled, distill_trade_reviews=0
    )
    argv = ["check", str(student_recipe), "fakecheck", "--teacher", str(teacher), "--seeds", "2"]
    assert main([*argv, "--max_unlabeled", "30", "--output_dir", str(tmp_path / "students"), *QUICK]) == 0

    values = yaml.safe_load((tmp_path / "students" / CHECK_RECIPE).read_text())
    assert values["unlabeled_from"] == "fakecheck" and "unlabeled_file" not in values
    assert values["split_seed"] == 7  # the teacher's draw for every seed
    teacher_config = json.loads((teacher / "finetune_run.json").read_text())
    teacher_test = load_run_data(teacher_config).splits["test"]["text"]
    for seed in (7, 8):
        run = json.loads((tmp_path / "students" / f"seed-{seed}" / "finetune_run.json").read_text())
        assert run["seed"] == seed and run["distillation"]["teacher"] == str(teacher.resolve())
        assert run["distillation"]["unlabeled_from"] == "fakecheck"
        assert run["distillation"]["unlabeled_from_reviews"] == 30 and run["distillation"]["unlabeled_file"] is None
        # Scored on the teacher's own test reviews, none of which it trained on.
        assert load_run_data(run).splits["test"]["text"] == teacher_test
    summary = json.loads((tmp_path / "students" / "seeds.json").read_text())
    assert [entry["seed"] for entry in summary["runs"]] == [7, 8]
    assert all(entry["accuracy vs baseline"] is not None for entry in summary["runs"])


def test_a_distillation_check_without_a_teacher_of_the_check_data_is_refused(
    tmp_path, tiny_model_dir, own_data, fake_check, capsys
):
    recipe = recipe_for(tmp_path, tiny_model_dir, own_data, distill_alpha=0.5)
    how = (
        "check the teacher's recipe first ('finetune check TEACHER_RECIPE fakecheck --output_dir TEACHER_CHECK'), "
        f"then 'finetune check {recipe} fakecheck --teacher TEACHER_CHECK/seed-SEED'"
    )
    assert one_line_error(["check", str(recipe), "fakecheck"], capsys) == (
        f"{recipe} distills a teacher (distill_alpha), so its check needs a teacher trained on fakecheck: {how}"
    )
    plain = recipe_for(tmp_path, tiny_model_dir, own_data)
    assert one_line_error(["check", str(plain), "fakecheck", "--unlabeled_from", "fakecheck"], capsys).startswith(
        "finetune check reads the reviews, columns and classes from fakecheck, so --unlabeled_from cannot be given"
    )
    # A teacher trained on the recipe's own data is not a teacher of the check data.
    teacher = tmp_path / "teacher"
    assert main(["train", str(plain), "--output_dir", str(teacher), "--max_steps", "1", *QUICK]) == 0
    capsys.readouterr()
    assert one_line_error(["check", str(recipe), "fakecheck", "--teacher", str(teacher)], capsys) == (
        f"the teacher {teacher} trained on files of its own, not on the check data fakecheck: {how}"
    )
    assert not (tmp_path / "runs-check-fakecheck").exists()


def test_a_ratings_recipe_is_checked_on_the_check_datas_stars_as_numbers(
    tmp_path, tiny_model_dir, own_data, fake_check, capsys
):
    """task: regression reads the check data's ratings as it reads its own: no bins, scored in stars."""
    recipe = recipe_for(
        tmp_path,
        tiny_model_dir,
        own_data,
        max_length=48,
        label_bins=None,
        task="regression",
        ignore_mismatched_sizes=True,
    )
    flags = ["--save_strategy", "no", "--load_best_model_at_end", "false", "--eval_strategy", "no"]
    assert main(["check", str(recipe), "fakecheck", *flags]) == 0
    folder = tmp_path / "runs-check-fakecheck"
    values = yaml.safe_load((folder / CHECK_RECIPE).read_text())
    assert "label_bins" not in values and values["task"] == "regression" and values["label_column"] == "rating"
    summary = json.loads((folder / "seeds.json").read_text())
    (entry,) = summary["runs"]
    report = json.loads((Path(entry["output_dir"]) / "test_report.json").read_text())
    assert report["task"] == "regression" and entry["test MAE"] == report["mae"]
    assert entry["baseline MAE"] is not None  # the ridge, on the same draw
    assert "test MAE" in capsys.readouterr().out
