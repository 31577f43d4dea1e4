"""``finetune serve`` on a multi_label run: each review's tags at the run's thresholds, every tag's score, chips.

The answers are checked against an independent reading of the run folder:
transformers' own model, a sigmoid, and the thresholds in ``tag_thresholds.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from bad_input.common import run_cli
from test_multi_label_run import tag_recipe
from transformers import AutoModelForSequenceClassification, AutoTokenizer

pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")

from fastapi.testclient import TestClient

from finetune.cli import main
from finetune.serve.app import create_app
from finetune.serve.model import load_served_model

TAGS = ["delivery", "price", "size"]
REVIEWS = ["cheap but the courier was late", "it runs small and tight", "the product was okay"]


@pytest.fixture(scope="module")
def tag_run(tmp_path_factory, tiny_model_dir) -> Path:
    folder = tmp_path_factory.mktemp("served-tags")
    assert main(["train", str(tag_recipe(folder, tiny_model_dir, num_train_epochs=2))]) == 0
    return folder / "run"


def reference_probabilities(run: Path, reviews: list[str]) -> np.ndarray:
    """transformers' model in ``run`` and a sigmoid per tag, with no finetune code between."""
    model = AutoModelForSequenceClassification.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    with torch.no_grad():
        logits = model(**tokenizer(reviews, padding=True, truncation=True, max_length=32, return_tensors="pt")).logits
    return torch.sigmoid(logits).numpy()


def saved_thresholds(run: Path) -> np.ndarray:
    thresholds = json.loads((run / "tag_thresholds.json").read_text())["thresholds"]
    return np.array([thresholds[name] for name in TAGS])


def test_predict_answers_the_tags_at_the_runs_thresholds_and_every_score(tag_run):
    with TestClient(create_app(load_served_model(tag_run))) as client:
        answer = client.post("/predict", json={"reviews": REVIEWS})
        info = client.get("/info").json()
    assert answer.status_code == 200, answer.text
    expected = reference_probabilities(tag_run, REVIEWS)
    thresholds = saved_thresholds(tag_run)
    for result, row in zip(answer.json()["results"], expected, strict=True):
        assert set(result) == {"labels", "scores"}
        assert list(result["scores"]) == TAGS
        assert np.allclose([result["scores"][name] for name in TAGS], row, atol=1e-5)
        assert result["labels"] == [name for name, p, limit in zip(TAGS, row, thresholds) if p >= limit]
    assert info["task"] == "multi_label" and info["classes"] == TAGS
    assert info["thresholds"] == pytest.approx(dict(zip(TAGS, thresholds)))
    report = json.loads((tag_run / "test_report.json").read_text())
    assert info["test"]["micro_f1"] == report["micro_f1"] and info["explain"] is True


@pytest.mark.parametrize("threshold", [0.01, 0.99])
def test_threshold_gives_every_tag_one_threshold(tag_run, threshold):
    """At 0.01 every tag of a sigmoid model is given, at 0.99 (almost surely) none: the flag, not the file, decides."""
    served = load_served_model(tag_run, threshold=threshold)
    results = served.predict(REVIEWS)
    expected = reference_probabilities(tag_run, REVIEWS)
    for result, row in zip(results, expected, strict=True):
        assert result["labels"] == [name for name, p in zip(TAGS, row) if p >= threshold]
    assert served.tag_thresholds.tolist() == [threshold] * 3


def test_explain_gives_the_words_behind_each_tag_given(tag_run):
    with TestClient(create_app(load_served_model(tag_run, threshold=0.01))) as client:
        explained = client.post("/explain", json={"reviews": REVIEWS, "top_k": 2})
        predicted = client.post("/predict", json={"reviews": REVIEWS})
    assert explained.status_code == 200, explained.text
    for result, prediction in zip(explained.json()["results"], predicted.json()["results"], strict=True):
        assert result["labels"] == prediction["labels"] == TAGS  # at 0.01 every tag is given
        assert result["scores"] == prediction["scores"]
        assert list(result["words"]) == list(result["top_words"]) == TAGS
        for tag in TAGS:
            assert [word["word"] for word in result["words"][tag]] == result["text"].split()
            assert all(result["text"][word["start"] : word["end"]] == word["word"] for word in result["words"][tag])
            assert len(result["top_words"][tag]) <= 2


@pytest.mark.parametrize("threshold", ["0", "1", "1.5", "-0.2"])
def test_a_threshold_outside_0_1_is_one_line_before_anything_loads(tag_run, threshold, capsys):
    error = run_cli(["serve", str(tag_run), "--port", "0", "--threshold", threshold], capsys)
    assert error == f"error: --threshold must be between 0 and 1 (got {float(threshold)}); e.g. --threshold 0.5"


def test_a_tags_run_without_its_thresholds_file_serves_at_0_5_and_says_so(tag_run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(tag_run, copy)
    (copy / "tag_thresholds.json").unlink()
    served = load_served_model(copy)
    assert served.tag_thresholds.tolist() == [0.5, 0.5, 0.5]
    assert "no tag_thresholds.json beside the model; every tag's threshold is 0.5" in capsys.readouterr().err


def test_the_page_shows_each_reviews_tags_as_chips_and_every_tags_probability(tag_run, tmp_path):
    """In headless Chromium, as a person would: the tags as chips, one probability bar per tag."""
    import shutil as which

    sync_api = pytest.importorskip("playwright.sync_api", reason="the page test drives Chromium with playwright")
    chromium = which.which("chromium") or which.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    from serving import ServerProcess

    # --threshold 0.01: every tag is given, so the chips the page must show are known without the model.
    server = ServerProcess(tag_run, tmp_path / "serve.log", "--threads", "1", "--threshold", "0.01")
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto(f"http://127.0.0.1:{server.port}/")
            sync_api.expect(page.locator("#model-info")).to_contain_text("tags: delivery, price, size")
            page.fill("#reviews", REVIEWS[0])
            page.click("#run")
            row = page.locator("tr.result")
            sync_api.expect(row).to_have_count(1, timeout=60_000)
            chips = row.locator("td.tags .tag").all_inner_texts()
            names = row.locator(".probability .name").all_inner_texts()
            page.screenshot(path=str(tmp_path / "serve-tags-page.png"), full_page=True)
            heading = page.locator("#label-heading").inner_text()
            button = page.locator("#run").inner_text()
            browser.close()
    finally:
        assert server.stop() == 0, (tmp_path / "serve.log").read_text()
    assert chips == TAGS and names == TAGS and heading == "Tags" and button == "Tag and explain"
