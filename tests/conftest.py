"""Shared fixtures: a tiny BERT (2 layers, hidden 32) with the real packaged tokenizer."""

from __future__ import annotations

import os

import pytest

# Tests never reach the Hugging Face Hub; fail fast instead of waiting on it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tokenizer():
    """The real uncased WordPiece tokenizer of the packaged MiniLM model."""
    from transformers import AutoTokenizer

    from finetune.modeling import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("all-minilm-l6-v2"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A saved 2-layer BERT classifier (hidden 32, no dropout) plus tokenizer: a model folder recipes can name."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    folder = tmp_path_factory.mktemp("tiny-bert")
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
