"""The test stage of a run: the model training ended with (the best, if asked) scored on the test split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.output_files import write_output_text
from ..data.columns import column_values

if TYPE_CHECKING:
    from .reading import RunInputs


def score_test(trainer: Any, inputs: RunInputs) -> dict[str, Any] | None:
    """The test split's report with bootstrap intervals, saved as ``test_report.json``; None without a test split."""
    from ..evaluation.bootstrap import score_intervals
    from ..evaluation.inference import predict_probabilities
    from ..evaluation.metrics import classification_report

    if "test" not in inputs.encoded:
        return None
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
    trainer.save_metrics("test", {"test_accuracy": report["accuracy"], "test_macro_f1": report["macro_f1"]})
    if trainer.is_world_process_zero():
        write_output_text(Path(args.output_dir, "test_report.json"), json.dumps(report, indent=2) + "\n")
    return report
