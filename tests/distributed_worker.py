"""One rank of tests/test_distributed.py: train the tiny model on 2 processes and save what the tests check.

Launched by the test as
``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_worker.py MODEL_DIR OUT_DIR``;
each rank writes ``OUT_DIR/rank<r>.pt``.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import NamedTuple

import datasets
import torch
from helpers import flat_parameters, quiet_args, review_dataset, sgd_args
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding, TrainerCallback

from finetune import ReviewTrainer


class ExactnessCase(NamedTuple):
    """2 processes with micro-batch ``micro_batch`` against 1 process with twice that, ``n`` micro-batches a window."""

    samples: int
    micro_batch: int
    n: int
    epochs: int = 1
    class_weighting: str = "none"
    sync_each_batch: bool = False  # Accelerate's option to all-reduce on every micro-batch
    micro_batch_tokens: int | None = None  # windows cut by tokens: each rank's piece count varies
    padding_free: bool = False  # pieces packed into one row each


EXACTNESS_CASES = {
    # 4 rounds of 2 x 3 samples, 2 windows.
    "divisible": ExactnessCase(24, 3, 2),
    # The last round is 3 samples on rank 0 and 1 on rank 1.
    "short-share": ExactnessCase(10, 3, 2),
    # 9 micro-batches of 2 (the last of 1): rank 1 has no share of round 5, an update step of a partial window.
    "empty-share-partial-window": ExactnessCase(17, 2, 2),
    # The same on each of 2 epochs (rank 1 empty at the end of each).
    "empty-share-across-epochs": ExactnessCase(13, 2, 2, epochs=2),
    # Rank 1 never has a sample: it only joins the all-reduces.
    "rank-without-samples": ExactnessCase(2, 2, 1),
    # Shares of the window weighed by summed class weights, over both ranks.
    "class-weighted": ExactnessCase(17, 2, 2, class_weighting="balanced"),
    # A user who asks for an all-reduce on every micro-batch gets one, and the same updates.
    "sync-each-batch": ExactnessCase(17, 2, 2, sync_each_batch=True),
    # Contract 9: each rank cuts its share of a window by a token budget, into as many pieces as its
    # reviews need (not the other rank's count), and still all-reduces once per update.
    "token-budget": ExactnessCase(17, 3, 2, micro_batch_tokens=20),
    "token-budget-packed": ExactnessCase(17, 3, 2, micro_batch_tokens=40, padding_free=True),
}
# Contract 10 on 2 processes: token-level and multi-label losses (tests/test_every_loss_exact.py's tiny
# models), each window's items summed over both ranks. (family, samples, micro-batch, n, token budget[, packed])
TOKEN_LEVEL_CASES = {
    "causal-lm-partial-window": ("causal-lm", 17, 2, 2, None),
    "causal-lm-token-budget": ("causal-lm", 17, 3, 2, 20),
    "token-classifier-partial-window": ("token-classifier", 17, 2, 2, None),
    "multi-label-partial-window": ("multi-label", 17, 2, 2, None),
    "multi-label-token-budget-packed": ("multi-label", 17, 3, 2, 40, True),
    "rating-regression-partial-window": ("rating-regression", 17, 2, 2, None),
    "ordinal-corn-partial-window": ("ordinal-corn", 17, 2, 2, None),
    "ordinal-corn-token-budget-packed": ("ordinal-corn", 17, 3, 2, 40, True),
}
# Coverage runs: dropout on (so ranks' random streams differ), 3 epochs of shuffled order.
COVERAGE_SAMPLES = 21
COVERAGE_STRATEGIES = ("group_by_length", "random")
EVAL_SAMPLES = 7


def case_dataset(tokenizer, case: ExactnessCase) -> datasets.Dataset:
    """The training set of an exactness case (imbalanced labels for the class-weighted one)."""
    dataset = review_dataset(tokenizer, case.samples, seed=case.samples)
    if case.class_weighting == "none":
        return dataset
    labels = [0 if index % 7 == 0 else 1 if index % 5 == 0 else 2 for index in range(case.samples)]
    return dataset.remove_columns("labels").add_column("labels", labels)


def sample_rows(inputs: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """Each sample of a collated batch (or a packed row) as its unpadded token ids."""
    if "cu_seq_lens_q" in inputs:
        starts = inputs["cu_seq_lens_q"].tolist()
        row = inputs["input_ids"][0].tolist()
        return [tuple(row[start:end]) for start, end in itertools.pairwise(starts)]
    return [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"])]


class CountingTrainer(ReviewTrainer):
    """ReviewTrainer that counts its window-mass reductions and records the samples it trains, per epoch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.window_reductions = 0
        self.micro_steps = 0  # forward and backward passes, pieces included
        self.trained_rows: list[list[tuple[int, ...]]] = []

    def _epoch_batches(self, train_dataloader, epoch):
        self.trained_rows.append([])
        return super()._epoch_batches(train_dataloader, epoch)

    def _sum_over_processes(self, value):
        self.window_reductions += 1
        return super()._sum_over_processes(value)

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_steps += 1
        if inputs is not self._stand_in:  # the stand-in for an empty share trains nothing
            self.trained_rows[-1].extend(sample_rows(inputs))
        return super().training_step(model, inputs, num_items_in_batch)


