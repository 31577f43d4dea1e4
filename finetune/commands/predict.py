"""``finetune predict``: a label and its probability for every review in a file or on stdin.

Prediction streams: rows are read (:mod:`finetune.pipeline.review_rows`), scored and
written in batches of ``READ_ROWS`` (or fewer, when stdin has nothing more waiting), so memory stays
bounded on a file of any length and a review piped in on stdin is answered as
soon as it arrives. Output goes to a hidden ``.partial`` file beside
``--output`` that replaces it only when every row is written, so a failure
leaves an earlier output whole.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.csv_cells import guard_cell, guard_row
from ..data.bad_text import ON_BAD_TEXT
from ..errors import FinetuneError
from ..pipeline.review_rows import _guess_text_column, _model_inputs, _open_rows

# What --output's extension asks for; with no extension, the input's format.
OUTPUT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
# --output names that mean standard output.
STDOUT_NAMES = ("-", "/dev/stdout")


def predict(
    model_path: str,
    input_path: str | None = None,
    output_path: str | None = None,
    text_column: str | None = None,
    batch_size: int = 32,
    overwrite: bool = False,
    explain: bool = False,
    raw_csv: bool = False,
    on_bad_text: str = "refuse",
    threshold: float | None = None,
    check_ratings: bool = False,
) -> int:
    """Classify reviews from ``input_path`` (CSV, TSV or JSONL; stdin lines when None or '-'); returns the count.

    Writes the input rows plus ``label`` and ``probability`` (and one ``prob_<class>`` column per class)
    to ``output_path`` in the input's format, or CSV to stdout, a batch at a time. With ``explain``, a
    ``top_words`` column too: the words that pushed each review toward its label
    (:mod:`finetune.evaluation.explain`), as ``"word (score); ..."`` in CSV and TSV, a list of
    ``{"word", "score"}`` objects in JSONL; with tags, the words behind each tag given
    (``"tag: word (score) | tag: ..."``, an object of lists).

    A star-rating run writes ``label`` (the level) and ``rating`` (``_Stars``). A multi_label run writes
    ``labels``: the tags reaching their threshold (``tag_thresholds.json``, or ``threshold`` for all),
    joined by the run's ``label_separator`` (``|``) in CSV and TSV, a list in JSONL; and ``prob_<tag>``s.

    CSV and TSV cells that a spreadsheet would run as a formula are written
    after a ``'``, and a CSV or TSV input loses that ``'`` again
    (:mod:`finetune.config.csv_cells`); ``raw_csv`` writes and reads cells as they are.

    A JSON Lines row holding text that is not Unicode (a lone surrogate, which
    the tokenizer cannot encode) is refused naming its line, before anything
    is written; with ``on_bad_text="replace"`` it is read with U+FFFD in its
    place (:mod:`finetune.data.bad_text`). With ``check_ratings``, a ratings run's given ratings are checked first.
    """
    from ..training.runs import find_run_config

    # Every check before the model loads: a mistake costs a second, not an inference.
    model_dir = Path(model_path)
    output_path = _checked_output(model_dir, output_path, batch_size, overwrite, explain, on_bad_text, threshold)
    data_fields = (find_run_config(model_dir) or {}).get("data", {})
    _check_given_ratings(check_ratings, model_dir, input_path, data_fields, (raw_csv, on_bad_text))
    rows, input_format = _open_rows(input_path, raw_csv=raw_csv, on_bad_text=on_bad_text)
    with _Output(output_path, input_format, replace=overwrite, raw_csv=raw_csv) as output, rows:
        batches = rows.batches()
        if not rows.is_stdin:
            # A file's first rows are read before the model loads, so a broken file costs no load;
            # stdin is not waited on, so the first review piped in finds the model ready.
            first = list(itertools.islice(batches, 1))
            batches = itertools.chain(first, batches)
        reading = _Reading(model_dir, data_fields, text_column, input_path, batch_size, explain, threshold)
        count, empty_reviews = _predict_batches(batches, reading, output)
        if count == 0 and rows.is_stdin:
            raise FinetuneError("no reviews on stdin; pipe one review per line or pass --input FILE")
        if count == 0:
            raise FinetuneError(f"{input_path} has no rows; give it at least one review")
    _say_notes(rows.repaired_lines, empty_reviews, count)
    if output_path:
        print(f"wrote {count} predictions to {output_path}", file=sys.stderr)
    return count


def _checked_output(
    model_dir: Path,
    output_path: str | None,
    batch_size: int,
    overwrite: bool,
    explain: bool,
    on_bad_text: str,
    threshold: float | None = None,
) -> str | None:
    """``--output`` checked before anything is read (None: standard output), with the other options."""
    from ..config.output_files import is_stream
    from ..evaluation.inference import check_batch_size
    from ..evaluation.tag_thresholds import check_threshold

    check_batch_size(batch_size)
    check_threshold(threshold)
    if on_bad_text not in ON_BAD_TEXT:
        raise FinetuneError(f"--on_bad_text must be one of {', '.join(ON_BAD_TEXT)} (got {on_bad_text!r})")
    if explain and model_dir.is_dir():
        from ..evaluation.explain import require_explainable_folder

        require_explainable_folder(model_dir)
    if output_path and output_path.endswith(("/", os.sep)):
        # Path() drops the slash, so "out/" would become a file named "out".
        raise FinetuneError(
            f"--output {output_path} names a folder; give a file name, e.g. {output_path}predictions.csv"
        )
    if output_path in STDOUT_NAMES:
        # Standard output itself, not the file /dev/stdout names (renamed over, it would be the shell's file replaced).
        output_path = None
    if output_path and Path(output_path).exists() and not is_stream(output_path) and not overwrite:
        # A pipe or a device (/dev/null) is written into, not replaced: --overwrite is for files.
        raise FinetuneError(f"{output_path} already exists; pass --overwrite to replace it or choose another --output")
    suffix = Path(output_path).suffix.lower() if output_path else ""
    if suffix and suffix not in OUTPUT_FORMATS:
        # Before the input's encoding check, which reads the whole file.
        raise FinetuneError(
            f"--output {output_path}: unknown file type {suffix}; end it in .csv, .tsv or .jsonl (or .json for JSONL)"
        )
    return output_path


def _check_given_ratings(
    asked: bool, model_dir: Path, input_path: str | None, data_fields: dict[str, Any], reading: tuple[bool, str]
) -> None:
    """``--check_ratings`` (``asked``): refuse a rating in the run's label_column that the model's levels cannot hold.

    A rating that is not a number, NaN or outside the levels is refused naming its row. A whole pass over
    the file before the model loads, so a bad row on the last line leaves nothing written, to a file or to
    stdout. ``reading`` is ``(raw_csv, on_bad_text)``, as the rows are read for scoring.
    """
    from ..config.tasks import task_of_folder
    from ..data.ratings import check_given_rating
    from ..training.model_files import read_json_object
    from ..training.ordered_heads import StarReader

    if not asked or task_of_folder(model_dir) is None:
        return  # no readable config.json: loading the model refuses the folder in its own words
    stars = StarReader.of_config(read_json_object(model_dir / "config.json", "copy the run again"), model_dir)
    if stars is None:
        raise FinetuneError(
            f"--check_ratings checks the ratings given with a regression or ordinal run's reviews, and {model_dir} "
            f"holds a {task_of_folder(model_dir)} model; leave out --check_ratings"
        )
    if any(not _is_number(name) for name in stars.level_names):
        raise FinetuneError(
            f"--check_ratings compares ratings with the model's levels, and {model_dir}'s are named "
            f"({', '.join(stars.level_names)}), not numbers; leave out --check_ratings"
        )
    if input_path in (None, "-"):
        raise FinetuneError(
            "--check_ratings reads a file's rating column, and stdin gives reviews only; pass --input FILE"
        )
    column = data_fields.get("label_column") or "label"
    rows, _ = _open_rows(input_path, raw_csv=reading[0], on_bad_text=reading[1])
    rated = 0  # rows with the column: a JSON Lines row may lack it (no rating given), but not every row
    fix = "fix the row, or leave out --check_ratings"
    with rows:
        for number, row in enumerate(rows.rows, start=1):
            rated += column in row
            check_given_rating(row.get(column), f"{input_path} row {number}", column, stars.scale.levels, fix)
    if not rated:
        raise FinetuneError(
            f"--check_ratings reads the ratings in the run's label_column '{column}', and {input_path} has no such "
            f"column; name the rating column '{column}', or leave out --check_ratings"
        )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class _Reading:
    """How the rows are read and scored: the model folder, its recipe's data fields, and the options."""

    model_dir: Path
    data_fields: dict[str, Any]
    text_column: str | None
    input_path: str | None
    batch_size: int
    explain: bool
    threshold: float | None = None


