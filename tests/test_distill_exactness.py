"""The accumulation contract for the distillation loss: every update equals one full-batch step.

The reference is written here from the formula, independently of
``distillation_losses``: per review, alpha * T^2 * sum_c p_t(c) * (log p_t(c) - log p_s(c))
at temperature T, plus (1 - alpha) * w[y] * -log softmax(z)[y] for labelled reviews;
the window's loss is the mean over all its reviews, and SGD(lr=1) subtracts its gradient.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from helpers import flat_parameters, review_dataset, sgd_args, sgd_step
from test_exactness import assert_matches_reference
from transformers import BertForSequenceClassification, DataCollatorWithPadding

from finetune.training.distillation import NO_LABEL, TEACHER_COLUMN, DistillationTrainer, distillation_losses


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


def distillation_dataset(tokenizer, samples: int, unlabelled_every: int = 0, seed: int = 0):
    """Pseudo-reviews with random teacher log-probabilities; every ``unlabelled_every``-th has no label."""
    dataset = review_dataset(tokenizer, samples, seed=seed)
    rng = random.Random(seed + 1)
    teacher = [torch.log_softmax(torch.tensor([rng.gauss(0, 2) for _ in range(3)]), -1).tolist() for _ in dataset]
    labels = [
        NO_LABEL if unlabelled_every and index % unlabelled_every == 0 else label
        for index, label in enumerate(dataset["labels"])
    ]
    return dataset.remove_columns("labels").add_column("labels", labels).add_column(TEACHER_COLUMN, teacher)


def reference_loss(logits, teacher_log_probs, labels, alpha, temperature, class_weights=None):
    """The window's mean loss, written out term by term."""
    total = torch.zeros(())
    for row in range(logits.shape[0]):
        student = logits[row] / temperature
        student_log = student - torch.logsumexp(student, 0)
        teacher = teacher_log_probs[row] / temperature
        teacher_log = teacher - torch.logsumexp(teacher, 0)
        soft = (teacher_log.exp() * (teacher_log - student_log)).sum() * temperature * temperature
        hard = torch.zeros(())
        label = int(labels[row])
        if label != NO_LABEL:
            weight = 1.0 if class_weights is None else float(class_weights[label])
            hard = -(logits[row] - torch.logsumexp(logits[row], 0))[label] * weight
        total = total + alpha * soft + (1 - alpha) * hard
    return total / logits.shape[0]


def reference_steps(model, dataset, collator, window_samples, alpha, temperature, class_weights=None):
    model = copy.deepcopy(model)
    model.train()
    parameters = list(model.parameters())
    for start in range(0, len(dataset), window_samples):
        batch = collator([dataset[row] for row in range(start, min(start + window_samples, len(dataset)))])
        teacher = batch.pop(TEACHER_COLUMN)
        labels = batch.pop("labels")
        loss = reference_loss(model(**batch).logits, teacher, labels, alpha, temperature, class_weights)
        sgd_step(parameters, loss)
    return flat_parameters(model)


@pytest.mark.parametrize(
    ("samples", "micro_batch", "n", "unlabelled_every"),
    [(12, 3, 2, 0), (10, 3, 2, 3), (10, 4, 4, 4)],
    ids=["divisible", "short-last-micro-batch-unlabelled", "partial-window-unlabelled"],
)
def test_distillation_update_equals_full_batch_step(
    initial_model, tokenizer, tmp_path, samples, micro_batch, n, unlabelled_every
):
    dataset = distillation_dataset(tokenizer, samples, unlabelled_every)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_steps(initial_model, dataset, collator, micro_batch * n, alpha=0.7, temperature=3.0)
    model = copy.deepcopy(initial_model)
    trainer = DistillationTrainer(
        model=model,
        args=sgd_args(tmp_path, micro_batch, n),
        train_dataset=dataset,
        data_collator=collator,
        distill_alpha=0.7,
        distill_temperature=3.0,
    )
    trainer.train()
    assert_matches_reference(flat_parameters(model), reference, flat_parameters(initial_model))


def test_distillation_exact_with_class_weights(initial_model, tokenizer, tmp_path):
    """Class weights weigh the hard term; the window's loss is still a plain mean over its reviews."""
    dataset = distillation_dataset(tokenizer, 10, unlabelled_every=4, seed=3)
    collator = DataCollatorWithPadding(tokenizer)
    weights = torch.tensor([0.5, 2.0, 1.25])
    reference = reference_steps(initial_model, dataset, collator, 6, 0.4, 2.0, weights)
    model = copy.deepcopy(initial_model)
    DistillationTrainer(
        model=model,
        args=sgd_args(tmp_path, 3, 2),
        train_dataset=dataset,
        data_collator=collator,
        class_weights=weights.tolist(),
        distill_alpha=0.4,
        distill_temperature=2.0,
    ).train()
    assert_matches_reference(flat_parameters(model), reference, flat_parameters(initial_model))


def test_alpha_zero_is_cross_entropy_and_alpha_one_ignores_labels():
    torch.manual_seed(0)
    logits, teacher = torch.randn(5, 3), torch.log_softmax(torch.randn(5, 3), -1)
    labels = torch.tensor([0, 2, 1, 1, 0])
    hard = distillation_losses(logits, teacher, labels, alpha=0.0, temperature=2.0)
    assert torch.allclose(hard, torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
    soft = distillation_losses(logits, teacher, labels, alpha=1.0, temperature=2.0)
    assert torch.allclose(soft, distillation_losses(logits, teacher, torch.full((5,), NO_LABEL), 1.0, 2.0))
    # A student that already matches the teacher has nothing left to learn from it.
    assert torch.allclose(distillation_losses(teacher * 1.0, teacher, labels, 1.0, 2.0), torch.zeros(5), atol=1e-6)
