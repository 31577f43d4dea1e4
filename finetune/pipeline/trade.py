"""The trade a distilled student offers: teacher and student on the same test reviews, scores and reviews/s.

After ``finetune distill`` trains a student, both models score the student's
test split the way each predicts (its own tokenizer, truncation and windows):
their accuracy and macro-F1, how often they give the same label, and how many
reviews a second each predicts on the same machine, in fp32 and, for the
student, as the int8 export ``finetune export`` writes. The teacher's labels
of the test reviews are cached as its soft labels are, so the next student
of the same teacher pays only for the timing. The figures go to the
student's ``report/metrics.json`` (``distillation_trade``), its model card
and the last lines ``finetune distill`` prints.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data.columns import column_values

if TYPE_CHECKING:
    from ..data.splits import ReviewData

# A few reviews through each model before its clock starts: the first call pays for one-time set-up.
WARM_UP_REVIEWS = 4


def measure_trade(
    teacher: Any,
    student_dir: Path,
    data: ReviewData,
    batch_size: int,
    timed_reviews: int,
    cache_dir: Path | None,
) -> dict[str, Any]:
    """Score and time teacher and student on ``data``'s test split; record, print and return the figures.

    ``teacher`` is a :class:`finetune.pipeline.teacher.TeacherRun` (which calls this).
    """
    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import load_inference_model, predict_probabilities
    from ..evaluation.model_card import write_model_card
    from ..evaluation.report import REPORT_DIR, add_to_run_metrics
    from ..training.runs import find_run_config

    texts = column_values(data.splits["test"], "text")
    labels = np.asarray(column_values(data.splits["test"], "labels"))
    student, student_tokenizer = load_inference_model(student_dir)
    student_encoding = ReviewEncoding.from_fields((find_run_config(student_dir) or {}).get("data") or {})
    teacher_model, teacher_tokenizer = load_inference_model(teacher.folder)
    teacher_encoding = ReviewEncoding.from_fields(teacher.encoding_fields)

    teacher.model = teacher.model or teacher_model  # soft_labels computes with it on a cache miss
    teacher_log_probs, note = teacher.soft_labels(texts, batch_size, cache_dir)
    print(note.replace("soft labels for", "labels for the student's test split:", 1), file=sys.stderr)
    student_probabilities = predict_probabilities(student, student_tokenizer, texts, batch_size, student_encoding)
    teacher_labels = teacher_log_probs.argmax(axis=1)
    student_labels = student_probabilities.argmax(axis=1)
    trade: dict[str, Any] = {
        "test_reviews": len(texts),
        "teacher": _scores(teacher_labels, labels, data.label_names),
        "student": _scores(student_labels, labels, data.label_names),
        "agreement": float(np.mean(teacher_labels == student_labels)),
        "batch_size": batch_size,
    }

    timed = texts[:timed_reviews]
    if timed:  # always, from distill; a caller may ask for the scores alone
        models = {"teacher_fp32": (teacher_model, teacher_tokenizer, teacher_encoding)}
        models["student_fp32"] = (student, student_tokenizer, student_encoding)
        trade.update(_timed(models, student_dir, data, texts, timed, batch_size))
    trade["teacher_base_model"] = teacher.base_model
    add_to_run_metrics(student_dir / REPORT_DIR, "distillation_trade", trade)
    write_model_card(student_dir)
    print("\n".join(format_trade(trade)), file=sys.stderr)
    return trade


def _timed(
    models: dict[str, tuple[Any, Any, Any]],
    student_dir: Path,
    data: ReviewData,
    texts: list[str],
    timed: list[str],
    batch_size: int,
) -> dict[str, Any]:
    """Reviews/s of each model on ``timed``, and the student's int8 export scored on ``texts`` and timed too."""
    from ..evaluation.inference import load_inference_model, predict_probabilities

    speeds = {name: _reviews_per_second(*model[:2], timed, batch_size, model[2]) for name, model in models.items()}
    found: dict[str, Any] = {"timed_reviews": len(timed), "reviews_per_second": speeds}
    student, tokenizer, encoding = models["student_fp32"]
    with tempfile.TemporaryDirectory(prefix="finetune-trade-") as scratch:
        int8_dir, backend = _student_int8(student, tokenizer, student_dir, data, encoding, scratch)
        if int8_dir is not None:
            int8, _ = load_inference_model(int8_dir)
            labels = predict_probabilities(int8, tokenizer, texts, batch_size, encoding).argmax(axis=1)
            found["student_int8"] = _scores(
                labels, np.asarray(column_values(data.splits["test"], "labels")), data.label_names
            )
            found["int8_backend"] = backend
            speeds["student_int8"] = _reviews_per_second(int8, tokenizer, timed, batch_size, encoding)
    return found


