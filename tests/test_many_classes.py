"""The bootstrap's memory does not grow with the square of the classes (issue 73).

A run on 10,000 rows with one label each trained and saved, then the test
split's intervals asked for 745 GiB (one 10,000 x 10,000 confusion matrix per
resample) and the run ended with a traceback, without its report or card.
Here the bootstrap functions run on small synthetic predictions with many
classes, under tracemalloc (numpy reports its arrays to it).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sklearn.metrics import f1_score

from finetune.evaluation.bootstrap import paired_comparison, score_intervals

CLASSES = 10_000
# What the intervals may hold at once here: a few blocks of (resamples x classes) counts, not classes squared.
PEAK_BYTES = 400 * 2**20


def _many_classes(num_samples: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, num_samples)
    predictions = np.where(rng.random(num_samples) < 0.5, labels, rng.integers(0, CLASSES, num_samples))
    return predictions, labels, [f"class {index}" for index in range(CLASSES)]


def _peak_bytes(function, *args, **kwargs):
    tracemalloc.start()
    try:
        result = function(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_intervals_of_10000_classes_stay_within_a_few_hundred_mib():
    predictions, labels, names = _many_classes()
    intervals, peak = _peak_bytes(score_intervals, predictions, labels, names, resamples=1000)
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB"
    assert len(intervals["per_class_f1"]) == CLASSES
    low, high = intervals["accuracy"]
    assert 0 <= low <= high <= 1


def test_a_paired_comparison_of_10000_classes_stays_within_a_few_hundred_mib():
    predictions, labels, _ = _many_classes()
    comparison, peak = _peak_bytes(paired_comparison, predictions, labels, labels, CLASSES, resamples=1000)
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB"
    assert comparison["accuracy_difference"] < 0


@pytest.mark.parametrize("cells", [None, 5_000], ids=["default-blocks", "small-blocks"])
def test_many_classes_score_as_scikit_learn_on_the_same_resamples(monkeypatch, cells):
    """Intervals of 500 classes, in blocks of classes and of resamples, against scikit-learn resample by resample."""
    if cells is not None:
        monkeypatch.setattr("finetune.evaluation.bootstrap.CHUNK_CELLS", cells)
    rng = np.random.default_rng(1)
    num_classes, resamples = 500, 60
    labels = rng.integers(0, num_classes, 400)
    predictions = np.where(rng.random(400) < 0.6, labels, rng.integers(0, num_classes, 400))
    names = [str(index) for index in range(num_classes)]
    intervals = score_intervals(predictions, labels, names, resamples=resamples, seed=5)
    indices = np.random.default_rng(5).integers(0, len(labels), size=(resamples, len(labels)))
    everyone = list(range(num_classes))
    per_class = np.array(
        [f1_score(labels[row], predictions[row], labels=everyone, average=None, zero_division=0) for row in indices]
    )
    macro = per_class.mean(axis=1)
    assert intervals["macro_f1"] == pytest.approx(list(np.percentile(macro, [2.5, 97.5])), abs=1e-12)
    for index in (0, 1, 250, num_classes - 1):
        expected = list(np.percentile(per_class[:, index], [2.5, 97.5]))
        assert intervals["per_class_f1"][names[index]] == pytest.approx(expected, abs=1e-12)


def test_a_run_of_more_classes_than_a_confusion_matrix_shows_writes_its_report_and_card(tmp_path, tiny_model_dir):
    """60 classes, 2 reviews each: the run ends with its report and card, and keeps no 60 x 60 matrix."""
    import csv
    import json

    from finetune.cli import main
    from finetune.evaluation.metrics import CONFUSION_MATRIX_MAX_CLASSES

    classes = CONFUSION_MATRIX_MAX_CLASSES + 10
    for name, copies in (("train.csv", 2), ("test.csv", 1)):
        with (tmp_path / name).open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["review", "label"])
            writer.writerows(
                [f"review {copy} of kind {index}", f"kind {index}"]
                for index in range(classes)
                for copy in range(copies)
            )
    folder = tmp_path / "run"
    argv = ["train", "--train_file", str(tmp_path / "train.csv"), "--test_file", str(tmp_path / "test.csv")]
    argv += ["--text_column", "review", "--label_column", "label", "--validation_split_percentage", "0"]
    argv += ["--model_name_or_path", str(tiny_model_dir), "--ignore_mismatched_sizes", "true", "--max_steps", "1"]
    argv += ["--max_length", "16", "--eval_strategy", "no", "--save_strategy", "no", "--baseline", "false"]
    argv += ["--disable_tqdm", "true", "--report_to", "none", "--output_dir", str(folder)]
    assert main(argv) == 0
    test = json.loads((folder / "report" / "metrics.json").read_text())["test"]
    assert test["confusion_matrix"] is None and test["support"] == [1] * classes
    assert len(test["intervals"]["per_class_f1"]) == classes
    assert not (folder / "report" / "confusion_matrix_test.png").exists()
    card = (folder / "README.md").read_text()
    assert f"No confusion matrix: {classes} classes are too many to show one." in card
    assert "| kind 59 |" in card
