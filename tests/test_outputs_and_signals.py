"""Issue 35: outputs that cannot be corrupted, saves that survive SIGTERM, recipes that cannot exhaust memory.

Each a bad-input case in the sense of tests/test_bad_input.py (one ``error:`` line naming the problem
and the fix, exit status 2, or 143 / 130 for a signal; no traceback; no file of the user's lost):

- outputs: two predicts to one --output (the second to finish is refused, the first's file kept);
  --output ``-`` and ``/dev/stdout`` (standard output), a FIFO and ``/dev/null`` without --overwrite
  (streamed into, not refused); predict piped into ``head`` (a quiet exit);
- signals: SIGTERM or SIGINT during the final save with save_strategy: no (the save finishes, a
  checkpoint of the last update is saved, exit 143 / 130 with the resume command, and the resume ends the run);
  SIGTERM during a scheduled checkpoint save (the run stops at that checkpoint);
- recipes and paths: nested YAML aliases that expand past 100,000 values; an output_dir or train_file
  that is not UTF-8;
- smaller: load_best_model_at_end with eval_strategy no, num_train_epochs .inf, a dangling link as
  output_dir, evaluate on a run still training, export after a kill -9 during export.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm_processes
from helpers import tiny_recipe

from finetune.cli import main

PROJECT = Path(__file__).parent.parent
REVIEWS = "review\n" + "".join(f"great product number {index}\n" for index in range(3000))


def finetune_process(*argv: str, **popen: object) -> warm_processes.Popen:
    """``python -m finetune ARGV`` as a child process (forked with its imports done), this checkout on its path."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "OMP_NUM_THREADS": "1"}
    return warm_processes.Popen([sys.executable, "-m", "finetune", *argv], env=env, text=True, **popen)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# --------------------------------------------------------------------------- outputs