def format_trade(trade: dict[str, Any]) -> list[str]:
    """The trade in two or three lines: scores and agreement, then reviews/s with the student's speed-ups."""
    teacher, student = trade["teacher"], trade["student"]
    gap = (student["accuracy"] - teacher["accuracy"]) * 100
    lines = [
        f"on the {trade['test_reviews']} test reviews: teacher ({trade.get('teacher_base_model', 'teacher')}) "
        f"accuracy {teacher['accuracy']:.3f}, macro-F1 {teacher['macro_f1']:.3f}; student {student['accuracy']:.3f}, "
        f"{student['macro_f1']:.3f} ({gap:+.1f} points of accuracy)"
        + (
            f", its int8 export {trade['student_int8']['accuracy']:.3f}, {trade['student_int8']['macro_f1']:.3f}"
            if "student_int8" in trade
            else ""
        ),
        f"teacher and student give the same label to {trade['agreement'] * 100:.1f}% of them",
    ]
    speeds = trade.get("reviews_per_second")
    if speeds:
        base = speeds["teacher_fp32"]
        parts = [
            f"teacher fp32 {base:.1f}",
            f"student fp32 {speeds['student_fp32']:.1f} ({speeds['student_fp32'] / base:.1f}x)",
        ]
        if "student_int8" in speeds:
            parts.append(f"student int8 {speeds['student_int8']:.1f} ({speeds['student_int8'] / base:.1f}x)")
        lines.append(
            f"reviews/s on {trade['timed_reviews']} of them, batch {trade['batch_size']}, this machine: "
            + ", ".join(parts)
        )
    return lines


def _scores(predicted: np.ndarray, labels: np.ndarray, label_names: list[str]) -> dict[str, float]:
    from ..evaluation.metrics import classification_report

    report = classification_report(predicted, labels, label_names)
    return {"accuracy": float(report["accuracy"]), "macro_f1": float(report["macro_f1"])}


def _reviews_per_second(model: Any, tokenizer: Any, texts: Sequence[str], batch_size: int, encoding: Any) -> float:
    from ..evaluation.inference import predict_probabilities

    predict_probabilities(model, tokenizer, list(texts[:WARM_UP_REVIEWS]), batch_size, encoding)
    started = time.perf_counter()
    predict_probabilities(model, tokenizer, list(texts), batch_size, encoding)
    return len(texts) / (time.perf_counter() - started)


def _student_int8(
    student: Any, tokenizer: Any, student_dir: Path, data: ReviewData, encoding: Any, scratch: str
) -> tuple[Path | None, str | None]:
    """The student as ``finetune export`` writes its int8 by default, in ``scratch``; (None, None) with no backend."""
    from ..errors import FinetuneError
    from ..export.common import CALIBRATION_REVIEWS
    from ..export.openvino import export_openvino_int8, require_openvino, sample_calibration_texts

    try:
        require_openvino()
    except FinetuneError:
        try:
            from ..export.onnxruntime import export_int8, require_onnx_runtime

            require_onnx_runtime()
        except FinetuneError as missing:
            print(f"note: no int8 figures in the trade: {missing}", file=sys.stderr)
            return None, None
        folder = Path(scratch) / "int8"
        export_int8(student, tokenizer, folder, source=str(student_dir))
        return folder, "onnxruntime"
    folder = Path(scratch) / "int8"
    calibration = sample_calibration_texts(column_values(data.splits["train"], "text"), CALIBRATION_REVIEWS)
    export_openvino_int8(student, tokenizer, folder, str(student_dir), calibration, encoding, "the train split")
    return folder, "openvino"
