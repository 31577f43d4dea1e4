"""Packed rows read as padded batches (finetune/fast_path/packed_attention.py): logits and gradients within 1e-5.

The reference is the stock model on a padded batch of the same reviews, with
transformers' own SDPA attention and pooler: nothing of the packing is in it.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import (
    BertForSequenceClassification,
    DataCollatorWithPadding,
    DistilBertConfig,
    DistilBertForSequenceClassification,
)

from finetune.errors import FinetuneError
from finetune.fast_path.bert import PACKED_ATTENTION
from finetune.fast_path.packed_attention import CPU_ATTENTION_GROUP_BYTES, PackedReading, attention_group_limit
from finetune.fast_path.review_attention import attention
from finetune.training.micro_batches import pack
from finetune.training.modeling import resolve_model_path
from finetune.training.pooling import add_mean_pooling_layer

TOLERANCE = 1e-5
REVIEWS = [
    "Stopped working after a week and support never answered.",
    "great",
    "The battery lasts two days, the screen is sharp and it was cheap. Five stars from me!",
    "ok I guess",
    "Returned it: cracked on arrival, and the refund took a month.",
]


def padded_and_packed(model, tokenizer, reviews=REVIEWS, max_group_scores=None):
    """Logits and parameter gradients of ``model`` on a padded batch and on the same reviews packed.

    Padded on the right, as BERT reads them: its position ids count from the row's start.
    ``max_group_scores`` caps the packed row's attention groups, as on a CPU.
    """
    features = [dict(tokenizer(text), labels=index % 3) for index, text in enumerate(reviews)]
    batch = DataCollatorWithPadding(tokenizer)(features)
    results = []
    for packed in (False, True):
        copied = copy.deepcopy(model)
        copied.eval()  # dropout off: the two must compute the same function
        reading = PackedReading(copied) if packed else None
        outputs = copied(**(pack(batch, max_group_scores=max_group_scores) if packed else batch))
        outputs.loss.backward()
        if reading is not None:
            reading.remove()
        gradients = torch.cat([parameter.grad.flatten() for parameter in copied.parameters()])
        results.append((outputs.logits.detach(), gradients))
    return results


def assert_same(padded, packed):
    (logits, gradients), (packed_logits, packed_gradients) = padded, packed
    assert packed_logits.shape == logits.shape
    assert float((packed_logits - logits).abs().max()) < TOLERANCE
    assert float((packed_gradients - gradients).abs().max()) < TOLERANCE
    assert float(gradients.abs().max()) > 1e-3  # a real gradient was compared


@pytest.fixture(scope="module")
def minilm():
    torch.manual_seed(0)
    return BertForSequenceClassification.from_pretrained(resolve_model_path("all-minilm-l6-v2"), num_labels=3)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_tiny_bert_packed_equals_padded(tiny_model_dir, tokenizer, pooling):
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    if pooling == "mean":
        add_mean_pooling_layer(model)
    assert_same(*padded_and_packed(model, tokenizer))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packaged_minilm_packed_equals_padded(minilm, tokenizer, pooling):
    model = copy.deepcopy(minilm)
    if pooling == "mean":
        add_mean_pooling_layer(model)
    assert_same(*padded_and_packed(model, tokenizer))


@pytest.mark.parametrize("reviews_a_group", [1, 2])
def test_capped_attention_groups_read_as_padded(tiny_model_dir, minilm, tokenizer, reviews_a_group):
    """Groups cut by the CPU's cap give the same logits and gradients: here the longest reviews come thrice."""
    reviews = [*REVIEWS, REVIEWS[2], REVIEWS[2], REVIEWS[0]]
    width = max(len(tokenizer(text)["input_ids"]) for text in reviews)
    cap = reviews_a_group * width * width
    batch = DataCollatorWithPadding(tokenizer)([dict(tokenizer(text)) for text in reviews])
    capped, uncapped = (pack(batch, max_group_scores=limit)["review_groups"] for limit in (cap, None))
    assert len(capped[0][0]) == reviews_a_group < len(uncapped[0][0])  # the longest group was cut
    for model in (BertForSequenceClassification.from_pretrained(tiny_model_dir), copy.deepcopy(minilm)):
        assert_same(*padded_and_packed(model, tokenizer, reviews, cap))


