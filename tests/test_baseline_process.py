"""The TF-IDF baseline fitted in a process of its own while the model trains: same scores, no process left behind.

``runs_beside_training`` is monkeypatched to choose the way: on the 2 cores
the suite runs on, a run left to decide fits its baseline inline.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import warm_processes
from helpers import tiny_recipe

import finetune.pipeline.baseline
from finetune.cli import main
from finetune.commands.train import train
from finetune.errors import FinetuneError
from finetune.evaluation import baseline_process
from finetune.evaluation.baseline import run_baseline
from finetune.evaluation.baseline_process import BaselineProcess

PROJECT = Path(__file__).parent.parent
LABELS = ["negative", "neutral", "positive"]


def _quick_recipe(folder: Path, model_dir: Path) -> Path:
    """2 updates of the tiny model on the quickstart's reviews, with the baseline and nothing else to wait for."""
    quick = {"eval_strategy": "no", "save_strategy": "no", "load_best_model_at_end": "false", "max_steps": 2}
    return tiny_recipe(folder, model_dir, folder / "run", baseline="true", **quick)


def _fit_beside(monkeypatch, beside: bool) -> list[BaselineProcess]:
    """Force the baseline inline or beside the training; the processes started are listed in the list returned."""
    monkeypatch.setattr(baseline_process, "runs_beside_training", lambda device_type: beside)
    started: list[BaselineProcess] = []
    start = finetune.pipeline.baseline._start_baseline

    def recorded(*args, **kwargs):
        started.append(start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(finetune.pipeline.baseline, "_start_baseline", recorded)
    return started


def _gone(pid: int) -> bool:
    """True once ``pid`` has ended and been reaped (no /proc entry, not even a zombie's)."""
    return not Path(f"/proc/{pid}").exists()


def _baseline_line(err: str) -> str:
    """The run's "baseline (...)" line without its fit time, which differs from run to run."""
    (line,) = [line for line in err.splitlines() if line.startswith("baseline (")]
    return line.split(": ", 1)[1]


def test_the_same_baseline_inline_and_in_its_own_process(tmp_path, tiny_model_dir, monkeypatch, capsys):
    # The inline run is the code as it was before the process, the reference. Mutation check: the child
    # fitted on the train split less its last review (train_texts[:-1], train_labels[:-1] in
    # _start_baseline) fails on the printed line; never collecting the result (no _collect_baseline) fails
    # on the metrics.
    _fit_beside(monkeypatch, False)
    (tmp_path / "inline").mkdir()
    inline = train(str(_quick_recipe(tmp_path / "inline", tiny_model_dir)))["baseline"]
    inline_line = _baseline_line(capsys.readouterr().err)

    started = _fit_beside(monkeypatch, True)
    (tmp_path / "beside").mkdir()
    beside = train(str(_quick_recipe(tmp_path / "beside", tiny_model_dir)))["baseline"]
    assert len(started) == 1  # it did run in its own process, which has ended and been reaped
    assert _gone(started[0].pid)
    assert _baseline_line(capsys.readouterr().err) == inline_line
    assert inline.pop("fit_seconds") > 0 and beside.pop("fit_seconds") > 0
    assert beside == inline
    assert set(beside["scores"]) == {"validation", "test"}
    assert beside["scores"]["test"]["num_samples"] == 111
    # The report written after training has it too.
    metrics = (tmp_path / "beside" / "run" / "report" / "metrics.json").read_text()
    assert '"baseline"' in metrics


def test_no_process_is_left_after_a_run_stopped_by_a_failure(tmp_path, tiny_model_dir, monkeypatch):
    # Mutation check: starting the process without beside_the_run.enter_context in _train_checked
    # (a bare _start_baseline call) leaves it alive after the failure: _gone fails.
    from finetune.training.trainer import ReviewTrainer

    started = _fit_beside(monkeypatch, True)

    def failing_step(self, *args, **kwargs):
        raise RuntimeError("a failure while the baseline fits")

    monkeypatch.setattr(ReviewTrainer, "training_step", failing_step)
    with pytest.raises(RuntimeError, match="while the baseline fits"):
        main(["train", str(_quick_recipe(tmp_path, tiny_model_dir))])
    assert len(started) == 1 and _gone(started[0].pid)


def test_a_refused_run_ends_the_process_too(tmp_path, tiny_model_dir, monkeypatch, capsys):
    # A one-line error after the data is read (here from the model's loading) goes out as exit 2, and the
    # baseline's process with it.
    import finetune.training.modeling

    started = _fit_beside(monkeypatch, True)

    def refused(*args, **kwargs):
        raise FinetuneError("no model today")

    monkeypatch.setattr(finetune.training.modeling, "load_classifier", refused)
    assert main(["train", str(_quick_recipe(tmp_path, tiny_model_dir))]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: no model today"
    assert len(started) == 1 and _gone(started[0].pid)


def _reviews(count: int) -> tuple[list[str], list[int]]:
    from finetune.data.synthetic import synthetic_reviews

    texts, stars = zip(*synthetic_reviews(count, seed=3))
    return list(texts), [min(star - 1, 2) for star in stars]


def test_ctrl_c_reaches_the_parent_alone(tmp_path):
    # Mutation check: with the parent's handler left in place while the child starts
    # (signal.getsignal for signal.signal(SIGINT, SIG_IGN) in _sigint_ignored_by_children), the first
    # SIGINT reaches the child as it imports and it dies of it: result() raises BaselineProcessFailed.
    texts, labels = _reviews(300)
    to_score = {"test": (texts[200:], labels[200:])}
    with BaselineProcess(texts[:200], labels[:200], to_score, LABELS, seed=5) as job:
        # One Ctrl-C while it starts up (it imports for seconds), one once it fits.
        os.kill(job.pid, signal.SIGINT)
        time.sleep(3)
        os.kill(job.pid, signal.SIGINT)
        result = job.result()
    assert _gone(job.pid)
    reference = run_baseline(texts[:200], labels[:200], to_score, LABELS, seed=5)
    assert result.scores == reference.scores and result.features == reference.features


def test_a_baseline_that_cannot_be_fit_is_skipped_as_inline():
    # Reviews with no word of two letters: scikit-learn's "empty vocabulary", raised here as inline.
    with (
        BaselineProcess(["a", "b"], [0, 1], {}, LABELS) as job,
        pytest.raises(ValueError, match="empty vocabulary"),
    ):
        job.result()


def test_the_process_ends_when_its_parent_is_killed(tmp_path):
    # Mutation check: without _end_with_parent in _fit_in_child the child goes on fitting 3,000 reviews
    # (tens of seconds) after its parent is killed: the wait below times out.
    script = textwrap.dedent(
        """
        import os, signal, sys
        from finetune.data.synthetic import synthetic_reviews
        from finetune.evaluation.baseline_process import BaselineProcess

        if __name__ == "__main__":
            texts, stars = zip(*synthetic_reviews(3000, seed=1))
            job = BaselineProcess(texts, stars, {"test": (texts[:500], stars[:500])}, ["0", "1", "2", "3", "4", "5"])
            job._sender.join()  # the reviews are in the child: it is fitting
            print(job.pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    (tmp_path / "parent.py").write_text(script, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")])}
    # Not subprocess.run: it would wait for the end of the output, which the child holds open too.
    with warm_processes.Popen(
        [sys.executable, str(tmp_path / "parent.py")],
        stdout=warm_processes.PIPE,
        stderr=warm_processes.DEVNULL,
        env=env,
        text=True,
    ) as parent:
        child = int(parent.stdout.readline())
        assert parent.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while not _ended(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ended(child)


def _ended(pid: int) -> bool:
    """Not running: gone, or a zombie waiting for an init that may not reap it (in a container)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


@pytest.mark.parametrize(
    ("device_type", "cores", "threads", "beside"),
    [("cuda", 2, 2, True), ("cpu", 2, 2, False), ("cpu", 16, 8, True), ("cpu", 4, 4, False)],
)
def test_beside_training_on_an_accelerator_or_spare_cores(monkeypatch, device_type, cores, threads, beside):
    # Mutation check: >= for > in runs_beside_training fits beside torch's 2 threads on 2 cores: fails.
    import torch

    monkeypatch.setattr(baseline_process, "available_cores", lambda: cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert baseline_process.runs_beside_training(device_type) is beside
