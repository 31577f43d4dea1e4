"""Contract 10: every loss counts its own items, so token-level, multi-label and rating losses are exact too.

A causal LM's loss is a mean over its labelled next tokens and a token
classifier's over its labelled tokens, not over rows; a multi-label
classifier's binary cross-entropy is a mean over reviews of each review's
mean over its tags, a rating regressor's squared (or Huber) error a mean over
reviews, and an ordinal (CORN) model's loss a mean over the (review, output)
pairs each review trains. The reference here is
plain PyTorch, independent of the trainer: each window's samples collated
into one batch, the model's own loss on it (its mean over the window's
items), one SGD(lr=1) step. ReviewTrainer must match it at every split of a
window; weighting the micro-batches by their rows (the old rule) must not.

The second half runs offline versions of transformers' own
``test_ga_with_num_items_in_batch`` and ``test_ga_with_compute_loss_func``
(tests/trainer/test_trainer.py): one batch of 8 against 8 micro-batches of 1,
logged losses within 0.001 and the same gradient norms, for stock ``Trainer``
and for ``ReviewTrainer``.
"""

from __future__ import annotations

import copy
import functools
import random

import datasets
import pytest
import torch
from helpers import flat_parameters, quiet_args, sgd_args, sgd_step
from test_exactness import assert_matches_reference
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
)

from finetune import ReviewTrainer
from finetune.errors import FinetuneError
from finetune.training.accumulation import loss_items

VOCAB = 40
PAD = 0
IGNORED = -100


def causal_lm() -> LlamaForCausalLM:
    """A 2-layer Llama of hidden size 16, built from a config (nothing is downloaded)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(config)


def tiny_bert(model_class: type, **head: object) -> torch.nn.Module:
    """A 2-layer BERT of hidden size 16 without dropout, seeded, with ``head``'s settings (labels, problem type)."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **head,
    )
    return model_class(config)


def token_classifier() -> BertForTokenClassification:
    """A tiny BERT token classifier with 3 tags per token."""
    return tiny_bert(BertForTokenClassification, num_labels=3)


def tag_classifier() -> BertForSequenceClassification:
    """A tiny BERT classifier giving 3 tags per review (sigmoid, binary cross-entropy)."""
    return tiny_bert(BertForSequenceClassification, num_labels=3, problem_type="multi_label_classification")


def rating_regressor() -> BertForSequenceClassification:
    """A tiny BERT that predicts a star rating as one number (mean squared error)."""
    return tiny_bert(BertForSequenceClassification, num_labels=1, problem_type="regression")


def ordinal_rater() -> BertForSequenceClassification:
    """A tiny BERT ranking reviews among 5 levels with CORN: 4 outputs, each 'above level k'."""
    model = tiny_bert(BertForSequenceClassification, num_labels=4)
    model.config.finetune_task = "ordinal"  # what finetune's own loader writes (training/ordered_heads.py)
    return model


def corn_by_the_paper(logits: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """CORN's loss as coral_pytorch.losses.corn_loss writes it: a loop over the outputs, each on its subset.

    Output k trains on the reviews above level k - 1 with target "above level k"; the summed losses
    are divided by the number of (review, output) pairs that trained.
    """
    total, pairs = 0.0, 0
    for output in range(logits.shape[1]):
        subset = levels > output - 1
        targets = (levels[subset] > output).float()
        if len(targets) < 1:
            continue
        pairs += len(targets)
        chosen = logits[subset, output]
        logsigmoid = torch.nn.functional.logsigmoid(chosen)
        total = total - torch.sum(logsigmoid * targets + (logsigmoid - chosen) * (1 - targets))
    return total / pairs


def level_rows(count: int, seed: int) -> datasets.Dataset:
    """Reviews of 2 to 14 tokens, each at a level 0-4 (1-5 stars), the top level on a few."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": []}
    for _ in range(count):
        rows["input_ids"].append([rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 14))])
        rows["labels"].append(rng.choice([0, 0, 1, 2, 3, 3, 4]))
    return datasets.Dataset.from_dict(rows)


def rated_rows(count: int, seed: int) -> datasets.Dataset:
    """Reviews of 2 to 14 tokens, each with a star rating from 1.0 to 5.0."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": []}
    for _ in range(count):
        rows["input_ids"].append([rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 14))])
        rows["labels"].append(float(rng.randint(1, 5)))
    return datasets.Dataset.from_dict(rows)


