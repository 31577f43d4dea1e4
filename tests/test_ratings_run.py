"""Star ratings, end to end: ``task: regression`` and ``task: ordinal`` trained to plain HF folders and scored.

Each run's test scores are checked against an independent reading of the
saved folder: transformers' own model, the decoding written by hand here
(the standardised output mapped back with numpy's mean and deviation of the
training stars; CORN's cumulative sigmoids), and scikit-learn's MAE and
kappa. Bad rating data gets one line and exit 2.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from bad_input.common import run_cli
from sklearn.metrics import cohen_kappa_score, mean_absolute_error
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.cli import main

# Words that say a star rating; each review has one among filler.
STAR_WORDS = {1: ["awful", "broken"], 2: ["poor", "flimsy"], 3: ["okay", "average"], 4: ["good", "solid"], 5: ["great"]}
FILLER = ["the", "product", "was", "really", "and", "it"]


def rated_reviews(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        stars = rng.randint(1, 5)
        words = [rng.choice(FILLER) for _ in range(3)] + [rng.choice(STAR_WORDS[stars])]
        rows.append({"review": " ".join(words), "stars": stars})
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["review", "stars"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def rating_recipe(folder: Path, model_dir: Path, **fields) -> Path:
    """A recipe of 6 epochs on 80 rated reviews (validation and test files of 30 each), on the tiny BERT."""
    values = dict(
        model_name_or_path=str(model_dir),
        ignore_mismatched_sizes=True,  # the tiny BERT has a 3-class head
        train_file=str(write_csv(folder / "train.csv", rated_reviews(80, 1))),
        validation_file=str(write_csv(folder / "validation.csv", rated_reviews(30, 2))),
        test_file=str(write_csv(folder / "test.csv", rated_reviews(30, 3))),
        text_column="review",
        label_column="stars",
        output_dir=str(folder / "run"),
        max_length=16,
        per_device_train_batch_size=8,
        num_train_epochs=6,
        learning_rate=0.005,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="mae",
        greater_is_better=False,
        disable_tqdm=True,
        report_to="none",
    )
    values.update(fields)
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(values), encoding="utf-8")
    return recipe


def tiny_rating_run(tmp_path_factory, tiny_model_dir, task: str) -> Path:
    """A 2-epoch regression or ordinal run of :func:`rating_recipe` in a fresh folder (serve and export tests)."""
    folder = tmp_path_factory.mktemp(f"rated-{task}")
    assert main(["train", str(rating_recipe(folder, tiny_model_dir, task=task, num_train_epochs=2))]) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory, tiny_model_dir) -> Path:
    folder = tmp_path_factory.mktemp("regression")
    assert main(["train", str(rating_recipe(folder, tiny_model_dir, task="regression"))]) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def ordinal_run(tmp_path_factory, tiny_model_dir) -> Path:
    folder = tmp_path_factory.mktemp("ordinal")
    assert main(["train", str(rating_recipe(folder, tiny_model_dir, task="ordinal"))]) == 0
    return folder / "run"


def read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text(encoding="utf-8"))


def test_rows(run: Path) -> tuple[list[str], np.ndarray]:
    with (run.parent / "test.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [row["review"] for row in rows], np.array([float(row["stars"]) for row in rows])


test_rows.__test__ = False  # a helper, not a test


def independent_logits(run: Path, texts: list[str]) -> np.ndarray:
    """The saved folder's logits as transformers' own model gives them."""
    model = AutoModelForSequenceClassification.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
        return model(**batch).logits.double().numpy()


def test_regression_folder_keeps_the_train_splits_scale(regression_run):
    config = read_json(regression_run / "config.json")
    stars = np.array([row["stars"] for row in rated_reviews(80, 1)], dtype=np.float64)
    assert config["problem_type"] == "regression" and list(config["id2label"].values()) == ["rating"]
    assert config["rating_mean"] == pytest.approx(stars.mean(), rel=1e-12)
    assert config["rating_std"] == pytest.approx(stars.std(), rel=1e-12)
    assert config["rating_levels"] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_regression_test_scores_equal_an_independent_reading(regression_run):
    config = read_json(regression_run / "config.json")
    texts, truth = test_rows(regression_run)
    logits = independent_logits(regression_run, texts)[:, 0]
    ratings = np.clip(config["rating_mean"] + config["rating_std"] * logits, 1, 5)
    report = read_json(regression_run / "test_report.json")
    assert report["task"] == "regression" and report["num_samples"] == len(texts)
    assert report["mae"] == pytest.approx(mean_absolute_error(truth, ratings), abs=1e-5)
    rounded = np.rint(ratings).astype(int)
    kappa = cohen_kappa_score(truth.astype(int), rounded, labels=[1, 2, 3, 4, 5], weights="quadratic")
    assert report["quadratic_weighted_kappa"] == pytest.approx(kappa, abs=1e-9)
    for score in ("mae", "rmse", "off_by_one_accuracy", "quadratic_weighted_kappa", "accuracy", "macro_f1"):
        low, high = report["intervals"][score]
        assert low <= report[score] + 1e-9 and report[score] <= high + 1e-9, score


def test_regression_folder_loads_in_a_transformers_pipeline(regression_run):
    from transformers import pipeline

    config = read_json(regression_run / "config.json")
    scored = pipeline("text-classification", model=str(regression_run), function_to_apply="none")("great product")
    logit = independent_logits(regression_run, ["great product"])[0, 0]
    assert scored[0]["label"] == "rating" and scored[0]["score"] == pytest.approx(logit, abs=1e-5)
    assert config["rating_decoding"].startswith("rating = clip(rating_mean + rating_std * logit")


def test_predict_rates_each_review_as_the_folder_decodes(regression_run, ordinal_run, tmp_path):
    for run in (regression_run, ordinal_run):
        output = tmp_path / f"{run.parent.name}.csv"
        assert main(["predict", str(run), "--input", str(run.parent / "test.csv"), "--output", str(output)]) == 0
        with output.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        config = read_json(run / "config.json")
        logits = independent_logits(run, [row["review"] for row in rows])
        if run is regression_run:
            expected = np.clip(config["rating_mean"] + config["rating_std"] * logits[:, 0], 1, 5)
            assert [float(row["rating"]) for row in rows] == pytest.approx(expected, abs=1e-3)
            assert [row["label"] for row in rows] == [str(int(np.rint(value))) for value in expected]
        else:
            above = np.cumprod(1 / (1 + np.exp(-logits)), axis=1)
            expected_stars = 1 + (above > 0.5).sum(axis=1)
            assert [int(row["label"]) for row in rows] == expected_stars.tolist()
            assert [float(row["prob_above_4"]) for row in rows] == pytest.approx(above[:, 3], abs=1e-5)


def test_ordinal_folder_is_corn_with_k_minus_1_outputs(ordinal_run):
    config = read_json(ordinal_run / "config.json")
    assert config["finetune_task"] == "ordinal"
    assert list(config["id2label"].values()) == ["above 1", "above 2", "above 3", "above 4"]
    assert config["rating_decoding"].startswith("corn:")


def test_ordinal_test_scores_equal_an_independent_corn_decoding(ordinal_run):
    texts, truth = test_rows(ordinal_run)
    logits = independent_logits(ordinal_run, texts)
    # Rank-consistent by construction: P(rating > k) is a running product of sigmoids.
    above = np.cumprod(1 / (1 + np.exp(-logits)), axis=1)
    assert np.all(np.diff(above, axis=1) <= 0)
    stars = 1 + (above > 0.5).sum(axis=1)
    report = read_json(ordinal_run / "test_report.json")
    assert report["mae"] == pytest.approx(mean_absolute_error(truth, stars), abs=1e-9)
    kappa = cohen_kappa_score(truth.astype(int), stars, labels=[1, 2, 3, 4, 5], weights="quadratic")
    assert report["quadratic_weighted_kappa"] == pytest.approx(kappa, abs=1e-9)
    assert report["off_by_one_accuracy"] == pytest.approx(np.mean(np.abs(truth - stars) <= 1))


def test_the_runs_say_mae_and_the_ridge_baseline_beside_it(regression_run, ordinal_run):
    for run in (regression_run, ordinal_run):
        metrics = read_json(run / "report" / "metrics.json")
        baseline = metrics["baseline"]
        assert "ridge regression" in baseline["description"] and "mae" in baseline["scores"]["test"]
        assert set(metrics["vs_baseline"]) >= {"mae", "quadratic_weighted_kappa"}
        card = (run / "README.md").read_text(encoding="utf-8")
        assert "MAE **" in card and "quadratic weighted kappa" in card and "| level |" in card
    assert (
        "rounded to the nearest level" in read_json(ordinal_run / "report" / "metrics.json")["baseline"]["description"]
    )


def test_the_best_checkpoint_is_chosen_by_validation_mae(ordinal_run):
    state = read_json(ordinal_run / "trainer_state.json")
    maes = [entry["eval_mae"] for entry in state["log_history"] if "eval_mae" in entry]
    assert state["best_metric"] == pytest.approx(min(maes))


# ---------------------------------------------------------------- bad input


def test_a_rating_that_is_no_number_is_refused_in_one_line(tmp_path, tiny_model_dir, capsys):
    recipe = rating_recipe(tmp_path, tiny_model_dir, task="regression")
    with (tmp_path / "train.csv").open("a", encoding="utf-8") as handle:
        handle.write("the product,four\n")
    message = run_cli(["train", recipe], capsys)
    assert "rating 'four' in 'stars' is not a number, and task: regression reads each rating as a number" in message
    assert not (tmp_path / "run").exists()


def test_a_nan_rating_is_refused_in_one_line(tmp_path, tiny_model_dir, capsys):
    """JSON Lines reads NaN as a float (a CSV's 'nan' is an empty cell, dropped and counted as any other)."""
    lines = [f'{{"review": "{row["review"]}", "stars": {row["stars"]}}}' for row in rated_reviews(20, 1)]
    (tmp_path / "train.jsonl").write_text("\n".join([*lines, '{"review": "the product", "stars": NaN}']) + "\n")
    recipe = rating_recipe(tmp_path, tiny_model_dir, task="ordinal", train_file=str(tmp_path / "train.jsonl"))
    message = run_cli(["train", recipe], capsys)
    assert "rating nan in 'stars' is not a finite number, and task: ordinal reads each rating as a number" in message


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (
            {"task": "regression", "class_names": ["1", "2"]},
            "task: regression predicts the rating as a number, and class_names makes classes of it; drop class_names",
        ),
        ({"task": "regression", "label_bins": "low=1-2,high=3-5"}, "and label_bins makes classes of it"),
        (
            {"task": "ordinal", "label_bins": "low=1-2,high=3-5"},
            "task: ordinal needs at least 3 rating levels, and the training reviews have 2 (low, high)",
        ),
        ({"task": "regression", "class_weighting": "balanced"}, "class_weighting weighs classes of a softmax"),
        ({"task": "ordinal", "regression_loss": "huber"}, "regression_loss: huber is for task: regression, and task"),
    ],
)
def test_a_ratings_recipe_that_cannot_work_is_refused_in_one_line(tmp_path, tiny_model_dir, capsys, fields, said):
    message = run_cli(["train", rating_recipe(tmp_path, tiny_model_dir, **fields)], capsys)
    assert said in message