def _predict_batches(
    batches: Iterator[list[dict[str, Any]]], reading: _Reading, output: _Output
) -> tuple[int, list[int]]:
    """Score and write every batch; returns the rows written and the (1-based) numbers of the empty reviews."""
    from tqdm.auto import tqdm

    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import load_inference_model, predict_probabilities, warn_if_model_changed

    model, tokenizer = load_inference_model(
        reading.model_dir, tags_read=True, threshold=reading.threshold, ratings_read=True
    )
    # After the check: a model that does not work is refused in one line, with no warning before it.
    warn_if_model_changed(reading.model_dir, "its predictions")
    tags = _Tags.of(model, reading, output.format) or _Stars.of(model, reading)
    fields = reading.data_fields
    encoding = ReviewEncoding.from_fields(fields)
    label_names = [model.config.id2label[index] for index in range(model.config.num_labels)]
    bar = tqdm(desc="predict", unit=" reviews", dynamic_ncols=True, disable=None)
    column = None
    count = 0
    empty_reviews: list[int] = []  # 1-based, in input order
    for batch in batches:
        column = (
            column or reading.text_column or _guess_text_column(batch, fields.get("text_column"), reading.input_path)
        )
        texts = _model_inputs(
            batch, column, fields.get("title_column"), fields.get("clean_text", True), reading.input_path, count + 1
        )
        # An empty review is not scored: training drops such rows and stdin skips blank lines.
        empty_reviews += [count + index + 1 for index, text in enumerate(texts) if not text]
        nonempty = [text for text in texts if text]
        probabilities = (
            predict_probabilities(model, tokenizer, nonempty, reading.batch_size, encoding) if nonempty else []
        )
        # The model's columns for each non-empty review, joined to its input row below.
        results = [_result({}, probs, label_names) if tags is None else tags.result(probs) for probs in probabilities]
        if reading.explain:
            _add_top_words(
                results, (model, tokenizer), nonempty, probabilities, reading.batch_size, encoding, output.format, tags
            )
        answers = iter(results)
        output.write(
            [
                {**row, **next(answers)} if text else _no_result(row, label_names, reading.explain, tags)
                for row, text in zip(batch, texts)
            ]
        )
        count += len(batch)
        bar.update(len(batch))
    bar.close()
    return count, empty_reviews