def review_tag_rows(count: int, seed: int) -> datasets.Dataset:
    """Reviews of 2 to 14 tokens, each with 3 yes/no tags (0.0 or 1.0); one review has no tag, a valid row."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": []}
    for index in range(count):
        rows["input_ids"].append([rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 14))])
        tags = [float(rng.random() < 0.35) for _ in range(3)]
        rows["labels"].append([0.0, 0.0, 0.0] if index == 3 else tags)
    return datasets.Dataset.from_dict(rows)


def causal_rows(count: int, seed: int) -> datasets.Dataset:
    """Rows of 2 to 14 tokens whose first tokens (a prompt) are masked with -100; one row has no target at all."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": []}
    for index in range(count):
        length = rng.randint(2, 14)
        input_ids = [rng.randrange(1, VOCAB) for _ in range(length)]
        # Row 1 keeps only its first label, which the shift drops: it has no next token to predict.
        prompt = length - 1 if index == 1 else rng.randint(0, length - 1)
        rows["input_ids"].append(input_ids)
        rows["labels"].append([IGNORED] * prompt + input_ids[prompt:])
    return datasets.Dataset.from_dict(rows)


def tagged_rows(count: int, seed: int) -> datasets.Dataset:
    """Rows of 2 to 14 tokens, each token tagged 0-2 or left untagged (-100); one row has no tag at all."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": []}
    for index in range(count):
        length = rng.randint(2, 14)
        rows["input_ids"].append([rng.randrange(1, VOCAB) for _ in range(length)])
        tags = [rng.randrange(3) if rng.random() < 0.6 else IGNORED for _ in range(length)]
        rows["labels"].append([IGNORED] * length if index == 2 else tags)
    return datasets.Dataset.from_dict(rows)


def pad_rows(features: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad a list of rows to the longest: ids with PAD, labels with -100, and an attention mask."""
    width = max(len(feature["input_ids"]) for feature in features)

    def padded(values, fill):
        return torch.tensor([list(value) + [fill] * (width - len(value)) for value in values])

    input_ids = [feature["input_ids"] for feature in features]
    labels = [feature["labels"] for feature in features]
    # A rating or a level is one number and a review's tags one row of floats; token labels run along the
    # tokens, padded.
    per_review = not isinstance(labels[0], list) or isinstance(labels[0][0], float)
    return {
        "input_ids": padded(input_ids, PAD),
        "attention_mask": padded([[1] * len(ids) for ids in input_ids], 0),
        "labels": torch.tensor(labels) if per_review else padded(labels, IGNORED),
    }


FAMILIES = {
    "causal-lm": (causal_lm, causal_rows),
    "token-classifier": (token_classifier, tagged_rows),
    "multi-label": (tag_classifier, review_tag_rows),
    "rating-regression": (rating_regressor, rated_rows),
    "ordinal-corn": (ordinal_rater, level_rows),
}


def reference_steps(
    model, dataset, window_samples: int, pos_weight: torch.Tensor | None = None, loss_of=None
) -> torch.Tensor:
    """One SGD(lr=1) step per window on the model's own loss over the window's samples collated as one batch.

    With ``pos_weight`` the loss is PyTorch's binary cross-entropy with those per-tag weights on the window;
    an ordinal model's is CORN's by the paper's code; ``loss_of(logits, labels)`` gives any other.
    """
    if loss_of is None and getattr(model.config, "finetune_task", None) == "ordinal":
        loss_of = corn_by_the_paper
    if pos_weight is not None:
        loss_of = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    model = copy.deepcopy(model)
    model.train()
    parameters = list(model.parameters())
    for start in range(0, len(dataset), window_samples):
        batch = pad_rows([dataset[row] for row in range(start, min(start + window_samples, len(dataset)))])
        if loss_of is None:
            loss = model(**batch).loss
        else:
            labels = batch.pop("labels")
            loss = loss_of(model(**batch).logits, labels)
        sgd_step(parameters, loss)
    return flat_parameters(model)


def trained(trainer_class, model, dataset, output_dir, micro_batch, n, **overrides) -> torch.Tensor:
    model = copy.deepcopy(model)
    args = sgd_args(output_dir, micro_batch, n, **overrides)
    trainer_class(model=model, args=args, train_dataset=dataset, data_collator=pad_rows).train()
    return flat_parameters(model)


