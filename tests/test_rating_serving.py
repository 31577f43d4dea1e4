"""``finetune serve`` on a star-rating run, and ``predict --check_ratings``.

The server's answers are checked against an independent decoding of the run
folder: transformers' own model, then numpy with the config's ``rating_mean``,
``rating_std`` and ``rating_levels`` (regression) or CORN's running product of
sigmoids (ordinal). A rating the model cannot hold, given with
``--check_ratings``, is one line, exit 2, and nothing written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from bad_input.common import run_cli
from test_ratings_run import independent_logits, rated_reviews, write_csv

from finetune.cli import main

pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")

from fastapi.testclient import TestClient

from finetune.serve.app import create_app
from finetune.serve.model import load_served_model

REVIEWS = ["the product was great", "awful and broken", "it was okay really", "solid and good"]
LEVELS = ["1", "2", "3", "4", "5"]


def config_of(run: Path) -> dict:
    return json.loads((run / "config.json").read_text(encoding="utf-8"))


def answers(run: Path) -> tuple[list[dict], dict, object]:
    """``/predict``'s results for REVIEWS, ``/info``, and the ``/explain`` response."""
    with TestClient(create_app(load_served_model(run))) as client:
        predicted = client.post("/predict", json={"reviews": REVIEWS})
        info = client.get("/info").json()
        explained = client.post("/explain", json={"reviews": REVIEWS[:1]})
    assert predicted.status_code == 200, predicted.text
    return predicted.json()["results"], info, explained


def test_serve_rates_a_regression_review_as_its_config_decodes(tiny_regression_run):
    results, info, explained = answers(tiny_regression_run)
    config = config_of(tiny_regression_run)
    levels = np.array(config["rating_levels"])
    logits = independent_logits(tiny_regression_run, REVIEWS)[:, 0]
    ratings = np.clip(config["rating_mean"] + config["rating_std"] * logits, levels.min(), levels.max())
    nearest = [LEVELS[int(np.abs(levels - rating).argmin())] for rating in ratings]
    assert [set(result) for result in results] == [{"rating", "label"}] * len(REVIEWS)  # no prob_above
    assert [result["rating"] for result in results] == pytest.approx(ratings, abs=1e-4)
    assert [result["label"] for result in results] == nearest
    assert info["task"] == "regression" and info["classes"] == LEVELS
    report = json.loads((tiny_regression_run / "test_report.json").read_text(encoding="utf-8"))
    assert info["test"]["mae"] == report["mae"] and info["explain"] is False
    assert explained.status_code == 501
    assert "rates stars (a regression run), and /explain gives the words" in explained.json()["error"]


def test_serve_rates_an_ordinal_review_by_corns_running_product(tiny_ordinal_run):
    results, info, _ = answers(tiny_ordinal_run)
    logits = independent_logits(tiny_ordinal_run, REVIEWS)
    above = np.cumprod(1 / (1 + np.exp(-logits)), axis=1)
    levels = (above > 0.5).sum(axis=1)
    assert [result["label"] for result in results] == [LEVELS[level] for level in levels]
    assert [result["rating"] for result in results] == [float(level + 1) for level in levels]
    for result, row in zip(results, above, strict=True):
        assert list(result["prob_above"]) == LEVELS[:-1]
        assert list(result["prob_above"].values()) == pytest.approx(row, abs=1e-5)
    assert info["task"] == "ordinal" and info["classes"] == LEVELS


def test_serve_and_predict_give_a_review_the_same_stars(tiny_ordinal_run, tmp_path):
    """One decoding: predict's columns and serve's answer for the same reviews."""
    reviews = tmp_path / "reviews.csv"
    write_csv(reviews, [{"review": review, "stars": ""} for review in REVIEWS])
    output = tmp_path / "rated.csv"
    assert main(["predict", str(tiny_ordinal_run), "--input", str(reviews), "--output", str(output)]) == 0
    with output.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    served = load_served_model(tiny_ordinal_run).predict(REVIEWS)
    assert [row["label"] for row in rows] == [result["label"] for result in served]
    assert [float(row["prob_above_2"]) for row in rows] == [result["prob_above"]["2"] for result in served]


# ---------------------------------------------------------------- predict --check_ratings