def _say_notes(repaired_lines: list[int], empty_reviews: list[int], count: int) -> None:
    """Say which reviews were read with U+FFFD (--on_bad_text replace) and which were empty."""
    if repaired_lines:
        shown = ", ".join(map(str, repaired_lines[:10])) + (", ..." if len(repaired_lines) > 10 else "")
        print(
            f"note: {len(repaired_lines)} review{'s' if len(repaired_lines) > 1 else ''} held text that is "
            f"not Unicode (line{'s' if len(repaired_lines) > 1 else ''} {shown}), read with U+FFFD in its place "
            "(--on_bad_text replace)",
            file=sys.stderr,
        )
    if empty_reviews:
        shown = ", ".join(map(str, empty_reviews[:10])) + (", ..." if len(empty_reviews) > 10 else "")
        print(
            f"note: {len(empty_reviews)} of {count} reviews are empty (review {shown}) and got an empty label, "
            "as training drops empty reviews",
            file=sys.stderr,
        )


def _result(row: dict[str, Any], probs: Any, label_names: list[str]) -> dict[str, Any]:
    best = int(probs.argmax())
    result = {**row, "label": label_names[best], "probability": round(float(probs[best]), 6)}
    result.update({f"prob_{name}": round(float(p), 6) for name, p in zip(label_names, probs)})
    return result