SPLITS = {
    # (samples, micro-batch, n, token budget)
    "by-count": (12, 3, 2, None),
    "short-last-micro-batch": (10, 3, 2, None),
    "partial-last-window": (14, 3, 3, None),
    "token-budget": (13, 4, 2, 30),
}


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILIES.keys())
@pytest.mark.parametrize(("samples", "micro_batch", "n", "budget"), SPLITS.values(), ids=SPLITS.keys())
def test_update_equals_full_batch_step_for_every_loss(tmp_path, family, samples, micro_batch, n, budget):
    make_model, make_rows = FAMILIES[family]
    model, dataset = make_model(), make_rows(samples, seed=samples)
    reference = reference_steps(model, dataset, micro_batch * n)
    ours = trained(ReviewTrainer, model, dataset, tmp_path, micro_batch, n, micro_batch_tokens=budget)
    assert_matches_reference(ours, reference, flat_parameters(model))


@pytest.mark.parametrize("budget", [24, 64], ids=["budget-24", "budget-64"])
def test_multi_label_packed_pieces_equal_full_batch_step(tmp_path, budget):
    """Packed rows (padding_free) read each review's tags as padded batches do: the same update."""
    model, dataset = tag_classifier(), review_tag_rows(13, seed=13)
    reference = reference_steps(model, dataset, 8)
    ours = trained(ReviewTrainer, model, dataset, tmp_path, 4, 2, micro_batch_tokens=budget, padding_free=True)
    assert_matches_reference(ours, reference, flat_parameters(model))


@pytest.mark.parametrize("family", ["rating-regression", "ordinal-corn"])
@pytest.mark.parametrize("budget", [24, 64], ids=["budget-24", "budget-64"])
def test_rating_packed_pieces_equal_full_batch_step(tmp_path, family, budget):
    """Packed rows (padding_free) read each review's rating or level as padded batches do: the same update."""
    make_model, make_rows = FAMILIES[family]
    model, dataset = make_model(), make_rows(13, seed=13)
    reference = reference_steps(model, dataset, 8)
    ours = trained(ReviewTrainer, model, dataset, tmp_path, 4, 2, micro_batch_tokens=budget, padding_free=True)
    assert_matches_reference(ours, reference, flat_parameters(model))


@pytest.mark.parametrize(("samples", "micro_batch", "n", "budget"), SPLITS.values(), ids=SPLITS.keys())
def test_huber_regression_update_equals_full_batch_step(tmp_path, samples, micro_batch, n, budget):
    """regression_loss: huber, against PyTorch's HuberLoss on each whole window (delta 1)."""
    model, dataset = rating_regressor(), rated_rows(samples, seed=samples)

    def huber(logits, labels):
        return torch.nn.HuberLoss(delta=1.0)(logits.squeeze(-1), labels)

    reference = reference_steps(model, dataset, micro_batch * n, loss_of=huber)
    ours = trained(
        ReviewTrainer, model, dataset, tmp_path, micro_batch, n, micro_batch_tokens=budget, regression_loss="huber"
    )
    assert_matches_reference(ours, reference, flat_parameters(model))


def test_the_check_has_teeth_ordinal_pieces_weighted_by_reviews_fail(tmp_path, monkeypatch):
    """Counting an ordinal piece by its reviews (not its CORN pairs) is caught: the pairs are what it averages."""
    model, dataset = ordinal_rater(), level_rows(12, seed=12)
    reference = reference_steps(model, dataset, 6)
    monkeypatch.setattr(ReviewTrainer, "_loss_items", lambda self, inputs: float(len(inputs["labels"])))
    ours = trained(ReviewTrainer, model, dataset, tmp_path, 3, 2)
    with pytest.raises(AssertionError, match="relative"):
        assert_matches_reference(ours, reference, flat_parameters(model))


def test_the_check_has_teeth_multi_label_pieces_weighted_alike_fail(tmp_path, monkeypatch):
    """Weighting each piece 1/pieces (not by its reviews) is caught on the multi-label loss too."""
    model, dataset = tag_classifier(), review_tag_rows(13, seed=13)
    reference = reference_steps(model, dataset, 8)
    monkeypatch.setattr(ReviewTrainer, "_loss_items", lambda self, inputs: 1.0)
    ours = trained(ReviewTrainer, model, dataset, tmp_path, 4, 2, micro_batch_tokens=24)
    with pytest.raises(AssertionError, match="relative"):
        assert_matches_reference(ours, reference, flat_parameters(model))


