"""The fast path's readings of every registered family besides BERT compute what the stock model computes.

The reference is transformers' own model of the family on a padded batch (its
SDPA or eager attention, the position ids its embeddings make from the padded
input ids): nothing of the fast path is in it. The same checks for each family
(tests/tiny_families.py); what only one family has (MPNet's fused attention,
RoBERTa's registry entry) is tested in its own module. BERT's are in
test_first_tokens.py and test_packed_attention.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import flat_parameters, padded_batch, reference_sgd_steps, review_dataset, sgd_args
from tiny_families import FAMILIES
from transformers import DataCollatorWithPadding

from finetune import ReviewTrainer
from finetune.evaluation.inference import _logits
from finetune.fast_path.packed_attention import PackedReading
from finetune.fast_path.readings import position_offset
from finetune.training.micro_batches import pack

TOLERANCE = 1e-5
FAMILY_NAMES = sorted(FAMILIES)


def stock_logits_and_gradients(model, batch):
    """The family's own model on a padded batch: its logits and every parameter's gradient."""
    model = copy.deepcopy(model).train()
    output = model(**batch)
    output.loss.backward()
    return output.logits.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


def packed_logits_and_gradients(model, batch, offset: int, max_group_scores: int | None = None):
    """The packed reading on the same reviews packed into one row (``max_group_scores`` 1: a review a group)."""
    model = copy.deepcopy(model).train()
    reading = PackedReading(model)
    output = model(**pack(batch, position_offset=offset, max_group_scores=max_group_scores))
    output.loss.backward()
    reading.remove()
    assert not model._forward_pre_hooks and not any("forward" in vars(module) for module in model.modules())
    return output.logits.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


@pytest.mark.parametrize("max_group_scores", [None, 1], ids=["groups-as-packed", "a-review-a-group"])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_packed_rows_equal_the_stock_padded_batch(tokenizer, family, max_group_scores):
    model = FAMILIES[family].build(tokenizer)
    batch = padded_batch(tokenizer)
    logits, gradients = stock_logits_and_gradients(model, batch)
    packed_logits, packed_gradients = packed_logits_and_gradients(
        model, batch, position_offset(model), max_group_scores
    )
    assert packed_logits.shape == logits.shape
    assert float((packed_logits - logits).abs().max()) < TOLERANCE
    assert float(gradients[FAMILIES[family].position_parameter].abs().max()) > 1e-3, "positions must learn"
    for name, gradient in gradients.items():
        assert float((packed_gradients[name] - gradient).abs().max()) < TOLERANCE, name


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_check_has_teeth_packed_rows_with_bert_s_positions_differ(tokenizer, family):
    """Positions counted from 0, as BERT's are, move the logits: the comparison above sees positions."""
    model = FAMILIES[family].build(tokenizer)
    batch = padded_batch(tokenizer)
    logits, _ = stock_logits_and_gradients(model, batch)
    wrong, _ = packed_logits_and_gradients(model, batch, offset=0)
    assert float((wrong - logits).abs().max()) > 1e-3


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_prediction_equals_the_stock_forward(tokenizer, family):
    model = FAMILIES[family].build(tokenizer, dropout=0.3).eval()  # dropout must be off when predicting
    batch = padded_batch(tokenizer, samples=9)
    rows = {
        name: [ids[mask.bool()].tolist() for ids, mask in zip(batch[name], batch["attention_mask"], strict=True)]
        for name in ("input_ids", "attention_mask")
    }
    with torch.no_grad():  # before prediction, which moves the model to a GPU where there is one
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    predicted = _logits(model, tokenizer, rows, batch_size=4)  # through the family's scoring reading
    assert torch.allclose(torch.from_numpy(predicted), expected.cpu(), atol=TOLERANCE)
    assert not any("forward" in vars(module) for module in model.modules()), "removed after prediction"


@pytest.mark.parametrize(
    ("padding_free", "token_budget"),
    [(False, None), (False, 40), (True, 40), (True, 100_000)],
    ids=["by-count", "token-budget", "packed-budget-40", "packed-one-row"],
)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_review_trainer_keeps_the_contract(tokenizer, tmp_path, family, padding_free, token_budget):
    """Every update equals one full-batch step of the stock model on its window (10 reviews, windows of 6)."""
    model = FAMILIES[family].build(tokenizer)
    dataset = review_dataset(tokenizer, 10)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_sgd_steps(model, dataset, collator, window_samples=6)
    trained = copy.deepcopy(model)
    args = sgd_args(tmp_path, 3, 2, padding_free=padding_free, micro_batch_tokens=token_budget)
    trainer = ReviewTrainer(model=trained, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    assert torch.allclose(flat_parameters(trained), reference, atol=TOLERANCE)
    trainer.evaluate(dataset)  # through the scoring reading, inside the run
    assert not trained._forward_pre_hooks
    assert not any("forward" in vars(module) for module in trained.modules()), "removed after the run"
