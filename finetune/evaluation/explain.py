"""Which words pushed a review toward its label: Integrated Gradients on the word embeddings, merged into words.

Captum's ``LayerIntegratedGradients`` walks the word embeddings of a review
from a baseline (every word piece replaced by ``[PAD]``, the special tokens
kept) to the review itself in ``n_steps`` straight-line steps, and sums the
gradient of the predicted class's log-probability along the way. A word
piece's score is its share of ``log p(label | review) - log p(label |
baseline)`` (the pieces' scores add up to that, up to the integral's
discretisation error): positive pushes toward the predicted label, negative
away from it. The log-probability, not the logit, is attributed because a
class wins against the others: a piece that raises every logit alike moves
no probability and gets no score.

Word pieces are merged back into words with the fast tokenizer's offset
mapping: a word is a run of letters or digits, with inner apostrophes
("didn't"), and its score is the sum of its pieces'. Punctuation is no word.
A word past ``max_length`` tokens, which the model does not read, scores 0.

An int8 export has no gradients. One made with ``--fp32_fallback`` keeps its
fp32 model, which is explained instead: the label and probabilities are the
export's (int8, with its close calls re-scored in fp32, as ``predict``
gives them), the scores the fp32 model's gradients toward that label.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from ..errors import FinetuneError

TOP_K = 5
# Integrated Gradients from the [PAD] baseline, or the gradient at the review times its embeddings (one pass).
METHODS = ("integrated_gradients", "gradient_x_input")
# Straight-line steps of the integral (Captum's Gauss-Legendre points). Measured on 30 quickstart test
# reviews (docs/explain.md): 16 steps and 32 give the same comprehensiveness (k = 1, 3: identical; k = 5:
# 0.283 against 0.284), 8 and 4 a little less, at half and a quarter of the cost.
N_STEPS = 16
# Said when asked to explain a model that has no gradients (an int8 export without its fp32 model).
NO_GRADIENTS = (
    "an int8 export has no gradients to explain with; explain the run folder it was exported from, "
    "or export again with --fp32_fallback 0.1 to keep its fp32 model beside it"
)
# Letters or digits, with inner apostrophes so that "didn't" and "customer's" stay one word.
WORD_PATTERN = re.compile(r"\w+(?:['’]\w+)*")


@dataclass(frozen=True)
class WordAttribution:
    """One word of a review: ``review[start:end] == word``; ``score`` > 0 pushed toward the predicted label."""

    word: str
    start: int
    end: int
    score: float


@dataclass(frozen=True)
class ReviewExplanation:
    """A review's predicted label, its class probabilities, and every word of it in order with its score.

    ``top_k`` is how many words :meth:`top_words` gives by default (``explain_reviews``' ``top_k``).
    """

    label: str
    probabilities: dict[str, float]
    words: list[WordAttribution]
    top_k: int = TOP_K

    def top_words(self, k: int | None = None) -> list[WordAttribution]:
        """The ``k`` (default ``top_k``) words that pushed most toward the label, highest score first.

        Only words with a positive score: a review with fewer gives fewer.
        """
        k = self.top_k if k is None else k
        pushing = [word for word in self.words if word.score > 0]
        return sorted(pushing, key=lambda word: word.score, reverse=True)[:k]


@dataclass(frozen=True)
class TagExplanation:
    """A multi_label review's tags, every tag's probability, and for each tag given the words behind it.

    ``words[tag]`` is every word of the review in order, scored toward that tag's logit (its log-odds).
    """

    labels: list[str]
    scores: dict[str, float]
    words: dict[str, list[WordAttribution]]
    top_k: int = TOP_K

    def top_words(self, k: int | None = None) -> dict[str, list[WordAttribution]]:
        """Per tag given, the ``k`` (default ``top_k``) words that pushed most toward it, highest score first."""
        k = self.top_k if k is None else k
        return {
            tag: sorted((word for word in words if word.score > 0), key=lambda word: word.score, reverse=True)[:k]
            for tag, words in self.words.items()
        }


def can_explain_folder(model_dir: Path) -> bool:
    """Whether the model in ``model_dir`` has gradients: PyTorch weights, or an int8 export with its fp32 fallback."""
    from ..export.fallback import read_fallback
    from .inference import is_exported_folder

    return not is_exported_folder(model_dir) or read_fallback(model_dir) is not None


def require_explainable_folder(model_dir: Path) -> None:
    """Refuse, before the model loads, to explain an int8 export that keeps no fp32 model."""
    if not can_explain_folder(model_dir):
        raise FinetuneError(f"{model_dir}: {NO_GRADIENTS}")


def format_top_words(explanation: ReviewExplanation | TagExplanation, k: int | None = None) -> str:
    """The top words as one cell: ``"refund (0.81); broke (0.42)"`` (three significant digits).

    A review's tags: each tag's, after its name, ``"price: cheap (0.8) | delivery: late (0.6); box (0.1)"``.
    """
    if isinstance(explanation, TagExplanation):
        return " | ".join(f"{tag}: {_word_list(words)}" for tag, words in explanation.top_words(k).items())
    return _word_list(explanation.top_words(k))


def _word_list(words: list[WordAttribution]) -> str:
    return "; ".join(f"{word.word} ({word.score:.3g})" for word in words)


def explain_reviews(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    reviews: Sequence[str],
    *,
    top_k: int = TOP_K,
    batch_size: int = 16,
    max_length: int | None = None,
    n_steps: int = N_STEPS,
    method: str = METHODS[0],
) -> list[ReviewExplanation]:
    """Explain each review's predicted label: one :class:`ReviewExplanation` per review, in order.

    ``model`` is what :func:`~finetune.evaluation.inference.load_inference_model`
    returns for a run or checkpoint folder (a PyTorch classifier, mean-pooling
    head included) or for an int8 export made with ``--fp32_fallback``; an
    int8 export without one is refused in one line. Reviews are cut at
    ``max_length`` tokens (default: the run's ``max_length`` when the model
    was loaded from a run, else what the model can read) on the tokenizer's
    truncation side. ``batch_size`` reviews are attributed at a time, one
    integration step per forward and backward pass, so memory is that of a
    training batch of ``batch_size``.
    """
    from ..data.encoding import ReviewEncoding
    from .inference import check_batch_size, predict_probabilities

    check_batch_size(batch_size)
    texts = list(reviews)
    gradient_model = _gradient_model(model, tokenizer)
    max_length = max_length or _default_max_length(gradient_model, tokenizer)
    # The label and probabilities are predict's, on the same tokens the scores are for.
    encoding = ReviewEncoding(max_length=max_length, truncation_side=_truncation_side(tokenizer))
    probabilities = predict_probabilities(model, tokenizer, texts, batch_size, encoding) if texts else []
    return explain_predictions(
        model,
        tokenizer,
        texts,
        probabilities,
        top_k=top_k,
        batch_size=batch_size,
        max_length=max_length,
        n_steps=n_steps,
        method=method,
    )


def explain_predictions(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    reviews: Sequence[str],
    probabilities: Any,
    *,
    top_k: int = TOP_K,
    batch_size: int = 16,
    max_length: int | None = None,
    n_steps: int = N_STEPS,
    method: str = METHODS[0],
) -> list[ReviewExplanation]:
    """:func:`explain_reviews` for reviews already scored: ``probabilities`` (one row per review) give the labels.

    For callers that have the probabilities from their own encoding of the
    reviews (``predict``, ``evaluate``): the words explained are the label they
    report, and the reviews are not scored twice.
    """
    _check_settings(batch_size, top_k, n_steps, method)
    gradient_model = _gradient_model(model, tokenizer)
    texts = list(reviews)
    if not texts:
        return []
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.shape != (len(texts), model.config.num_labels):
        raise ValueError(f"probabilities must be one row of {model.config.num_labels} per review")
    max_length = max_length or _default_max_length(gradient_model, tokenizer)
    label_names = [model.config.id2label[index] for index in range(model.config.num_labels)]
    predicted = probabilities.argmax(axis=1)
    scores = _word_piece_scores(gradient_model, tokenizer, texts, predicted, batch_size, max_length, n_steps, method)
    return [
        ReviewExplanation(
            label=label_names[predicted[index]],
            probabilities={name: float(p) for name, p in zip(label_names, probabilities[index])},
            words=_merge_into_words(text, *scores[index]),
            top_k=top_k,
        )
        for index, text in enumerate(texts)
    ]


def explain_tag_predictions(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    reviews: Sequence[str],
    probabilities: Any,
    thresholds: Any,
    *,
    top_k: int = TOP_K,
    batch_size: int = 16,
    max_length: int | None = None,
    n_steps: int = N_STEPS,
    method: str = METHODS[0],
) -> list[TagExplanation]:
    """The words behind each tag a multi_label model gives each review: one :class:`TagExplanation` per review.

    A tag is given where its probability (``probabilities``, one row per review)
    reaches its threshold (``thresholds``, one per tag), as ``predict`` gives it.
    Each (review, tag given) pair is explained on its own: the attributed output is
    that tag's logit, the log-odds of its sigmoid, since tags do not compete as a
    softmax's classes do. Its words' scores add up to ``logit(tag | review) -
    logit(tag | baseline)``. A review with no tag gets no words.
    """
    _check_settings(batch_size, top_k, n_steps, method)
    gradient_model = _gradient_model(model, tokenizer)
    texts = list(reviews)
    probabilities = np.asarray(probabilities, dtype=np.float64).reshape(len(texts), model.config.num_labels)
    given = probabilities >= np.asarray(thresholds, dtype=np.float64)
    # One row per (review, tag given), so a batch attributes each row to its own tag's logit.
    pairs = [(review, int(tag)) for review in range(len(texts)) for tag in np.flatnonzero(given[review])]
    max_length = max_length or _default_max_length(gradient_model, tokenizer)
    tag_names = [model.config.id2label[index] for index in range(model.config.num_labels)]
    pair_texts = [texts[review] for review, _ in pairs]
    targets = np.array([tag for _, tag in pairs], dtype=np.int64)
    settings = (batch_size, max_length, n_steps, method)
    scores = _word_piece_scores(gradient_model, tokenizer, pair_texts, targets, *settings, True) if pairs else []
    words: list[dict[str, list[WordAttribution]]] = [{} for _ in texts]
    for (review, tag), (offsets, piece_scores) in zip(pairs, scores):
        words[review][tag_names[tag]] = _merge_into_words(texts[review], offsets, piece_scores)
    return [
        TagExplanation(
            labels=list(words[index]),
            scores={name: float(p) for name, p in zip(tag_names, probabilities[index])},
            words=words[index],
            top_k=top_k,
        )
        for index in range(len(texts))
    ]


def _check_settings(batch_size: int, top_k: int, n_steps: int, method: str) -> None:
    """Refuse a batch size, ``top_k`` or step count under 1, and a method that is not one of ``METHODS``."""
    from .inference import check_batch_size

    check_batch_size(batch_size)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise FinetuneError(f"top_k must be a whole number >= 1 (got {top_k!r}); pass e.g. top_k=5")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise FinetuneError(f"n_steps must be a whole number >= 1 (got {n_steps!r}); the default is {N_STEPS}")
    if method not in METHODS:
        raise FinetuneError(f"method must be one of {', '.join(METHODS)} (got {method!r})")


def _gradient_model(model: Any, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """The PyTorch model whose gradients explain ``model``'s predictions: itself, or an int8 export's fp32 fallback."""
    from ..export.fallback import Int8WithFallback

    gradient_model = model.fp32 if isinstance(model, Int8WithFallback) else model
    if not isinstance(gradient_model, torch.nn.Module):
        raise FinetuneError(NO_GRADIENTS)
    if not tokenizer.is_fast:
        raise FinetuneError(
            f"explanations need a fast tokenizer (for its offset mapping), and {type(tokenizer).__name__} is not; "
            "save the model with its tokenizer.json (AutoTokenizer.from_pretrained(..., use_fast=True))"
        )
    return gradient_model


def _default_max_length(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> int:
    """The run's ``max_length`` when the model came from a run folder, else the most tokens the model reads."""
    from ..training.runs import find_run_config

    folder = getattr(model, "name_or_path", "") or ""
    if folder and Path(folder).is_dir():
        recorded = ((find_run_config(Path(folder)) or {}).get("data") or {}).get("max_length")
        if isinstance(recorded, int) and recorded > 0:
            return recorded
    limits = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    return min(limit for limit in [*limits, 512] if isinstance(limit, int) and limit > 0)


def _truncation_side(tokenizer: PreTrainedTokenizerBase) -> str:
    return "left" if tokenizer.truncation_side == "left" else "right"


def _batch_attributions(
    explainer: Any, batch: Any, target: torch.Tensor, device: torch.device, pad_id: int, n_steps: int
) -> tuple[torch.Tensor, np.ndarray]:
    """One tokenized batch's word-piece mask and each token's attribution to ``target`` (summed over the embedding)."""
    from captum.attr import LayerIntegratedGradients

    input_ids = batch["input_ids"].to(device)
    attention_mask = batch["attention_mask"].to(device)
    # The baseline keeps [CLS] and [SEP] (and padding) and blanks every word piece to [PAD].
    is_piece = (batch["special_tokens_mask"] == 0).to(device) & (attention_mask == 1)
    # Gradients even when the caller runs under inference_mode or no_grad (a server answering requests).
    with torch.inference_mode(False), torch.enable_grad():
        if isinstance(explainer, LayerIntegratedGradients):
            attributions = explainer.attribute(
                inputs=input_ids,
                baselines=torch.where(is_piece, torch.full_like(input_ids, pad_id), input_ids),
                additional_forward_args=(attention_mask,),
                target=target,
                n_steps=n_steps,
                # One step of every review in the batch per pass: memory of one batch_size batch.
                internal_batch_size=len(input_ids),
            )
        else:
            attributions = explainer.attribute(input_ids, additional_forward_args=(attention_mask,), target=target)
    return is_piece, attributions.sum(dim=-1).detach().float().cpu().numpy()


def _word_piece_scores(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    predicted: np.ndarray,
    batch_size: int,
    max_length: int,
    n_steps: int,
    method: str,
    tag_logits: bool = False,
) -> list[tuple[list[tuple[int, int]], np.ndarray]]:
    """For each text: its word pieces' character offsets and Integrated Gradients scores (special tokens excluded).

    Attributed: the log-probability of class ``predicted[i]``, or with ``tag_logits`` that tag's logit.
    """
    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients

    device = next(model.parameters()).device
    model.eval()
    tokenizer.truncation_side = _truncation_side(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def log_probabilities(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        # A tag's logit is its log-odds: tags are independent yes/no questions, not rivals in a softmax.
        return logits.float() if tag_logits else torch.log_softmax(logits.float(), dim=-1)

    embeddings = model.get_input_embeddings()
    integrated = LayerIntegratedGradients(log_probabilities, embeddings)
    local = LayerGradientXActivation(log_probabilities, embeddings)
    results: list[Any] = [None] * len(texts)
    # Sorted by length, so a batch pads only to its own longest review (padding is wasted compute).
    order = np.argsort([len(text) for text in texts], kind="stable")
    for start in range(0, len(order), batch_size):
        chosen = [int(index) for index in order[start : start + batch_size]]
        batch = tokenizer(
            [texts[index] for index in chosen],
            truncation=True,
            max_length=max_length,
            padding=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        explainer = integrated if method == "integrated_gradients" else local
        target = torch.as_tensor(predicted[chosen], device=device)
        is_piece, piece_scores = _batch_attributions(explainer, batch, target, device, pad_id, n_steps)
        for row, index in enumerate(chosen):
            kept = is_piece[row].cpu().numpy()
            offsets = [tuple(pair) for pair in batch["offset_mapping"][row][kept].tolist()]
            results[index] = (offsets, piece_scores[row][kept])
    return results


def _merge_into_words(text: str, offsets: list[tuple[int, int]], piece_scores: np.ndarray) -> list[WordAttribution]:
    """Every word of ``text`` in order, scored by the sum of the word pieces that fall in it."""
    spans = [match.span() for match in WORD_PATTERN.finditer(text)]
    word_at = np.full(len(text), -1, dtype=np.int64)
    for index, (start, end) in enumerate(spans):
        word_at[start:end] = index
    totals = np.zeros(len(spans), dtype=np.float64)
    for (start, end), score in zip(offsets, piece_scores):
        # A piece's span may include a leading space (SentencePiece's "▁word"); its first word character decides.
        inside = word_at[start:end]
        inside = inside[inside >= 0]
        if inside.size:
            totals[inside[0]] += float(score)
    return [
        WordAttribution(word=text[start:end], start=start, end=end, score=float(total))
        for (start, end), total in zip(spans, totals)
    ]