def _no_result(row: dict[str, Any], label_names: list[str], explain: bool = False, tags: Any = None) -> dict[str, Any]:
    """The columns of a result, empty: for a review with no text, which no label describes."""
    if isinstance(tags, _Stars):
        return {**row, **tags.empty()}
    given = {"labels": None} if tags else {"label": "", "probability": None}
    empty = {**row, **given, **{f"prob_{name}": None for name in label_names}}
    return {**empty, "top_words": None} if explain else empty


@dataclass
class _Tags:
    """How a multi_label run's tags are given: each tag's threshold, and how a set of tags is written."""

    names: list[str]
    thresholds: Any  # one per tag
    separator: str
    as_list: bool  # JSON Lines: a list; CSV and TSV: the tags joined by the separator

    @classmethod
    def of(cls, model: Any, reading: _Reading, output_format: str) -> _Tags | None:
        """A multi_label model's tags, at the run's thresholds or ``--threshold`` (None for one label per review)."""
        from ..evaluation.tag_thresholds import tag_thresholds

        if getattr(model.config, "problem_type", None) != "multi_label_classification":
            return None
        names = [model.config.id2label[index] for index in range(model.config.num_labels)]
        thresholds = tag_thresholds(reading.model_dir, names, reading.threshold)
        separator = reading.data_fields.get("label_separator") or "|"
        return cls(names, thresholds, separator, output_format == "jsonl")

    def result(self, probs: Any) -> dict[str, Any]:
        """A review's tags (those at or above their threshold) and every tag's probability."""
        given = [name for name, p, limit in zip(self.names, probs, self.thresholds) if p >= limit]
        result: dict[str, Any] = {"labels": given if self.as_list else self.separator.join(given)}
        result.update({f"prob_{name}": round(float(p), 6) for name, p in zip(self.names, probs)})
        return result


@dataclass
class _Stars:
    """How a star-rating run's reviews are written: the columns of :class:`~finetune.training.ordered_heads.StarReader`.

    ``rating`` is a regression's output mapped back and clipped to the levels' range (``label`` the nearest
    level), or an ordinal run's level; an ordinal run adds ``prob_above_<level>``, P(rating > level), per output.
    """

    reader: Any  # a StarReader

    @classmethod
    def of(cls, model: Any, reading: _Reading) -> _Stars | None:
        """The stars of a regression or ordinal model (None for another); refuses ``--explain`` with them."""
        from ..training.ordered_heads import StarReader

        reader = StarReader.of_config(model.config, reading.model_dir)
        if reader is None:
            return None
        if reading.explain:
            raise FinetuneError(
                f"--explain gives the words behind a class's probability, and this run rates stars ({reader.task}); "
                "drop --explain"
            )
        return cls(reader)

    def result(self, outputs: Any) -> dict[str, Any]:
        """A review's level and rating (and for ordinal, each P(rating > level))."""
        stars = self.reader.rate(outputs[None, :])[0]
        result: dict[str, Any] = {"label": stars.label, "rating": stars.rating}
        result.update({f"prob_above_{name}": p for name, p in (stars.prob_above or {}).items()})
        return result

    def empty(self) -> dict[str, Any]:
        """The columns of a result, empty (a review with no text)."""
        from ..config.tasks import ORDINAL

        above = self.reader.level_names[:-1] if self.reader.task == ORDINAL else []
        return {"label": "", "rating": None, **{f"prob_above_{name}": None for name in above}}


