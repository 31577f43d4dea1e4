"""Whether explanations mean something: comprehensiveness against random words.

Comprehensiveness (DeYoung et al. 2020, ERASER): delete a review's k
highest-scored words and see how far the probability of the class the model
predicted falls. Words that truly carried the prediction take more of it away
than k words picked at random from the same review. Each review gives one
paired difference (top-k drop minus the mean drop over ``random_draws``
random k-word deletions); their mean comes with a percentile bootstrap
interval over reviews (:mod:`.bootstrap`'s seeded resamples).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .bootstrap import CONFIDENCE, RESAMPLES, SEED, percentile_interval, resample_indices
from .explain import ReviewExplanation, WordAttribution

KS = (1, 3, 5)
RANDOM_DRAWS = 5


def delete_words(text: str, words: Sequence[WordAttribution]) -> str:
    """``text`` with each word's characters cut out, the spaces they leave collapsed to one."""
    kept, position = [], 0
    for word in sorted(words, key=lambda word: word.start):
        kept.append(text[position : word.start])
        position = word.end
    kept.append(text[position:])
    return re.sub(r"[ \t]{2,}", " ", "".join(kept)).strip()


def comprehensiveness(
    texts: Sequence[str],
    explanations: Sequence[ReviewExplanation],
    probability_of: Any,
    ks: Sequence[int] = KS,
    random_draws: int = RANDOM_DRAWS,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> list[dict[str, Any]]:
    """One row per k: mean probability drop deleting the top-k words, deleting k random words, and the difference.

    ``probability_of(texts, labels)`` gives each text's probability of the
    label (a class name) beside it; the labels are the explanations'. A review
    with fewer than k words loses all of them in both arms. Reviews without
    words are left out.
    """
    rng = np.random.default_rng(seed)
    kept = [index for index, explanation in enumerate(explanations) if explanation.words]
    labels = [explanations[index].label for index in kept]
    original = np.array([explanations[index].probabilities[explanations[index].label] for index in kept])
    rows = []
    for k in ks:
        top_texts, random_texts = [], []
        for index in kept:
            words = explanations[index].words
            ranked = sorted(words, key=lambda word: word.score, reverse=True)
            top_texts.append(delete_words(texts[index], ranked[:k]))
            for _ in range(random_draws):
                chosen = rng.choice(len(words), size=min(k, len(words)), replace=False)
                random_texts.append(delete_words(texts[index], [words[position] for position in chosen]))
        top_drop = original - np.asarray(probability_of(top_texts, labels))
        random_labels = [label for label in labels for _ in range(random_draws)]
        random_probability = np.asarray(probability_of(random_texts, random_labels)).reshape(-1, random_draws)
        random_drop = original - random_probability.mean(axis=1)
        difference = top_drop - random_drop
        means = np.concatenate(
            [difference[indices].mean(axis=1) for indices in resample_indices(len(kept), resamples, seed)]
        )
        rows.append(
            {
                "k": k,
                "reviews": len(kept),
                "top_k_drop": float(top_drop.mean()),
                "random_drop": float(random_drop.mean()),
                "difference": float(difference.mean()),
                "interval": percentile_interval(means, confidence),
                "confidence": confidence,
                "resamples": resamples,
                "random_draws": random_draws,
            }
        )
    return rows
