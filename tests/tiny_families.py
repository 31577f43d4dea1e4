"""Tiny random models of the families the fast path registers besides BERT, built alike for the tests.

Each is 2 layers, hidden 32, 3 labels, no dropout unless asked, over the
packaged WordPiece vocabulary, with weights large enough that every gradient is
well above rounding. ``FAMILIES`` names, per family, the model builder and the
parameter whose gradient shows that positions (or MPNet's relative-position
bias) reach the loss: the checks that compare with the stock model need it to
learn in the reference, or they would not see it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import MPNetConfig, MPNetForSequenceClassification, RobertaConfig, RobertaForSequenceClassification

SHAPE = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=160
)


def tiny_roberta(tokenizer, dropout: float = 0.0) -> RobertaForSequenceClassification:
    """A 2-layer RoBERTa classifier; RoBERTa counts positions from its padding id + 1."""
    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size,
        **SHAPE,
        type_vocab_size=1,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=3,
        initializer_range=0.2,
    )
    return RobertaForSequenceClassification(config).train()


def tiny_mpnet(tokenizer, dropout: float = 0.0) -> MPNetForSequenceClassification:
    """A 2-layer MPNet classifier with a visible relative-position bias (at init it is near zero and hides)."""
    torch.manual_seed(0)
    config = MPNetConfig(
        vocab_size=tokenizer.vocab_size,
        **SHAPE,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=tokenizer.pad_token_id,  # MPNet counts positions from its padding id
        num_labels=3,
        initializer_range=0.2,
    )
    model = MPNetForSequenceClassification(config)
    with torch.no_grad():
        model.mpnet.encoder.relative_attention_bias.weight.normal_(0, 1.0)
    return model.train()


@dataclass(frozen=True)
class TinyFamily:
    """How the shared tests build one family's tiny model and which gradient shows its positions learn."""

    build: Callable[..., torch.nn.Module]
    position_parameter: str


FAMILIES = {
    "roberta": TinyFamily(tiny_roberta, "roberta.embeddings.position_embeddings.weight"),
    "mpnet": TinyFamily(tiny_mpnet, "mpnet.encoder.relative_attention_bias.weight"),
}
