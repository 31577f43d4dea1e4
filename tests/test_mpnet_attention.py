"""MPNet's attention through SDPA computes what transformers' eager MPNet computes.

The checks every family shares (packed rows, prediction, the accumulation
contract by count, token budget and packed) are in test_fast_path_families.py.

The reference is transformers' own MPNet (eager attention, the relative-position
bias added to materialised scores), never the fused code under test.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import flat_parameters, padded_batch, reference_sgd_steps, review_dataset, sgd_args
from tiny_families import tiny_mpnet
from transformers import DataCollatorWithPadding

import finetune.fast_path.mpnet as mpnet_attention
from finetune import ReviewTrainer
from finetune.evaluation.inference import _logits
from finetune.fast_path import readings
from finetune.fast_path.mpnet import FusedMPNetAttention
from finetune.fast_path.packed_attention import PackedReading
from finetune.fast_path.review_attention import biased_attention_with_dropout

TOLERANCE = 1e-5


def logits_and_gradients(model, batch, fused: bool):
    model = copy.deepcopy(model).train()
    installed = FusedMPNetAttention(model) if fused else None
    output = model(**batch)
    output.loss.backward()
    if installed is not None:
        installed.remove()
    return output.logits.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


def test_fused_logits_and_gradients_equal_the_eager_model(tokenizer):
    model = tiny_mpnet(tokenizer)
    batch = padded_batch(tokenizer)
    assert bool((batch["attention_mask"] == 0).any()), "the batch must have padding to test the mask"
    eager_logits, eager_gradients = logits_and_gradients(model, batch, fused=False)
    fused_logits, fused_gradients = logits_and_gradients(model, batch, fused=True)
    assert torch.allclose(fused_logits, eager_logits, atol=TOLERANCE)
    bias_gradient = eager_gradients["mpnet.encoder.relative_attention_bias.weight"]
    assert bias_gradient.abs().max() > 1e-3, "the bias must learn in the reference for the check to mean anything"
    for name, gradient in eager_gradients.items():
        assert torch.allclose(fused_gradients[name], gradient, atol=TOLERANCE), name


def test_through_the_classifier_the_last_layer_computes_first_tokens_only(tokenizer, monkeypatch):
    """The head's forward takes the first-token path (same logits, tested above); the encoder called alone does not."""
    calls = []
    first_tokens = mpnet_attention._last_layer_at_first_tokens
    monkeypatch.setattr(mpnet_attention, "_last_layer_at_first_tokens", lambda *a: calls.append(1) or first_tokens(*a))
    model = tiny_mpnet(tokenizer).eval()
    batch = padded_batch(tokenizer)
    with torch.no_grad():
        expected = model.mpnet(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state
        installed = FusedMPNetAttention(model)
        model(**batch)
        assert calls == [1]
        # Called directly, the encoder's every token comes out, as the eager model's.
        hidden = model.mpnet(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state
        installed.remove()
    assert calls == [1]
    assert hidden.shape == expected.shape
    assert torch.allclose(hidden, expected, atol=TOLERANCE)


def test_the_check_has_teeth_without_the_bias(tokenizer, monkeypatch):
    """Dropping the relative-position bias (passing only the padding mask) is caught by the same comparison."""
    model = tiny_mpnet(tokenizer)
    batch = padded_batch(tokenizer)
    eager_logits, _ = logits_and_gradients(model, batch, fused=False)
    monkeypatch.setattr(
        mpnet_attention, "_bias_and_padding_mask", lambda encoder, hidden, mask: mask.expand(-1, 4, -1, -1)
    )
    fused_logits, _ = logits_and_gradients(model, batch, fused=True)
    assert not torch.allclose(fused_logits, eager_logits, atol=TOLERANCE)


def test_bf16_autocast_stays_close_to_fp32(tokenizer):
    model = tiny_mpnet(tokenizer).eval()
    batch = padded_batch(tokenizer)
    with torch.no_grad():
        reference = model(**batch).logits
        installed = FusedMPNetAttention(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fused = model(**batch).logits.float()
        installed.remove()
    assert torch.isfinite(fused).all()
    assert torch.allclose(fused, reference, atol=0.05), (fused - reference).abs().max()


def test_removed_it_leaves_a_stock_model_with_the_same_weights(tokenizer):
    model = tiny_mpnet(tokenizer)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with readings.reading_for_training(model, packed=False):
        installed_forward = vars(model.mpnet.encoder)["forward"]
        with readings.reading_for_scores(model):  # a validation pass inside a training run
            assert vars(model.mpnet.encoder)["forward"] is installed_forward, "the run's reading stays in charge"
        assert vars(model.mpnet.encoder)["forward"] is installed_forward, "the pass must leave the run's reading"
    assert not any("forward" in vars(module) for module in model.modules())
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in weights.items())
    # Attention weights come from the eager path, as before.
    output = model(**padded_batch(tokenizer), output_attentions=True)
    assert len(output.attentions) == 2


def test_attention_weights_asked_for_while_fused_come_from_the_eager_path(tokenizer):
    model = tiny_mpnet(tokenizer).eval()
    batch = padded_batch(tokenizer)
    expected = model(**batch, output_attentions=True)
    installed = FusedMPNetAttention(model)
    output = model(**batch, output_attentions=True)
    installed.remove()
    assert torch.allclose(output.logits, expected.logits, atol=TOLERANCE)
    assert all(torch.allclose(a, b) for a, b in zip(output.attentions, expected.attentions, strict=True))


def test_other_models_are_left_alone(tiny_model_dir):
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    assert not FusedMPNetAttention(model).installed
    assert not any("forward" in vars(module) for module in model.modules())


def test_biased_attention_with_dropout_is_unbiased():
    """Averaged over draws, the CPU dropout path equals SDPA without dropout, the bias included."""
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 2, 6, 4) for _ in range(3))
    bias = torch.randn(1, 2, 6, 6)
    exact = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=0.5)
    draws = torch.stack([biased_attention_with_dropout(query, key, value, bias, 0.3, 0.5) for _ in range(4000)])
    spread = draws.std(dim=0) / 4000**0.5
    assert bool(((draws.mean(dim=0) - exact).abs() < 6 * spread + 1e-6).all())
    unbiased = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=0.5)
    assert not bool(((draws.mean(dim=0) - unbiased).abs() < 6 * spread + 1e-6).all())


