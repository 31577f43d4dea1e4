"""The TF-IDF baseline beside a run: started in a process of its own where cores are free, or fitted inline."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

from ..config.tasks import SINGLE_LABEL
from ..data.columns import column_values

if TYPE_CHECKING:
    from ..data.splits import ReviewData


def start_baseline_beside(data: ReviewData, args: Any, beside_the_run: contextlib.ExitStack | None) -> Any:
    """The baseline's process, started where cores are free beside the training and the recipe asks for it; or None.

    The process ends with ``beside_the_run``, however the run ends; without it, the baseline is fitted inline.
    """
    from ..evaluation.baseline_process import runs_beside_training

    main_process = args.process_index == 0
    # Tags and ratings are fitted inline: the baseline's process scores one class per review.
    one_class = data.task == SINGLE_LABEL
    beside = beside_the_run is not None and one_class and runs_beside_training(args.device.type)
    if args.baseline and main_process and beside:
        return beside_the_run.enter_context(_start_baseline(data, args.seed))
    return None


def fit_baseline_inline(data: ReviewData, args: Any) -> Any:
    """The baseline fitted here (a ``BaselineResult``), where the recipe asks for it; None on other processes."""
    if args.baseline and args.process_index == 0:
        return _fit_baseline(data, args.seed)
    return None


def collect_baseline(job: Any) -> Any:
    """The result of the baseline's process (None where it could not fit); said as an inline fit says it."""
    return _collect_baseline(job)


def _baseline_inputs(data: ReviewData) -> tuple[Any, Any, dict[str, tuple[Any, Any]]]:
    """The train split's texts and labels, and the splits the baseline is scored on (validation, test)."""
    splits = data.splits
    to_score = {
        split: (column_values(splits[split], "text"), column_values(splits[split], "labels"))
        for split in ("validation", "test")
        if split in splits
    }
    return column_values(splits["train"], "text"), column_values(splits["train"], "labels"), to_score


def _fit_baseline(data: ReviewData, seed: int) -> Any:
    """Fit the TF-IDF baseline on the train split, score it on validation and test, and say so."""
    from ..evaluation.baseline import run_baseline
    from ..evaluation.rating_baseline import run_rating_baseline

    train_texts, train_labels, to_score = _baseline_inputs(data)
    try:
        if data.scale is not None:
            result = run_rating_baseline(
                train_texts, train_labels, to_score, data.label_names, data.scale, data.task, seed=seed
            )
        else:
            result = run_baseline(
                train_texts, train_labels, to_score, data.label_names, seed=seed, multi_label=data.multi_label
            )
    except ValueError as error:
        _say_baseline_skipped(error)
        return None
    _say_baseline(result)
    return result


def _start_baseline(data: ReviewData, seed: int) -> Any:
    """The baseline's fit started in a process of its own: a ``BaselineProcess``, to collect after training."""
    from ..evaluation.baseline_process import BaselineProcess

    train_texts, train_labels, to_score = _baseline_inputs(data)
    return BaselineProcess(train_texts, train_labels, to_score, data.label_names, seed=seed)


def _collect_baseline(job: Any) -> Any:
    """Wait for the baseline's process; its result, said as an inline fit says it, or None (said too)."""
    from ..evaluation.baseline_process import BaselineProcessFailed

    try:
        result = job.result()
    except ValueError as error:
        _say_baseline_skipped(error)
        return None
    except BaselineProcessFailed as failure:
        print(f"baseline skipped: {failure}", file=sys.stderr)
        return None
    _say_baseline(result)
    return result


def _say_baseline_skipped(error: ValueError) -> None:
    # scikit-learn's vectorizers give up on a handful of reviews ("no terms remain"); the run need not.
    print(f"baseline skipped: it cannot be fit on these reviews ({error})", file=sys.stderr)


def _say_baseline(result: Any) -> None:
    scores = ", ".join(_split_scores(split, score) for split, score in result.scores.items())
    note = f"; {result.note}" if result.note else ""
    model = "ridge regression" if "ridge" in result.description else "logistic regression"
    print(f"baseline (TF-IDF + {model}, {result.fit_seconds:.1f}s): {scores}{note}", file=sys.stderr)


def _split_scores(split: str, score: dict[str, Any]) -> str:
    """One split's baseline scores: MAE and kappa first for ratings, micro-F1 first for tags."""
    if "mae" in score:
        first = f"MAE {score['mae']:.3f}, QWK {score['quadratic_weighted_kappa']:.3f}, "
    elif "micro_f1" in score:
        first = f"micro-F1 {score['micro_f1']:.3f}, "
    else:
        first = ""
    return f"{split} {first}accuracy {score['accuracy']:.3f}, macro-F1 {score['macro_f1']:.3f}"