def test_ordinal_with_two_star_levels_is_refused(tmp_path, tiny_model_dir, capsys):
    recipe = rating_recipe(tmp_path, tiny_model_dir, task="ordinal")
    write_csv(tmp_path / "train.csv", [row for row in rated_reviews(80, 1) if row["stars"] in (1, 5)])
    message = run_cli(["train", recipe], capsys)
    assert "needs at least 3 rating levels, and the training reviews have 2 (1, 5); use task: single_label" in message


def test_a_classifier_of_star_classes_is_read_as_stars_too(tmp_path, tiny_model_dir):
    """single_label on 1-5 star classes: the same ordered scores, so the three tasks compare on one split."""
    bins = "1=1,2=2,3=3,4=4,5=5"
    recipe = rating_recipe(tmp_path, tiny_model_dir, label_bins=bins, metric_for_best_model="macro_f1")
    assert main(["train", str(recipe), "--greater_is_better", "true", "--num_train_epochs", "2"]) == 0
    run = tmp_path / "run"
    texts, truth = test_rows(run)
    stars = independent_logits(run, texts).argmax(axis=1) + 1
    ordered = read_json(run / "test_report.json")["ordered"]
    assert ordered["mae"] == pytest.approx(mean_absolute_error(truth, stars), abs=1e-9)
    kappa = cohen_kappa_score(truth.astype(int), stars, labels=[1, 2, 3, 4, 5], weights="quadratic")
    assert ordered["quadratic_weighted_kappa"] == pytest.approx(kappa, abs=1e-9)
    assert "Read as stars: MAE" in (run / "README.md").read_text(encoding="utf-8")