def rated_file(tmp_path: Path, bad: str | None) -> Path:
    """The review file with the third row's rating replaced by ``bad`` (None: left as it is)."""
    rows = rated_reviews(6, 5)
    if bad is not None:
        rows[2]["stars"] = bad
    return write_csv(tmp_path / "given.csv", rows)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("7", "is outside the model's levels, 1 to 5 (rating_levels in its config.json)"),
        ("0.5", "is outside the model's levels, 1 to 5 (rating_levels in its config.json)"),
        ("four", "is not a number"),
        ("nan", "is not a finite number"),
    ],
)
def test_check_ratings_refuses_a_rating_the_model_cannot_hold(tiny_regression_run, tmp_path, capsys, bad, problem):
    given = rated_file(tmp_path, bad)
    output = tmp_path / "rated.csv"
    command = ["predict", tiny_regression_run, "--input", given, "--output", output, "--check_ratings"]
    message = run_cli(command, capsys)
    assert message == (
        f"error: {given} row 3: rating {bad!r} in 'stars' {problem}; fix the row, or leave out --check_ratings"
    )
    assert list(tmp_path.iterdir()) == [given]  # no output, no partial file


def test_check_ratings_refuses_a_nan_in_json_lines_before_anything_reaches_stdout(tiny_ordinal_run, tmp_path, capsys):
    given = tmp_path / "given.jsonl"
    given.write_text('{"review": "good", "stars": 4}\n{"review": "awful", "stars": NaN}\n', encoding="utf-8")
    message = run_cli(["predict", tiny_ordinal_run, "--input", given, "--check_ratings"], capsys)
    assert message == (
        f"error: {given} row 2: rating nan in 'stars' is not a finite number; fix the row, or leave out --check_ratings"
    )
    assert capsys.readouterr().out == ""


def test_check_ratings_passes_ratings_within_the_levels_and_empty_cells(tiny_regression_run, tmp_path):
    given = rated_file(tmp_path, "")  # a review with no rating is not checked
    output = tmp_path / "rated.csv"
    command = ["predict", str(tiny_regression_run), "--input", str(given), "--output", str(output), "--check_ratings"]
    assert main(command) == 0
    assert len(output.read_text(encoding="utf-8").splitlines()) == 7


def test_check_ratings_needs_the_runs_rating_column(tiny_regression_run, tmp_path, capsys):
    given = tmp_path / "given.csv"
    given.write_text("review,score\ngood,4\n", encoding="utf-8")
    message = run_cli(["predict", tiny_regression_run, "--input", given, "--check_ratings"], capsys)
    assert message == (
        f"error: --check_ratings reads the ratings in the run's label_column 'stars', and {given} has no such column; "
        "name the rating column 'stars', or leave out --check_ratings"
    )


def test_check_ratings_is_for_a_ratings_run(served_run, tmp_path, capsys):
    given = rated_file(tmp_path, None)
    message = run_cli(["predict", served_run, "--input", given, "--check_ratings"], capsys)
    assert message == (
        "error: --check_ratings checks the ratings given with a regression or ordinal run's reviews, and "
        f"{served_run} holds a single_label model; leave out --check_ratings"
    )


def test_the_page_shows_each_reviews_stars_and_prob_above(tiny_ordinal_run, tmp_path):
    """In headless Chromium, as a person would: the stars of the level CORN decodes, one bar per P(rating > level)."""
    import shutil

    sync_api = pytest.importorskip("playwright.sync_api", reason="the page test drives Chromium with playwright")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    from serving import ServerProcess

    server = ServerProcess(tiny_ordinal_run, tmp_path / "serve.log", "--threads", "1")
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto(f"http://127.0.0.1:{server.port}/")
            sync_api.expect(page.locator("#model-info")).to_contain_text("ordinal rating, levels: 1, 2, 3, 4, 5")
            page.fill("#reviews", "\n".join(REVIEWS[:2]))
            page.click("#run")
            rows = page.locator("tr.result")
            sync_api.expect(rows).to_have_count(2, timeout=60_000)
            glyphs = rows.locator(".star-glyphs").all_inner_texts()
            bars = rows.nth(0).locator(".probability .name").all_inner_texts()
            heading, button = page.locator("#label-heading").inner_text(), page.locator("#run").inner_text()
            page.screenshot(path=str(tmp_path / "serve-stars-page.png"), full_page=True)
            browser.close()
    finally:
        assert server.stop() == 0, (tmp_path / "serve.log").read_text()
    levels = (np.cumprod(1 / (1 + np.exp(-independent_logits(tiny_ordinal_run, REVIEWS[:2]))), axis=1) > 0.5).sum(
        axis=1
    )
    assert glyphs == ["★" * (level + 1) + "☆" * (4 - level) for level in levels]
    assert bars == ["> 1", "> 2", "> 3", "> 4"] and heading == "Stars" and button == "Rate"
