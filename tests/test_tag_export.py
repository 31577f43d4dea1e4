"""``finetune export --int8`` on a multi_label run: the export keeps the tags, and says how often int8 agrees with fp32.

The agreement the export records is checked against an independent count:
transformers' fp32 model and a sigmoid on one side, ``finetune predict`` on the
export (the path predict and serve take) on the other, compared pair by pair in Python.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_multi_label_run import tag_recipe
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.cli import main
from finetune.export.agreement import tag_agreement

pytest.importorskip("onnxruntime", reason="finetune export needs the [export] extra")
pytest.importorskip("openvino", reason="finetune export needs the [export] extra")

TAGS = ["delivery", "price", "size"]


@pytest.fixture(scope="module")
def tag_run(tmp_path_factory, tiny_model_dir) -> Path:
    folder = tmp_path_factory.mktemp("exported-tags")
    assert main(["train", str(tag_recipe(folder, tiny_model_dir, num_train_epochs=2))]) == 0
    return folder / "run"


def test_reference_count_of_agreeing_pairs():
    """tag_agreement against a loop over every review-tag pair."""
    rng = np.random.default_rng(0)
    fp32 = rng.random((40, 3))
    int8 = np.clip(fp32 + rng.normal(0, 0.05, fp32.shape), 0, 1)
    thresholds = np.array([0.3, 0.5, 0.7])
    same_pairs = same_reviews = 0
    for review in range(40):
        agrees = [(fp32[review, tag] >= thresholds[tag]) == (int8[review, tag] >= thresholds[tag]) for tag in range(3)]
        same_pairs += sum(agrees)
        same_reviews += all(agrees)
    found = tag_agreement(fp32, int8, thresholds, TAGS)
    assert found["pairs"] == 120 and found["reviews"] == 40
    assert found["pair_agreement"] == pytest.approx(same_pairs / 120)
    assert found["pairs_changed"] == 120 - same_pairs
    assert found["review_agreement"] == pytest.approx(same_reviews / 40)
    assert 0 < found["pairs_changed"] < 120  # the noise changes some pairs and not all: the check can fail


def fp32_tags(run: Path, reviews: list[str], thresholds: np.ndarray) -> np.ndarray:
    """The run's fp32 tags, read with transformers and a sigmoid, with no finetune code between."""
    model = AutoModelForSequenceClassification.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    with torch.no_grad():
        logits = model(**tokenizer(reviews, padding=True, truncation=True, max_length=32, return_tensors="pt")).logits
    return torch.sigmoid(logits).numpy() >= thresholds


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_the_export_keeps_the_tags_and_records_its_agreement_with_fp32(tag_run, tmp_path, capsys, backend):
    exported = tmp_path / "tags-int8"
    assert main(["export", str(tag_run), "--int8", "--backend", backend, "--output", str(exported)]) == 0
    error = capsys.readouterr().err
    # The folder carries the run's thresholds and says it is a multi-label model.
    assert (exported / "tag_thresholds.json").read_bytes() == (tag_run / "tag_thresholds.json").read_bytes()
    assert json.loads((exported / "config.json").read_text())["problem_type"] == "multi_label_classification"

    # finetune predict on the export (as serve reads it) against the fp32 tags, pair by pair.
    test_rows = [json.loads(line) for line in (tag_run.parent / "test.jsonl").read_text().splitlines()]
    output = tmp_path / "tags.jsonl"
    assert main(["predict", str(exported), "--input", str(tag_run.parent / "test.jsonl"), "--output", str(output)]) == 0
    int8_given = np.array(
        [[tag in json.loads(line)["labels"] for tag in TAGS] for line in output.read_text().splitlines()]
    )
    saved = json.loads((tag_run / "tag_thresholds.json").read_text())["thresholds"]
    fp32_given = fp32_tags(tag_run, [row["review"] for row in test_rows], np.array([saved[tag] for tag in TAGS]))
    record = json.loads((exported / "export.json").read_text())["tag_agreement"]
    assert record["split"] == "test" and record["reviews"] == len(test_rows) == 24 and record["pairs"] == 72
    assert record["pair_agreement"] == pytest.approx((fp32_given == int8_given).mean())
    assert record["review_agreement"] == pytest.approx((fp32_given == int8_given).all(axis=1).mean())
    assert f"int8 gives the same tags as fp32 on {record['pair_agreement']:.2%} of the 72 review-tag pairs" in error

    from finetune.serve.model import load_served_model

    served = load_served_model(exported)
    assert served.tags and served.predict(["cheap but late"])[0]["labels"] is not None


