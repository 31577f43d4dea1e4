"""Formula starts hidden behind whitespace, a byte-order mark or a fullwidth sign are guarded too (issue 73).

A cell that begins with whitespace (a space, a newline, a no-break or
ideographic space), a byte-order mark or a zero-width character before a
formula start, or with a fullwidth ``＝ ＋ － ＠``, was written without the
leading ``'``. Spreadsheets trim such characters or fold fullwidth signs to
their ASCII forms (and OWASP's ASVS 1.2.10 adds the NUL to its list); the rule
(``finetune/config/csv_cells.py``) guards all of them, and a guarded cell
still reads back as it was.
"""

from __future__ import annotations

import pytest

from finetune.config.csv_cells import guard_cell, needs_guard, unguard_cell

HIDDEN_FORMULAS = [
    " =1+1",
    "   +1+cmd|' /C calc'!A0",
    "\u00a0=1+1",  # no-break space
    "\u3000=1+1",  # ideographic space
    "\u2003@SUM(1+1)",  # em space
    "\ufeff=1+1",  # byte-order mark
    "\u200b=1+1",  # zero-width space
    "\n=1+1",
    "\r\n=1+1",
    " \t =1+1",
    "\x00=1+1",
    "\uff1d1+1",  # fullwidth equals
    "\uff0b1+1",  # fullwidth plus
    "\uff0d1+1",  # fullwidth minus
    "\uff20SUM(1+1)",  # fullwidth at
    " \uff1d1+1",
]
PLAIN = ["plain review", " plain after a space", "\u3000日本語のレビュー", "a = b", "1+1", "x＝y", ""]


@pytest.mark.parametrize("value", HIDDEN_FORMULAS)
def test_a_formula_behind_whitespace_a_mark_or_in_fullwidth_is_guarded_and_reads_back(value):
    assert needs_guard(value)
    assert guard_cell(value) == "'" + value
    assert unguard_cell(guard_cell(value)) == value
    # A review's own quote before it survives the round trip, as for a plain formula.
    assert unguard_cell(guard_cell("'" + value)) == "'" + value


@pytest.mark.parametrize("value", PLAIN)
def test_text_that_starts_no_formula_is_written_as_it_is(value):
    assert not needs_guard(value)
    assert guard_cell(value) == value and unguard_cell(value) == value


def test_the_page_guards_by_the_same_rule():
    """``serve/static/app.js``'s ``needsGuard`` gives the same answer as :func:`needs_guard` (run with node)."""
    import json
    import random
    import re
    import shutil
    import subprocess
    from pathlib import Path

    import finetune

    node = shutil.which("node")
    if node is None:
        pytest.skip("needs node to run the page's script")
    script = (Path(finetune.__file__).parent / "serve" / "static" / "app.js").read_text(encoding="utf-8")
    pieces = [
        re.search(rf"const {name} = .*?;\n", script).group(0)
        for name in ("FORMULA_STARTS", "FORMULA_SIGNS", "HIDDEN_LEAD")
    ]
    pieces.append(re.search(r"function needsGuard\(text\) \{.*?\n\}\n", script, re.S).group(0))
    letters = ["=", "+", "-", "@", "'", " ", "\t", "\n", "\r", "\x00", "\xa0", "\u3000", "\ufeff", "\u200b"]
    letters += ["\uff1d", "\uff0b", "\uff0d", "\uff20", "a", "1", "\x1c", "\x85", "\u2060", "\u180e"]
    rng = random.Random(0)
    cases = HIDDEN_FORMULAS + PLAIN
    cases += ["".join(rng.choice(letters) for _ in range(rng.randint(0, 4))) for _ in range(3000)]
    program = "".join(pieces) + (
        "const cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "process.stdout.write(JSON.stringify(cases.map(needsGuard)));"
    )
    answered = subprocess.run(
        [node, "-e", program], input=json.dumps(cases), capture_output=True, text=True, check=True
    )
    differ = [case for case, answer in zip(cases, json.loads(answered.stdout)) if answer != needs_guard(case)]
    assert differ == []


# Formulas LibreOffice's Calc can evaluate, in the forms a review may hide them in (Calc's own separator, ';').
CALC_CASES = ["=1+1", " =1+1", "\u3000=1+1", "\ufeff=1+1", "\x00=1+1", "\n=1+1", "\uff1d1+1", "+1+1", "@SUM(1;1)"]


def _calc_formulas(tmp_path, cells: list[str], trim_spaces: bool) -> list[str]:
    """The cells Calc imports as formulas from a CSV of ``cells`` (one column), with Evaluate formulas on."""
    import csv
    import shutil
    import subprocess
    import xml.etree.ElementTree as ElementTree

    folder = tmp_path / f"calc-trim-{trim_spaces}"
    folder.mkdir(parents=True)
    with (folder / "cells.csv").open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([cell] for cell in ["cell", *cells])
    # Tokens: comma, double quote, UTF-8, from line 1, no column types, en-US, quoted not text, special numbers,
    # ..., trim spaces, sheet, evaluate formulas (LibreOffice's CSV filter options).
    options = f"CSV:44,34,76,1,,1033,false,true,false,false,{str(trim_spaces).lower()},-1,true"
    soffice = [shutil.which("soffice"), f"-env:UserInstallation=file://{tmp_path / 'profile'}", "--headless"]
    subprocess.run(
        [*soffice, f"--infilter={options}", "--convert-to", "fods", "--outdir", str(folder), str(folder / "cells.csv")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    table = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
    rows = ElementTree.parse(folder / "cells.fods").getroot().iter(f"{{{table}}}table-row")
    formulas = [row.find(f"{{{table}}}table-cell").get(f"{{{table}}}formula") for row in list(rows)[1:]]
    return [cell for cell, formula in zip(cells, formulas) if formula]


@pytest.mark.parametrize("trim_spaces", [False, True], ids=["as-is", "trim-spaces"])
def test_libreoffice_evaluates_no_guarded_cell(tmp_path, trim_spaces):
    """A real Calc import: the raw cells it runs (the negative control), and none once guarded."""
    import shutil

    if shutil.which("soffice") is None:
        pytest.skip("needs LibreOffice (apt-get install libreoffice-calc-nogui)")
    raw = _calc_formulas(tmp_path, CALC_CASES, trim_spaces)
    # LibreOffice 7.4 drops a NUL and runs what follows, and with Trim spaces runs a formula after a space.
    assert {"=1+1", "\x00=1+1"} <= set(raw) and (" =1+1" in raw) == trim_spaces, raw
    assert _calc_formulas(tmp_path / "guarded", [guard_cell(cell) for cell in CALC_CASES], trim_spaces) == []
