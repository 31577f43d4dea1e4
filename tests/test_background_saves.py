"""Checkpoints written in a background thread (``background_checkpoint_saves``) are those a synchronous save
writes, and everything that reads them sees only complete ones.

Most tests hold each background write back until training waits for it (``writes_wait_for_training``): the
slowest disk there is, without a clock, so a missing wait fails every time instead of on a slow day.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
import warm_processes
from helpers import checkpointing_recipe, flat_parameters, quiet_args, review_dataset, tiny_recipe
from safetensors.torch import load_file
from test_resume import WORKER, finetune_cli, logged_updates
from transformers import BertForSequenceClassification, DataCollatorWithPadding, TrainerCallback

from finetune.cli import main
from finetune.errors import TrainingInterrupted
from finetune.training.background_saves import cpu_copy, reads_checkpoint_on_save
from finetune.training.checkpointing import COMPLETE_MARKER, CrashSafeCheckpoints, latest_complete_checkpoint
from finetune.training.interrupt import StopOnSignal
from finetune.training.trainer import ReviewTrainer


@pytest.fixture
def writes_wait_for_training(monkeypatch) -> list[int]:
    """Hold every background write until training waits for it; the list gets each written step."""
    written: list[int] = []
    write = CrashSafeCheckpoints._write_in_background

    def held(self, snapshot, *where):
        # A bound, not a hang: a run that never waits still ends, and its test fails on what is missing.
        self._checkpoint_writer.waited.wait(timeout=120)
        written.append(snapshot.global_step)
        write(self, snapshot, *where)

    monkeypatch.setattr(CrashSafeCheckpoints, "_write_in_background", held)
    return written


def recipe_for(folder: Path, model_dir: Path) -> Path:
    # 20 updates in one epoch; a checkpoint every 3 (and at 20).
    return checkpointing_recipe(folder, model_dir, epochs=1, save_steps=3)


@pytest.fixture(scope="module")
def synchronous_run(tmp_path_factory, tiny_dropout_model_dir) -> Path:
    """``recipe_for``'s run with checkpoints written in place: the reference (dropout on, so random states count)."""
    folder = tmp_path_factory.mktemp("synchronous")
    recipe = recipe_for(folder, tiny_dropout_model_dir)
    assert main(["train", str(recipe), "--background_checkpoint_saves", "false"]) == 0
    return folder / "run"


def checkpoint_files(run_dir: Path) -> dict[str, bytes]:
    """Every file of every checkpoint, by path, as bytes, except two that differ between any two runs.

    training_args.bin is compared as its arguments, less the run's folder and the flag. tokenizer.json
    less its truncation and padding settings: they are those of the tokenizer's last call, which a run
    that found its tokenized data in the datasets cache never made.
    """
    files = {}
    for path in sorted(run_dir.glob("checkpoint-*/*")):
        name = str(path.relative_to(run_dir))
        if path.name == "training_args.bin":
            arguments = torch.load(path, weights_only=False).to_dict()
            arguments.pop("background_checkpoint_saves")
            files[name] = json.dumps(arguments, sort_keys=True, default=str).replace(str(run_dir), "RUN").encode()
        elif path.name == "tokenizer.json":
            tokenizer = json.loads(path.read_text(encoding="utf-8"))
            files[name] = json.dumps({**tokenizer, "truncation": None, "padding": None}, sort_keys=True).encode()
        else:
            files[name] = path.read_bytes()
    return files


def test_background_saves_write_the_checkpoints_a_synchronous_save_writes(
    tmp_path, tiny_dropout_model_dir, synchronous_run, writes_wait_for_training
):
    recipe = recipe_for(tmp_path, tiny_dropout_model_dir)
    assert main(["train", str(recipe), "--background_checkpoint_saves", "true"]) == 0
    run_dir = tmp_path / "run"
    # Each write began only once training had gone on to the next save: a copy that was not one
    # (weights, optimizer or random state read when written) would hold later numbers.
    assert writes_wait_for_training == [3, 6, 9, 12, 15, 18, 20]
    ours, theirs = checkpoint_files(run_dir), checkpoint_files(synchronous_run)
    assert ours.keys() == theirs.keys()
    assert [name for name in ours if ours[name] != theirs[name]] == []
    assert (run_dir / "model.safetensors").read_bytes() == (synchronous_run / "model.safetensors").read_bytes()
    assert logged_updates(run_dir) == logged_updates(synchronous_run)