def by_hand_positive_weights(rows: list[list[float]]) -> torch.Tensor:
    """Each tag's negatives over its positives, counted here, independently of the package."""
    columns = list(zip(*rows))
    return torch.tensor([(len(column) - sum(column)) / sum(column) for column in columns])


@pytest.mark.parametrize(("micro_batch", "n", "budget"), [(3, 2, None), (3, 3, None), (4, 2, 30)])
def test_multi_label_class_weighting_is_per_tag_pos_weight_and_exact(tmp_path, micro_batch, n, budget):
    model, dataset = tag_classifier(), review_tag_rows(14, seed=7)
    pos_weight = by_hand_positive_weights(dataset["labels"])
    reference = reference_steps(model, dataset, micro_batch * n, pos_weight=pos_weight)
    ours = trained(
        ReviewTrainer, model, dataset, tmp_path, micro_batch, n, micro_batch_tokens=budget, class_weighting="balanced"
    )
    assert_matches_reference(ours, reference, flat_parameters(model))


def test_multi_label_weights_refuse_a_tag_on_no_review(tmp_path):
    dataset = review_tag_rows(6, seed=1).map(lambda row: {"labels": [row["labels"][0], row["labels"][1], 0.0]})
    with pytest.raises(FinetuneError, match=r"tag ids \[2\] are on none.*set class_weighting: none"):
        ReviewTrainer(
            model=tag_classifier(),
            args=sgd_args(tmp_path, 2, 1, class_weighting="balanced"),
            train_dataset=dataset,
            data_collator=pad_rows,
        )


@pytest.mark.parametrize("family", ["causal-lm", "token-classifier"])
def test_the_check_has_teeth_micro_batches_weighted_by_rows_fail(tmp_path, monkeypatch, family):
    """The old rule, a micro-batch weighted by its rows, is caught on a token-level loss."""
    make_model, make_rows = FAMILIES[family]
    model, dataset = make_model(), make_rows(12, seed=12)
    reference = reference_steps(model, dataset, 6)
    monkeypatch.setattr(ReviewTrainer, "_loss_items", lambda self, inputs: float(len(inputs["labels"])))
    ours = trained(ReviewTrainer, model, dataset, tmp_path, 3, 2)
    with pytest.raises(AssertionError, match="relative"):
        assert_matches_reference(ours, reference, flat_parameters(model))


def test_items_are_counted_as_each_loss_averages():
    labels = torch.tensor([[IGNORED, 5, 6, IGNORED], [7, 8, IGNORED, IGNORED]])
    assert loss_items({"labels": labels}) == 4  # label tokens
    assert loss_items({"labels": labels}, shifts_labels=True) == 3  # next tokens: position 0 is never a target
    shifted = torch.tensor([[5, IGNORED], [IGNORED, IGNORED]])
    assert loss_items({"labels": labels, "shift_labels": shifted}, shifts_labels=True) == 1  # a collator's own
    assert loss_items({"labels": torch.tensor([2, IGNORED, 0])}) == 2  # reviews, an unlabelled one not counted
    weights = torch.tensor([0.5, 1.0, 4.0])
    assert loss_items({"labels": torch.tensor([2, 0, IGNORED])}, class_weights=weights) == 4.5
    assert loss_items({"labels": torch.zeros(3, 5)}) == 3  # float labels (tags, ratings): one per review
    assert loss_items({"input_ids": torch.zeros(2, 7)}) == 2
    # CORN with 4 outputs: a review at level y trains min(y + 1, 4) of them; an ignored one none.
    levels = torch.tensor([0, 1, 4, 3, IGNORED])
    assert loss_items({"labels": levels}, ordinal_outputs=4) == 1 + 2 + 4 + 4


def test_padding_free_is_refused_for_a_token_level_loss(tmp_path):
    dataset = tagged_rows(4, seed=4)
    trainer = ReviewTrainer(
        model=token_classifier(),
        args=sgd_args(tmp_path, 2, 1, padding_free=True, micro_batch_tokens=40),
        train_dataset=dataset,
        data_collator=pad_rows,
    )
    with pytest.raises(FinetuneError, match="padding_free works with the sequence classifiers of BERT"):
        trainer.train()