class CountAllReduces(TrainerCallback):
    """Registers a DDP communication hook that counts gradient all-reduces (then does the default one)."""

    def __init__(self, trainer: ReviewTrainer) -> None:
        self.trainer = trainer
        self.buckets = 0
        self.rounds = 0  # backward passes that all-reduced: one per bucket set

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.model_wrapped.register_comm_hook(None, self._hook)

    def _hook(self, process_group, bucket):
        self.buckets += 1
        self.rounds += bucket.is_last()
        return default_hooks.allreduce_hook(process_group, bucket)


def run_exactness_case(model_dir: Path, tokenizer, case: ExactnessCase, output_dir: Path) -> dict:
    """Train one case; its final parameters and the counts the tests compare with the number of updates."""
    model = BertForSequenceClassification.from_pretrained(model_dir)
    accelerator_config = {"gradient_accumulation_kwargs": {"sync_each_batch": case.sync_each_batch}}
    trainer = CountingTrainer(
        model=model,
        args=sgd_args(
            output_dir,
            case.micro_batch,
            case.n,
            case.epochs,
            class_weighting=case.class_weighting,
            accelerator_config=accelerator_config,
            micro_batch_tokens=case.micro_batch_tokens,
            padding_free=case.padding_free,
        ),
        train_dataset=case_dataset(tokenizer, case),
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    counter = CountAllReduces(trainer)
    trainer.add_callback(counter)
    result = trainer.train()
    return {
        "parameters": flat_parameters(model),
        "updates": result.global_step,
        "gradient_all_reduces": counter.rounds,
        "buckets": counter.buckets,
        "scheduler_steps": trainer.lr_scheduler.last_epoch,
        "window_reductions": trainer.window_reductions,
        "micro_steps": trainer.micro_steps,
    }


def run_token_level_case(
    family: str, samples: int, micro_batch: int, n: int, budget, packed=False, *, output_dir: Path
) -> torch.Tensor:
    """Train one token-level or multi-label case on this rank; its final parameters."""
    from test_every_loss_exact import FAMILIES, pad_rows

    make_model, make_rows = FAMILIES[family]
    model = make_model()
    args = sgd_args(output_dir, micro_batch, n, micro_batch_tokens=budget, padding_free=packed)
    dataset = make_rows(samples, seed=samples)
    ReviewTrainer(model=model, args=args, train_dataset=dataset, data_collator=pad_rows).train()
    return flat_parameters(model)


def run_coverage(model_dir: Path, tokenizer, strategy: str, output_dir: Path) -> list[list[tuple[int, ...]]]:
    """The samples this rank trained in each of 3 epochs of a shuffled, dropout-on run."""
    model = BertForSequenceClassification.from_pretrained(
        model_dir, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1
    )
    trainer = CountingTrainer(
        model=model,
        args=quiet_args(
            output_dir,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            num_train_epochs=3,
            learning_rate=1e-3,
            train_sampling_strategy=strategy,
        ),
        train_dataset=review_dataset(tokenizer, COVERAGE_SAMPLES, seed=1),
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    trainer.train()
    return trainer.trained_rows


def run_evaluation(model_dir: Path, tokenizer, output_dir: Path) -> dict:
    """``evaluate()`` of the tiny model on ``EVAL_SAMPLES`` reviews, with what compute_metrics was given."""
    seen = {}

    def compute_metrics(prediction):
        seen["labels"] = prediction.label_ids.tolist()
        seen["predictions"] = prediction.predictions.argmax(-1).tolist()
        return {"samples": len(prediction.label_ids)}

    trainer = ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(model_dir),
        args=quiet_args(output_dir, per_device_eval_batch_size=2, train_sampling_strategy="group_by_length"),
        eval_dataset=review_dataset(tokenizer, EVAL_SAMPLES, seed=2),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    return {"metrics": trainer.evaluate(), **seen}


def main(model_dir: str, out_dir: str) -> None:
    """Run every case on this rank and save the results as ``rank<r>.pt``."""
    model_dir, out = Path(model_dir), Path(out_dir)
    rank = int(os.environ["RANK"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results = {
        "world_size": int(os.environ["WORLD_SIZE"]),
        "cases": {
            name: run_exactness_case(model_dir, tokenizer, case, out / "runs" / name)
            for name, case in EXACTNESS_CASES.items()
        },
        "token_level": {
            name: run_token_level_case(*case, output_dir=out / "runs" / name)
            for name, case in TOKEN_LEVEL_CASES.items()
        },
        "coverage": {
            strategy: run_coverage(model_dir, tokenizer, strategy, out / "runs" / strategy)
            for strategy in COVERAGE_STRATEGIES
        },
        "evaluation": run_evaluation(model_dir, tokenizer, out / "runs" / "evaluation"),
    }
    torch.save(results, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
