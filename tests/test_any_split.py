"""Contract 9: any split of a window (by a token budget, packed, cut again after out-of-memory) gives the same update.

The reference is test_exactness.py's plain PyTorch: one full-batch SGD step on
each window's samples, collated as one padded batch. Nothing of the trainer's
cutting or packing is in it.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from helpers import flat_parameters, review_dataset, sgd_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_exactness import (
    assert_matches_reference,
    by_hand_balanced_weights,
    imbalanced_dataset,
    reference_full_batch_steps,
    trained_parameters,
)
from transformers import BertForSequenceClassification, DataCollatorWithPadding

from finetune import ReviewTrainer
from finetune.errors import FinetuneError
from finetune.training import trainer as trainer_module


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


class RecordingCollator(DataCollatorWithPadding):
    """The run's collator, remembering every batch it made (what each forward pass computed)."""

    def __init__(self, tokenizer, pad_to_multiple_of=None):
        super().__init__(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
        self.batches = []

    def __call__(self, features):
        batch = super().__call__(features)
        self.batches.append(batch)
        return batch


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("budget", [1, 24, 64, None], ids=["budget-1", "budget-24", "budget-64", "by-count"])
@pytest.mark.parametrize(("samples", "micro_batch", "n"), [(12, 3, 2), (10, 4, 4)], ids=["divisible", "partial-window"])
def test_update_equals_full_batch_step_for_any_split(
    initial_model, tokenizer, tmp_path, samples, micro_batch, n, budget, packed
):
    dataset = review_dataset(tokenizer, samples)
    collator = RecordingCollator(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, micro_batch * n)
    collator.batches.clear()
    trained = trained_parameters(
        ReviewTrainer,
        initial_model,
        dataset,
        collator,
        tmp_path,
        micro_batch,
        n,
        micro_batch_tokens=budget,
        padding_free=packed,
    )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    assert sum(len(batch["labels"]) for batch in collator.batches) == samples  # each sample once
    if budget is not None:
        for batch in collator.batches:
            # A piece holds at most the budget, unless it is one review longer than the budget.
            cost = int(batch["attention_mask"].sum()) if packed else batch["input_ids"].numel()
            assert cost <= budget or len(batch["labels"]) == 1


@pytest.mark.parametrize("budget", [24, 40, None], ids=["budget-24", "budget-40", "by-count"])
def test_pieces_padded_to_a_multiple_keep_the_update_and_the_budget(initial_model, tokenizer, tmp_path, budget):
    """``pad_to_multiple_of`` (few shapes, for CUDA graphs): wider pieces, the same updates, the budget kept."""
    dataset = review_dataset(tokenizer, 10)
    # The reference pads to each batch's longest review, as it always does.
    reference = reference_full_batch_steps(initial_model, dataset, DataCollatorWithPadding(tokenizer), 8)
    collator = RecordingCollator(tokenizer, pad_to_multiple_of=8)
    trained = trained_parameters(
        ReviewTrainer, initial_model, dataset, collator, tmp_path, 4, 2, micro_batch_tokens=budget
    )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    assert sum(len(batch["labels"]) for batch in collator.batches) == 10
    widths = {batch["input_ids"].shape[1] for batch in collator.batches}
    assert all(width % 8 == 0 for width in widths), widths
    real_widths = {int(batch["attention_mask"].sum(dim=1).max()) for batch in collator.batches}
    assert real_widths - widths, "no piece was padded past its longest review: the test shows nothing"
    if budget is not None:
        for batch in collator.batches:
            # The budget counts the padded width: rows x a multiple of 8.
            assert batch["input_ids"].numel() <= budget or len(batch["labels"]) == 1


# The three ways a window reaches the model: the loader's micro-batches, pieces cut by tokens, packed rows.
THREE_WAYS = pytest.mark.parametrize(
    ("budget", "packed"), [(None, False), (24, False), (64, True)], ids=["by-count", "budget-24", "packed-64"]
)


class PidRecordingCollator(DataCollatorWithPadding):
    """Writes the id of the process that collated each batch to ``pid_file`` (a loader worker's stays there)."""

    def __init__(self, tokenizer, pid_file):
        super().__init__(tokenizer)
        self.pid_file = pid_file

    def __call__(self, features):
        with open(self.pid_file, "a") as pids:
            pids.write(f"{os.getpid()}\n")
        return super().__call__(features)


@THREE_WAYS
def test_loader_workers_keep_the_update(initial_model, tokenizer, tmp_path, budget, packed):
    """Batches collated ahead in loader worker processes (``dataloader_num_workers``) make the same updates."""
    dataset = review_dataset(tokenizer, 10)
    reference = reference_full_batch_steps(initial_model, dataset, DataCollatorWithPadding(tokenizer), 8, epochs=2)
    pid_file = tmp_path / "pids"
    collator = PidRecordingCollator(tokenizer, pid_file)
    trained = trained_parameters(
        ReviewTrainer,
        initial_model,
        dataset,
        collator,
        tmp_path,
        4,
        2,
        epochs=2,
        micro_batch_tokens=budget,
        padding_free=packed,
        dataloader_num_workers=2,
    )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    pids = pid_file.read_text().split()
    if budget is None:
        assert len(pids) == 6 and str(os.getpid()) not in pids  # 3 micro-batches an epoch, collated by workers
    else:
        # The workers read the features; a window is cut and its pieces collated in the training process.
        assert set(pids) == {str(os.getpid())}


@THREE_WAYS
def test_activation_checkpointing_keeps_the_update(initial_model, tokenizer, tmp_path, budget, packed):
    """Each layer recomputed in the backward (``activation_checkpointing``) reads its micro-batch as the forward did."""
    dataset = review_dataset(tokenizer, 10)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 8)
    model = copy.deepcopy(initial_model)
    model_forwards, layer_forwards = [], []
    model.register_forward_pre_hook(lambda *_: model_forwards.append(1))
    # Inside the first layer: the recomputation skips the layer's own hooks, not those of its parts.
    model.bert.encoder.layer[0].intermediate.register_forward_hook(lambda *_: layer_forwards.append(1))
    args = sgd_args(tmp_path, 4, 2, micro_batch_tokens=budget, padding_free=packed, activation_checkpointing=True)
    ReviewTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator).train()
    assert_matches_reference(flat_parameters(model), reference, flat_parameters(initial_model))
    assert model_forwards and len(layer_forwards) == 2 * len(model_forwards)  # every forward recomputed once


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    micro_batch=st.integers(min_value=1, max_value=6),
    n=st.integers(min_value=1, max_value=5),
    windows=st.integers(min_value=1, max_value=3),
    short_by=st.integers(min_value=0, max_value=29),
    budget=st.integers(min_value=1, max_value=200),
    packed=st.booleans(),
)
def test_exact_for_any_budget(initial_model, tokenizer, tmp_path, micro_batch, n, windows, short_by, budget, packed):
    window_samples = micro_batch * n
    samples = windows * window_samples - min(short_by, window_samples - 1)
    dataset = review_dataset(tokenizer, samples, seed=samples + budget)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, window_samples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # n larger than the epoch warns (test_exactness.py)
        trained = trained_parameters(
            ReviewTrainer,
            initial_model,
            dataset,
            collator,
            tmp_path,
            micro_batch,
            n,
            micro_batch_tokens=budget,
            padding_free=packed,
        )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))


