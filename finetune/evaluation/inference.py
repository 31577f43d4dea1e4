"""Batched inference: class probabilities for a list of texts."""

from __future__ import annotations

import numpy as np
import torch
from transformers import DataCollatorWithPadding, PreTrainedModel, PreTrainedTokenizerBase


def predict_probabilities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    batch_size: int = 32,
    max_length: int = 256,
) -> np.ndarray:
    """Softmax probabilities, one row per text, in the order given.

    Texts are sorted by length so each batch pads only to its own longest
    review (padding is wasted compute), and run under ``inference_mode``.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    order = np.argsort([len(ids) for ids in encoded["input_ids"]], kind="stable")
    collator = DataCollatorWithPadding(tokenizer)
    probabilities = np.zeros((len(texts), model.config.num_labels), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            batch = collator([{key: encoded[key][row] for key in encoded} for row in rows])
            logits = model(**{key: value.to(device) for key, value in batch.items()}).logits
            probabilities[rows] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
    return probabilities