def test_evaluate_scores_every_checkpoint_in_stars_and_marks_the_lowest_mae(ordinal_run, capsys):
    assert main(["evaluate", str(ordinal_run), "--resamples", "200"]) == 0
    assert "| model | step | MAE [95% interval] |" in capsys.readouterr().out
    reports = read_json(ordinal_run / "evaluation_test.json")
    models, ridge = reports[:-1], reports[-1]
    assert [Path(report["model"]).name for report in models][-1] == "run" and len(models) == 7  # 6 epochs + final
    best = next(report for report in models if report["best"])
    assert best["mae"] == min(report["mae"] for report in models)
    final = models[-1]
    assert final["mae"] == pytest.approx(read_json(ordinal_run / "test_report.json")["mae"], abs=1e-9)
    for report in [*models, ridge]:
        if not report["best"] if "best" in report else True:
            assert report["vs_best"]["mae_difference"] == pytest.approx(report["mae"] - best["mae"], abs=1e-9)
    assert ridge["kind"] == "baseline" and ridge["mae"] == pytest.approx(
        read_json(ordinal_run / "report" / "metrics.json")["baseline"]["scores"]["test"]["mae"], abs=1e-9
    )


def test_compare_tasks_trains_the_three_on_one_split_and_tables_them(tmp_path, tiny_model_dir, capsys):
    # The recipe names its own ratings task: the comparison replaces it run by run.
    recipe = rating_recipe(tmp_path, tiny_model_dir, num_train_epochs=2, task="ordinal")
    assert main(["compare-tasks", str(recipe)]) == 0
    assert "| task | MAE | RMSE | off-by-one | QWK | accuracy | macro-F1 |" in capsys.readouterr().out
    summary = read_json(tmp_path / "run" / "tasks.json")
    assert list(summary["rows"]) == ["single_label", "regression", "ordinal", "TF-IDF ridge baseline"]
    reports = {
        task: read_json(tmp_path / "run" / task / "test_report.json")
        for task in ("single_label", "regression", "ordinal")
    }
    assert summary["rows"]["single_label"]["mae"] == reports["single_label"]["ordered"]["mae"]
    assert summary["rows"]["ordinal"]["mae"] == reports["ordinal"]["mae"]
    # One split: the same test reviews, level by level, whichever the task.
    assert len({tuple(report["support"]) for report in reports.values()}) == 1
    # The classifier's best checkpoint was chosen by validation MAE too.
    state = read_json(tmp_path / "run" / "single_label" / "trainer_state.json")
    assert state["best_metric"] == min(entry["eval_mae"] for entry in state["log_history"] if "eval_mae" in entry)
    tasks = {task: read_json(tmp_path / "run" / task / "config.json").get("finetune_task") for task in reports}
    assert tasks["regression"] == "regression" and tasks["ordinal"] == "ordinal"
    classes = read_json(tmp_path / "run" / "single_label" / "config.json")
    assert classes.get("problem_type") == "single_label_classification"


