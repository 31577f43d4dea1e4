"""Synthetic reviews for benchmarks: seeded, of varied lengths, with star ratings the words give away.

``finetune bench --scaling --synthetic 200000`` measures how a run's cost grows
on more reviews than any file the project fetches; the reviews are written on
demand into the bench's work folder (never committed). Each review is 1 to 60
sentences of 5 to 15 everyday words (about 40 words at the median, a long
tail to several hundred), and half its sentences carry one word of sentiment:
from its own star rating's list 80% of the time, else from a neighbouring
rating's, so the ratings can be learnt from the words, but not perfectly.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Words of sentiment by star rating (1 to 5).
CUE_WORDS = {
    1: ("awful", "terrible", "horrible", "useless", "broken", "refund", "worst", "garbage", "waste", "junk"),
    2: ("poor", "mediocre", "flimsy", "annoying", "weak", "overpriced", "disappointing", "cheap", "slow", "lacking"),
    3: ("okay", "average", "decent", "fine", "acceptable", "mixed", "ordinary", "fair", "passable", "middling"),
    4: ("good", "solid", "nice", "pleased", "reliable", "comfortable", "sturdy", "handy", "recommended", "happy"),
    5: ("excellent", "amazing", "perfect", "outstanding", "fantastic", "superb", "love", "brilliant", "flawless"),
}
_FILLER_TEXT = (
    "the a an it this that these my our their i we you they he she one some any every each other "
    "product item order package box delivery shipping price size color colour fit quality battery screen "
    "phone shoe shirt dress jacket bag lamp chair table kettle blender charger cable case strap lid handle "
    "bought ordered received used tried wore washed returned opened charged kept gave arrived came looked "
    "felt seemed worked lasted took made put got went said told asked wanted needed expected hoped "
    "day days week weeks month months year time times morning evening night weekend trip home office kitchen "
    "after before during since until while when because although though so and but or then also just "
    "really quite very rather fairly pretty still even only again almost already soon later now "
    "first second last next new old small large big little long short heavy light soft hard warm cold "
    "to of in on at for with from by about into over under around between through without "
    "is was are were be been has had have do did does can could would should will may might must"
)
FILLER_WORDS = tuple(_FILLER_TEXT.split())
# Sentences per review: log-normal around this median, clipped to 1..MAX_SENTENCES.
MEDIAN_SENTENCES = 4
MAX_SENTENCES = 60
CUE_SHARE = 0.5  # of sentences carrying a word of sentiment
OWN_RATING_SHARE = 0.8  # of those words, from the review's own rating's list (else a neighbour's)
_CHUNK = 10_000


def synthetic_reviews(count: int, seed: int = 0) -> Iterator[tuple[str, int]]:
    """``count`` (review, stars) pairs, stars 1 to 5 in about equal numbers; fewer are the first of more.

    Every chunk of reviews draws its random numbers in full, used or not, so
    the first n reviews of a seed are the same whatever ``count`` is.
    """
    rng = np.random.default_rng(seed)
    filler = np.array(FILLER_WORDS)
    cues = [np.array(CUE_WORDS[stars]) for stars in range(1, 6)]
    for start in range(0, count, _CHUNK):
        stars = rng.integers(1, 6, _CHUNK)
        sentences = np.clip(np.rint(rng.lognormal(np.log(MEDIAN_SENTENCES), 0.9, _CHUNK)), 1, MAX_SENTENCES)
        sentences = sentences.astype(int)
        lengths = rng.integers(5, 16, sentences.sum())
        words = filler[rng.integers(0, len(filler), lengths.sum())]
        has_cue = rng.random(len(lengths)) < CUE_SHARE
        sentence_stars = np.repeat(stars, sentences)
        neighbour = np.clip(sentence_stars + rng.choice([-1, 1], len(lengths)), 1, 5)
        cue_stars = np.where(rng.random(len(lengths)) < OWN_RATING_SHARE, sentence_stars, neighbour)
        cue_index = rng.integers(0, 100, len(lengths))
        cue_slot = (rng.random(len(lengths)) * lengths).astype(int)
        sentence, word = 0, 0
        for review in range(min(_CHUNK, count - start)):
            parts = []
            for _ in range(sentences[review]):
                tokens = list(words[word : word + lengths[sentence]])
                if has_cue[sentence]:
                    choices = cues[cue_stars[sentence] - 1]
                    tokens[cue_slot[sentence]] = choices[cue_index[sentence] % len(choices)]
                parts.append(" ".join(tokens).capitalize() + ".")
                word += lengths[sentence]
                sentence += 1
            yield " ".join(parts), int(stars[review])


def write_synthetic_reviews(path: Path, count: int, seed: int = 0) -> Path:
    """Write ``count`` synthetic reviews to ``path`` as a CSV with the columns ``review`` and ``stars``."""
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "stars"])
        writer.writerows(synthetic_reviews(count, seed))
    return Path(path)