@pytest.mark.slow  # three processes, about a minute on 2 cores
def test_killed_during_a_background_write_resumes_bitwise(tmp_path, tiny_dropout_model_dir, synchronous_run):
    recipe = recipe_for(tmp_path, tiny_dropout_model_dir)
    run_dir = tmp_path / "run"
    background = ("--background_checkpoint_saves", "true")
    # Checkpoint-9's write hangs after its model files; SIGKILL comes at update 11. A save that made
    # training wait for the write would hang here until the timeout.
    killed = warm_processes.run(
        [sys.executable, str(WORKER), str(recipe), "during-background-write", "9", *background],
        capture_output=True,
        timeout=300,  # the run takes seconds
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert not (run_dir / "checkpoint-9").exists()  # the half-written folder never took the checkpoint's name
    partial = {path.name for path in (run_dir / ".checkpoint-9.partial").iterdir()}
    assert "model.safetensors" in partial and COMPLETE_MARKER not in partial
    assert latest_complete_checkpoint(run_dir) == run_dir / "checkpoint-6"

    finished = finetune_cli("train", str(recipe), "--resume_from_checkpoint", "auto", *background)
    assert finished.returncode == 0, finished.stderr[-2000:]
    ours, theirs = load_file(run_dir / "model.safetensors"), load_file(synchronous_run / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert [name for name in ours if not (ours[name] == theirs[name]).all()] == []
    assert logged_updates(run_dir) == logged_updates(synchronous_run)
    assert sorted(path.name for path in run_dir.glob("*checkpoint-*")) == sorted(
        path.name for path in synchronous_run.glob("checkpoint-*")
    )
    assert all((path / COMPLETE_MARKER).is_file() for path in run_dir.glob("checkpoint-*"))


class WatchCheckpoints(TrainerCallback):
    """After every update and evaluation: each checkpoint-* folder complete, the newest complete one kept."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.newest: Path | None = None
        self.weights_at_end: torch.Tensor | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.look(Path(args.output_dir), state.global_step)
        if state.global_step == state.max_steps:
            self.weights_at_end = flat_parameters(model)

    def on_evaluate(self, args, state, control, **kwargs):
        self.look(Path(args.output_dir), state.global_step)

    def look(self, run_dir: Path, step: int) -> None:
        """Note any checkpoint folder without its marker, and a newest complete checkpoint that went away."""
        for folder in run_dir.glob("checkpoint-*"):
            if not (folder / COMPLETE_MARKER).is_file():
                self.problems.append(f"update {step}: {folder.name} is incomplete")
        newest = latest_complete_checkpoint(run_dir)
        if self.newest is not None and (newest is None or newest.name < self.newest.name):
            self.problems.append(f"update {step}: the newest complete checkpoint {self.newest.name} went away")
        self.newest = newest or self.newest


class ScoreByUpdate(TrainerCallback):
    """``compute_metrics`` whose score is chosen per update, so the test says which checkpoint is best."""

    def __init__(self, scores: dict[int, float]) -> None:
        self.scores, self.update = scores, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.update = state.global_step

    def __call__(self, predictions) -> dict[str, float]:
        return {"score": self.scores[self.update]}


def test_rotation_and_the_best_model_see_only_complete_checkpoints(
    tmp_path, tiny_model_dir, tokenizer, writes_wait_for_training
):
    # Saved only when best (updates 2 and 6), one kept: the best (6) must replace 2, and be loaded at the end
    # although its write is still held when the last update (9) is done.
    finished = {}
    for background in (False, True):
        output_dir = tmp_path / f"background-{background}"
        watch, score = WatchCheckpoints(), ScoreByUpdate({2: 0.5, 4: 0.4, 6: 0.9, 8: 0.1, 9: 0.2})
        trainer = ReviewTrainer(
            model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
            args=quiet_args(
                output_dir,
                background_checkpoint_saves=background,
                per_device_train_batch_size=4,
                learning_rate=1e-3,
                max_steps=9,
                eval_strategy="steps",
                eval_steps=2,
                save_strategy="best",
                metric_for_best_model="score",
                load_best_model_at_end=True,
                save_total_limit=1,
            ),
            train_dataset=review_dataset(tokenizer, 40),
            eval_dataset=review_dataset(tokenizer, 8, seed=1),
            data_collator=DataCollatorWithPadding(tokenizer),
            compute_metrics=score,
            callbacks=[watch, score],
        )
        trainer.train()
        assert watch.problems == []
        listing = sorted(path.name for path in output_dir.iterdir())
        finished[background] = (listing, flat_parameters(trainer.model), watch.weights_at_end)

    assert torch.equal(finished[True][1], finished[False][1])
    assert not torch.equal(finished[True][1], finished[True][2])  # the best, not the last update's weights
    best = load_file(tmp_path / "background-True" / "checkpoint-6" / "model.safetensors")
    loaded = dict(trainer.model.named_parameters())
    assert all(torch.equal(best[name], loaded[name].detach()) for name in best if name in loaded)
    assert finished[True][0] == finished[False][0] == ["checkpoint-6"]
    assert writes_wait_for_training == [2, 6]


def short_recipe(folder: Path, model_dir: Path, **fields) -> Path:
    """6 updates of 4 reviews, a checkpoint every 2, all kept, nothing else saved or fitted on the way."""
    values = dict(
        max_steps=6,
        per_device_train_batch_size=4,
        n_accumulate=1,
        eval_strategy="no",
        save_strategy="steps",
        save_steps=2,
        save_total_limit="null",
        load_best_model_at_end="false",
        baseline="false",
    )
    return tiny_recipe(folder, model_dir, folder / "run", **{**values, **fields})


@pytest.mark.parametrize("failing", [4, 6], ids=["raised-at-the-next-save", "raised-at-the-end"])
@pytest.mark.parametrize("background", ["false", "true"])
def test_a_failed_write_stops_the_run_with_the_synchronous_line(
    tmp_path, tiny_model_dir, capsys, monkeypatch, writes_wait_for_training, background, failing
):
    save = ReviewTrainer._save

    def disk_full_at(self, output_dir=None, state_dict=None):
        if str(output_dir).endswith(f".checkpoint-{failing}.partial"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(self, output_dir, state_dict)

    monkeypatch.setattr(ReviewTrainer, "_save", disk_full_at)
    recipe = short_recipe(tmp_path, tiny_model_dir)
    run_dir = tmp_path / "run"
    assert main(["train", str(recipe), "--background_checkpoint_saves", background]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: cannot save {run_dir / f'checkpoint-{failing}'} (No space left on device); the previous "
        f"checkpoint {run_dir / f'checkpoint-{failing - 2}'} is kept; free disk space or choose another output_dir"
    )
    # Stopped there: no later checkpoint, no final model, no partial folder.
    kept = [f"checkpoint-{step}" for step in range(2, failing, 2)]
    assert sorted(path.name for path in run_dir.glob("*checkpoint-*")) == kept
    assert not (run_dir / "model.safetensors").exists()


class SignalAt(TrainerCallback):
    """Sends this process SIGTERM after update ``step``, as a cluster's scheduler might."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_while_a_write_is_pending_stops_with_complete_checkpoints(
    tmp_path, tiny_model_dir, writes_wait_for_training
):
    from finetune.commands.train import train

    # Checkpoint-4's write is still held when SIGTERM comes after update 5: the run saves update 6
    # (finishing 4 first), stops, and names checkpoint-6, complete.
    recipe = short_recipe(tmp_path, tiny_model_dir, max_steps=12, save_steps=4)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(str(recipe), callbacks=[SignalAt(5)])
    run_dir = tmp_path / "run"
    assert stopped.value.exit_status == 143
    assert str(stopped.value).startswith("stopped by SIGTERM at update 6 (epoch ")
    assert f"checkpoint saved in {run_dir / 'checkpoint-6'};" in str(stopped.value)
    assert writes_wait_for_training == [4, 6]
    assert sorted(path.name for path in run_dir.glob("*checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert all((path / COMPLETE_MARKER).is_file() for path in run_dir.glob("checkpoint-*"))


class FailAt(TrainerCallback):
    """Raises after update ``step``, as a bug in a callback or a loss would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"failed after update {self.step}")


def test_train_that_raises_finishes_the_pending_write_first(
    tmp_path, tiny_model_dir, tokenizer, writes_wait_for_training
):
    trainer = ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
        args=quiet_args(tmp_path, per_device_train_batch_size=4, max_steps=4, save_strategy="steps", save_steps=2),
        train_dataset=review_dataset(tokenizer, 16),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[FailAt(3)],
    )
    with pytest.raises(RuntimeError, match="failed after update 3"):
        trainer.train()
    # Checkpoint-2's write was held until train() waited for it on its way out.
    assert writes_wait_for_training == [2]
    assert sorted(path.name for path in tmp_path.glob("*checkpoint-*")) == ["checkpoint-2"]
    assert (tmp_path / "checkpoint-2" / COMPLETE_MARKER).is_file()


class NaNFromUpdate3:
    """compute_loss that goes non-finite from the third update on."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss * float("nan") if self.state.global_step >= 2 else loss


def test_a_run_that_diverges_names_the_checkpoint_still_being_written(
    tmp_path, tiny_model_dir, tokenizer, writes_wait_for_training
):
    from finetune import FinetuneError

    trainer = type("Diverging", (NaNFromUpdate3, ReviewTrainer), {})(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
        args=quiet_args(
            tmp_path,
            per_device_train_batch_size=4,
            max_steps=6,
            save_strategy="steps",
            save_steps=1,
            max_nonfinite_updates=1,
        ),
        train_dataset=review_dataset(tokenizer, 24),
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    with pytest.raises(FinetuneError) as stopped:
        trainer.train()
    # Checkpoint-2's write was held when update 3 failed: the message waits for it and names it.
    assert str(stopped.value) == (
        "1 updates in a row had a non-finite loss or gradient (the last is update 3); "
        f"the last good checkpoint is {tmp_path / 'checkpoint-2'}; lower learning_rate, "
        "check the data for broken rows, or raise max_nonfinite_updates"
    )
    assert writes_wait_for_training == [1, 2]


class ReadsOnSave(TrainerCallback):
    """Looks for each checkpoint in ``on_save``, as the wandb and MLflow integrations upload it there."""

    def __init__(self) -> None:
        self.found: list[bool] = []

    def on_save(self, args, state, control, **kwargs):
        self.found.append((Path(args.output_dir) / f"checkpoint-{state.global_step}" / COMPLETE_MARKER).is_file())


def test_a_callback_that_reads_checkpoints_on_save_finds_them_written(
    tmp_path, tiny_model_dir, tokenizer, writes_wait_for_training
):
    reader = ReadsOnSave()
    trainer = ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
        args=quiet_args(tmp_path, per_device_train_batch_size=4, max_steps=2, save_strategy="steps", save_steps=1),
        train_dataset=review_dataset(tokenizer, 8),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[reader],
    )
    trainer.train()
    assert reader.found == [True, True]
    assert writes_wait_for_training == []  # written in place
    # Callbacks that say their on_save reads nothing keep saves in the background.
    assert not reads_checkpoint_on_save(StopOnSignal())
    assert reads_checkpoint_on_save(reader) and not reads_checkpoint_on_save(TrainerCallback())


def test_the_copy_is_on_the_cpu_shares_what_was_shared_and_nothing_with_the_original():
    weights = torch.arange(6.0).reshape(2, 3)
    state = {"embeddings": weights, "decoder": weights, "step": torch.tensor(3.0), "lr": [1e-3]}
    copied = cpu_copy(state)
    # Tied weights stay one tensor (saving drops the alias by its storage); none is the live one.
    assert copied["embeddings"] is copied["decoder"]
    assert copied["embeddings"].untyped_storage().data_ptr() != weights.untyped_storage().data_ptr()
    weights += 1  # the next update
    assert torch.equal(copied["decoder"], torch.arange(6.0).reshape(2, 3))
    assert copied["lr"] == [1e-3] and copied["lr"] is not state["lr"]