# ---------------------------------------------------------------- transformers' own GA tests, offline


class LossAndGradNorm(TrainerCallback):
    """Records each logged training loss and gradient norm."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])
            self.grad_norms.append(logs["grad_norm"])


def causal_lm_loss(outputs, labels, vocab_size, num_items_in_batch=None, disable_num_items_in_batch=False):
    """transformers' test helper, as a user writes it: summed over next tokens, over the window's count if given."""
    logits = outputs["logits"].float()[..., :-1, :].reshape(-1, vocab_size)
    targets = labels[..., 1:].reshape(-1).to(logits.device)
    if num_items_in_batch is None or disable_num_items_in_batch:
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORED)
    summed = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORED, reduction="sum")
    return summed / num_items_in_batch


def ga_run(trainer_class, tmp_path, micro_batch: int, n: int, **trainer_kwargs) -> LossAndGradNorm:
    """3 AdamW updates of the tiny causal LM on 24 rows, logging every update (the test's settings)."""
    recorder = LossAndGradNorm()
    args = quiet_args(
        tmp_path / f"{trainer_class.__name__}-{micro_batch}x{n}",
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=n,
        max_steps=3,
        learning_rate=3e-4,
        logging_strategy="steps",
        logging_steps=1,
        train_sampling_strategy="sequential",
    )
    trainer = trainer_class(
        model=causal_lm(),
        args=args,
        train_dataset=causal_rows(24, seed=5),
        data_collator=pad_rows,
        callbacks=[recorder],
        **trainer_kwargs,
    )
    trainer.train()
    return recorder


def assert_same_run(accumulated: LossAndGradNorm, full_batch: LossAndGradNorm) -> None:
    # transformers' tolerance on the logged loss; the gradient norms must agree as closely.
    assert len(accumulated.losses) == len(full_batch.losses) == 3
    for ours, reference in zip(accumulated.losses, full_batch.losses):
        assert abs(ours - reference) < 0.001, (accumulated.losses, full_batch.losses)
    assert accumulated.grad_norms == pytest.approx(full_batch.grad_norms, rel=1e-4)


LOSS_FUNCTIONS = {
    "model-loss": {},
    "compute_loss_func": {"compute_loss_func": functools.partial(causal_lm_loss, vocab_size=VOCAB)},
}


@pytest.mark.parametrize("trainer_class", [Trainer, ReviewTrainer], ids=["stock", "ReviewTrainer"])
@pytest.mark.parametrize("loss", LOSS_FUNCTIONS, ids=LOSS_FUNCTIONS.keys())
def test_transformers_ga_tests_pass(tmp_path, trainer_class, loss):
    """``test_ga_with_num_items_in_batch`` (the model's loss) and ``test_ga_with_compute_loss_func``."""
    full_batch = ga_run(trainer_class, tmp_path, 8, 1, **LOSS_FUNCTIONS[loss])
    accumulated = ga_run(trainer_class, tmp_path, 1, 8, **LOSS_FUNCTIONS[loss])
    assert_same_run(accumulated, full_batch)


def test_transformers_ga_test_fails_on_weighting_by_rows(tmp_path, monkeypatch):
    """The negative control: the old rule (each micro-batch weighted by its rows) fails the same test."""
    full_batch = ga_run(ReviewTrainer, tmp_path, 8, 1)
    monkeypatch.setattr(ReviewTrainer, "_loss_items", lambda self, inputs: float(len(inputs["input_ids"])))
    accumulated = ga_run(ReviewTrainer, tmp_path, 1, 8)
    with pytest.raises(AssertionError):
        assert_same_run(accumulated, full_batch)


def test_compute_loss_func_without_the_count_is_weighted_by_its_items(tmp_path):
    """A ``compute_loss_func`` that does not take ``num_items_in_batch`` returns a mean, weighted by the loop."""

    def mean_only(outputs, labels):
        return causal_lm_loss(outputs, labels, VOCAB)

    full_batch = ga_run(ReviewTrainer, tmp_path, 8, 1, compute_loss_func=mean_only)
    accumulated = ga_run(ReviewTrainer, tmp_path, 1, 8, compute_loss_func=mean_only)
    assert_same_run(accumulated, full_batch)
