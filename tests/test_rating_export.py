"""``finetune export --int8`` on a star-rating run: the export keeps the decoding, and says how close int8's stars are.

The agreement the export records is checked against an independent count:
transformers' fp32 model decoded with numpy and the config's scale on one side,
``finetune predict`` on the export (the path predict and serve take) on the
other, compared review by review in Python.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from test_ratings_run import independent_logits

from finetune.cli import main
from finetune.config.tasks import ORDINAL, REGRESSION
from finetune.data.ratings import RatingScale
from finetune.export.agreement import rating_agreement
from finetune.training.ordered_heads import StarReader

pytest.importorskip("onnxruntime", reason="finetune export needs the [export] extra")
pytest.importorskip("openvino", reason="finetune export needs the [export] extra")

DECODING_FIELDS = ("finetune_task", "rating_levels", "rating_mean", "rating_std", "rating_decoding", "problem_type")
SCALE = RatingScale(levels=(1.0, 2.0, 3.0, 4.0, 5.0), mean=3.1, std=1.3)
NAMES = ("1", "2", "3", "4", "5")


def fp32_stars(run: Path, reviews: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each review's fp32 rating and level index: transformers' logits decoded with numpy, no finetune code between."""
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    levels = np.array(config["rating_levels"])
    logits = independent_logits(run, reviews)
    if config.get("finetune_task") == "ordinal":
        index = (np.cumprod(1 / (1 + np.exp(-logits)), axis=1) > 0.5).sum(axis=1)
        return levels[index], index
    ratings = np.clip(config["rating_mean"] + config["rating_std"] * logits[:, 0], levels.min(), levels.max())
    return ratings, np.abs(ratings[:, None] - levels[None, :]).argmin(axis=1)


def predicted_rows(model: Path, reviews_file: Path, output: Path) -> list[dict]:
    assert main(["predict", str(model), "--input", str(reviews_file), "--output", str(output)]) == 0
    with output.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize(
    ("task", "backend"), [("regression", "onnxruntime"), ("ordinal", "onnxruntime"), ("regression", "openvino")]
)
def test_the_export_keeps_the_decoding_and_records_its_agreement_with_fp32(
    tiny_regression_run, tiny_ordinal_run, tmp_path, capsys, task, backend
):
    run = tiny_regression_run if task == "regression" else tiny_ordinal_run
    exported = tmp_path / f"{task}-int8"
    assert main(["export", str(run), "--int8", "--backend", backend, "--output", str(exported)]) == 0
    error = capsys.readouterr().err
    saved, copied = (json.loads((folder / "config.json").read_text()) for folder in (run, exported))
    assert {key: copied.get(key) for key in DECODING_FIELDS} == {key: saved.get(key) for key in DECODING_FIELDS}

    # finetune predict on the export (as serve reads it) against fp32 decoded independently, review by review.
    rows = predicted_rows(exported, run.parent / "test.csv", tmp_path / "int8.csv")
    ratings, index = fp32_stars(run, [row["review"] for row in rows])
    int8_ratings = np.array([float(row["rating"]) for row in rows])
    int8_index = np.array([NAMES.index(row["label"]) for row in rows])
    record = json.loads((exported / "export.json").read_text())["rating_agreement"]
    assert record["split"] == "test" and record["reviews"] == len(rows) == 30
    assert record["level_agreement"] == pytest.approx((int8_index == index).mean())
    assert record["levels_changed"] == int((int8_index != index).sum())
    # predict writes ratings to 4 decimals.
    assert record["mean_absolute_rating_difference"] == pytest.approx(np.abs(int8_ratings - ratings).mean(), abs=1e-4)
    assert f"int8 gives the same level as fp32 on {record['level_agreement']:.2%} of the 30 reviews" in error

    from finetune.serve.model import load_served_model

    served = load_served_model(exported)
    assert served.task == task and served.predict([rows[0]["review"]])[0]["label"] == rows[0]["label"]


def test_fp32_fallback_on_ordinal_rescores_every_review_at_margin_1(tiny_ordinal_run, tmp_path, capsys):
    """At margin 1 every P(rating > level) is within it of 0.5: the export gives fp32's stars, all rescored."""
    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.export.fallback import Int8WithFallback

    exported = tmp_path / "ordinal-int8"
    command = ["export", str(tiny_ordinal_run), "--int8", "--backend", "onnxruntime", "--output", str(exported)]
    assert main([*command, "--fp32_fallback", "1"]) == 0
    record = json.loads((exported / "export.json").read_text())
    assert "int8 P(rating > level) within margin of 0.5" in record["fp32_fallback"]["rule"]
    assert record["rating_agreement"]["level_agreement"] == 1.0
    model, tokenizer = load_inference_model(exported, ratings_read=True)
    assert isinstance(model, Int8WithFallback) and model.stars.task == ORDINAL
    reviews = ["great product", "awful and broken", "okay"]
    outputs = predict_probabilities(model, tokenizer, reviews)
    above = np.cumprod(1 / (1 + np.exp(-independent_logits(tiny_ordinal_run, reviews))), axis=1)
    assert model.rescored == 3 and np.allclose(outputs, above, atol=1e-5)
    capsys.readouterr()


def test_rating_agreement_against_a_loop():
    rng = np.random.default_rng(0)
    fp32 = rng.normal(0, 1.2, (40, 1))
    int8 = fp32 + rng.normal(0, 0.1, fp32.shape)
    same = differences = 0
    for one, other in zip(fp32[:, 0], int8[:, 0]):
        first, second = (min(max(SCALE.mean + SCALE.std * value, 1.0), 5.0) for value in (one, other))
        same += round(first) == round(second)  # levels 1..5: the nearest is the rounded rating (no .5 ties here)
        differences += abs(first - second)
    found = rating_agreement(fp32, int8, StarReader(REGRESSION, SCALE, NAMES))
    assert found["reviews"] == 40 and found["levels_changed"] == 40 - same
    assert found["level_agreement"] == pytest.approx(same / 40)
    assert found["mean_absolute_rating_difference"] == pytest.approx(differences / 40)
    assert 0 < found["levels_changed"] < 40  # the noise changes some levels and not all: the check can fail


@pytest.mark.parametrize("task", [REGRESSION, ORDINAL])
def test_close_calls_against_a_loop(task):
    rng = np.random.default_rng(1)
    outputs = rng.normal(0, 1.2, (60, 1)) if task == REGRESSION else np.cumprod(rng.random((60, 4)), axis=1)
    expected = []
    for row, values in enumerate(outputs):
        if task == ORDINAL:
            near = any(abs(p - 0.5) < 0.05 for p in values)
        else:
            rating = SCALE.mean + SCALE.std * values[0]
            near = any(abs(rating - halfway) < 0.2 for halfway in (1.5, 2.5, 3.5, 4.5))
        if near:
            expected.append(row)
    margin = 0.05 if task == ORDINAL else 0.2
    assert StarReader(task, SCALE, NAMES).close_calls(outputs, margin).tolist() == expected
    assert 0 < len(expected) < 60