@pytest.mark.parametrize(
    ("fields", "flags", "named"),
    [
        ({"task": "single_label"}, [], "task"),
        ({"label_bins": "low=1-2,high=3-5"}, [], "label_bins"),
        ({"task": "ordinal"}, ["--task", "multi_label"], "task"),
    ],
)
def test_compare_tasks_refuses_a_recipe_that_fixes_classes(tmp_path, tiny_model_dir, capsys, fields, flags, named):
    message = run_cli(["compare-tasks", rating_recipe(tmp_path, tiny_model_dir, **fields), *flags], capsys)
    assert f"compare-tasks sets the task and reads the stars as numbers itself, and the recipe sets {named} " in message
    assert not (tmp_path / "run").exists()


def test_ordinal_levels_may_be_named_bins_in_their_order(tmp_path):
    """label_bins are ordered classes: an ordinal run's levels, ranked 1, 2, 3 for its scores."""
    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_review_data

    train = write_csv(tmp_path / "train.csv", rated_reviews(40, 1))
    data_args = DataArguments(
        train_file=str(train),
        text_column="review",
        label_column="stars",
        task="ordinal",
        label_bins="low=1-2,mid=3,high=4-5",
        test_split_percentage=0,
        validation_split_percentage=0,
    )
    data = load_review_data(data_args)
    assert data.task == "ordinal" and data.label_names == ["low", "mid", "high"]
    assert data.scale.levels == (1.0, 2.0, 3.0)
    stars = [row["stars"] for row in rated_reviews(40, 1)]
    expected = [0 if star <= 2 else 1 if star == 3 else 2 for star in stars]
    assert data.splits["train"]["labels"] == expected


