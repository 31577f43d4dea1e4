"""Contract 1-3: every update equals one full-batch step on the window's samples.

The reference here is independent of the trainer: plain PyTorch that collates
each window's samples into one batch, takes its mean loss and subtracts the
gradient (SGD, lr=1).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from helpers import flat_parameters, review_dataset, sgd_args, sgd_step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer, TrainerCallback

from finetune import ReviewTrainer
from finetune.errors import FinetuneError

# The contract: parameters within 1e-6 of the reference, relative to the reference's norm.
TOLERANCE = 1e-6
# A second, stricter view: the error relative to how far the reference moved. Summing
# per-micro-batch gradients that partly cancel costs a few 1e-6 of float32 rounding here,
# while a wrongly scaled update is off by O(1).
UPDATE_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


def reference_full_batch_steps(
    model, dataset, collator, window_samples: int, epochs: int = 1, class_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """One explicit SGD(lr=1) step per window on the concatenation of its samples.

    With ``class_weights`` the window's loss is PyTorch's class-weighted cross-entropy over the whole window.
    """
    model = copy.deepcopy(model)
    model.train()
    parameters = list(model.parameters())
    for _ in range(epochs):
        for start in range(0, len(dataset), window_samples):
            rows = range(start, min(start + window_samples, len(dataset)))
            batch = collator([dataset[row] for row in rows])
            if class_weights is None:
                loss = model(**batch).loss
            else:
                labels = batch.pop("labels")
                loss = torch.nn.functional.cross_entropy(model(**batch).logits, labels, weight=class_weights)
            sgd_step(parameters, loss)
    return flat_parameters(model)


def trained_parameters(trainer_class, model, dataset, collator, output_dir, micro_batch, n, epochs=1, **overrides):
    model = copy.deepcopy(model)
    args = sgd_args(output_dir, micro_batch, n, epochs, **overrides)
    trainer_class(model=model, args=args, train_dataset=dataset, data_collator=collator).train()
    return flat_parameters(model)


def assert_matches_reference(trained: torch.Tensor, reference: torch.Tensor, initial: torch.Tensor) -> None:
    weight_error = float((trained - reference).norm() / reference.norm())
    update_error = float((trained - reference).norm() / (reference - initial).norm())
    print(f"relative error {weight_error:.3g}, relative to the update {update_error:.3g}")  # shown with -s
    assert weight_error < TOLERANCE, f"relative error {weight_error:.3g}"
    assert update_error < UPDATE_TOLERANCE, f"error relative to the update {update_error:.3g}"


@pytest.mark.parametrize(
    ("samples", "micro_batch", "n"),
    [(12, 3, 2), (10, 3, 2), (12, 3, 3), (10, 4, 4)],
    ids=["divisible", "short-last-micro-batch", "divisible-n3", "partial-window"],
)
def test_update_equals_full_batch_step(initial_model, tokenizer, tmp_path, samples, micro_batch, n):
    dataset = review_dataset(tokenizer, samples)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, micro_batch * n)
    trained = trained_parameters(ReviewTrainer, initial_model, dataset, collator, tmp_path, micro_batch, n)
    assert_matches_reference(trained, reference, flat_parameters(initial_model))


def test_stock_trainer_fails_the_same_check(initial_model, tokenizer, tmp_path):
    """The check has teeth: stock Trainer 5.23 makes 2x updates on the divisible case."""
    dataset = review_dataset(tokenizer, 12)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6)
    trained = trained_parameters(Trainer, initial_model, dataset, collator, tmp_path, 3, 2)
    with pytest.raises(AssertionError, match="relative error"):
        assert_matches_reference(trained, reference, flat_parameters(initial_model))


def test_exact_across_epochs(initial_model, tokenizer, tmp_path):
    """Nothing carries from one epoch's partial window into the next; gradients start at zero."""
    dataset = review_dataset(tokenizer, 11)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 9, epochs=3)
    trained = trained_parameters(ReviewTrainer, initial_model, dataset, collator, tmp_path, 3, 3, epochs=3)
    assert_matches_reference(trained, reference, flat_parameters(initial_model))


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    micro_batch=st.integers(min_value=1, max_value=6),
    n=st.integers(min_value=1, max_value=6),
    windows=st.integers(min_value=1, max_value=3),
    short_by=st.integers(min_value=0, max_value=35),
)
def test_exact_for_any_sizes(initial_model, tokenizer, tmp_path, micro_batch, n, windows, short_by):
    # At most 3 updates: SGD at lr=1 amplifies float32 rounding chaotically over many updates,
    # which would measure the optimizer's sensitivity, not the accumulation.
    window_samples = micro_batch * n
    samples = windows * window_samples - min(short_by, window_samples - 1)
    dataset = review_dataset(tokenizer, samples, seed=samples)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, window_samples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # n larger than the epoch warns; that is tested below
        trained = trained_parameters(ReviewTrainer, initial_model, dataset, collator, tmp_path, micro_batch, n)
    assert_matches_reference(trained, reference, flat_parameters(initial_model))


class _CountUpdates(TrainerCallback):
    def __init__(self):
        self.step_ends = 0
        self.epoch_begin_gradients_zero = []

    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        self.epoch_begin_gradients_zero.append(all(p.grad is None or not p.grad.any() for p in model.parameters()))

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends += 1