def test_packed_attention_groups_cut_by_the_cpu_cap_keep_the_update(initial_model, tokenizer, tmp_path, monkeypatch):
    """On a CPU, groups are cut to keep their scores under malloc's mmap threshold; cut to a review each here."""
    from finetune.fast_path import packed_attention
    from finetune.training import micro_batches

    monkeypatch.setattr(packed_attention, "CPU_ATTENTION_GROUP_BYTES", 1)
    group_sizes = []
    layout = micro_batches.attention_layout

    def recording_layout(*args, **kwargs):
        result = layout(*args, **kwargs)
        group_sizes.extend(len(token_index) for token_index, _, _ in result["review_groups"])
        return result

    monkeypatch.setattr(micro_batches, "attention_layout", recording_layout)
    dataset = review_dataset(tokenizer, 12)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6)
    trained = trained_parameters(
        ReviewTrainer, initial_model, dataset, collator, tmp_path, 3, 2, micro_batch_tokens=200, padding_free=True
    )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    assert group_sizes and set(group_sizes) == {1}  # the cap was applied: one review a group


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_class_weighted_pieces_weigh_by_summed_weights(initial_model, tokenizer, tmp_path, packed):
    dataset = imbalanced_dataset(tokenizer, 10)
    weights = by_hand_balanced_weights(dataset["labels"], 3)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6, class_weights=weights)
    trained = trained_parameters(
        ReviewTrainer,
        initial_model,
        dataset,
        collator,
        tmp_path,
        3,
        2,
        class_weighting="balanced",
        micro_batch_tokens=30,
        padding_free=packed,
    )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))