def test_near_a_threshold_against_a_loop():
    from finetune.export.fallback import near_a_threshold

    rng = np.random.default_rng(1)
    probabilities, thresholds = rng.random((50, 3)), np.array([0.2, 0.5, 0.9])
    near = [[abs(probabilities[row, tag] - thresholds[tag]) < 0.1 for tag in range(3)] for row in range(50)]
    expected = [row for row in range(50) if any(near[row])]
    assert near_a_threshold(probabilities, thresholds, 0.1).tolist() == expected
    assert 0 < len(expected) < 50


def test_fp32_fallback_on_tags_rescores_reviews_with_a_tag_near_its_threshold(tag_run, tmp_path, capsys):
    """At margin 1 every review is a close call, so the export gives fp32's tags: 100% agreement, all rescored."""
    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.export.fallback import Int8WithFallback

    exported = tmp_path / "tags-int8"
    command = ["export", str(tag_run), "--int8", "--backend", "onnxruntime", "--output", str(exported)]
    assert main([*command, "--fp32_fallback", "1"]) == 0
    record = json.loads((exported / "export.json").read_text())
    assert "within margin of the tag's threshold" in record["fp32_fallback"]["rule"]
    assert record["tag_agreement"]["pair_agreement"] == 1.0
    model, tokenizer = load_inference_model(exported, tags_read=True)
    assert isinstance(model, Int8WithFallback)
    saved = json.loads((tag_run / "tag_thresholds.json").read_text())["thresholds"]
    assert model.tag_thresholds.tolist() == [saved[tag] for tag in TAGS]
    reviews = ["cheap but late", "runs small", "okay"]
    fallback = predict_probabilities(model, tokenizer, reviews)
    fp32 = predict_probabilities(*load_inference_model(tag_run, tags_read=True), reviews)
    assert model.rescored == 3 and np.allclose(fallback, fp32, atol=1e-6)
    # A --threshold for every tag (predict, serve) is where a tag can change, so close calls are judged there.
    assert load_inference_model(exported, tags_read=True, threshold=0.3)[0].tag_thresholds.tolist() == [0.3] * 3
    capsys.readouterr()


def test_a_run_without_a_test_split_exports_and_says_the_agreement_was_not_measured(tmp_path, tiny_model_dir, capsys):
    recipe = tag_recipe(tmp_path, tiny_model_dir, num_train_epochs=1, save_strategy="no", load_best_model_at_end=False)
    lines = recipe.read_text().splitlines()
    recipe.write_text("\n".join(line for line in lines if not line.startswith("test_file")) + "\n")
    assert main(["train", str(recipe)]) == 0
    capsys.readouterr()
    exported = tmp_path / "tags-int8"
    assert main(["export", str(tmp_path / "run"), "--int8", "--backend", "onnxruntime", "--output", str(exported)]) == 0
    assert "the run has no test split on record, so int8's tags were not compared" in capsys.readouterr().err
    assert "tag_agreement" not in json.loads((exported / "export.json").read_text())
    # Training tunes and saves thresholds with the test scores, so such a run has none to carry.
    assert not (tmp_path / "run" / "tag_thresholds.json").exists() and not (exported / "tag_thresholds.json").exists()
