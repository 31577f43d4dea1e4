"""``finetune distill`` end to end on the tiny model: teacher run -> student run -> predict, and its bad input."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
import warm_processes
from helpers import PROJECT, tiny_recipe

from finetune.cli import main

# One quick epoch, no checkpoints or validation: these tests are about the wiring, not the scores.
QUICK = {
    "num_train_epochs": 1,
    "eval_strategy": "no",
    "save_strategy": "no",
    "load_best_model_at_end": "false",
    "validation_split_percentage": 0,
}


@pytest.fixture(scope="module")
def soft_label_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        cache = tmp_path_factory.mktemp("cache")
        patch.setenv("FINETUNE_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, tiny_model_dir, soft_label_cache):
    folder = tmp_path_factory.mktemp("teacher")
    recipe = tiny_recipe(folder, tiny_model_dir, folder / "run", **QUICK)
    assert main(["train", str(recipe)]) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def student_run(tmp_path_factory, tiny_varied_model_dir, teacher_run, soft_label_cache):
    # A student whose answers differ by review, so that its predictions can be told from a constant.
    folder = tmp_path_factory.mktemp("student")
    unlabeled = folder / "unlabeled.csv"
    rows = [f"review {index} {'great value' if index % 2 else 'broke quickly'}" for index in range(40)]
    unlabeled.write_text("review\n" + "\n".join(rows) + "\n", encoding="utf-8")
    recipe = tiny_recipe(folder, tiny_varied_model_dir, folder / "run", unlabeled_file=unlabeled, **QUICK)
    assert main(["distill", str(teacher_run), str(recipe), "--distill_alpha", "0.7"]) == 0
    return folder / "run"


def test_student_run_is_a_model_folder_that_names_its_teacher(student_run, teacher_run):
    run = json.loads((student_run / "finetune_run.json").read_text())
    distilled = run["distillation"]
    assert distilled["teacher"] == str(teacher_run.resolve())
    assert distilled["alpha"] == 0.7 and distilled["temperature"] == 2.0
    assert distilled["unlabeled_reviews"] == 40
    assert run["command"][:3] == ["finetune", "distill", str(teacher_run.resolve())]
    teacher_test = json.loads((teacher_run / "test_report.json").read_text())
    assert distilled["teacher_test"]["accuracy"] == teacher_test["accuracy"]
    # 458 labelled + 40 unlabelled reviews = 32 micro-batches of 16: 16 updates (458 alone make 15).
    state = json.loads((student_run / "trainer_state.json").read_text())
    assert state["global_step"] == math.ceil(math.ceil(498 / 16) / 2) == 16
    card = (student_run / "README.md").read_text()
    assert "## Distillation" in card
    assert "| student `" in card and "| teacher `" in card


def test_student_predicts(student_run):
    import random

    import torch
    from helpers import WORDS
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rng = random.Random(0)
    reviews = [" ".join(rng.choices(WORDS, k=rng.randint(2, 12))) for _ in range(30)]
    result = warm_processes.run(
        [sys.executable, "-m", "finetune", "predict", str(student_run)],
        input="".join(f"{review}\n" for review in reviews),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert [row["text"] for row in rows] == reviews

    # The student read by transformers alone, its classes named in the recipe's order (label_bins).
    tokenizer = AutoTokenizer.from_pretrained(student_run)
    model = AutoModelForSequenceClassification.from_pretrained(student_run).eval()
    with torch.no_grad():
        inputs = tokenizer(reviews, padding=True, truncation=True, max_length=64, return_tensors="pt")
        expected = torch.softmax(model(**inputs).logits, dim=-1)
    classes = ["negative", "neutral", "positive"]
    expected_labels = [classes[index] for index in expected.argmax(-1).tolist()]
    assert len(set(expected_labels)) >= 2, expected_labels  # answers that differ by review
    assert [row["label"] for row in rows] == expected_labels
    for row, probabilities in zip(rows, expected.tolist(), strict=True):
        assert [float(row[f"prob_{name}"]) for name in classes] == pytest.approx(probabilities, abs=1e-5)


def test_soft_labels_are_cached_and_reused(tmp_path, tiny_model_dir, teacher_run, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FINETUNE_CACHE", str(cache))  # cold: nothing another test computed
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "first", **QUICK)
    quick = ["--max_steps", "1", "--distill_trade_reviews", "0"]  # the trade's test labels would be cached too
    assert main(["distill", str(teacher_run), str(recipe), *quick]) == 0
    first = capsys.readouterr().err
    again = ["distill", str(teacher_run), str(recipe), *quick, "--output_dir", str(tmp_path / "second")]
    assert main(again) == 0
    second = capsys.readouterr().err
    (stored,) = (cache / "soft-labels").glob("*.npy")
    assert "teacher soft labels for 458 reviews computed in " in first and f"; cached in {stored}" in first
    assert "read from the cache" not in first
    assert f"teacher soft labels for 458 reviews read from the cache ({stored})" in second
    assert "computed in" not in second
    # What was read back is what was computed: the two students trained alike, to the bit.
    weights = [(tmp_path / run / "model.safetensors").read_bytes() for run in ("first", "second")]
    assert weights[0] == weights[1], "the student trained on soft labels read from the cache differs"


def _refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    # Progress bars of the data read may come first; the error is one line, the last.
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and err.count("error: ") == 1
    return last


def test_a_teacher_with_other_classes_is_refused(tmp_path, tiny_model_dir, teacher_run, capsys):
    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, tmp_path / "out", label_bins="{negative: [1, 2], positive: [3, 5]}", **QUICK
    )
    err = _refused(["distill", str(teacher_run), str(recipe)], capsys)
    assert "['negative', 'neutral', 'positive']" in err and "['negative', 'positive']" in err
    assert not (tmp_path / "out").exists()


def test_a_teacher_found_only_in_the_data_is_refused(tmp_path, tiny_model_dir, teacher_run, capsys):
    # No class_names or label_bins in the recipe: the classes are only known once the data is read.
    reviews = tmp_path / "reviews.csv"
    rows = [f"review {index},{'bad' if index % 2 else 'good'}" for index in range(20)]
    reviews.write_text("review,verdict\n" + "\n".join(rows) + "\n", encoding="utf-8")
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        tmp_path / "out",
        dataset_dir="null",
        train_file=reviews,
        test_split_percentage=20,
        label_column="verdict",
        title_column="null",
        label_bins="null",
        ignore_mismatched_sizes="true",  # the tiny model's head has 3 classes
        **QUICK,
    )
    err = _refused(["distill", str(teacher_run), str(recipe)], capsys)
    assert "the recipe's data has ['bad', 'good']" in err
    assert not (tmp_path / "out").exists()


def test_a_teacher_folder_without_a_model_is_refused(tmp_path, tiny_model_dir, capsys):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "finetune_run.json").write_text("{}", encoding="utf-8")
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", **QUICK)
    err = _refused(["distill", str(teacher), str(recipe)], capsys)
    assert "holds no model" in err
    assert not (tmp_path / "out").exists()
    assert "is not a folder" in _refused(["distill", str(tmp_path / "missing"), str(recipe)], capsys)


def test_an_unlabeled_file_without_the_text_column_is_refused(tmp_path, tiny_model_dir, teacher_run, capsys):
    unlabeled = tmp_path / "u.csv"
    unlabeled.write_text("body\nnice\n", encoding="utf-8")
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", unlabeled_file=unlabeled, **QUICK)
    err = _refused(["distill", str(teacher_run), str(recipe)], capsys)
    assert "has no column 'review' (text_column); its columns are body" in err
    assert not (tmp_path / "out").exists()


def _reads(split: str) -> list[str]:
    """The texts the model reads for data/reviews/<split>.csv: 'Title. Review', read here with the csv module."""
    with (PROJECT / "data" / "reviews" / f"{split}.csv").open(encoding="utf-8", newline="") as handle:
        rows = [(row["title"].strip(), row["review"].strip()) for row in csv.DictReader(handle)]
    return [f"{title}. {review}" if title else review for title, review in rows]


def _spy_on_the_teacher(monkeypatch) -> list[list[str]]:
    """Every list of texts the teacher computes labels for, in order."""
    from finetune.pipeline.teacher import TeacherRun

    labelled: list[list[str]] = []
    compute = TeacherRun._compute

    def spy(self, texts, batch_size, encoding):
        labelled.append(list(texts))
        return compute(self, texts, batch_size, encoding)

    monkeypatch.setattr(TeacherRun, "_compute", spy)
    return labelled


def test_unlabeled_sentences_come_from_the_train_split_only(tmp_path, tiny_model_dir, teacher_run, monkeypatch):
    labelled = _spy_on_the_teacher(monkeypatch)
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))  # computed here, not read from another test's
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "run", unlabeled_sentences="true", **QUICK)
    assert main(["distill", str(teacher_run), str(recipe), "--max_steps", "1", "--distill_trade_reviews", "0"]) == 0

    count = json.loads((tmp_path / "run" / "finetune_run.json").read_text())["distillation"]["unlabeled_sentences"]
    train, held_out = _reads("train"), _reads("validation") + _reads("test")
    (texts,) = labelled
    reviews, sentences = texts[: len(texts) - count], texts[len(texts) - count :]
    assert sorted(reviews) == sorted(train)
    assert count > len(train)  # most reviews here have several sentences
    assert len(set(sentences)) == count
    for sentence in sentences:
        assert len(sentence.split()) >= 4 and sentence not in train
        assert any(sentence in review for review in train), sentence
    # A held-out sentence that no training review shares would be a leak.
    held_out_only = {s for s in sentences if any(s in review for review in held_out)} - {
        s for s in sentences if any(s in review for review in train)
    }
    assert not held_out_only
    card = (tmp_path / "run" / "README.md").read_text()
    assert f"It also labelled {count} sentences of the training reviews" in card


def test_review_sentences_keep_abbreviations_and_drop_short_pieces():
    from finetune.data.sentences import review_sentences

    review = "I took 50mg. of it for 3 weeks. Dr. Smith said it was fine! Gone. But e.g. my sleep got worse..."
    other = "It broke after two days of use."  # a sentence of the next review, and a review of its own
    assert review_sentences([review, "One sentence is the whole review.", review, f"Sad. {other}", other]) == [
        "I took 50mg. of it for 3 weeks.",
        "Dr. Smith said it was fine!",
        "But e.g. my sleep got worse...",
    ]


def test_the_help_and_the_docs_give_the_sentence_minimum_the_code_uses():
    """The minimum is written out in the field's help (config sits below data, so it cannot import the constant)
    and in docs/distill.md; a change of the constant must change both."""
    import dataclasses
    import re

    from finetune.config.arguments import DataArguments
    from finetune.data.sentences import MIN_SENTENCE_WORDS

    (field,) = [field for field in dataclasses.fields(DataArguments) if field.name == "unlabeled_sentences"]
    texts = [field.metadata["help"], (PROJECT / "docs" / "distill.md").read_text()]
    said = [number for text in texts for number in re.findall(r"\bof at\s+least (\d+) words", text)]
    assert len(said) >= 3 and set(said) == {str(MIN_SENTENCE_WORDS)}, said


def test_train_refuses_distillation_settings(tmp_path, tiny_model_dir, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", **QUICK)
    err = _refused(["train", str(recipe), "--distill_alpha", "0.3"], capsys)
    assert "distill_alpha is for 'finetune distill TEACHER_RUN RECIPE'" in err
    assert not (tmp_path / "out").exists()
    err = _refused(["train", str(recipe), "--unlabeled_sentences", "true"], capsys)
    assert "unlabeled_sentences is for 'finetune distill TEACHER_RUN RECIPE'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flag", "value"), [("--distill_alpha", "1.5"), ("--distill_temperature", "0")])
def test_distillation_settings_are_checked(tmp_path, tiny_model_dir, teacher_run, capsys, flag, value):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", **QUICK)
    err = _refused(["distill", str(teacher_run), str(recipe), flag, value], capsys)
    assert flag.lstrip("-") in err
    assert not Path(tmp_path / "out").exists()


def test_a_teacher_whose_model_does_not_work_is_refused(tmp_path, tiny_model_dir, teacher_run, capsys):
    """The model-folder check runs on the teacher: here its classes reordered in config.json."""
    import shutil

    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run, teacher)
    config = json.loads((teacher / "config.json").read_text())
    config["id2label"] = {"0": "positive", "1": "neutral", "2": "negative"}
    config["label2id"] = {name: int(index) for index, name in config["id2label"].items()}
    (teacher / "config.json").write_text(json.dumps(config), encoding="utf-8")
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", **QUICK)
    err = _refused(["distill", str(teacher), str(recipe)], capsys)
    assert "id2label" in err
    assert not (tmp_path / "out").exists()


def test_seeds_train_one_student_each_and_reuse_finished_students(tmp_path, tiny_model_dir, teacher_run, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "students", **QUICK)
    argv = ["distill", str(teacher_run), str(recipe), "--seeds", "2", "--max_steps", "1"]
    argv += ["--distill_trade_reviews", "0"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "students" / "seeds.json").read_text())
    assert summary["seeds"] == [42, 43]
    for seed in (42, 43):
        run = json.loads((tmp_path / "students" / f"seed-{seed}" / "finetune_run.json").read_text())
        assert run["distillation"]["teacher"] == str(teacher_run.resolve()) and run["seed"] == seed
    capsys.readouterr()
    (tmp_path / "students" / "seeds.json").unlink()
    assert main(argv) == 0  # the same students again: read back, not trained
    assert capsys.readouterr().err.count("finished before") == 2
    # A plain run's seeds are not the students': the folders are refused, not reused.
    (tmp_path / "students" / "seeds.json").unlink()
    err = _refused(["train", str(recipe), "--seeds", "2", "--max_steps", "1"], capsys)
    assert "already holds a run finished with other recipe values" in err


# ------------------------------------------------ unlabeled_from: a source's reviews that no split holds

NEW_REVIEWS = [
    "Arrived a week late and the box was crushed, but the kettle inside works fine.",
    "The strap snapped the second time I carried it. Cheap stitching.",
    "Exactly as pictured; the blue is a little darker in person.",
    "My cat ignores it, my dog loves it. Sturdy enough for both.",
    "Returned it: the charger whined loudly all night.",
]


def _planted_source(folder: Path) -> Path:
    """A source of the recipe's columns: five new reviews, with reviews of each of the recipe's splits among them."""
    rows: list[dict[str, str]] = []
    for split, count in (("test", 3), ("validation", 2), ("train", 2)):
        with (PROJECT / "data" / "reviews" / f"{split}.csv").open(encoding="utf-8", newline="") as handle:
            rows += list(csv.DictReader(handle))[:count]
    rows[1:1] = [{"title": "", "review": review, "stars": "3"} for review in NEW_REVIEWS]
    folder.mkdir()
    with (folder / "train.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, ["title", "review", "stars"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return folder


@pytest.fixture
def planted(tmp_path, monkeypatch):
    from finetune.fetching.catalog import CATALOG, CatalogEntry

    folder = _planted_source(tmp_path / "planted")
    entry = CatalogEntry(name="planted", task="test", source="project", recipe="", card="", path=str(folder))
    monkeypatch.setitem(CATALOG, "planted", entry)
    return entry


def test_unlabeled_from_labels_only_reviews_no_split_holds(
    tmp_path, tiny_model_dir, teacher_run, planted, monkeypatch, capsys
):
    labelled = _spy_on_the_teacher(monkeypatch)
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "run", unlabeled_from="planted", **QUICK)
    assert main(["distill", str(teacher_run), str(recipe), "--max_steps", "1", "--distill_trade_reviews", "0"]) == 0
    err = capsys.readouterr().err

    (texts,) = labelled
    train = _reads("train")
    assert sorted(texts[: len(train)]) == sorted(train)
    # The planted test, validation and train reviews are left out; the new ones are labelled, in source order.
    assert texts[len(train) :] == NEW_REVIEWS
    held_out = set(_reads("test") + _reads("validation"))
    assert not held_out & set(texts)
    assert "unlabeled_from planted: all 5 of its 5 reviews in none of the recipe's splits" in err
    assert "(7 of its 12 reviews are in the splits and left out)" in err
    distilled = json.loads((tmp_path / "run" / "finetune_run.json").read_text())["distillation"]
    assert distilled["unlabeled_from"] == "planted" and distilled["unlabeled_from_reviews"] == 5
    assert "The teacher also labelled 5 reviews of `planted`" in (tmp_path / "run" / "README.md").read_text()


def test_max_unlabeled_draws_the_same_reviews_for_every_seed(tmp_path, tiny_model_dir, planted):
    from finetune.config.recipes import load_recipe
    from finetune.data.splits import load_review_data
    from finetune.data.unlabeled import unused_reviews

    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "run", unlabeled_from="planted", max_unlabeled=3)
    draws = []
    for seed in (42, 43):
        run = load_recipe(str(recipe), ["--seed", str(seed)])
        draws.append(unused_reviews(run.data, load_review_data(run.data, seed=seed)))
    assert draws[0].texts == draws[1].texts
    assert len(draws[0].texts) == 3 and set(draws[0].texts) < set(NEW_REVIEWS)
    assert "3 (a seeded draw) of its 5 reviews" in draws[0].note()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--unlabeled_from", "imbd"], "did you mean 'imdb'"),
        # Every review of the project's set is in the recipe's splits: nothing is left to label.
        (["--unlabeled_from", "reviews"], "all 680 of its reviews are in the recipe's splits"),
        (["--max_unlabeled", "10"], "max_unlabeled caps unlabeled_from's reviews, and no unlabeled_from is set"),
        (["--unlabeled_from", "reviews", "--max_unlabeled", "0"], "max_unlabeled must be >= 1"),
        (["--distill_trade_reviews", "-1"], "distill_trade_reviews must be >= 0"),
    ],
)
def test_bad_unlabeled_from_settings_are_refused(tmp_path, tiny_model_dir, teacher_run, capsys, flags, expected):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", **QUICK)
    err = _refused(["distill", str(teacher_run), str(recipe), *flags], capsys)
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_train_refuses_unlabeled_from(tmp_path, tiny_model_dir, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "out", **QUICK)
    err = _refused(["train", str(recipe), "--unlabeled_from", "imdb"], capsys)
    assert "unlabeled_from is for 'finetune distill TEACHER_RUN RECIPE'" in err


def test_a_student_whose_test_reviews_trained_the_teacher_is_refused(tmp_path, tiny_model_dir, capsys):
    # One source, its test split drawn by the seed: seed 43's test reviews are partly seed 42's training reviews.
    held_out = {**QUICK, "dataset_dir": None, "train_file": PROJECT / "data" / "reviews" / "train.csv"}
    held_out["test_split_percentage"] = 30
    teacher = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "teacher", **held_out)
    assert main(["train", str(teacher), "--max_steps", "1"]) == 0
    capsys.readouterr()
    err = _refused(["distill", str(tmp_path / "teacher"), str(teacher), "--seed", "43"], capsys)
    assert "of the recipe's 137 test reviews trained the teacher" in err
    assert "set split_seed: 42 (the seed that drew the teacher's splits)" in err
    assert not (tmp_path / "student").exists()
    # The fix the message names: the student's splits are the teacher's, whatever its own seed.
    flags = ["--seed", "43", "--split_seed", "42", "--max_steps", "1", "--distill_trade_reviews", "0"]
    assert main(["distill", str(tmp_path / "teacher"), str(teacher), *flags, "--output_dir", str(tmp_path / "s")]) == 0
    student = json.loads((tmp_path / "s" / "test_report.json").read_text())
    assert student["num_samples"] == 137


def test_the_trade_scores_both_models_on_the_same_test_reviews(student_run, teacher_run):
    """Scores and agreement against references: each run's own test report, and transformers alone."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    trade = json.loads((student_run / "report" / "metrics.json").read_text())["distillation_trade"]
    for run, name in ((teacher_run, "teacher"), (student_run, "student")):
        report = json.loads((run / "test_report.json").read_text())
        assert trade[name]["accuracy"] == pytest.approx(report["accuracy"], abs=1e-9)
        assert trade[name]["macro_f1"] == pytest.approx(report["macro_f1"], abs=1e-9)
    texts = _reads("test")
    labels = []
    for run in (teacher_run, student_run):
        tokenizer = AutoTokenizer.from_pretrained(run)
        model = AutoModelForSequenceClassification.from_pretrained(run).eval()
        with torch.no_grad():
            inputs = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
            labels.append(model(**inputs).logits.argmax(-1))
    assert trade["test_reviews"] == len(texts)
    assert trade["agreement"] == pytest.approx((labels[0] == labels[1]).sum().item() / len(texts), abs=1e-12)
    speeds = trade["reviews_per_second"]
    assert trade["timed_reviews"] == 111 and set(speeds) == {"teacher_fp32", "student_fp32", "student_int8"}
    assert all(value > 0 for value in speeds.values())
    card = (student_run / "README.md").read_text()
    assert f"they give the same label to {trade['agreement'] * 100:.1f}% of them" in card
    assert "| student, int8 (openvino) |" in card


@pytest.mark.parametrize(
    ("data", "seed", "expected"), [({"split_seed": 0}, 42, 0), ({}, 43, 43), ({"split_seed": 7}, 43, 7)]
)
def test_the_teachers_split_seed_is_the_one_that_drew_its_splits(tmp_path, data, seed, expected):
    # split_seed 0 is a seed like any other: it, not the training seed, drew the teacher's splits.
    from finetune.pipeline.teacher import TeacherRun
    from finetune.training.runs import RUN_CONFIG

    (tmp_path / RUN_CONFIG).write_text(json.dumps({"seed": seed, "data": data}), encoding="utf-8")
    teacher = TeacherRun(tmp_path, ["negative", "positive"], data, "tiny", None)
    assert teacher.split_seed == expected
