"""The real entry points end to end: train from a recipe, evaluate checkpoints, predict, reload with pipeline."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from helpers import tiny_recipe

from finetune.cli import main

PROJECT = Path(__file__).parent.parent
CLASSES = ["negative", "neutral", "positive"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("e2e")
    run_dir = folder / "run"
    recipe = tiny_recipe(folder, tiny_model_dir, run_dir)
    assert main(["train", str(recipe)]) == 0
    return run_dir


@pytest.fixture(scope="module")
def varied_run(tmp_path_factory, tiny_varied_model_dir):
    """One quick epoch of a model whose answers differ by review (``trained_run`` answers one label for all)."""
    folder = tmp_path_factory.mktemp("e2e-varied")
    quick = {"num_train_epochs": 1, "eval_strategy": "no", "save_strategy": "no", "load_best_model_at_end": "false"}
    recipe = tiny_recipe(folder, tiny_varied_model_dir, folder / "run", baseline="false", **quick)
    assert main(["train", str(recipe)]) == 0
    return folder / "run"


def _safetensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_train_writes_a_standard_model_folder(trained_run):
    config = json.loads((trained_run / "config.json").read_text())
    assert [config["id2label"][str(index)] for index in range(3)] == CLASSES
    assert (trained_run / "model.safetensors").is_file()
    assert (trained_run / "tokenizer.json").is_file()
    assert sorted(path.name for path in trained_run.glob("checkpoint-*")) == ["checkpoint-15", "checkpoint-30"]

    report = json.loads((trained_run / "test_report.json").read_text())
    assert report["num_samples"] == 111
    assert set(report["per_class"]) == set(CLASSES)
    assert sum(map(sum, report["confusion_matrix"])) == 111
    results = json.loads((trained_run / "all_results.json").read_text())
    assert 0.0 <= results["test_accuracy"] <= 1.0
    state = json.loads((trained_run / "trainer_state.json").read_text())
    assert state["global_step"] == 30  # 2 epochs x ceil(29 micro-batches / 2)
    assert [entry["step"] for entry in state["log_history"] if "eval_macro_f1" in entry] == [15, 30]


def test_pipeline_loads_the_output(varied_run):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    reviews = _test_reviews()[:40]
    classify = pipeline("text-classification", model=str(varied_run), device="cpu")
    predictions = classify(reviews, truncation=True, max_length=64)

    # The folder read by transformers alone, its classes named in the recipe's order (label_bins).
    tokenizer = AutoTokenizer.from_pretrained(varied_run)
    model = AutoModelForSequenceClassification.from_pretrained(varied_run).eval()
    with torch.no_grad():
        inputs = tokenizer(reviews, padding=True, truncation=True, max_length=64, return_tensors="pt")
        expected = torch.softmax(model(**inputs).logits, dim=-1)
    labels = [CLASSES[index] for index in expected.argmax(-1).tolist()]
    assert len(set(labels)) >= 2, labels  # answers that differ by review
    assert [prediction["label"] for prediction in predictions] == labels
    scores = [prediction["score"] for prediction in predictions]
    assert scores == pytest.approx(expected.max(-1).values.tolist(), abs=1e-5)


def _test_reviews() -> list[str]:
    """The reviews of data/reviews/test.csv as the model reads them ('Title. Review'), read with the csv module."""
    with (PROJECT / "data" / "reviews" / "test.csv").open(encoding="utf-8", newline="") as handle:
        rows = [(row["title"].strip(), row["review"].strip()) for row in csv.DictReader(handle)]
    return [f"{title}. {review}" if title else review for title, review in rows]


def test_evaluate_scores_every_checkpoint_and_marks_the_best(trained_run, capsys):
    import torch

    assert main(["evaluate", str(trained_run)]) == 0
    table = capsys.readouterr().out
    assert "checkpoint-15" in table and "checkpoint-30" in table and "| final |" in table
    reports = json.loads((trained_run / "evaluation_test.json").read_text())
    *models, baseline = reports
    assert [report["step"] for report in models] == [15, 30, None]
    # Marked: the first of the highest test macro-F1s.
    scores = [report["macro_f1"] for report in models]
    assert [report["best"] for report in models] == [index == scores.index(max(scores)) for index in range(3)]
    best = models[scores.index(max(scores))]

    # The final model is the best checkpoint by validation macro-F1 (the first of equals), reloaded
    # (load_best_model_at_end): the same weights, so the same test scores.
    state = json.loads((trained_run / "trainer_state.json").read_text())
    validation = {entry["step"]: entry["eval_macro_f1"] for entry in state["log_history"] if "eval_macro_f1" in entry}
    best_step = max(validation, key=lambda step: (validation[step], -step))
    # Only a best before the last update shows the reload: the last checkpoint's weights are the final ones anyway.
    assert best_step == 15, validation
    final, chosen, last = (_safetensors(trained_run / name) for name in ("", "checkpoint-15", "checkpoint-30"))
    assert final.keys() == chosen.keys()
    assert [name for name in final if not torch.equal(final[name], chosen[name])] == []
    assert not all(torch.equal(final[name], last[name]) for name in final)
    by_step = {report["step"]: report for report in models}
    for key in ("accuracy", "macro_f1", "confusion_matrix"):
        assert by_step[None][key] == by_step[best_step][key], key
    # The TF-IDF baseline, fit on the run's train split, scored on the same test reviews.
    assert baseline["kind"] == "baseline" and "best" not in baseline
    assert baseline["num_samples"] == best["num_samples"] and baseline["train_reviews"] == 458
    assert baseline["best_vs_baseline"]["macro_f1"] == pytest.approx(best["macro_f1"] - baseline["macro_f1"], abs=1e-4)
    assert "| TF-IDF baseline | - |" in table


def test_evaluate_a_checkpoint_on_a_given_file(trained_run, tmp_path, capsys):
    data = tmp_path / "few.csv"
    data.write_text("review,stars\nterrible do not buy,1\nit is fine I guess,3\nexcellent,5\n", encoding="utf-8")
    assert main(["evaluate", str(trained_run / "checkpoint-30"), "--data", str(data)]) == 0
    report = json.loads((trained_run / "checkpoint-30" / "evaluation_data-few.json").read_text())[0]
    assert report["num_samples"] == 3


def test_predict_csv_and_jsonl(trained_run, tmp_path):
    reviews = tmp_path / "reviews.csv"
    reviews.write_text('id,review\n1,"Great value, would buy again"\n2,Stopped working in a week\n', encoding="utf-8")
    output = tmp_path / "predictions.csv"
    assert main(["predict", str(trained_run), "--input", str(reviews), "--output", str(output)]) == 0
    rows = list(csv.DictReader(output.open()))
    assert [row["id"] for row in rows] == ["1", "2"]
    assert all(row["label"] in CLASSES and 0.0 < float(row["probability"]) <= 1.0 for row in rows)
    assert all(abs(sum(float(row[f"prob_{name}"]) for name in CLASSES) - 1.0) < 1e-4 for row in rows)

    jsonl = tmp_path / "reviews.jsonl"
    jsonl.write_text('{"text": "meh"}\n{"text": "superb"}\n', encoding="utf-8")
    jsonl_out = tmp_path / "predictions.jsonl"
    assert main(["predict", str(trained_run), "--input", str(jsonl), "--output", str(jsonl_out)]) == 0
    assert [json.loads(line)["text"] for line in jsonl_out.read_text().splitlines()] == ["meh", "superb"]

    # Never overwrite an earlier output without being asked.
    before = output.read_bytes()
    assert main(["predict", str(trained_run), "--input", str(reviews), "--output", str(output)]) == 2
    assert output.read_bytes() == before


def test_predict_from_stdin(trained_run, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("awful\n\nfantastic product\n"))
    assert main(["predict", str(trained_run)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["text"] for row in rows] == ["awful", "fantastic product"]


def test_refuses_to_train_over_a_run_then_overwrites_when_asked(trained_run, tmp_path, tiny_model_dir, capsys):
    recipe = tiny_recipe(tmp_path, tiny_model_dir, trained_run)
    weights = (trained_run / "model.safetensors").read_bytes()
    assert main(["train", str(recipe)]) == 2
    assert "already holds a run; pass --overwrite_output_dir" in capsys.readouterr().err
    assert (trained_run / "model.safetensors").read_bytes() == weights

    other = tmp_path / "copy"
    import shutil

    shutil.copytree(trained_run, other)
    recipe = tiny_recipe(tmp_path, tiny_model_dir, other, max_steps=2, save_strategy="no", eval_strategy="no")
    recipe.write_text(recipe.read_text().replace("load_best_model_at_end: true", "load_best_model_at_end: false"))
    assert main(["train", str(recipe), "--overwrite_output_dir"]) == 0
    assert not list(other.glob("checkpoint-*"))
    assert json.loads((other / "trainer_state.json").read_text())["global_step"] == 2


def test_messy_data_run_records_what_was_dropped_and_weighted(tmp_path, tiny_model_dir, capsys):
    rows = [f'"Review number {index} isn&#039;t bad",{1 + index % 5}' for index in range(30)]
    rows += ['"   ",4', '"no stars",', '"rated zero",0']
    train = tmp_path / "train.csv"
    train.write_text("review,stars\n" + "\n".join(rows) + "\n", encoding="utf-8")
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        tmp_path / "run",
        dataset_dir="null",
        train_file=str(train),
        title_column="null",
        class_weighting="balanced",
        truncation_side="left",
        num_train_epochs=1,
        load_best_model_at_end="false",
        save_strategy="no",
    )
    assert main(["train", str(recipe)]) == 0
    err = capsys.readouterr().err
    assert "train: read 33 rows, dropped 3 (1 empty text, 1 missing label, 1 label outside label_bins)" in err
    assert "class weights: negative" in err
    run = json.loads((tmp_path / "run" / "finetune_run.json").read_text())
    assert run["data_report"]["dropped"]["train"] == {
        "empty text": 1,
        "missing label": 1,
        "label outside label_bins": 1,
    }
    assert run["data_report"]["rows"] == {"train": 27, "validation": 3}
    # 12 / 6 / 12 kept; the stratified hold-out takes one of each, so training has 11 / 5 / 11.
    assert run["class_weights"] == pytest.approx([27 / 33, 27 / 15, 27 / 33])
    saved = json.loads((tmp_path / "run" / "tokenizer_config.json").read_text())
    assert saved["truncation_side"] == "left"


def test_predict_cleans_and_joins_like_training():
    from finetune.pipeline.review_rows import _model_inputs

    rows = [{"title": "Nice", "review": "It&#039;s fine<br />Really"}, {"title": "", "review": "plain"}]
    assert _model_inputs(rows, "review", "title", clean=True) == ["Nice. It's fine\nReally", "plain"]


def test_evaluate_writes_intervals_errors_and_calibrates_for_pipeline(trained_run, tmp_path):
    import shutil

    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("checkpoint-*"))
    texts = ["Broke after two days, sent it back.", "Love it, works perfectly!"]
    tokenizer = AutoTokenizer.from_pretrained(run)
    with torch.no_grad():
        before = AutoModelForSequenceClassification.from_pretrained(run)(
            **tokenizer(texts, padding=True, return_tensors="pt")
        ).logits

    assert main(["evaluate", str(run), "--calibrate", "--resamples", "100"]) == 0
    model_report, baseline = json.loads((run / "evaluation_test.json").read_text())
    low, high = model_report["intervals"]["accuracy"]
    assert low <= model_report["accuracy"] <= high and model_report["intervals"]["resamples"] == 100
    assert "vs_best" in baseline and 0.0 <= model_report["ece"] <= 1.0
    errors = list(csv.DictReader((run / "errors_test.csv").read_text(encoding="utf-8").splitlines()))
    assert list(errors[0]) == ["text", "true", "predicted", "probability", "true_probability", "loss", "top_words"]
    assert [float(row["loss"]) for row in errors] == sorted((float(row["loss"]) for row in errors), reverse=True)
    assert (run / "reliability_test.png").is_file() and (run / "scores_test.png").is_file()

    # pipeline() reads the calibrated folder with no code: its probabilities are softmax(logits / T).
    temperature = json.loads((run / "calibration.json").read_text())["temperature"]
    classify = pipeline("text-classification", model=str(run), device="cpu", top_k=None)
    expected = torch.softmax(before / temperature, dim=-1).numpy()
    for row, scores in zip(expected, classify(texts)):
        by_label = {score["label"]: score["score"] for score in scores}
        np.testing.assert_allclose([by_label[name] for name in CLASSES], row, atol=1e-5)


def test_evaluate_compares_runs_side_by_side(trained_run, tmp_path, capsys):
    import shutil

    twin = tmp_path / "twin"
    shutil.copytree(trained_run, twin, ignore=shutil.ignore_patterns("checkpoint-*", "evaluation_*", "*.png"))
    assert main(["evaluate", str(trained_run), str(twin), "--no_baseline", "--resamples", "50"]) == 0
    table = capsys.readouterr().out
    assert f"| {trained_run.name} | final |" in table and "| twin | final |" in table
    # The same model twice: the same predictions, so nothing tells them apart.
    assert "not distinguishable" in table
    reports = json.loads((trained_run / "comparison" / "evaluation_test.json").read_text())
    assert [Path(report["model"]).name for report in reports] == [trained_run.name, "twin"]
    assert reports[1]["vs_best"]["distinguishable"] is False
    assert (trained_run / "comparison" / "scores_test.png").is_file()
