"""A tags recipe through ``--seeds``, ``--folds``, ``tune``, ``check`` and ``distill``: it works, or one line says why.

Seeds and folds tables gain the tag run's headline, micro-F1, beside the
baseline's and the lead, read back here from each run's own test report.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from bad_input.common import run_cli, snapshot
from test_check import check_entry
from test_multi_label_run import tag_recipe

from finetune.cli import main
from finetune.fetching.catalog import CATALOG

# One epoch, no checkpoints: each run of a repeat trains in about a second.
QUICK = dict(num_train_epochs=1, save_strategy="no", load_best_model_at_end=False, eval_strategy="no")


@pytest.mark.parametrize("kind", ["seeds", "folds"])
def test_seeds_and_folds_of_a_tags_recipe_report_micro_f1_beside_the_baseline(tmp_path, tiny_model_dir, kind, capsys):
    recipe = tag_recipe(tmp_path, tiny_model_dir, **QUICK)
    assert main(["train", str(recipe), f"--{kind}", "2"]) == 0
    summary = json.loads((tmp_path / "run" / f"{kind}.json").read_text())
    scored_on = "test" if kind == "seeds" else "fold"
    assert summary["task"] == "multi_label" and len(summary["runs"]) == 2
    for entry in summary["runs"]:
        metrics = json.loads((Path(entry["output_dir"]) / "report" / "metrics.json").read_text())
        assert entry[f"{scored_on} micro-F1"] == metrics["test"]["micro_f1"]
        baseline = metrics["baseline"]["scores"]["test"]["micro_f1"]
        assert entry["baseline micro-F1"] == baseline
        assert entry["micro-F1 vs baseline"] == pytest.approx(metrics["test"]["micro_f1"] - baseline)
    table = (tmp_path / "run" / f"{kind}.md").read_text()
    assert table.splitlines()[0].startswith(f"| {kind[:-1]} | {scored_on} micro-F1 | baseline micro-F1 |")
    capsys.readouterr()


def test_a_single_label_summary_keeps_its_columns(tmp_path):
    """The micro-F1 columns are a tags run's only: a summary of one-label runs is written as before."""
    from finetune.pipeline.repeats import format_summary

    names = ["test accuracy", "test macro-F1", "baseline accuracy", "baseline macro-F1"]
    names += ["accuracy vs baseline", "macro-F1 vs baseline", "train seconds"]
    run = {"seed": 1, **dict.fromkeys(names, 0.5)}
    summary = {"scored_on": "test", "runs": [run], "mean": dict.fromkeys(names, 0.5), "sd": dict.fromkeys(names)}
    assert format_summary(summary, "seed").splitlines()[0] == "| seed | " + " | ".join(names) + " |"


def test_tune_on_a_tags_recipe_trains_tags_in_every_trial(tmp_path, tiny_model_dir, capsys):
    recipe = tag_recipe(tmp_path, tiny_model_dir, num_train_epochs=1)
    assert main(["tune", str(recipe), "--trials", "2", "--output", str(tmp_path / "tune")]) == 0
    rows = list(csv.DictReader((tmp_path / "tune" / "trials.csv").open(encoding="utf-8")))
    assert len(rows) == 2 and all(0 <= float(row["validation_macro_f1"]) <= 1 for row in rows)
    assert (tmp_path / "tune" / "best_recipe.yaml").is_file()
    # Tag metrics were logged: the trials trained a sigmoid per tag, not a softmax over three classes.
    assert "eval_micro_f1" in capsys.readouterr().out


def test_check_refuses_a_tags_recipe_in_one_line_and_writes_nothing(tmp_path, tiny_model_dir, monkeypatch, capsys):
    entry = check_entry(tmp_path / "check")
    monkeypatch.setitem(CATALOG, entry.name, entry)
    recipe = tag_recipe(tmp_path, tiny_model_dir, **QUICK)
    before = snapshot(tmp_path)
    error = run_cli(["check", str(recipe), "fakecheck"], capsys)
    assert error == (
        f"error: {recipe} trains several tags per review (multi_label), and finetune check maps fakecheck's ratings "
        "onto one class per review; measure a tags recipe's spread with finetune train RECIPE --seeds 3"
    )
    assert snapshot(tmp_path) == before


def test_distill_refuses_a_tags_teacher_and_a_tags_student_in_one_line(tmp_path, tiny_model_dir, finished_run, capsys):
    recipe = tag_recipe(tmp_path, tiny_model_dir, **QUICK)
    assert main(["train", str(recipe)]) == 0
    tag_run = tmp_path / "run"
    capsys.readouterr()
    single_recipe = finished_run / "recipe.yaml"
    error = run_cli(["distill", str(tag_run), str(single_recipe), "--output_dir", str(tmp_path / "s1")], capsys)
    assert "several tags per review" in error and "finetune distill reads one label per review" in error
    assert not (tmp_path / "s1").exists()
    student = ["distill", str(finished_run / "run"), str(recipe), "--output_dir", str(tmp_path / "s2")]
    assert run_cli(student, capsys) == (
        f"error: {recipe} trains several tags per review (multi_label), and finetune distill is for one label per "
        "review for now; train it with finetune train"
    )
    assert not (tmp_path / "s2").exists()
