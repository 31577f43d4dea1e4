"""``finetune predict MODEL``: a label and its probability for every review in a file or on stdin."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, as_keywords, option
from .shared import on_bad_text_option, raw_csv_option
from .values import positive_int


@dataclass(frozen=True)
class PredictOptions:
    """The options of ``finetune predict``."""

    model: str = argument(help="a model folder (a run's output_dir or a checkpoint)")
    input: str | None = option(help="CSV, TSV or JSONL with a text column; omit or '-' for one review per line")
    output: str | None = option(
        help="where to write (.csv, .tsv or .jsonl; no extension: as the input); default or '-': CSV on stdout"
    )
    text_column: str | None = option(help="the column holding the review (default: the recipe's, or 'text')")
    batch_size: int = option(32, type=positive_int)
    overwrite: bool = option(False, help="replace --output if it exists")
    explain: bool = option(False, help="add top_words: the words that pushed each review toward its label")
    threshold: float | None = option(
        help="a multi_label run's tags: give a tag where its probability reaches this, for every tag "
        "(default: each tag's own, tuned on validation, from tag_thresholds.json)"
    )
    check_ratings: bool = option(
        False,
        help="a regression or ordinal run: first read the ratings --input gives in the run's label_column, and "
        "refuse (exit 2, nothing written) one that is not a number, NaN or outside the model's levels",
    )
    raw_csv: bool = raw_csv_option("the output's", "--input")
    on_bad_text: str = on_bad_text_option("a JSON Lines row", "refused naming its line")


def run(options: PredictOptions, extra: list[str]) -> None:
    """Label the reviews, after checking that ``--output`` can be written."""
    from ..predict import STDOUT_NAMES, predict

    if options.output and options.output not in STDOUT_NAMES:
        from ...config.output_files import check_output_file

        # predict itself refuses an existing file without --overwrite, in its own words.
        check_output_file(options.output, replace=True)
    predict(
        options.model,
        input_path=options.input,
        output_path=options.output,
        **as_keywords(options, leave_out=("model", "input", "output")),
    )


COMMAND = Command("predict", help="label reviews from a CSV/JSONL file or stdin", options=PredictOptions, run=run)