@pytest.mark.parametrize(("samples", "micro_batch", "n"), [(10, 3, 2), (10, 4, 4), (9, 3, 3), (7, 2, 1)])
def test_updates_per_epoch_is_ceil_of_micro_batches_over_n(initial_model, tokenizer, tmp_path, samples, micro_batch, n):
    dataset = review_dataset(tokenizer, samples)
    counter = _CountUpdates()
    trainer = ReviewTrainer(
        model=copy.deepcopy(initial_model),
        args=sgd_args(tmp_path, micro_batch, n, epochs=2, learning_rate=0.01),
        train_dataset=dataset,
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[counter],
    )
    result = trainer.train()
    expected = 2 * math.ceil(math.ceil(samples / micro_batch) / n)
    assert result.global_step == expected
    assert counter.step_ends == expected  # callbacks fire once per update
    assert counter.epoch_begin_gradients_zero == [True, True]


def test_n_larger_than_epoch_makes_one_update_and_warns(initial_model, tokenizer, tmp_path):
    dataset = review_dataset(tokenizer, 7)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 7, epochs=2)
    model = copy.deepcopy(initial_model)
    trainer = ReviewTrainer(
        model=model, args=sgd_args(tmp_path, 2, 10, epochs=2), train_dataset=dataset, data_collator=collator
    )
    with pytest.warns(UserWarning, match="more than the 4 micro-batches"):
        result = trainer.train()
    assert result.global_step == 2
    assert_matches_reference(flat_parameters(model), reference, flat_parameters(initial_model))


def by_hand_balanced_weights(labels: list[int], num_classes: int) -> torch.Tensor:
    """n_samples / (n_classes * n_in_class), written out here rather than taken from the code under test."""
    counts = [labels.count(class_id) for class_id in range(num_classes)]
    return torch.tensor([len(labels) / (num_classes * count) for count in counts])


def imbalanced_dataset(tokenizer, samples: int):
    dataset = review_dataset(tokenizer, samples, seed=3)
    # Mostly class 2, as in drugscom, so the weights are far from 1.
    labels = [0 if index % 7 == 0 else 1 if index % 5 == 0 else 2 for index in range(samples)]
    return dataset.remove_columns("labels").add_column("labels", labels)


@pytest.mark.parametrize(
    ("samples", "micro_batch", "n", "class_weighting", "container"),
    [
        (12, 3, 2, "balanced", "datasets"),
        (10, 3, 2, "balanced", "datasets"),
        (10, 4, 4, "balanced", "datasets"),
        (10, 3, 2, "sqrt", "datasets"),
        # A plain sized dataset (here a list of dicts), as a Trainer user may pass: labels read per example.
        (10, 3, 2, "balanced", "list"),
    ],
)
def test_class_weighted_update_equals_weighted_full_batch_step(
    initial_model, tokenizer, tmp_path, samples, micro_batch, n, class_weighting, container
):
    """Contract with class_weighting balanced or sqrt: each window equals one weighted full-batch step."""
    dataset = imbalanced_dataset(tokenizer, samples)
    train_set = dataset if container == "datasets" else [dict(row) for row in dataset]
    weights = by_hand_balanced_weights(dataset["labels"], 3)
    if class_weighting == "sqrt":
        weights = weights.sqrt()
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, micro_batch * n, class_weights=weights)
    unweighted = reference_full_batch_steps(initial_model, dataset, collator, micro_batch * n)
    assert float((reference - unweighted).norm() / (reference - flat_parameters(initial_model)).norm()) > 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trained = trained_parameters(
            ReviewTrainer, initial_model, train_set, collator, tmp_path, micro_batch, n, class_weighting=class_weighting
        )
    assert_matches_reference(trained, reference, flat_parameters(initial_model))


class _TorchStream(torch.utils.data.IterableDataset):
    def __len__(self):  # a length does not make a stream indexable
        return 3

    def __iter__(self):
        return iter([])


@pytest.mark.parametrize("streamed", ["torch", "datasets"])
def test_class_weighting_on_a_streamed_dataset_says_what_to_do(initial_model, tokenizer, tmp_path, streamed):
    # A datasets stream has a labels "column" too, but reading it would pull the whole stream first.
    dataset = _TorchStream() if streamed == "torch" else imbalanced_dataset(tokenizer, 10).to_iterable_dataset()
    args = sgd_args(tmp_path, 3, 2, max_steps=1, class_weighting="balanced")
    with pytest.raises(FinetuneError, match=r"is streamed .* pass class_weights=.* or set class_weighting: none"):
        ReviewTrainer(model=copy.deepcopy(initial_model), args=args, train_dataset=dataset)


def test_class_weighted_windows_must_be_normalised_by_summed_weights(initial_model, tokenizer, tmp_path, monkeypatch):
    """The check has teeth: sharing the window by sample counts instead of summed weights is caught."""
    dataset = imbalanced_dataset(tokenizer, 10)
    weights = by_hand_balanced_weights(dataset["labels"], 3)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6, class_weights=weights)
    monkeypatch.setattr(ReviewTrainer, "_loss_items", lambda self, inputs: float(len(inputs["labels"])))
    trained = trained_parameters(
        ReviewTrainer, initial_model, dataset, collator, tmp_path, 3, 2, class_weighting="balanced"
    )
    with pytest.raises(AssertionError, match="relative"):
        assert_matches_reference(trained, reference, flat_parameters(initial_model))
