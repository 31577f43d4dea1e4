"""The last layer at first tokens only (finetune/fast_path/bert.py): the same logits and gradients.

The reference is the stock model's own forward on the same padded batch.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import (
    BertForSequenceClassification,
    BertModel,
    DataCollatorWithPadding,
    DistilBertConfig,
    DistilBertForSequenceClassification,
)

from finetune.evaluation.inference import predict_probabilities
from finetune.fast_path.bert import LastLayerAtFirstTokens
from finetune.fast_path.families import family_of
from finetune.training.modeling import resolve_model_path
from finetune.training.pooling import add_mean_pooling_layer

REVIEWS = [
    "Stopped working after a week and support never answered.",
    "great",
    "The battery lasts two days, the screen is sharp and it was cheap. Five stars from me!",
    "Returned it: cracked on arrival, and the refund took a month.",
]


def logits_and_gradients(model, batch, first_tokens: bool):
    model = copy.deepcopy(model).eval()
    installed = LastLayerAtFirstTokens(model) if first_tokens else None
    outputs = model(**batch)
    outputs.loss.backward()
    if installed is not None:
        installed.remove()
    assert not any("forward" in vars(module) for module in model.modules())
    return outputs.logits.detach(), torch.cat([parameter.grad.flatten() for parameter in model.parameters()])


@pytest.fixture(scope="module")
def minilm():
    torch.manual_seed(0)
    return BertForSequenceClassification.from_pretrained(resolve_model_path("all-minilm-l6-v2"), num_labels=3)


@pytest.mark.parametrize("which", ["tiny", "minilm"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_padded_batch_gives_the_same_logits_and_gradients(tiny_model_dir, minilm, tokenizer, which, pooling):
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir) if which == "tiny" else minilm
    model = copy.deepcopy(model)
    if pooling == "mean":
        add_mean_pooling_layer(model)
    features = [dict(tokenizer(text), labels=index % 3) for index, text in enumerate(REVIEWS)]
    batch = DataCollatorWithPadding(tokenizer)(features)
    assert int(batch["attention_mask"].sum()) < batch["input_ids"].numel()  # padding to mask out
    (logits, gradients), (cut_logits, cut_gradients) = (
        logits_and_gradients(model, batch, first_tokens) for first_tokens in (False, True)
    )
    assert float((cut_logits - logits).abs().max()) < 1e-5
    assert float((cut_gradients - gradients).abs().max()) < 1e-5
    assert float(gradients.abs().max()) > 1e-3


def test_the_check_has_teeth_ignoring_the_key_mask_changes_the_logits(minilm, tokenizer, monkeypatch):
    """With every key read as real, padding leaks into the first token and the test above would fail."""
    import finetune.fast_path.bert as first_tokens

    batch = DataCollatorWithPadding(tokenizer)([dict(tokenizer(text), labels=0) for text in REVIEWS])
    logits, _ = logits_and_gradients(minilm, batch, first_tokens=False)
    monkeypatch.setattr(first_tokens, "_key_mask", lambda mask, hidden: torch.ones(hidden.shape[:2], dtype=torch.bool))
    leaked, _ = logits_and_gradients(minilm, batch, first_tokens=True)
    assert float((leaked - logits).abs().max()) > 1e-3


def test_only_classifiers_whose_head_reads_the_first_token():
    assert family_of(BertForSequenceClassification(BertModel.config_class(num_hidden_layers=1))).name == "BERT"
    assert family_of(BertModel(BertModel.config_class(num_hidden_layers=1))) is None  # no head: stock
    assert not family_of(
        DistilBertForSequenceClassification(DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2))
    )


def test_prediction_equals_the_stock_forward(tiny_model_dir, tokenizer):
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    texts = REVIEWS * 5
    probabilities = predict_probabilities(model, tokenizer, texts, batch_size=4)
    # The reference runs where prediction left the model (a GPU when there is one), one padded batch.
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, return_tensors="pt").to(model.device)
        reference = torch.softmax(model(**batch).logits, -1).cpu().numpy()
    assert np.abs(probabilities - reference).max() < 1e-6
    assert not any("forward" in vars(module) for module in model.modules())


def test_review_trainer_evaluates_at_first_tokens_with_stock_s_loss(tiny_model_dir, tokenizer, tmp_path):
    from helpers import quiet_args, review_dataset
    from transformers import Trainer

    from finetune import ReviewTrainer

    dataset = review_dataset(tokenizer, 10)
    losses, shapes = {}, []
    for trainer_class in (Trainer, ReviewTrainer):
        model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
        hook = model.bert.encoder.layer[-1].intermediate.register_forward_hook(
            lambda module, args, output, name=trainer_class.__name__: shapes.append((name, tuple(args[0].shape[:2])))
        )
        trainer = trainer_class(
            model=model,
            args=quiet_args(tmp_path, per_device_eval_batch_size=4),
            eval_dataset=dataset,
            data_collator=DataCollatorWithPadding(tokenizer),
        )
        losses[trainer_class.__name__] = trainer.evaluate()["eval_loss"]
        hook.remove()
        assert not any("forward" in vars(module) for module in model.modules())
    assert losses["ReviewTrainer"] == pytest.approx(losses["Trainer"], rel=1e-6)
    # Stock runs the last layer's feed-forward at every token; ReviewTrainer at each review's first only.
    assert all(length > 1 for name, (_, length) in shapes if name == "Trainer")
    assert [shape for name, shape in shapes if name == "ReviewTrainer"] == [(4, 1), (4, 1), (2, 1)]


def test_evaluation_inside_a_run_leaves_the_run_s_reading_in_charge(tiny_model_dir, tokenizer):
    """In a packed run the run's last layer already reads first tokens; in a padded run evaluation adds its own."""
    from finetune.fast_path.readings import reading_for_scores, reading_for_training

    model = BertForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    batch = DataCollatorWithPadding(tokenizer)([dict(tokenizer(text)) for text in REVIEWS])
    with torch.no_grad():
        stock = model(**batch).logits
    layer = model.bert.encoder.layer[-1]
    for packed in (True, False):
        with reading_for_training(model, packed=packed):
            run_forward = vars(layer).get("forward")
            assert (run_forward is not None) == packed
            with reading_for_scores(model), torch.no_grad():
                scoring_forward = vars(layer)["forward"]
                scored = model(**batch).logits
            assert (scoring_forward is run_forward) == packed
            assert vars(layer).get("forward") is run_forward, "the pass leaves the run's reading as it found it"
        assert not any("forward" in vars(module) for module in model.modules())
        assert float((scored - stock).abs().max()) < 1e-5
