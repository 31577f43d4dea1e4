"""Formula injection: no review written into a CSV the project makes can run as a spreadsheet formula.

A cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return
is written after a ``'`` (OWASP's advice), in predict's CSV and TSV (a file or
stdout) and in evaluate's ``errors_<split>.csv``; reading such a file back
(``predict --input``, ``evaluate --data``) strips the ``'`` again, so a round
trip gives the reviews back as they were. ``--raw_csv`` writes and reads cells
as they are. The page's download is tested in ``test_serve_page.py``.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from finetune.cli import main
from finetune.config.csv_cells import FORMULA_STARTS, guard_cell, unguard_cell

# What the adversarial round sent (issue 48), and each other start a spreadsheet reads as a formula.
FORMULAS = [
    '=HYPERLINK("http://example.com/x","click")',
    "+1+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1 after a tab",
    "\r=1+1 after a carriage return",
]
# A ' the user wrote themselves must survive the round trip too, not be taken for the guard.
TRICKY = ["'=already quoted", "''=twice", "'plain quote", "'", "plain review"]
REVIEWS = FORMULAS + TRICKY


def write_reviews(path, reviews, delimiter=","):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(["id", "review", "stars"])
        writer.writerows([index, review, 1 + index % 5] for index, review in enumerate(reviews))


def raw_cells(text: str, delimiter: str = ",") -> list[list[str]]:
    """Every cell as the file holds it (what a spreadsheet sees), header row included."""
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


def file_cells(path, delimiter: str = ",") -> list[list[str]]:
    """:func:`raw_cells` of a file, its line ends kept (a carriage return inside a cell is part of the review)."""
    with path.open(newline="", encoding="utf-8") as handle:
        return raw_cells(handle.read(), delimiter)


def no_cell_starts_a_formula(rows: list[list[str]]) -> None:
    starts = [cell for row in rows for cell in row if cell.startswith(FORMULA_STARTS)]
    assert starts == [], starts


@pytest.mark.parametrize("value", [*REVIEWS, "", "-", "=", "'-", "''", "x=1", "0.5", "-0.5"])
def test_a_guarded_cell_reads_back_as_it_was(value):
    guarded = guard_cell(value)
    assert not guarded.startswith(FORMULA_STARTS)
    assert unguard_cell(guarded) == value


def test_numbers_are_not_cells_of_text():
    # The project's own numbers (probabilities) are written as numbers, never quoted.
    assert guard_cell(-0.5) == -0.5 and guard_cell(None) is None


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_predict_writes_no_formula_and_reads_its_own_file_back_whole(run_copy, tmp_path, suffix):
    delimiter = "\t" if suffix == ".tsv" else ","
    source = tmp_path / f"formula{suffix}"
    write_reviews(source, REVIEWS, delimiter)
    first = tmp_path / f"predictions{suffix}"
    assert main(["predict", str(run_copy / "run"), "--input", str(source), "--output", str(first)]) == 0
    cells = file_cells(first, delimiter)
    no_cell_starts_a_formula(cells)
    written = [row[cells[0].index("review")] for row in cells[1:]]
    assert written[: len(FORMULAS)] == ["'" + text for text in FORMULAS]
    # Reading strips a ' before a formula start, whoever wrote the file: the input's '=x was read as =x.
    assert [unguard_cell(cell) for cell in written] == [unguard_cell(text) for text in REVIEWS]
    # The file predict wrote, given to predict again: every cell comes back as it was written.
    second = tmp_path / f"again{suffix}"
    assert main(["predict", str(run_copy / "run"), "--input", str(first), "--output", str(second)]) == 0
    assert file_cells(second, delimiter) == cells


def test_predict_on_stdout_writes_no_formula(run_copy, tmp_path, capsys):
    source = tmp_path / "formula.jsonl"
    source.write_text("".join(json.dumps({"review": text}) + "\n" for text in REVIEWS), encoding="utf-8")
    assert main(["predict", str(run_copy / "run"), "--input", str(source)]) == 0
    cells = raw_cells(capsys.readouterr().out)
    no_cell_starts_a_formula(cells)
    # JSON Lines are no CSV: their text is read as it is, and only written guarded.
    assert [unguard_cell(row[0]) for row in cells[1:]] == REVIEWS


def test_predict_raw_csv_writes_and_reads_cells_as_they_are(run_copy, tmp_path):
    source = tmp_path / "formula.csv"
    write_reviews(source, REVIEWS)
    output = tmp_path / "raw.csv"
    command = ["predict", str(run_copy / "run"), "--input", str(source), "--output", str(output), "--raw_csv"]
    assert main(command) == 0
    with output.open(newline="", encoding="utf-8") as handle:
        assert [row["review"] for row in csv.DictReader(handle)] == REVIEWS


def test_evaluate_reads_a_guarded_file_back_and_writes_an_errors_file_with_no_formula(run_copy):
    # The errors file holds reviews as the model read them: cleaned, so no leading tab or carriage return.
    reviews = FORMULAS[:4] + TRICKY
    scored = run_copy / "scored.csv"
    with scored.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "stars"])
        # As the project writes them: guarded, so evaluate must strip the guard to score the review itself.
        writer.writerows([guard_cell(text), 1 + index % 5] for index, text in enumerate(reviews))
        # And as a user's own file may hold them: formulas as they are.
        writer.writerows([text, 1] for text in FORMULAS[:4])
    command = ["evaluate", str(run_copy / "run"), "--data", str(scored), "--no_baseline", "--resamples", "10"]
    assert main([*command, "--no_explain"]) == 0
    cells = file_cells(run_copy / "run" / "errors_data-scored.csv")
    no_cell_starts_a_formula(cells)
    texts = [row[0] for row in cells[1:]]
    # Guarded once, not twice: the ' the file held was stripped on reading.
    assert sorted(unguard_cell(text) for text in texts) == sorted(reviews + FORMULAS[:4])
    assert sorted(texts) == sorted(guard_cell(text) for text in reviews + FORMULAS[:4])


def test_evaluate_raw_csv_writes_the_errors_file_as_it_is(run_copy):
    scored = run_copy / "scored.csv"
    write_reviews(scored, FORMULAS[:4])
    command = ["evaluate", str(run_copy / "run"), "--data", str(scored), "--no_baseline", "--resamples", "10"]
    assert main([*command, "--no_explain", "--raw_csv"]) == 0
    with (run_copy / "run" / "errors_data-scored.csv").open(newline="", encoding="utf-8") as handle:
        assert sorted(row["text"] for row in csv.DictReader(handle)) == sorted(FORMULAS[:4])
