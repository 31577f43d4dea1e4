"""The test stage of a run: the model training ended with (the best, if asked) scored on the test split."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.output_files import write_output_text
from ..data.columns import column_values
from ..evaluation.tag_thresholds import THRESHOLDS_FILE  # each tag's threshold, tuned on the validation split

if TYPE_CHECKING:
    from .reading import RunInputs


def score_test(trainer: Any, inputs: RunInputs) -> dict[str, Any] | None:
    """The test split's report with bootstrap intervals, saved as ``test_report.json``; None without a test split."""
    from ..data.ratings import star_levels
    from ..evaluation.bootstrap import score_intervals
    from ..evaluation.inference import predict_probabilities
    from ..evaluation.metrics import classification_report
    from ..evaluation.ordered import ordered_reading

    if "test" not in inputs.encoded:
        return None
    if inputs.data.multi_label:
        return _score_tags(trainer, inputs)
    if inputs.data.scale is not None:
        return _score_ratings(trainer, inputs)
    args, label_names = trainer.args, inputs.data.label_names
    if inputs.encoding.sliding_window:
        # Long reviews read in overlapping windows, as evaluate and predict will read them.
        predicted = predict_probabilities(
            trainer.model,
            inputs.tokenizer,
            column_values(inputs.data.splits["test"], "text"),
            args.per_device_eval_batch_size,
            inputs.encoding,
        ).argmax(-1)
        references = column_values(inputs.data.splits["test"], "labels")
    else:
        prediction = trainer.predict(inputs.encoded["test"], metric_key_prefix="test")
        predicted, references = prediction.predictions.argmax(-1), prediction.label_ids
    report = classification_report(predicted, references, label_names)
    report["intervals"] = score_intervals(predicted, references, label_names)
    stars = star_levels(label_names)
    if stars is not None:
        # Classes that are stars: their ordered scores too, so a classifier compares with the ratings tasks.
        report["ordered"] = ordered_reading(predicted, references, label_names, stars)
    trainer.save_metrics("test", {"test_accuracy": report["accuracy"], "test_macro_f1": report["macro_f1"]})
    if trainer.is_world_process_zero():
        write_output_text(Path(args.output_dir, "test_report.json"), json.dumps(report, indent=2) + "\n")
    return report


def _score_ratings(trainer: Any, inputs: RunInputs) -> dict[str, Any]:
    """A regression or ordinal run's test report: outputs decoded to stars, then the ordered scores."""
    import numpy as np

    from ..evaluation.ordered import ordered_report
    from ..training.ordered_heads import decode

    data = inputs.data
    prediction = trainer.predict(inputs.encoded["test"], metric_key_prefix="test")
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    predicted_ratings, predicted_levels = decode(logits, data.task, data.scale)
    # The true levels as read, in the test split's order (trainer.predict keeps it): a regression run's
    # labels were standardised for training.
    true_levels = np.asarray(column_values(data.splits["test"], "labels"), dtype=np.int64)
    true_ratings = np.asarray(data.scale.levels)[true_levels]
    report = ordered_report(true_ratings, predicted_ratings, true_levels, predicted_levels, data.label_names, data.task)
    trainer.save_metrics("test", {f"test_{name}": report[name] for name in ("mae", "quadratic_weighted_kappa")})
    if trainer.is_world_process_zero():
        write_output_text(Path(trainer.args.output_dir, "test_report.json"), json.dumps(report, indent=2) + "\n")
    return report


def _score_tags(trainer: Any, inputs: RunInputs) -> dict[str, Any]:
    """A multi_label run's test report: each tag's threshold tuned on validation, saved, then the test scored."""
    import numpy as np
    import torch

    from ..evaluation.multi_label import MIN_POSITIVES_TO_TUNE, multi_label_report

    def probabilities_and_labels(split: str) -> tuple[np.ndarray, np.ndarray]:
        prediction = trainer.predict(inputs.encoded[split], metric_key_prefix=split)
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        return torch.sigmoid(torch.as_tensor(logits).float()).numpy(), np.asarray(prediction.label_ids) > 0.5

    validation = probabilities_and_labels("validation") if "validation" in inputs.encoded else None
    if validation is None and trainer.args.should_log:
        print("no validation split: every tag's threshold is 0.5", file=sys.stderr)
    report = multi_label_report(*probabilities_and_labels("test"), inputs.data.label_names, validation)
    untuned = report.get("thresholds_untuned", {})
    if untuned and trainer.args.should_log:
        print(
            f"note: too few validation reviews to tune a threshold on (under {MIN_POSITIVES_TO_TUNE}): "
            f"{_too_rare(untuned)}; each keeps 0.5",
            file=sys.stderr,
        )
    trainer.save_metrics("test", {"test_micro_f1": report["micro_f1"], "test_macro_f1": report["macro_f1"]})
    if trainer.is_world_process_zero():
        output_dir = Path(trainer.args.output_dir)
        thresholds = {"thresholds": report["thresholds"], "tuned_on": report["thresholds_tuned_on"]}
        if untuned:
            thresholds["untuned"] = untuned
        write_output_text(output_dir / THRESHOLDS_FILE, json.dumps(thresholds, indent=2) + "\n")
        write_output_text(output_dir / "test_report.json", json.dumps(report, indent=2) + "\n")
    return report


def _too_rare(untuned: dict[str, int]) -> str:
    """``trend (9), ...``: the tags too rare to tune, with their validation review counts."""
    return ", ".join(f"{name} ({count})" for name, count in untuned.items())