def test_the_check_has_teeth_pieces_weighted_alike_fail(initial_model, tokenizer, tmp_path, monkeypatch):
    """Weighting each piece 1 / pieces (as the classic loop weighs micro-batches) is caught."""
    dataset = review_dataset(tokenizer, 12)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6)
    monkeypatch.setattr(ReviewTrainer, "_loss_items", lambda self, inputs: 1.0)
    trained = trained_parameters(ReviewTrainer, initial_model, dataset, collator, tmp_path, 3, 2, micro_batch_tokens=40)
    with pytest.raises(AssertionError, match="relative"):
        assert_matches_reference(trained, reference, flat_parameters(initial_model))


class _OutOfMemoryAbove(ReviewTrainer):
    """ReviewTrainer on a device that runs out of memory on more than ``limit`` reviews at once.

    Pieces come longest first, so with a budget of 64 tokens the first piece holds
    2 long reviews and fits, and a later one holds more short ones and does not:
    the window fails with gradients already accumulated.
    """

    limit = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.refused = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if len(inputs["labels"]) > self.limit:
            self.refused += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_out_of_memory_halves_the_budget_and_redoes_the_window(initial_model, tokenizer, tmp_path, monkeypatch, packed):
    dataset = review_dataset(tokenizer, 12)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6)
    written = []
    monkeypatch.setattr(trainer_module.EpochProgressBar, "write", lambda self, message: written.append(message))
    model = copy.deepcopy(initial_model)
    trainer = _OutOfMemoryAbove(
        model=model,
        args=sgd_args(tmp_path, 3, 2, micro_batch_tokens=64, padding_free=packed),
        train_dataset=dataset,
        data_collator=collator,
    )
    trainer.train()
    # Pieces of the first window ran before one ran out of memory: their gradients must not count twice.
    assert trainer.refused > 0
    assert trainer.micro_batch_tokens < 64
    assert_matches_reference(flat_parameters(model), reference, flat_parameters(initial_model))
    assert len(written) == 1 and "micro_batch_tokens lowered to" in written[0]


def test_out_of_memory_without_a_budget_is_raised(initial_model, tokenizer, tmp_path, monkeypatch):
    model = copy.deepcopy(initial_model)
    trainer = ReviewTrainer(
        model=model,
        args=sgd_args(tmp_path, 3, 2, padding_free=True),
        train_dataset=review_dataset(tokenizer, 6),
        data_collator=DataCollatorWithPadding(tokenizer),
    )

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(trainer, "compute_loss", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.train()
    # The per-review attention is taken off the model even when the run fails.
    assert model.config._attn_implementation == "sdpa"


def test_a_budget_below_one_is_refused_naming_the_field(tmp_path):
    with pytest.raises(FinetuneError, match=r"micro_batch_tokens must be >= 1 \(got 0\); try 4096"):
        sgd_args(tmp_path, 3, 2, micro_batch_tokens=0)
