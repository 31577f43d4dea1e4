"""``finetune evaluate PATH [PATH ...]``: score a model folder, or every checkpoint of a run."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, as_keywords, option
from .shared import raw_csv_option
from .values import positive_int, resample_count, seed_int


@dataclass(frozen=True)
class EvaluateOptions:
    """The options of ``finetune evaluate``."""

    # argument() returns a dataclasses.field, not a default shared between instances.
    path: list[str] = argument(  # noqa: RUF009
        nargs="+", help="a run folder (output_dir) or a model/checkpoint folder; several to compare runs"
    )
    data: str | None = option(help="a labelled file with the recipe's columns (default: the run's test split)")
    split: str = option("test", help="which split of the run's data to score (default: test)")
    batch_size: int = option(32, type=positive_int)
    no_baseline: bool = option(False, help="skip the TF-IDF baseline row")
    resamples: int = option(1000, type=resample_count, help="bootstrap resamples for the 95%% intervals")
    seed: int = option(0, type=seed_int, help="seed of the bootstrap resamples (default: 0)")
    calibrate: bool = option(
        False,
        help="fit a temperature on validation and fold it into the folder's model (predict and pipeline() use it)",
    )
    no_explain: bool = option(
        False,
        help="leave the errors file's top_words empty (explaining takes a second or two per listed mistake on a CPU)",
    )
    raw_csv: bool = raw_csv_option("the errors file's", "--data")


def run(options: EvaluateOptions, extra: list[str]) -> None:
    """Score the folders; one folder is scored alone, several side by side."""
    from ..evaluate import evaluate

    evaluate(
        options.path if len(options.path) > 1 else options.path[0],
        baseline=not options.no_baseline,
        explain=not options.no_explain,
        **as_keywords(options, leave_out=("path", "no_baseline", "no_explain")),
    )


COMMAND = Command(
    "evaluate", help="score a model folder or every checkpoint of a run", options=EvaluateOptions, run=run
)
