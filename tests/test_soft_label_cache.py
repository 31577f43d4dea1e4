"""The teacher's soft labels in the cache are used only when they are the ones the teacher made.

A cached array whose values were changed (poisoned: the student would train on
them with exit 0) or that cannot be read (cut short, empty, random bytes: a
traceback) is computed again, with one line saying so (issue 48, families 2 and 4).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from finetune.pipeline.teacher import TeacherRun

TEXTS = [f"review {index} was {'great value' if index % 2 else 'broken on arrival'}" for index in range(12)]
CLASSES = ["LABEL_0", "LABEL_1", "LABEL_2"]


def fresh_teacher(model_dir: Path, max_length: int = 32) -> TeacherRun:
    """The tiny model as a teacher, loaded anew (a teacher frees its model once it has labelled)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    return TeacherRun(Path(model_dir), CLASSES, {"max_length": max_length}, "tiny", None, model)


@pytest.fixture
def cached(tiny_model_dir, tmp_path) -> tuple[np.ndarray, Path]:
    """Soft labels computed once into an empty cache: the values, and the cached array's file."""
    values, note = fresh_teacher(tiny_model_dir).soft_labels(TEXTS, 4, tmp_path)
    assert "computed in" in note, note
    (array,) = tmp_path.glob("*.npy")
    return values, array


def test_a_cached_array_is_read_back(tiny_model_dir, tmp_path, cached):
    values, _ = cached
    again, note = fresh_teacher(tiny_model_dir).soft_labels(TEXTS, 4, tmp_path)
    assert note.startswith(f"teacher soft labels for {len(TEXTS)} reviews read from the cache")
    np.testing.assert_array_equal(again, values)


def test_poisoned_values_are_not_used(tiny_model_dir, tmp_path, cached):
    values, array = cached
    # The right shape, finite, and wrong: each review "certainly" the second class.
    np.save(array, np.tile([0.0, 50.0, -50.0], (len(TEXTS), 1)))
    again, note = fresh_teacher(tiny_model_dir).soft_labels(TEXTS, 4, tmp_path)
    assert "read from the cache" not in note
    assert "does not match the digest in" in note and "computed again" in note, note
    assert "\n" not in note
    np.testing.assert_allclose(again, values, atol=1e-6)
    # Stored again: the next student reads the teacher's own values.
    third, note = fresh_teacher(tiny_model_dir).soft_labels(TEXTS, 4, tmp_path)
    assert "read from the cache" in note
    np.testing.assert_allclose(third, values, atol=1e-6)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # cut short, as by a full disk or a kill
        lambda data: b"",  # empty
        lambda data: os.urandom(len(data)),  # random bytes
    ],
    ids=["truncated", "empty", "random-bytes"],
)
def test_a_damaged_array_is_computed_again_without_a_traceback(tiny_model_dir, tmp_path, cached, damage):
    values, array = cached
    array.write_bytes(damage(array.read_bytes()))
    again, note = fresh_teacher(tiny_model_dir).soft_labels(TEXTS, 4, tmp_path)
    assert "computed again" in note and "\n" not in note, note
    np.testing.assert_allclose(again, values, atol=1e-6)


def test_other_settings_are_another_entry(tiny_model_dir, tmp_path, cached):
    # The encoding the texts were read with is part of the key: other settings, other soft labels.
    _, note = fresh_teacher(tiny_model_dir, max_length=16).soft_labels(TEXTS, 4, tmp_path)
    assert "computed in" in note and "again" not in note, note
    assert len(list(tmp_path.glob("*.npy"))) == 2


def test_a_teacher_trained_further_is_another_entry(tiny_model_dir, tmp_path, cached):
    # Same texts, same settings, other weights: its own labels, never the first teacher's from the cache.
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    changed = tmp_path / "changed-teacher"
    shutil.copytree(tiny_model_dir, changed)
    model = AutoModelForSequenceClassification.from_pretrained(changed)
    with torch.no_grad():
        model.classifier.bias.add_(torch.tensor([2.0, 0.0, -2.0]))
    model.save_pretrained(changed)
    values, _ = cached
    again, note = fresh_teacher(changed).soft_labels(TEXTS, 4, tmp_path)
    assert "computed in" in note and "again" not in note, note
    assert not np.allclose(again, values, atol=1e-3)
    assert len(list(tmp_path.glob("*.npy"))) == 2
    # The first teacher still reads its own labels back.
    first, note = fresh_teacher(tiny_model_dir).soft_labels(TEXTS, 4, tmp_path)
    assert "read from the cache" in note
    np.testing.assert_allclose(first, values, atol=1e-6)
