"""Every ``finetune train`` says where its wall-clock time went, at its end and in report/metrics.json."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import pytest
from bad_input.common import run_recipe

from finetune.cli import main
from finetune.training import run_clock
from finetune.training.run_clock import PARTS, RunClock


def _breakdown(run_folder):
    return json.loads((run_folder / "report" / "metrics.json").read_text())["time_breakdown"]


class _LengthenedClock:
    """``time.perf_counter`` plus the seconds the test adds inside chosen functions, and a count of them per part.

    A real run's parts take seconds nobody can predict; a part lengthened by
    thousands of seconds must show them, and only it, whatever the machine.
    """

    def __init__(self, monkeypatch) -> None:
        self.real = time.perf_counter
        self.added = dict.fromkeys(PARTS, 0.0)
        monkeypatch.setattr(time, "perf_counter", lambda: self.real() + sum(self.added.values()))

    def lengthen(self, monkeypatch, owner, name: str, part: str, seconds: float) -> None:
        """Every call of ``owner.name`` takes ``seconds`` more, in ``part``'s time."""
        original = getattr(owner, name)

        def lengthened(*args, **kwargs):
            self.added[part] += seconds
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, lengthened)


@pytest.mark.parametrize("beside", [False, True], ids=["baseline inline", "baseline beside training"])
def test_parts_add_up_to_the_run_and_each_lands_where_it_happened(
    tmp_path, tiny_model_dir, capsys, monkeypatch, beside
):
    import finetune.config.recipes
    import finetune.data.splits
    import finetune.evaluation.bootstrap
    import finetune.evaluation.model_card
    import finetune.evaluation.report
    import finetune.pipeline.baseline
    import finetune.training.modeling
    from finetune.evaluation import baseline_process
    from finetune.training.trainer import ReviewTrainer

    # An evaluation after each update, the baseline and a test split, but no checkpoint: saves must take no time.
    recipe = run_recipe(
        tmp_path,
        tiny_model_dir,
        save_strategy="no",
        eval_strategy="steps",
        eval_steps=1,
        baseline="true",
        test_split_percentage=20,
    )
    monkeypatch.setattr(baseline_process, "runs_beside_training", lambda device_type: beside)
    clock = _LengthenedClock(monkeypatch)
    # One function inside each part, lengthened by its own amount (per call), far above a real run's seconds.
    clock.lengthen(monkeypatch, finetune.config.recipes, "load_recipe", "startup", 1000)
    clock.lengthen(monkeypatch, finetune.data.splits, "load_review_data", "read", 2000)
    clock.lengthen(monkeypatch, finetune.data.splits, "tokenize_splits", "tokenize", 2500)
    # Inline, the fit; beside the training, the wait for its process after training (which the fit's
    # seconds in the other process do not count in): either is the run's baseline time.
    fit_or_wait = "_collect_baseline" if beside else "_fit_baseline"
    clock.lengthen(monkeypatch, finetune.pipeline.baseline, fit_or_wait, "baseline", 3000)
    clock.lengthen(monkeypatch, finetune.training.modeling, "load_classifier", "load", 4000)
    clock.lengthen(monkeypatch, ReviewTrainer, "__init__", "other", 5000)  # building the Trainer
    clock.lengthen(monkeypatch, ReviewTrainer, "training_step", "train_steps", 300)
    clock.lengthen(monkeypatch, ReviewTrainer, "evaluate", "evaluation", 700)
    clock.lengthen(monkeypatch, ReviewTrainer, "save_final_model", "final_save", 6000)
    clock.lengthen(monkeypatch, finetune.evaluation.bootstrap, "score_intervals", "test_scoring", 6500)
    clock.lengthen(monkeypatch, finetune.evaluation.report, "write_run_report", "report", 7000)
    clock.lengthen(monkeypatch, finetune.evaluation.model_card, "write_model_card", "model_card", 8000)

    started = clock.real()
    assert main(["train", str(recipe)]) == 0
    real_seconds = clock.real() - started
    breakdown = _breakdown(tmp_path / "run")
    assert list(breakdown) == [*PARTS, "total"]
    assert clock.added["evaluation"] == 2 * 700  # the 2 updates were evaluated
    # The baseline was fitted (or waited for) once, the test split scored once. Mutation check: the wait
    # lapped as the test scoring's (clock.lap("test_scoring") after _collect_baseline in _train_checked)
    # fails the loop below for the baseline beside training.
    assert clock.added["baseline"] == 3000 and clock.added["test_scoring"] == 6500
    # Each part holds its added seconds plus at most the run's real seconds; a part lengthened by none took none.
    for part in PARTS:
        assert clock.added[part] <= breakdown[part] <= clock.added[part] + real_seconds, (part, breakdown, real_seconds)
    assert breakdown["checkpoint_saves"] == 0
    added = sum(clock.added.values())
    assert added <= breakdown["total"] <= added + real_seconds
    assert breakdown["total"] == pytest.approx(sum(breakdown[part] for part in PARTS), abs=0.01)
    err = capsys.readouterr().err
    assert f"wall time {breakdown['total']:.1f}s:" in err and f"evaluation {breakdown['evaluation']:.1f}s" in err


