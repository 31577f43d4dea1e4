"""Models compared side by side get names that tell them apart (finetune/evaluation/model_names.py)."""

from __future__ import annotations

from finetune.commands.evaluate import format_table
from finetune.evaluation.model_names import distinct_names


def test_runs_with_one_folder_name_are_told_apart_by_their_parents():
    runs = ["/w/runs/clean/seed-42", "/w/runs/noisy/seed-42", "/w/other/noisy/seed-42"]
    assert distinct_names(runs) == {
        "/w/runs/clean/seed-42": "clean/seed-42",
        "/w/runs/noisy/seed-42": "runs/noisy/seed-42",
        "/w/other/noisy/seed-42": "other/noisy/seed-42",
    }


def test_a_run_s_checkpoints_keep_their_own_names():
    models = ["runs/q/checkpoint-10", "runs/q/checkpoint-20", "runs/q"]
    assert distinct_names(models) == {
        "runs/q/checkpoint-10": "checkpoint-10",
        "runs/q/checkpoint-20": "checkpoint-20",
        "runs/q": "q",
    }


def test_the_comparison_table_names_each_run_apart():
    reports = [
        {"model": f"/w/{name}/seed-42", "step": None, "accuracy": 0.8, "macro_f1": 0.7, "best": name == "clean"}
        for name in ("clean", "noisy")
    ]
    rows = format_table(reports).splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| clean/seed-42", "| noisy/seed-42"]