def test_two_predicts_to_one_output_keep_the_first_finished_file(tiny_model_dir, tmp_path):
    # Both once wrote .out.csv.partial: the output held rows of both, and the later one ended in a traceback.
    output = tmp_path / "out.csv"
    (tmp_path / "b.csv").write_text("review\nawful\nfine\n", encoding="utf-8")
    slow = finetune_process(
        "predict", str(tiny_model_dir), "--output", str(output),
        stdin=warm_processes.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    # It reads stdin, so it waits, its output open, until this test sends it reviews.
    slow.stdin.write("great\n")
    slow.stdin.flush()
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.csv*.partial")) and time.monotonic() < deadline:
        time.sleep(0.05)
    fast = finetune_process(
        "predict", str(tiny_model_dir), "--input", str(tmp_path / "b.csv"), "--output", str(output),
        stderr=subprocess.PIPE,
    )  # fmt: skip
    _, fast_err = fast.communicate(timeout=120)
    assert fast.returncode == 0, fast_err
    finished = output.read_bytes()
    assert finished.count(b"\n") == 3  # header and b.csv's two reviews

    _, slow_err = slow.communicate("lovely\n", timeout=120)
    assert slow.returncode == 2
    assert one_error_line(slow_err) == (
        f"error: {output} was written by another process while this one worked, and is kept; "
        "choose another --output, or pass --overwrite to replace it"
    )
    assert output.read_bytes() == finished
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b.csv", "out.csv"]  # no .partial left


def test_output_dash_and_dev_stdout_are_standard_output(tiny_model_dir, tmp_path, capsys, monkeypatch):
    # /dev/stdout was refused as "already exists; pass --overwrite" (as root, advice to replace the device),
    # and "-" was written as a file named "-".
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.csv").write_text("review\ngreat\nawful\n", encoding="utf-8")
    for name in ("-", "/dev/stdout"):
        assert main(["predict", str(tiny_model_dir), "--input", "in.csv", "--output", name]) == 0
        captured = capsys.readouterr()
        assert captured.out.splitlines()[0].startswith("review,label,probability")
        assert len(captured.out.splitlines()) == 3
        assert "wrote" not in captured.err and "overwrite" not in captured.err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.csv"]


def test_fifo_and_character_device_outputs_are_streamed_without_overwrite(tiny_model_dir, tmp_path, capsys):
    # Both were refused as "already exists; pass --overwrite to replace it": nothing there is replaced.
    (tmp_path / "in.csv").write_text("review\ngreat\nawful\n", encoding="utf-8")
    fifo = tmp_path / "stream.csv"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    assert main(["predict", str(tiny_model_dir), "--input", str(tmp_path / "in.csv"), "--output", str(fifo)]) == 0
    streamed, _ = reader.communicate(timeout=30)
    assert streamed.decode().splitlines()[0].startswith("review,label") and streamed.count(b"\n") == 3
    assert fifo.is_fifo()
    assert main(["predict", str(tiny_model_dir), "--input", str(tmp_path / "in.csv"), "--output", "/dev/null"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == "wrote 2 predictions to /dev/null"


def test_predict_piped_into_head_exits_quietly(tiny_model_dir, tmp_path):
    # A BrokenPipeError traceback, exit status 1.
    (tmp_path / "big.csv").write_text(REVIEWS, encoding="utf-8")
    process = finetune_process(
        "predict", str(tiny_model_dir), "--input", str(tmp_path / "big.csv"),
        stdout=warm_processes.PIPE, stderr=warm_processes.PIPE,
    )  # fmt: skip
    head = [process.stdout.readline() for _ in range(2)]
    process.stdout.close()  # as head does after its lines
    _, err = process.communicate(timeout=120)
    assert head[0].startswith("review,label")
    assert process.returncode == 141, err  # 128 + SIGPIPE, as a shell reports a writer that head stopped
    assert "Traceback" not in err and "Error" not in err, err


# --------------------------------------------------------------------------- signals

# A run whose save into the folder named argv[3] (.final-model.partial, .checkpoint-2.partial) is
# interrupted: the signal is sent from inside the save, which no timing from outside could hit every time.
_SIGNAL_DURING_SAVE = """
import os, sys
from finetune.cli import main
from finetune.training.trainer import ReviewTrainer

save_model = ReviewTrainer.save_model

def save_model_then_signal(self, output_dir=None, _internal_call=False):
    if output_dir is not None and output_dir.endswith(sys.argv[3]):
        os.kill(os.getpid(), int(sys.argv[2]))
    return save_model(self, output_dir, _internal_call)

ReviewTrainer.save_model = save_model_then_signal
sys.exit(main(["train", sys.argv[1]]))
"""


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_the_final_save_lets_it_finish_and_the_run_resumes(tmp_path, tiny_model_dir, signum, status):
    # SIGTERM killed the process at once (no message), leaving .final-model.partial and the lock, and with
    # save_strategy: no not one checkpoint, so --resume_from_checkpoint auto started over.
    run_dir = tmp_path / "run"
    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, run_dir,
        max_steps=3, per_device_train_batch_size=4, eval_strategy="no", save_strategy="no",
        load_best_model_at_end="false", baseline="false",
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "OMP_NUM_THREADS": "1"}
    stopped = warm_processes.run(
        [sys.executable, "-c", _SIGNAL_DURING_SAVE, str(recipe), str(int(signum)), ".final-model.partial"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert stopped.returncode == status, stopped.stderr
    assert "Traceback" not in stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last == (
        f"stopped by {signum.name} at update 3 (epoch 0.05), after the last update; the final model is saved "
        f"whole; checkpoint saved in {run_dir / 'checkpoint-3'}; "
        f"resume with: finetune train {recipe} --resume_from_checkpoint auto"
    )
    assert (run_dir / "model.safetensors").is_file() and (run_dir / "checkpoint-3" / "model.safetensors").is_file()
    assert not (run_dir / ".final-model.partial").exists() and not (run_dir / ".finetune.lock").exists()
    if signum == signal.SIGINT:
        return  # one resume is enough to show the checkpoint is the run's
    resumed = finetune_process("train", str(recipe), "--resume_from_checkpoint", "auto", stderr=subprocess.PIPE)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 3
    assert (run_dir / "test_report.json").is_file()


def test_signal_during_a_checkpoint_save_stops_at_that_checkpoint(tmp_path, tiny_model_dir):
    # The save finished, but training went on one more update to save another checkpoint.
    # Saves in place: a background write runs while training goes on, so a signal during it stops at a
    # later update (tests/test_background_saves.py has that case).
    run_dir = tmp_path / "run"
    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, run_dir,
        max_steps=6, per_device_train_batch_size=4, eval_strategy="no", save_strategy="steps", save_steps=2,
        load_best_model_at_end="false", baseline="false", background_checkpoint_saves="false",
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "OMP_NUM_THREADS": "1"}
    stopped = warm_processes.run(
        [sys.executable, "-c", _SIGNAL_DURING_SAVE, str(recipe), str(int(signal.SIGTERM)), ".checkpoint-2.partial"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"stopped by SIGTERM at update 2 (epoch 0.03); checkpoint saved in {run_dir / 'checkpoint-2'}; "
        f"resume with: finetune train {recipe} --resume_from_checkpoint auto"
    )
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint-2", "finetune_run.json"]


# --------------------------------------------------------------------------- recipes and paths


def test_recipe_of_nested_aliases_is_refused_before_it_expands(tmp_path, capsys):
    # 9 deep and 9 wide made 2.4 GB in 22 s, then a MemoryError traceback; 6 deep (531,441 values)
    # is enough to show the bound without that cost when the fix is missing.
    lines = ["class_names:", "  - &l0 [c, c, c, c, c, c, c, c, c]"]
    lines += [f"  - &l{depth} [{', '.join([f'*l{depth - 1}'] * 9)}]" for depth in range(1, 6)]
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text("\n".join([*lines, f"output_dir: {tmp_path / 'run'}"]) + "\n", encoding="utf-8")
    assert len(recipe.read_bytes()) < 1024
    status = main(["train", str(recipe)])
    assert status == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: recipe {recipe} expands to more than 100,000 values through its YAML aliases (anchors nested "
        "in anchors); write the values out, or nest fewer aliases"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bomb.yaml"]


@pytest.mark.parametrize(
    ("flag", "path", "shown", "byte"),
    [
        ("--output_dir", b"runs/out\xfe", "runs/out\\xfe", "0xfe"),
        ("--train_file", b"data/tr\xff.csv", "data/tr\\xff.csv", "0xff"),
    ],
)
def test_path_that_is_not_utf8_is_refused_before_training(tmp_path, tiny_model_dir, flag, path, shown, byte):
    # output_dir trained, then failed at the first checkpoint advising to "free disk space"; train_file
    # trained to the end, then the model card raised UnicodeEncodeError and left README.md at 0 bytes.
    (tmp_path / "data").mkdir()
    reviews = (PROJECT / "data" / "reviews" / "train.csv").read_bytes()
    (tmp_path / "data" / "train.csv").write_bytes(reviews)
    (tmp_path / "data" / os.fsdecode(b"tr\xff.csv")).write_bytes(reviews)
    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, "run", dataset_dir=None, train_file="data/train.csv", max_steps=1,
        eval_strategy="no", save_strategy="no", load_best_model_at_end="false", baseline="false",
    )  # fmt: skip
    process = finetune_process("train", str(recipe), flag, os.fsdecode(path), cwd=tmp_path, stderr=subprocess.PIPE)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err
    assert one_error_line(err) == (
        f"error: {flag[2:]} {shown} is not UTF-8 (byte {byte}); a run records its paths as UTF-8 "
        "(finetune_run.json, the model card), so rename it to a UTF-8 name"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data", "recipe.yaml"]  # no run folder begun


# --------------------------------------------------------------------------- smaller


def test_load_best_model_with_eval_strategy_no_says_what_was_found_and_the_fix(capsys):
    # The message stopped at "... requires the save and eval strategy to match, ... but found".
    status = main(["train", str(PROJECT / "recipes" / "quickstart.yaml"), "--eval_strategy", "no"])
    assert status == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: load_best_model_at_end needs eval_strategy and save_strategy to match, but found eval_strategy no "
        "and save_strategy epoch; pass --save_strategy no --load_best_model_at_end false to keep the last model, "
        "or --eval_strategy epoch to keep the best"
    )


def test_infinite_epochs_are_refused_as_never_ending(tmp_path, capsys):
    # "must be > 0 (got inf)": inf is > 0.
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("num_train_epochs: .inf\n", encoding="utf-8")
    assert main(["train", str(recipe)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: num_train_epochs must be a finite number (got inf: training would never end); pass "
        "--num_train_epochs 3, or --max_steps N to count updates instead"
    )


def test_dangling_link_as_output_dir_is_named(tmp_path, tiny_model_dir, capsys):
    # "cannot create output_dir (File exists)".
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "nowhere")
    recipe = tiny_recipe(tmp_path, tiny_model_dir, link, max_steps=1)
    assert main(["train", str(recipe)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: output_dir {link} is a link to {tmp_path / 'nowhere'}, which does not exist; create that folder, "
        "remove the link, or choose another --output_dir"
    )
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_evaluate_refuses_a_run_still_training(tmp_path, tiny_model_dir, capsys):
    # It scored what was there and wrote into the live folder without a word.
    import shutil

    from finetune.training.runs import output_dir_lock

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run_dir)
    before = sorted(path.name for path in run_dir.iterdir())
    with output_dir_lock(str(run_dir)):  # as a training process holds it
        assert main(["evaluate", str(run_dir), "--data", str(PROJECT / "data" / "reviews" / "test.csv")]) == 2
        assert sorted(path.name for path in run_dir.iterdir()) == sorted([*before, ".finetune.lock"])
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {run_dir} is a run still training (process {os.getpid()}); finetune evaluate would read "
        "checkpoints that training may still delete and write into its folder: run it once training ends, or "
        "copy a checkpoint-* folder elsewhere and finetune evaluate that"
    )


_KILLED_EXPORT = """
import os, signal, sys
import finetune.export.common as export_module
from finetune.cli import main

# Killed once the model files are written, before the run record: what a kill -9 part-way leaves.
export_module.copy_run_record = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(main(["export", sys.argv[1], "--int8", "--backend", "onnxruntime", "--output", sys.argv[2]]))
"""


def test_export_after_a_killed_export_cleans_what_it_left(tmp_path, tiny_model_dir, capsys):
    # The kill left the output folder, and the re-run refused it as "already exists" without saying why.
    pytest.importorskip("onnxruntime", reason="finetune export needs the [export] extra")
    output = tmp_path / "tiny-int8"
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "OMP_NUM_THREADS": "1"}
    killed = warm_processes.run(
        [sys.executable, "-c", _KILLED_EXPORT, str(tiny_model_dir), str(output)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not output.exists()  # nothing named like an export, only a hidden leftover
    assert main(["export", str(tiny_model_dir), "--int8", "--backend", "onnxruntime", "--output", str(output)]) == 0
    assert (output / "model_int8.onnx").is_file() and (output / "export.json").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny-int8"]  # the leftover removed
