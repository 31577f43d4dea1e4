"""``calibrate_temperature``: the saved model of a run comes out calibrated on its validation split."""

from __future__ import annotations

import json

import numpy as np
from helpers import tiny_recipe

from finetune.cli import main
from finetune.data.encoding import ReviewEncoding
from finetune.evaluation.inference import load_inference_model, predict_probabilities

QUICK = {"num_train_epochs": 1, "eval_strategy": "no", "save_strategy": "no", "load_best_model_at_end": "false"}


def _validation_rows() -> tuple[list[str], list[int]]:
    import csv

    from helpers import PROJECT

    rows = list(csv.DictReader((PROJECT / "data" / "reviews" / "validation.csv").open(encoding="utf-8")))
    bins = {1: 0, 2: 0, 3: 1, 4: 2, 5: 2}
    texts = [f"{row['title']}. {row['review']}" if row["title"] else row["review"] for row in rows]
    return texts, [bins[int(row["stars"])] for row in rows]


def _nll_minimiser(probabilities: np.ndarray, labels: list[int]) -> float:
    """The T that minimises the mean negative log-likelihood of softmax(log p / T), by brute force.

    Every T in [0.05, 20] a factor 1.001 apart, then every T a factor 1.000001 apart around the
    best of those. The loss is convex in 1/T, so the grid's lowest point is next to the minimum.
    """
    logits = np.log(np.clip(probabilities.astype(np.float64), 1e-12, None))
    rows = np.arange(len(labels))

    def nll(temperatures: np.ndarray) -> np.ndarray:
        scaled = logits[None, :, :] / temperatures[:, None, None]
        top = scaled.max(axis=2, keepdims=True)
        log_normaliser = np.log(np.exp(scaled - top).sum(axis=2)) + top[:, :, 0]
        return (log_normaliser - scaled[:, rows, labels]).mean(axis=1)

    coarse = np.exp(np.arange(np.log(0.05), np.log(20.0), np.log(1.001)))
    best = coarse[nll(coarse).argmin()]
    fine = best * np.exp(np.arange(-1000, 1001) * np.log(1.000001))
    return float(fine[nll(fine).argmin()])


def test_the_saved_model_is_calibrated_and_keeps_its_labels(tmp_path, tiny_varied_model_dir, capsys):
    # A model whose answers differ by review, so that keeping its labels means something.
    plain = tiny_recipe(tmp_path, tiny_varied_model_dir, tmp_path / "plain", **QUICK)
    assert main(["train", str(plain)]) == 0
    calibrated = tiny_recipe(
        tmp_path, tiny_varied_model_dir, tmp_path / "calibrated", calibrate_temperature="true", **QUICK
    )
    assert main(["train", str(calibrated)]) == 0
    record = json.loads((tmp_path / "calibrated" / "calibration.json").read_text())
    assert "calibrated on validation, 111 reviews" in capsys.readouterr().err

    texts, labels = _validation_rows()
    encoding = ReviewEncoding(max_length=64)  # as the recipe trained
    before = predict_probabilities(*load_inference_model(tmp_path / "plain"), texts, encoding=encoding)
    after = predict_probabilities(*load_inference_model(tmp_path / "calibrated"), texts, encoding=encoding)
    # Same seed, same training: the only difference is the temperature folded into the head.
    assert len(set(before.argmax(1))) == 3
    assert np.array_equal(before.argmax(1), after.argmax(1))
    # The recorded T is the plain model's NLL minimiser, found here by brute force; the saved model needs none.
    temperature = _nll_minimiser(before, labels)
    assert abs(record["temperature"] - temperature) < 1e-4 * temperature, (record["temperature"], temperature)
    assert abs(_nll_minimiser(after, labels) - 1.0) < 1e-4
    assert abs(temperature - 1.0) > 0.05  # it did change something


def test_calibrating_without_a_validation_split_is_refused_before_training(tmp_path, tiny_model_dir, capsys):
    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, tmp_path / "out", calibrate_temperature="true", dataset_dir=None, **QUICK
    )
    from helpers import PROJECT

    argv = ["train", str(recipe), "--train_file", str(PROJECT / "data" / "reviews" / "train.csv")]
    argv += ["--validation_split_percentage", "0", "--test_split_percentage", "10"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("set validation_split_percentage (e.g. 10), or drop calibrate_temperature")
    assert not (tmp_path / "out").exists()