def _add_top_words(
    results: list[dict[str, Any]],
    model_and_tokenizer: tuple[Any, Any],
    texts: list[str],
    probabilities: Any,
    batch_size: int,
    encoding: Any,
    output_format: str,
    tags: _Tags | None = None,
) -> None:
    """Add each result's ``top_words``: the words behind the label predict gave it (one cell, or a JSON list).

    With tags, the words behind each tag given: ``"tag: word (score); ... | tag: ..."`` in one cell,
    or a JSON object of a list per tag.
    """
    from ..evaluation.explain import explain_predictions, explain_tag_predictions, format_top_words

    if not texts:
        return
    model, tokenizer = model_and_tokenizer
    settings = {"batch_size": batch_size, "max_length": encoding.max_length}
    if tags is None:
        explanations: list[Any] = explain_predictions(model, tokenizer, texts, probabilities, **settings)
    else:
        explanations = explain_tag_predictions(model, tokenizer, texts, probabilities, tags.thresholds, **settings)
    for result, explanation in zip(results, explanations):
        if output_format != "jsonl":
            result["top_words"] = format_top_words(explanation)
        elif tags is None:
            result["top_words"] = _word_objects(explanation.top_words())
        else:
            result["top_words"] = {tag: _word_objects(words) for tag, words in explanation.top_words().items()}


def _word_objects(words: list[Any]) -> list[dict[str, Any]]:
    """Words and their scores as JSON objects, the score rounded to 4 places."""
    return [{"word": word.word, "score": round(word.score, 4)} for word in words]


# ------------------------------------------------------------------ writing


class _Output:
    """Where predictions go, opened before the model loads; a file is written whole or not at all (output_file)."""

    def __init__(
        self, output_path: str | None, input_format: str, replace: bool = False, raw_csv: bool = False
    ) -> None:
        from ..config.output_files import OUTPUT_FLAG, output_file

        self.path = Path(output_path) if output_path else None
        self.writer: csv.DictWriter | None = None
        self.raw_csv = raw_csv
        if self.path is None:
            self.format, self.handle, self.file = "csv", sys.stdout, None
            return
        suffix = self.path.suffix.lower()  # one of OUTPUT_FORMATS or none: predict() checked it
        self.format = OUTPUT_FORMATS[suffix] if suffix else input_format
        # Without --overwrite, a file another process finished meanwhile is kept, not renamed over.
        self.file = output_file(self.path, instead=OUTPUT_FLAG, replace=replace)
        self.handle = self.file.__enter__()

    def __enter__(self) -> _Output:
        return self

    def write(self, results: list[dict[str, Any]]) -> None:
        """Write one batch and flush it, so a reader of a stream sees each answer at once."""
        if self.format == "jsonl":
            for result in results:
                self.handle.write(json.dumps(result, ensure_ascii=False) + "\n")
        else:
            if self.writer is None:
                # Rows of a JSONL input may differ in keys: the first row's columns, missing ones left empty.
                self.writer = csv.DictWriter(
                    self.handle,
                    fieldnames=list(results[0]),
                    extrasaction="ignore",
                    delimiter="\t" if self.format == "tsv" else ",",
                )
                # Column names come from the input's header: user text, guarded like any cell.
                names = list(results[0])
                self.writer.writerow(dict(zip(names, names if self.raw_csv else map(guard_cell, names))))
            self.writer.writerows(results if self.raw_csv else map(guard_row, results))
        self.handle.flush()

    def __exit__(self, error_type: type[BaseException] | None, error: BaseException | None, traceback: Any) -> None:
        # output_file flushes, syncs and renames into place, or removes what it wrote and raises.
        if self.file is not None:
            self.file.__exit__(error_type, error, traceback)