@pytest.mark.parametrize("fused_attention", [True, False])
def test_review_trainer_on_mpnet_equals_full_batch_steps(tokenizer, tmp_path, monkeypatch, fused_attention):
    """ReviewTrainer trains MPNet through the fused path (validation too) and keeps the accumulation contract."""
    calls = []
    eager_forward = mpnet_attention.fused_mpnet_self_attention
    monkeypatch.setattr(
        mpnet_attention, "fused_mpnet_self_attention", lambda *a, **k: calls.append(1) or eager_forward(*a, **k)
    )
    model = tiny_mpnet(tokenizer)
    dataset = review_dataset(tokenizer, 10)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_sgd_steps(model, dataset, collator, window_samples=6)
    trained = copy.deepcopy(model)
    args = sgd_args(tmp_path, 3, 2, fused_attention=fused_attention)
    trainer = ReviewTrainer(model=trained, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    assert torch.allclose(flat_parameters(trained), reference, atol=TOLERANCE)
    assert (len(calls) > 0) == fused_attention
    calls.clear()
    trainer.evaluate(dataset)
    assert (len(calls) > 0) == fused_attention
    assert not any("forward" in vars(module) for module in trained.modules()), "removed after the run"


def test_prediction_goes_through_the_fused_attention(tokenizer, monkeypatch):
    """What prediction computes is checked against the eager model in test_fast_path_families.py; here, how."""
    calls = []
    eager_forward = mpnet_attention.fused_mpnet_self_attention
    monkeypatch.setattr(
        mpnet_attention, "fused_mpnet_self_attention", lambda *a, **k: calls.append(1) or eager_forward(*a, **k)
    )
    model = tiny_mpnet(tokenizer).eval()
    rows = {"input_ids": [[101, 2204, 102], [101, 2919, 2204, 102]], "attention_mask": [[1, 1, 1], [1, 1, 1, 1]]}
    _logits(model, tokenizer, rows, batch_size=4)
    assert calls, "prediction must go through the fused attention"
    assert not any("forward" in vars(module) for module in model.modules())


# ---------------------------------------------------------------- packed rows (padding_free)
# Packed rows against the eager padded batch and the contract when packed: test_fast_path_families.py.


def test_positions_start_after_mpnet_s_own_padding_id(tokenizer):
    """MPNet's embeddings count positions from padding id 1 (set in transformers), whatever the tokenizer pads with."""
    assert tokenizer.pad_token_id == 0
    assert readings.position_offset(tiny_mpnet(tokenizer)) == 2


def test_packed_reading_removed_leaves_no_hook_nor_forward(tokenizer):
    model = tiny_mpnet(tokenizer)
    reading = PackedReading(model)
    assert model._forward_pre_hooks, "the packed layout is read by a pre-hook while installed"
    reading.remove()
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not any("forward" in vars(module) for module in model.modules())
