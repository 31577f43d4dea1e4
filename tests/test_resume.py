"""Stop anywhere, resume exactly: a run SIGKILLed at four kinds of moment and resumed each time
ends bitwise equal to an uninterrupted run (weights and logged loss history, CPU fp32).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import warm_processes
from helpers import checkpointing_recipe
from safetensors.torch import load_file

from finetune.training.checkpointing import COMPLETE_MARKER

WORKER = Path(__file__).parent / "resume_worker.py"


def recipe_for(folder: Path, model_dir: Path) -> Path:
    # 40 updates in 2 epochs; a checkpoint every 4 updates.
    return checkpointing_recipe(folder, model_dir, epochs=2, save_steps=4)


def finetune_cli(*args: str) -> subprocess.CompletedProcess:
    return warm_processes.run([sys.executable, "-m", "finetune", *args], capture_output=True, text=True)


def killed_at(recipe: Path, point: str, step: int, *flags: str) -> None:
    result = warm_processes.run(
        [sys.executable, str(WORKER), str(recipe), point, str(step), *flags], capture_output=True
    )
    assert result.returncode == -9, result.stderr.decode()[-2000:]  # SIGKILL


def logged_updates(run_dir: Path) -> list[tuple]:
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    return [
        (entry["step"], entry["loss"], entry["grad_norm"], entry["learning_rate"])
        for entry in history
        if "loss" in entry
    ]


# Contract 9 with 7: windows cut by tokens into packed rows resume as exactly (the cut depends on the window
# only). The kills around saves do not depend on the split, so that case keeps the two kills inside windows.
SPLITS = {"by-count": (), "packed-token-budget": ("--micro_batch_tokens", "120", "--padding_free", "true")}


@pytest.mark.parametrize("split", SPLITS)
def test_killed_four_ways_and_resumed_equals_uninterrupted(tmp_path, tiny_dropout_model_dir, split):
    reference_dir, interrupted_dir = tmp_path / "reference", tmp_path / "interrupted"
    reference_dir.mkdir()
    interrupted_dir.mkdir()
    reference = recipe_for(reference_dir, tiny_dropout_model_dir)
    recipe = recipe_for(interrupted_dir, tiny_dropout_model_dir)
    run_dir = interrupted_dir / "run"
    assert finetune_cli("train", str(reference), *SPLITS[split]).returncode == 0

    resume = ("--resume_from_checkpoint", "auto", *SPLITS[split])
    killed_at(recipe, "mid-window", 5, *SPLITS[split])  # update 6 half accumulated; checkpoint-4 is the latest
    if split == "by-count":
        killed_at(recipe, "after-save", 12, *resume)  # resumed from 4, killed right after saving 12
        killed_at(recipe, "during-save", 20, *resume)  # resumed from 12, killed while writing 20 (end of epoch 1)
        assert not (run_dir / "checkpoint-20").exists()  # the half-written checkpoint never took the name
        assert (run_dir / ".checkpoint-20.partial").is_dir()
    killed_at(recipe, "mid-epoch", 27, *resume)  # resumed from 16 (or 4), killed after update 27 (epoch 2)
    finished = finetune_cli("train", str(recipe), *resume)  # resumed from 24, runs to the end
    assert finished.returncode == 0, finished.stderr[-2000:]

    ours = load_file(run_dir / "model.safetensors")
    theirs = load_file(reference_dir / "run" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    mismatched = [name for name in ours if not (ours[name] == theirs[name]).all()]
    assert not mismatched, f"{len(mismatched)} tensors differ, e.g. {mismatched[:3]}"
    assert logged_updates(run_dir) == logged_updates(reference_dir / "run")
    assert all((path / COMPLETE_MARKER).is_file() for path in run_dir.glob("checkpoint-*"))


class _NaNFromSecondUpdate:
    """compute_loss that goes non-finite from the second update on, for good."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss * float("nan") if self.state.global_step >= 1 else loss


def test_non_finite_updates_in_a_row_stop_the_run_and_keep_the_last_good_checkpoint(
    tmp_path, tiny_model_dir, tokenizer
):
    from helpers import quiet_args, review_dataset
    from transformers import BertForSequenceClassification, DataCollatorWithPadding

    from finetune import FinetuneError, ReviewTrainer

    trainer_class = type("Diverging", (_NaNFromSecondUpdate, ReviewTrainer), {})
    trainer = trainer_class(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
        args=quiet_args(
            tmp_path,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            save_strategy="steps",
            save_steps=1,
            max_nonfinite_updates=3,
        ),
        train_dataset=review_dataset(tokenizer, 40),  # 10 updates an epoch
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    with pytest.raises(FinetuneError) as stopped:
        trainer.train()
    assert str(stopped.value) == (
        "3 updates in a row had a non-finite loss or gradient (the last is update 4); "
        f"the last good checkpoint is {tmp_path / 'checkpoint-3'}; lower learning_rate, "
        "check the data for broken rows, or raise max_nonfinite_updates"
    )
    # Skipped updates do not touch the weights, so every checkpoint saved holds finite numbers.
    for checkpoint in tmp_path.glob("checkpoint-*"):
        weights = load_file(checkpoint / "model.safetensors")
        assert all(bool(tensor.isfinite().all()) for tensor in weights.values())


def test_pickled_checkpoint_weights_are_refused_unless_allowed(tmp_path, tiny_model_dir, capsys):
    import shutil

    import torch

    from finetune.cli import main

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, pickled)
    weights = load_file(pickled / "model.safetensors")
    (pickled / "model.safetensors").unlink()
    torch.save(weights, pickled / "pytorch_model.bin")
    assert main(["evaluate", str(pickled)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has only pickled weights (pytorch_model.bin), which can run code when loaded" in err[0]

    # Resuming from such a checkpoint is refused too, unless the recipe opts in.
    from helpers import quiet_args
    from transformers import BertForSequenceClassification

    from finetune import FinetuneError, ReviewTrainer

    trainer = ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir), args=quiet_args(tmp_path)
    )
    with pytest.raises(FinetuneError, match="pass --allow_pickle_checkpoints if you trust where they came from"):
        trainer._load_from_checkpoint(str(pickled))
    trainer.args.allow_pickle_checkpoints = True
    trainer._load_from_checkpoint(str(pickled))  # opted in: loads
