"""Reviews nobody labelled for this run: a catalog dataset's reviews that are in none of the recipe's splits.

``finetune distill --unlabeled_from imdb`` hands a teacher the reviews of a
source that the recipe does not use, to label for its student. A review that
the recipe trains, validates or tests on is never among them (compared as
the model reads them: cleaned, with the title in front), so the student's
validation and test scores stay scores on reviews no model of the run has
seen a label for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import FinetuneError
from .columns import column_values

# The draw of max_unlabeled reviews does not follow the training seed: every student of a teacher (--seeds)
# on the same splits gets the same reviews, so the teacher labels them once.
DRAW_SEED = 0

if TYPE_CHECKING:
    from ..config.arguments import DataArguments
    from .splits import ReviewData


@dataclass
class UnusedReviews:
    """The reviews drawn, and the counts that say where they came from."""

    texts: list[str]
    source: str  # the catalog name
    source_reviews: int  # distinct non-empty reviews in the source
    in_splits: int  # of those, how many the recipe's splits hold (never used)
    unused: int  # the rest, of which ``texts`` is all or a seeded draw of ``max_unlabeled``

    def note(self) -> str:
        """One line for the data report."""
        drawn = f"all {self.unused}" if len(self.texts) == self.unused else f"{len(self.texts)} (a seeded draw)"
        return (
            f"unlabeled_from {self.source}: {drawn} of its {self.unused} reviews in none of the recipe's splits, "
            f"labelled by the teacher ({self.in_splits} of its {self.source_reviews} reviews are in the splits "
            "and left out)"
        )


def unused_reviews(data_args: DataArguments, data: ReviewData) -> UnusedReviews:
    """The reviews of the catalog dataset ``data_args.unlabeled_from`` that none of ``data``'s splits holds.

    Every split of the source is read (as the recipe reads text: ``text_column``,
    ``title_column`` where the source has it, ``clean_text``); empty and repeated
    reviews are dropped; at most ``max_unlabeled`` are kept, in a draw that does
    not depend on the training seed (:data:`DRAW_SEED`).
    """
    from ..fetching.catalog import get_entry
    from .sources import read_sources
    from .splits import review_texts

    name = data_args.unlabeled_from
    entry = get_entry(name)  # an unknown name: an error naming the closest one
    source_args = dataclasses.replace(
        data_args,
        dataset_name=entry.name,
        dataset_config_name=None,
        dataset_dir=None,
        train_file=None,
        validation_file=None,
        test_file=None,
    )
    raw = read_sources(source_args)
    in_splits = {text for split in data.splits.values() for text in column_values(split, "text")}
    seen: set[str] = set()
    kept: list[str] = []
    source_reviews = left_out = 0
    for split, table in raw.tables.items():
        if data_args.text_column not in table.column_names:
            raise FinetuneError(
                f"unlabeled_from {name} has no column '{data_args.text_column}' (text_column) in its {split} split; "
                f"its columns are {', '.join(table.column_names)}; take unlabeled reviews from a source that "
                "reads like the recipe's"
            )
        has_titles = bool(data_args.title_column) and data_args.title_column in table.column_names
        titles = table[data_args.title_column] if has_titles else None
        texts, _ = review_texts(table[data_args.text_column], titles, data_args.clean_text)
        for text in texts:
            if not text or text in seen:
                continue
            seen.add(text)
            source_reviews += 1
            if text in in_splits:
                left_out += 1
            else:
                kept.append(text)
    if not kept:
        raise FinetuneError(
            f"unlabeled_from {name}: all {source_reviews} of its reviews are in the recipe's splits, so none is "
            "left to label; take unlabeled reviews from a larger source, or use unlabeled_file"
        )
    unused = len(kept)
    limit = data_args.max_unlabeled
    if limit is not None and limit < unused:
        # Sorted, so the draw keeps the source's order: the same texts in the same order for every student.
        chosen = np.sort(np.random.default_rng(DRAW_SEED).choice(unused, size=limit, replace=False))
        kept = [kept[index] for index in chosen]
    return UnusedReviews(kept, entry.name, source_reviews, left_out, unused)
