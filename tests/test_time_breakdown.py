"""Every ``finetune train`` says where its wall-clock time went, at its end and in report/metrics.json."""

from __future__ import annotations

import json
import time

import pytest
from bad_input.common import run_recipe

from finetune.cli import main
from finetune.training.run_clock import PARTS, RunClock


def _breakdown(run_folder):
    return json.loads((run_folder / "report" / "metrics.json").read_text())["time_breakdown"]


def test_parts_add_up_to_the_run_and_each_lands_where_it_happened(tmp_path, tiny_model_dir, capsys):
    # An evaluation after each update and the baseline, but no checkpoint: saves must take no time.
    recipe = run_recipe(
        tmp_path, tiny_model_dir, save_strategy="no", eval_strategy="steps", eval_steps=1, baseline="true"
    )
    started = time.perf_counter()
    assert main(["train", str(recipe)]) == 0
    wall = time.perf_counter() - started
    breakdown = _breakdown(tmp_path / "run")
    assert list(breakdown) == [*PARTS, "total"]
    assert all(seconds >= 0 for seconds in breakdown.values())
    assert sum(breakdown[part] for part in PARTS) == pytest.approx(breakdown["total"], abs=0.01)
    assert breakdown["total"] <= wall
    assert breakdown["checkpoint_saves"] == 0
    for part in PARTS:
        assert breakdown[part] > 0 or part in ("checkpoint_saves", "other"), part
    err = capsys.readouterr().err
    assert f"wall time {breakdown['total']:.1f}s:" in err and "evaluation" in err


def test_checkpoint_saves_are_timed_apart_from_the_steps(finished_run):
    # The shared run saves a checkpoint after each of its 2 updates, evaluates never, fits no baseline.
    breakdown = _breakdown(finished_run / "run")
    assert breakdown["checkpoint_saves"] > 0
    assert breakdown["evaluation"] == 0 and breakdown["baseline"] == 0
    assert breakdown["train_steps"] > 0


def test_laps_and_moves_keep_the_total():
    clock = RunClock()
    time.sleep(0.02)
    clock.lap("train_steps")
    clock.move(0.01, "train_steps", "evaluation")
    breakdown = clock.breakdown()
    assert breakdown["evaluation"] == pytest.approx(0.01)
    assert breakdown["train_steps"] >= 0.0095
    assert breakdown["total"] == pytest.approx(sum(breakdown[part] for part in PARTS), abs=0.005)
