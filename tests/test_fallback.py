"""Int8 with an fp32 fallback: only the close calls are scored again, whole reviews at a time."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from finetune.data.encoding import ReviewEncoding
from finetune.errors import FinetuneError
from finetune.evaluation.inference import predict_probabilities
from finetune.export.fallback import Int8WithFallback, top_two_gap

TEXTS = [
    "great value, works perfectly",
    "broke after a week",
    "it is fine",
    "awful, returned it",
    "the battery lasts two days and the screen is sharp " * 20,  # several windows
    "ok",
    "would not buy again",
    "five stars from me",
]


class BagOfTokens(torch.nn.Module):
    """A classifier whose logits are the mean of seeded random token vectors: reviews differ clearly."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.vectors = torch.nn.Parameter(3 * torch.randn(vocab_size, 3, generator=generator))
        self.config = SimpleNamespace(num_labels=3)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        mask = attention_mask.unsqueeze(-1).float()
        return SimpleNamespace(logits=(self.vectors[input_ids] * mask).sum(1) / mask.sum(1))


def _models(tokenizer):
    """Two different classifiers: one stands in for int8, the other for fp32."""
    return BagOfTokens(len(tokenizer), seed=1), BagOfTokens(len(tokenizer), seed=2)


def test_top_two_gap_by_hand():
    probabilities = np.array([[0.5, 0.3, 0.2], [0.1, 0.45, 0.45], [1.0, 0.0, 0.0]])
    assert top_two_gap(probabilities) == pytest.approx([0.2, 0.0, 1.0])
    assert top_two_gap(np.array([[1.0], [1.0]])) == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("sliding_window", [False, True])
def test_only_close_calls_take_the_fp32_probabilities(tokenizer, sliding_window):
    int8, fp32 = _models(tokenizer)
    encoding = ReviewEncoding(max_length=32, sliding_window=sliding_window, window_stride=8)
    alone_int8 = predict_probabilities(int8, tokenizer, TEXTS, batch_size=3, encoding=encoding)
    alone_fp32 = predict_probabilities(fp32, tokenizer, TEXTS, batch_size=3, encoding=encoding)
    # A margin between the gaps, so some reviews are close calls and some are not.
    gaps = np.sort(top_two_gap(alone_int8))
    margin = float((gaps[3] + gaps[4]) / 2)
    close = top_two_gap(alone_int8) < margin
    assert 0 < close.sum() < len(TEXTS)
    assert close[4]  # the long review: with sliding windows, all its windows are scored again

    model = Int8WithFallback(int8, fp32, margin)
    combined = predict_probabilities(model, tokenizer, TEXTS, batch_size=3, encoding=encoding)
    expected = np.where(close[:, None], alone_fp32, alone_int8)
    np.testing.assert_allclose(combined, expected, atol=1e-6)
    assert model.rescored == close.sum()


@pytest.mark.parametrize("margin", [0, -0.1, 1.5, float("nan"), True])
def test_a_margin_outside_zero_to_one_is_refused(tokenizer, margin):
    int8, fp32 = _models(tokenizer)
    with pytest.raises(FinetuneError, match=r"--fp32_fallback must be a probability gap in \(0, 1\]"):
        Int8WithFallback(int8, fp32, margin)
