"""Reviews split into sentences: more text for a teacher to label when a data set has no unlabelled reviews.

A drug or product review of ten sentences teaches a student through one
soft label; its sentences, each labelled by the teacher on its own, teach it
how the teacher reads the parts (``finetune distill`` with
``unlabeled_sentences``). syntok splits them: it keeps "Dr. Smith", "e.g."
and "50mg. of" inside their sentences, which a split at every full stop
does not.
"""

from __future__ import annotations

from collections.abc import Sequence

# Shorter pieces ("Gone.", "Five stars.") carry little the whole review does not.
MIN_SENTENCE_WORDS = 4


def review_sentences(reviews: Sequence[str], min_words: int = MIN_SENTENCE_WORDS) -> list[str]:
    """The sentences of at least ``min_words`` words of each review, in order, as written in the review.

    A sentence that is a whole review (its own or another's) is left out: the
    review itself is already a training example. Repeats are kept once.
    """
    from syntok import segmenter

    seen = {review.strip() for review in reviews}
    sentences: list[str] = []
    for review in reviews:
        for paragraph in segmenter.analyze(review):
            for sentence in paragraph:
                start, last = sentence[0], sentence[-1]
                text = review[start.offset : last.offset + len(last.value)].strip()
                if len(text.split()) < min_words or text in seen:
                    continue
                seen.add(text)
                sentences.append(text)
    return sentences
