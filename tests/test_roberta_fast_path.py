"""RoBERTa through the fast path's registry: its first-token and packed readings compute what stock RoBERTa does.

The reference is transformers' own ``RobertaForSequenceClassification`` on a
padded batch, with its SDPA attention and the position ids its embeddings
make from the padded input ids: nothing of the fast path is in it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import flat_parameters, padded_batch, reference_sgd_steps, review_dataset, sgd_args
from transformers import (
    DataCollatorWithPadding,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from finetune import ReviewTrainer
from finetune.evaluation.inference import _logits
from finetune.fast_path import readings
from finetune.fast_path.families import family_of
from finetune.fast_path.packed_attention import PackedReading
from finetune.fast_path.readings import position_offset, reading_for_scores
from finetune.training.micro_batches import pack

TOLERANCE = 1e-5


def tiny_roberta(tokenizer) -> RobertaForSequenceClassification:
    """A 2-layer RoBERTa classifier (hidden 32, 3 labels, no dropout) over the packaged WordPiece vocabulary."""
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=160,
        type_vocab_size=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id,  # RoBERTa counts positions from its padding id + 1
        num_labels=3,
        initializer_range=0.2,  # weights large enough that every gradient is well above rounding
    )
    return RobertaForSequenceClassification(config).train()


def stock_logits_and_gradients(model, batch):
    """Transformers' RoBERTa on a padded batch: its logits and every parameter's gradient."""
    model = copy.deepcopy(model)
    output = model(**batch)
    output.loss.backward()
    return output.logits.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


def assert_same(reference, ours):
    (logits, gradients), (our_logits, our_gradients) = reference, ours
    assert our_logits.shape == logits.shape
    assert float((our_logits - logits).abs().max()) < TOLERANCE
    assert max(float(gradient.abs().max()) for gradient in gradients.values()) > 1e-3  # a real gradient
    for name, gradient in gradients.items():
        assert float((our_gradients[name] - gradient).abs().max()) < TOLERANCE, name


def test_the_registry_reads_roberta_as_bert_with_positions_after_padding(tokenizer):
    model = tiny_roberta(tokenizer)
    assert family_of(model).name == "RoBERTa"
    assert position_offset(model) == tokenizer.pad_token_id + 1


def test_first_token_reading_equals_the_stock_model(tokenizer):
    model = tiny_roberta(tokenizer)
    batch = padded_batch(tokenizer)
    cut = copy.deepcopy(model)
    shapes = []
    cut.roberta.encoder.layer[-1].register_forward_hook(lambda module, args, output: shapes.append(output.shape))
    with reading_for_scores(cut):
        output = cut(**batch)
        output.loss.backward()
    assert shapes == [(len(batch["input_ids"]), 1, 32)], "the last layer computed first tokens only"
    ours = output.logits.detach(), {name: parameter.grad for name, parameter in cut.named_parameters()}
    assert_same(stock_logits_and_gradients(model, batch), ours)
    assert not any("forward" in vars(module) for module in cut.modules()), "removed after the block"


def test_prediction_equals_the_stock_forward(tokenizer):
    model = tiny_roberta(tokenizer).eval()
    batch = padded_batch(tokenizer, samples=9)
    rows = {
        name: [ids[mask.bool()].tolist() for ids, mask in zip(batch[name], batch["attention_mask"], strict=True)]
        for name in ("input_ids", "attention_mask")
    }
    with torch.no_grad():  # before prediction, which moves the model to a GPU where there is one
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    shapes = []
    model.roberta.encoder.layer[-1].register_forward_hook(lambda module, args, output: shapes.append(output.shape))
    predicted = _logits(model, tokenizer, rows, batch_size=4)
    assert shapes and all(shape[1] == 1 for shape in shapes), "prediction must read first tokens only"
    assert torch.allclose(torch.from_numpy(predicted), expected.cpu(), atol=TOLERANCE)


@pytest.mark.parametrize("max_group_scores", [None, 1], ids=["groups-as-packed", "a-review-a-group"])
def test_packed_rows_equal_the_stock_padded_batch(tokenizer, max_group_scores):
    model = tiny_roberta(tokenizer)
    batch = padded_batch(tokenizer)
    packed_model = copy.deepcopy(model)
    reading = PackedReading(packed_model)
    output = packed_model(**pack(batch, position_offset=position_offset(model), max_group_scores=max_group_scores))
    output.loss.backward()
    reading.remove()
    ours = output.logits.detach(), {name: parameter.grad for name, parameter in packed_model.named_parameters()}
    assert_same(stock_logits_and_gradients(model, batch), ours)
    assert packed_model.config._attn_implementation == "sdpa", "the model's own attention back after the run"


def test_the_check_has_teeth_packed_rows_with_bert_s_positions_differ(tokenizer):
    """Positions counted from 0, as BERT's are, move the logits: the comparison above sees positions."""
    model = tiny_roberta(tokenizer).eval()
    batch = padded_batch(tokenizer)
    with torch.no_grad():
        stock = model(**batch).logits
        reading = PackedReading(model)
        wrong = model(**pack(batch, position_offset=0)).logits
        reading.remove()
    assert float((wrong - stock).abs().max()) > 1e-3


@pytest.mark.parametrize(
    ("padding_free", "token_budget"),
    [(False, None), (False, 40), (True, 40), (True, 100_000)],
    ids=["by-count", "token-budget", "packed-budget-40", "packed-one-row"],
)
def test_review_trainer_keeps_the_contract_on_roberta(tokenizer, tmp_path, padding_free, token_budget):
    """Every update equals one full-batch step on its window (10 reviews, windows of 6: a partial last one)."""
    model = tiny_roberta(tokenizer)
    dataset = review_dataset(tokenizer, 10)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_sgd_steps(model, dataset, collator, window_samples=6)
    trained = copy.deepcopy(model)
    args = sgd_args(tmp_path, 3, 2, padding_free=padding_free, micro_batch_tokens=token_budget)
    trainer = ReviewTrainer(model=trained, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    assert torch.allclose(flat_parameters(trained), reference, atol=TOLERANCE)
    trainer.evaluate(dataset)  # through the scoring reading, inside the run
    assert not any("forward" in vars(module) for module in trained.modules()), "removed after the run"


def test_a_family_not_known_runs_stock_and_is_said_once(tokenizer, capsys, monkeypatch):
    monkeypatch.setattr(readings, "_SAID_STOCK", set())  # another test's model may have been said already
    model = DistilBertForSequenceClassification(
        DistilBertConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=37, num_labels=3)
    ).eval()
    batch = padded_batch(tokenizer)
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        stock = model(**batch).logits
        for _ in range(2):
            with reading_for_scores(model):
                assert torch.equal(model(**batch).logits, stock)
    notes = [line for line in capsys.readouterr().err.splitlines() if "DistilBertForSequenceClassification" in line]
    assert len(notes) == 1 and "read by transformers' own code" in notes[0]
    assert "RoBERTa (roberta)" in notes[0]