def test_the_cap_applies_on_a_cpu_only(minilm):
    # MiniLM's 12 heads of fp32 scores: 24 MiB is 524,288 scores a head, 8 reviews of 256 tokens.
    assert attention_group_limit(minilm, torch.device("cpu")) * 12 * 4 == CPU_ATTENTION_GROUP_BYTES
    assert attention_group_limit(minilm, torch.device("cuda")) is None


def test_the_check_has_teeth_plain_sdpa_on_a_packed_row_differs(minilm, tokenizer):
    """Without the per-review attention, reviews in one row attend to each other and the logits move."""
    model = copy.deepcopy(minilm).eval()
    batch = DataCollatorWithPadding(tokenizer)([dict(tokenizer(text)) for text in REVIEWS])
    padded = model(**batch).logits
    row = pack(batch)
    hidden = model.bert(input_ids=row["input_ids"], position_ids=row["position_ids"]).last_hidden_state
    first_tokens = hidden[0, row["cu_seq_lens_q"][:-1].long()]
    leaked = model.classifier(model.bert.pooler(first_tokens.unsqueeze(1)))
    assert float((leaked - padded).abs().max().detach()) > 100 * TOLERANCE


def test_the_model_is_stock_again_after_the_run(tiny_model_dir, tokenizer, tmp_path):
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    reading = PackedReading(model)
    assert model.config._attn_implementation == PACKED_ATTENTION
    # Padded batches read as before while it is installed (evaluation during training).
    batch = DataCollatorWithPadding(tokenizer)([dict(tokenizer(text)) for text in REVIEWS])
    model.eval()
    with torch.no_grad():
        during = model(**batch).logits
    reading.remove()
    with torch.no_grad():
        after = model(**batch).logits
    assert torch.allclose(during, after, atol=1e-6)
    assert model.config._attn_implementation == "sdpa"
    assert not any("forward" in vars(module) for module in model.modules())
    model.save_pretrained(tmp_path)
    assert "finetune" not in json.dumps(json.loads((tmp_path / "config.json").read_text()))


def test_a_model_that_cannot_be_packed_is_refused_with_the_fix():
    model = DistilBertForSequenceClassification(
        DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2, hidden_dim=37)
    )
    with pytest.raises(
        FinetuneError,
        match=r"padding_free works with the sequence classifiers of BERT .* RoBERTa .* set padding_free: false",
    ):
        PackedReading(model)


def test_attention_with_dropout_is_unbiased_and_the_check_has_teeth():
    """Averaged over draws, attention with dropout equals attention without it (the 1/(1-p) rescaling)."""
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 2, 6, 4) for _ in range(3))
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    exact = nn_attention(query, key, value, key_mask)
    # On the CPU, attention with dropout takes the cheaper-mask path (biased_attention_with_dropout).
    draws = torch.stack([attention(query, key, value, key_mask, 0.3, 0.5) for _ in range(4000)])
    spread = draws.std(dim=0) / 4000**0.5
    assert bool(((draws.mean(dim=0) - exact).abs() < 6 * spread + 1e-6).all())
    unscaled = draws * 0.7  # what the mean would be without the rescaling
    assert not bool(((unscaled.mean(dim=0) - exact).abs() < 6 * spread + 1e-6).all())


def nn_attention(query, key, value, key_mask):
    """The reference: SDPA without dropout, each row attending to its real keys."""
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=key_mask[:, None, None, :], scale=0.5
    )


def test_packed_training_with_dropout_is_reproducible_and_leaves_dropout_stock(tiny_dropout_model_dir, tokenizer):
    """The same seed draws the same masks; after the run every module forwards as the class says again."""
    features = [dict(tokenizer(text), labels=index % 3) for index, text in enumerate(REVIEWS)]
    batch = pack(DataCollatorWithPadding(tokenizer)(features))
    gradients = []
    for _ in range(2):
        model = BertForSequenceClassification.from_pretrained(tiny_dropout_model_dir).train()
        reading = PackedReading(model)
        torch.manual_seed(7)
        model(**batch).loss.backward()
        reading.remove()
        gradients.append(torch.cat([parameter.grad.flatten() for parameter in model.parameters()]))
        assert not any("forward" in vars(module) for module in model.modules())
    assert torch.equal(*gradients)
