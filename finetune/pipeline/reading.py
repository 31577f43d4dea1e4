"""The data stage of a run: the reviews read, cleaned, split and tokenized, and a teacher's soft labels added."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import FinetuneError
from .baseline import start_baseline_beside

if TYPE_CHECKING:
    from ..config.recipes import Recipe
    from ..data.encoding import ReviewEncoding
    from ..data.splits import ReviewData
    from ..training.run_clock import RunClock


@dataclass
class RunInputs:
    """What the data stage hands on: the clean splits, the tokenizer, how reviews are encoded, the encoded splits."""

    data: ReviewData
    tokenizer: Any
    encoding: ReviewEncoding
    encoded: Any  # a datasets.DatasetDict of token ids


def read_data(run: Recipe, clock: RunClock, beside_the_run: contextlib.ExitStack | None) -> tuple[RunInputs, Any]:
    """Read, clean, map labels (dropping and counting bad rows) and tokenize; returns them and the baseline's process.

    The main process goes first, so the fetch and datasets caches are filled once. The baseline's process
    (None when it is not fitted beside the training) starts as soon as the splits are known.
    """
    from ..config.tasks import REGRESSION, head_size
    from ..data.encoding import ReviewEncoding
    from ..data.ratings import with_standardised_targets
    from ..data.splits import load_review_data, tokenize_splits
    from ..training.modeling import check_classifier_head, load_tokenizer

    args = run.training
    with args.main_process_first(desc="reading and tokenizing the data"):
        data = load_review_data(run.data, seed=args.seed)
        # The classes are known now, the model not loaded.
        check_classifier_head(run.model, head_size(data.task, len(data.label_names)))
        clock.lap("read")
        # Baseline: the obvious alternative, fit on the same train split, so every figure this run prints can
        # be read against it. Where cores are free (beside an accelerator, say) it is fitted in a process of
        # its own from here on and collected after training; elsewhere inline, after this stage.
        baseline_job = start_baseline_beside(data, args, beside_the_run)
        if baseline_job is not None:
            clock.lap("baseline")
        tokenizer = load_tokenizer(run.model, run.data.truncation_side)
        clock.lap("load")
        encoding = ReviewEncoding.from_fields(asdict(run.data))
        encoded, truncated = tokenize_splits(data.splits, tokenizer, encoding)
        if data.task == REGRESSION and data.scale is not None:
            encoded = with_standardised_targets(encoded, data.scale)  # the rating, as the model learns it
        clock.lap("tokenize")
    data.report.count_truncated(truncated, encoding)
    if "validation" not in encoded and (args.eval_strategy != "no" or args.load_best_model_at_end):
        raise FinetuneError(
            "the data has no validation split (validation_split_percentage 0); set eval_strategy: no and "
            "load_best_model_at_end: false to keep the final model, or hold some reviews out"
        )
    return RunInputs(data, tokenizer, encoding, encoded), baseline_job


def add_teacher(inputs: RunInputs, distillation: Any, args: Any, clock: RunClock) -> None:
    """The teacher's soft labels on every training review (and the unlabelled ones), once, before training."""
    with args.main_process_first(desc="the teacher's soft labels"):
        inputs.encoded["train"] = distillation.attach(
            inputs.data, inputs.encoded["train"], inputs.tokenizer, inputs.encoding, args.per_device_eval_batch_size
        )
    clock.lap("teacher")


def say_data_report(inputs: RunInputs, distillation: Any, args: Any) -> None:
    """What reading the data kept, dropped and truncated (and where a teacher's labels came from)."""
    if args.should_log:
        notes = distillation.notes if distillation else []
        print("\n".join(inputs.data.report.summary_lines() + notes), file=sys.stderr)
        _warn_if_reviews_exceed_the_token_budget(inputs, args)


def _warn_if_reviews_exceed_the_token_budget(inputs: RunInputs, args: Any) -> None:
    """Say once when ``micro_batch_tokens`` is below the longest training review.

    A review is never split, so each one longer than the budget becomes a micro-batch of its own,
    over the budget: ``--micro_batch_tokens 1`` trained one review at a time without a word.
    """
    budget = getattr(args, "micro_batch_tokens", None)
    if budget is None or budget >= inputs.encoding.max_length or "train" not in inputs.encoded:
        return  # no review is longer than max_length tokens
    if "length" not in inputs.encoded["train"].column_names:
        return
    lengths = inputs.encoded["train"]["length"]
    over = sum(1 for length in lengths if length > budget)
    if over:
        longest = max(lengths)
        print(
            f"warning: micro_batch_tokens {budget} is below the longest training review ({longest} tokens): "
            f"{over:,} of {len(lengths):,} reviews are each a micro-batch of its own, over the budget; set "
            f"--micro_batch_tokens {longest} or more",
            file=sys.stderr,
        )
