"""Out-of-fold probabilities on a recipe's train split: every review scored by a model that never trained on it.

The folds are ``finetune train --folds K``'s (:func:`finetune.data.splits.fold_rows`,
drawn with the recipe's seed on the train split cross-validation divides), so
the fine-tuned folds are exactly the runs ``--folds`` trains, reused where they
finished before. The TF-IDF baseline fitted on the same folds is the cheap look
(seconds). Row ids are positions in that train split
(:mod:`finetune.data.label_issue_rows`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FinetuneError

if TYPE_CHECKING:
    from ..config.recipes import Recipe

OUT_OF_FOLD_PROBABILITIES = "oof_probabilities.npy"
OUT_OF_FOLD_ROW_IDS = "oof_row_ids.npy"
# Beside the fine-tuned folds' probabilities when the ranking averaged them with the TF-IDF folds'.
OUT_OF_FOLD_TFIDF = "oof_probabilities_tfidf.npy"


@dataclass
class FoldedTrainSplit:
    """The train split cross-validation divides: texts, labels (class ids, or 0/1 rows per tag) and the folds."""

    texts: list[str]
    labels: list[Any]
    label_names: list[str]
    multi_label: bool
    held_out: list[np.ndarray]  # each fold's held-out row ids, sorted

    @property
    def row_ids(self) -> np.ndarray:
        """Every review's row id: its position in the split."""
        return np.arange(len(self.texts))


def folded_train_split(run: Recipe, folds: int) -> FoldedTrainSplit:
    """The recipe's train split as ``--folds`` divides it; refused where a fold could not score every class."""
    from ..data.columns import column_values
    from ..data.splits import drawing_seed, fold_rows, load_review_data

    if folds < 2:
        raise FinetuneError(f"--folds must be >= 2 (got {folds}): one fold leaves no review unseen; e.g. --folds 5")
    if run.data.drop_label_issues:
        # Its row ids would count a split with reviews missing, and the listed reviews would never be looked at.
        raise FinetuneError(
            "finetune find-label-issues looks at the whole train split, so drop_label_issues must not be set; "
            "leave it out of the recipe and the flags"
        )
    # Only the reviews the folds divide: no validation hold-out, extra reviews or titles (each fold run adds them).
    data_args = dataclasses.replace(
        run.data, validation_split_percentage=0, extra_train_file=None, title_as_review=False
    )
    data = load_review_data(data_args, seed=run.training.seed)
    train = data.splits["train"]
    labels = column_values(train, "labels")
    if not data.multi_label:
        _refuse_small_classes(data.report.class_counts["train"], folds)
    seed = drawing_seed(run.data.split_seed, run.training.seed)
    rows = fold_rows(labels, folds, len(data.label_names), seed, stratify=not data.multi_label)
    held_out = [np.sort(held) for _, held in rows]
    return FoldedTrainSplit(column_values(train, "text"), labels, data.label_names, data.multi_label, held_out)


def _refuse_small_classes(class_counts: dict[str, int], folds: int) -> None:
    """Every class needs a review in every fold, or a fold's model is never asked about it."""
    name, count = min(class_counts.items(), key=lambda item: item[1])
    if count < folds:
        fix = f"pass --folds {count} or fewer" if count >= 2 else f"add reviews of {name!r}"
        raise FinetuneError(
            f"class {name!r} has {count} training reviews, fewer than --folds {folds}, so some fold would hold "
            f"none of it; {fix}"
        )


def baseline_out_of_fold(split: FoldedTrainSplit, seed: int) -> np.ndarray:
    """The TF-IDF baseline's probabilities for every review, each from the baseline fitted on the other folds."""
    from ..evaluation.baseline import TfidfBaseline

    probabilities = np.zeros((len(split.texts), len(split.label_names)), dtype=np.float64)
    labels = np.asarray(split.labels)
    for held in split.held_out:
        trained_on = np.setdiff1d(split.row_ids, held)
        baseline = TfidfBaseline(len(split.label_names), seed=seed, multi_label=split.multi_label)
        baseline.fit([split.texts[row] for row in trained_on], labels[trained_on])
        probabilities[held] = baseline.probabilities([split.texts[row] for row in held])
    return probabilities


def finetuned_out_of_fold(recipe: str | None, overrides: list[str], split: FoldedTrainSplit, run: Recipe) -> np.ndarray:
    """Train the recipe's ``--folds`` runs (reusing finished ones), then score each fold with its own run's model."""
    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import load_inference_model, predict_probabilities
    from .repeats import fold_repeats, run_repeats

    plan = fold_repeats(recipe, overrides, len(split.held_out))
    run_repeats(recipe, overrides, plan)
    encoding = ReviewEncoding.from_fields(dataclasses.asdict(run.data))
    probabilities = np.zeros((len(split.texts), len(split.label_names)), dtype=np.float64)
    for repeat, held in zip(plan.repeats, split.held_out):
        _check_fold_size(repeat.output_dir, len(held))
        model, tokenizer = load_inference_model(repeat.output_dir, tags_read=split.multi_label)
        texts = [split.texts[row] for row in held]
        probabilities[held] = predict_probabilities(
            model, tokenizer, texts, run.training.per_device_eval_batch_size, encoding
        )
        print(f"fold {repeat.key}: scored its {len(held)} held-out reviews", file=sys.stderr)
    return probabilities


def _check_fold_size(output_dir: Path, held_out: int) -> None:
    """The fold run tested on as many reviews as the fold holds: else its folds were drawn from other rows."""
    from ..training.runs import RUN_CONFIG

    record = json.loads((output_dir / RUN_CONFIG).read_text(encoding="utf-8"))
    tested = ((record.get("data_report") or {}).get("rows") or {}).get("test")
    if tested != held_out:
        raise FinetuneError(
            f"{output_dir} was tested on {tested} reviews but its fold holds {held_out}; it was trained on other "
            "data: pass --overwrite_output_dir to train the folds again"
        )


def save_out_of_fold(
    folder: Path, split: FoldedTrainSplit, probabilities: np.ndarray, tfidf: np.ndarray | None = None
) -> list[Path]:
    """Write the probabilities (a row per review, a column per class or tag) and row ids as ``.npy``.

    ``tfidf``: the TF-IDF folds' probabilities, where the ranking blended them in, written beside.
    """
    from ..config.output_files import output_file

    written = []
    arrays = [(OUT_OF_FOLD_PROBABILITIES, probabilities.astype(np.float32)), (OUT_OF_FOLD_ROW_IDS, split.row_ids)]
    if tfidf is not None:
        arrays.append((OUT_OF_FOLD_TFIDF, tfidf.astype(np.float32)))
    else:  # one left by an earlier blended ranking would be blended into this one's by ranked_probabilities
        (folder / OUT_OF_FOLD_TFIDF).unlink(missing_ok=True)
    for name, values in arrays:
        with output_file(folder / name, binary=True) as handle:
            np.save(handle, values)
        written.append(folder / name)
    return written


def ranked_probabilities(folder: Path) -> np.ndarray:
    """The probabilities find-label-issues ranked on, read back from its folder (blended where it blended)."""
    from ..evaluation.label_issues import blend_probabilities

    probabilities = np.load(folder / OUT_OF_FOLD_PROBABILITIES).astype(np.float64)
    if (folder / OUT_OF_FOLD_TFIDF).is_file():
        probabilities = blend_probabilities(probabilities, np.load(folder / OUT_OF_FOLD_TFIDF).astype(np.float64))
    return probabilities
