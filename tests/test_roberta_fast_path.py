"""RoBERTa through the fast path's registry: its entry, and its first-token reading against stock RoBERTa.

The reference is transformers' own ``RobertaForSequenceClassification`` on a
padded batch, with its SDPA attention and the position ids its embeddings
make from the padded input ids: nothing of the fast path is in it. The checks
every family shares (packed rows, prediction, the accumulation contract) are
in test_fast_path_families.py.
"""

from __future__ import annotations

import copy

import torch
from helpers import padded_batch
from tiny_families import tiny_roberta
from transformers import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
)

from finetune.fast_path import readings
from finetune.fast_path.families import family_of
from finetune.fast_path.readings import position_offset, reading_for_scores

TOLERANCE = 1e-5


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