def test_distill_and_bench_refuse_a_ratings_run_in_one_line(regression_run):
    """They read a softmax over classes; a rating model's output is no class. serve and export read its stars."""
    from finetune.errors import FinetuneError
    from finetune.evaluation.inference import load_inference_model
    from finetune.pipeline.teacher import TeacherRun

    with pytest.raises(
        FinetuneError, match=r"star-rating model \(a regression run\), and finetune distill and bench read"
    ):
        load_inference_model(regression_run)  # what bench loads with
    with pytest.raises(FinetuneError, match=r"star-rating model \(a regression run\), and finetune distill reads"):
        TeacherRun.open(str(regression_run))


def test_seeds_of_a_ratings_recipe_table_mae_and_kappa_beside_the_ridge(tmp_path, tiny_model_dir, capsys):
    recipe = rating_recipe(tmp_path, tiny_model_dir, task="regression", num_train_epochs=1)
    assert main(["train", str(recipe), "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "| seed | test MAE | test QWK | baseline MAE | baseline QWK | test accuracy |" in out
    summary = read_json(tmp_path / "run" / "seeds.json")
    assert summary["ordered"] is True
    for entry in summary["runs"]:
        report = read_json(Path(entry["output_dir"]) / "test_report.json")
        assert entry["test MAE"] == report["mae"] and entry["test QWK"] == report["quadratic_weighted_kappa"]
        # The ridge's kappa, as the run's own report records it.
        ridge = read_json(Path(entry["output_dir"]) / "report" / "metrics.json")["baseline"]
        assert entry["baseline QWK"] == ridge["scores"]["test"]["quadratic_weighted_kappa"]
    assert summary["mean"]["test MAE"] == pytest.approx(np.mean([entry["test MAE"] for entry in summary["runs"]]))


def test_tune_refuses_a_ratings_recipe_in_one_line(tmp_path, tiny_model_dir, capsys):
    pytest.importorskip("optuna")
    recipe = rating_recipe(tmp_path, tiny_model_dir, task="ordinal")
    message = run_cli(["tune", recipe, "--trials", "1", "--output", tmp_path / "trials"], capsys)
    assert "finetune tune searches a classifier's settings, and this recipe rates stars (task: ordinal)" in message