def test_checkpoint_saves_are_timed_apart_from_the_steps(finished_run):
    # The shared run saves a checkpoint after each of its 2 updates, evaluates never, fits no baseline.
    breakdown = _breakdown(finished_run / "run")
    assert breakdown["checkpoint_saves"] > 0
    assert breakdown["evaluation"] == 0 and breakdown["baseline"] == 0
    assert breakdown["train_steps"] > 0


def test_laps_and_moves_keep_the_total(monkeypatch):
    now = [1000.0]  # a clock that moves only when the test says so
    monkeypatch.setattr(run_clock, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    clock = RunClock()
    now[0] += 2.0
    clock.lap("load")
    now[0] += 10.0
    clock.lap("train_steps")
    clock.move(3.0, "train_steps", "evaluation")
    clock.move(1.5, "train_steps", "checkpoint_saves")
    now[0] += 0.25  # not lapped: other's
    # Halves and quarters are exact in binary: the breakdown is compared exactly.
    assert clock.breakdown() == {
        **dict.fromkeys(PARTS, 0.0),
        "load": 2.0,
        "train_steps": 5.5,
        "evaluation": 3.0,
        "checkpoint_saves": 1.5,
        "other": 0.25,
        "total": 12.25,
    }


def test_a_command_line_run_counts_from_its_process_start_the_imports_included(tmp_path, tiny_model_dir):
    # A real interpreter: it imports torch, transformers and datasets itself (7 to 10 s on 2 cores), time a user
    # waits for. Before the clock started with the process, the breakdown's total was 6.6 s of a 14.7 s process.
    recipe = run_recipe(tmp_path, tiny_model_dir, save_strategy="no")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "finetune", "train", str(recipe)], capture_output=True, text=True)
    process_seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    breakdown = _breakdown(tmp_path / "run")
    # All but the process's own exit (and its fork and exec, before the kernel counts it as started).
    assert 0.75 * process_seconds <= breakdown["total"] <= process_seconds, (breakdown, process_seconds)
    assert breakdown["startup"] >= max(breakdown[part] for part in PARTS if part != "startup")


def test_only_the_first_run_of_a_command_claims_the_process_start(monkeypatch):
    import psutil

    monkeypatch.setattr(run_clock, "_command_started", None)
    alive = time.time() - psutil.Process().create_time()  # whole seconds off at most (the boot time's rounding)
    assert run_clock.seconds_since_process_start() == pytest.approx(alive, abs=1.5)
    run_clock.start_at_process_start()
    first, second = RunClock(), RunClock()  # --seeds: the second run starts when it is called
    first.lap("startup")
    second.lap("startup")
    assert first.seconds["startup"] >= alive - 1.5
    assert second.seconds["startup"] < 0.5
    assert run_clock._command_started is None
