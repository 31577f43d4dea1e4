"""Bootstrap intervals, the paired test, calibration and the errors file, against independent computations."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from finetune.evaluation.bootstrap import describe_comparison, paired_comparison, score_intervals
from finetune.evaluation.calibration import (
    calibration_table,
    expected_calibration_error,
    fit_temperature,
    scale_classifier,
    temperature_scaled,
)
from finetune.evaluation.errors import write_largest_losses

NAMES = ["negative", "neutral", "positive"]


def _predictions_and_labels(num_samples: int = 111, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, num_samples)
    # Right about 70% of the time, otherwise a random class.
    predictions = np.where(rng.random(num_samples) < 0.7, labels, rng.integers(0, 3, num_samples))
    return predictions, labels


# The default draws the 300 resamples in one block; 1,000 cells a block draws them 9 at a time
# (the last block short), as a million resamples are drawn: the same resamples either way.
@pytest.mark.parametrize("chunk_cells", [None, 1_000], ids=["one-block", "blocks-of-9"])
def test_fixed_seed_gives_the_interval_scikit_learn_gives_on_the_same_resamples(monkeypatch, chunk_cells):
    if chunk_cells is not None:
        monkeypatch.setattr("finetune.evaluation.bootstrap.CHUNK_CELLS", chunk_cells)
    predictions, labels = _predictions_and_labels()
    intervals = score_intervals(predictions, labels, NAMES, resamples=300, seed=7)
    # By hand: the documented resamples, each scored by scikit-learn, then numpy's percentiles.
    indices = np.random.default_rng(7).integers(0, len(labels), size=(300, len(labels)))
    accuracy = [accuracy_score(labels[row], predictions[row]) for row in indices]
    macro = [
        f1_score(labels[row], predictions[row], labels=[0, 1, 2], average="macro", zero_division=0) for row in indices
    ]
    per_class = np.array(
        [f1_score(labels[row], predictions[row], labels=[0, 1, 2], average=None, zero_division=0) for row in indices]
    )
    assert intervals["accuracy"] == pytest.approx(list(np.percentile(accuracy, [2.5, 97.5])), abs=1e-12)
    assert intervals["macro_f1"] == pytest.approx(list(np.percentile(macro, [2.5, 97.5])), abs=1e-12)
    for index, name in enumerate(NAMES):
        expected = list(np.percentile(per_class[:, index], [2.5, 97.5]))
        assert intervals["per_class_f1"][name] == pytest.approx(expected, abs=1e-12)
    # The same seed, the same interval; another seed, another.
    assert score_intervals(predictions, labels, NAMES, resamples=300, seed=7) == intervals
    assert score_intervals(predictions, labels, NAMES, resamples=300, seed=8)["accuracy"] != intervals["accuracy"]
    low, high = intervals["accuracy"]
    assert low < accuracy_score(labels, predictions) < high


def test_identical_predictions_are_not_distinguishable():
    predictions, labels = _predictions_and_labels()
    comparison = paired_comparison(predictions, predictions.copy(), labels, 3, resamples=200)
    assert comparison["accuracy_interval"] == [0.0, 0.0] and comparison["macro_f1_interval"] == [0.0, 0.0]
    assert comparison["distinguishable"] is False
    assert comparison["mcnemar"] == {"only_best_right": 0, "only_other_right": 0, "p_value": 1.0}
    assert describe_comparison(comparison).startswith("not distinguishable")


def test_a_clearly_better_model_is_distinguishable_and_mcnemar_matches_scipy():
    from scipy.stats import binomtest

    predictions, labels = _predictions_and_labels(num_samples=300)
    comparison = paired_comparison(labels, predictions, labels, 3, resamples=200)
    assert comparison["distinguishable"] is True and comparison["macro_f1_interval"][0] > 0
    wrong = int(np.sum(predictions != labels))
    assert comparison["mcnemar"]["only_best_right"] == wrong
    assert comparison["mcnemar"]["p_value"] == pytest.approx(binomtest(wrong, wrong).pvalue)
    assert comparison["accuracy_difference"] == pytest.approx(wrong / 300)
    assert describe_comparison(comparison).startswith("best better")


def _constructed_calibration_case() -> tuple[np.ndarray, np.ndarray]:
    # 10 reviews at confidence 0.9 of which 7 right, 10 at 0.6 of which 6 right:
    # ECE = (10 x |0.7 - 0.9| + 10 x |0.6 - 0.6|) / 20 = 0.1.
    high = np.tile([0.9, 0.05, 0.05], (10, 1))
    low = np.tile([0.6, 0.3, 0.1], (10, 1))
    labels = np.array([0] * 7 + [1] * 3 + [0] * 6 + [2] * 4)
    return np.vstack([high, low]), labels


def test_calibration_figures_on_a_constructed_case(tmp_path):
    from PIL import Image

    from finetune.evaluation.report import plot_reliability

    probabilities, labels = _constructed_calibration_case()
    table = calibration_table(probabilities, labels)
    assert [(row["reviews"], row["confidence"], row["accuracy"]) for row in table] == [
        (10, pytest.approx(0.6), pytest.approx(0.6)),
        (10, pytest.approx(0.9), pytest.approx(0.7)),
    ]
    assert expected_calibration_error(probabilities, labels) == pytest.approx(0.1)
    plot_reliability(tmp_path / "reliability.png", table, "constructed")
    assert Image.open(tmp_path / "reliability.png").size == (700, 600)

    # Overconfident: the fitted temperature softens (T > 1), lowers the NLL, and keeps every prediction.
    temperature = fit_temperature(probabilities, labels)
    scaled = temperature_scaled(probabilities, temperature)
    nll = [-np.log(p[np.arange(20), labels]).mean() for p in (probabilities, scaled)]
    assert temperature > 1 and nll[1] < nll[0]
    assert (scaled.argmax(1) == probabilities.argmax(1)).all()
    # The minimum: a little either way is worse.
    for nearby in (temperature * 0.9, temperature * 1.1):
        assert -np.log(temperature_scaled(probabilities, nearby)[np.arange(20), labels]).mean() > nll[1]


def test_scaling_the_classifier_divides_the_logits(tiny_model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).eval()
    batch = AutoTokenizer.from_pretrained(tiny_model_dir)(
        ["great value", "broke in a week"], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        before = model(**batch).logits
        after = scale_classifier(model, 2.5)(**batch).logits
    torch.testing.assert_close(after, before / 2.5)


def test_errors_file_lists_the_largest_losses_first(tmp_path):
    probabilities = np.array([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.05, 0.05, 0.9], [0.4, 0.35, 0.25]])
    labels = [0, 0, 0, 1]
    path = write_largest_losses(tmp_path / "errors.csv", ["a", "b", "c", "d"], labels, probabilities, NAMES, count=3)
    rows = list(csv.DictReader(Path(path).read_text(encoding="utf-8").splitlines()))
    # Losses -log p(true): c 3.00, a 2.30, d 1.05, b 0.36.
    assert [row["text"] for row in rows] == ["c", "a", "d"]
    assert [(row["true"], row["predicted"], float(row["probability"])) for row in rows] == [
        ("negative", "positive", 0.9),
        ("negative", "neutral", 0.8),
        ("neutral", "negative", 0.4),
    ]
    assert float(rows[0]["loss"]) == pytest.approx(-np.log(0.05), abs=1e-6)


@pytest.mark.parametrize("resamples", [0, -1])
def test_no_resamples_is_refused_from_python_too(resamples):
    from finetune import FinetuneError

    predictions, labels = _predictions_and_labels()
    with pytest.raises(FinetuneError, match=rf"^resamples must be >= 1 \(got {resamples}\)"):
        score_intervals(predictions, labels, NAMES, resamples=resamples)
