"""The report stage of a run: pictures and their numbers in ``report/``, the model card, and the summary said."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..evaluation.report import UpdateRecorder
    from ..training.run_clock import RunClock


def write_report(
    trainer: Any, recipe: str | None, update_recorder: UpdateRecorder, metrics: dict[str, Any], clock: RunClock
) -> None:
    """Write ``report/`` and the model card, say the summary, and add the run's time breakdown to ``metrics``.

    The card is written last so that it, not a README.md from transformers' saving, is the one the folder keeps.
    """
    from ..evaluation.model_card import write_model_card
    from ..evaluation.report import add_to_run_metrics, write_run_report
    from ..training.run_clock import format_breakdown

    args, main_process = trainer.args, trainer.is_world_process_zero()
    if main_process:
        report_dir = write_run_report(
            args.output_dir,
            args,
            trainer.state,
            update_recorder.updates,
            recipe,
            train_metrics={key: value for key, value in metrics.items() if key not in ("test", "baseline")},
            test_report=metrics.get("test"),
            baseline=metrics.get("baseline"),
        )
        clock.lap("report")
        card = write_model_card(args.output_dir)
        clock.lap("model_card")
        print_summary(args.output_dir, metrics)
        print(f"pictures and numbers in {report_dir}, model card {card}", file=sys.stderr)
        clock.lap("report")
    metrics["time_breakdown"] = clock.breakdown()
    if main_process:
        add_to_run_metrics(report_dir, "time_breakdown", metrics["time_breakdown"])
        print(format_breakdown(metrics["time_breakdown"]), file=sys.stderr)


def print_summary(output_dir: str, metrics: dict[str, Any]) -> None:
    """One line of speed and test scores (against the baseline's), and where the model is."""
    from ..evaluation.baseline import describe_comparison

    line = f"trained in {metrics['train_wall_seconds']:.0f}s, {metrics['train_samples_per_second']:.1f} samples/s"
    if "test" in metrics:
        test = metrics["test"]
        # Several tags per review: micro-F1 first, and accuracy is the whole set of tags right.
        headline = f"micro-F1 {test['micro_f1']:.3f}, subset " if "micro_f1" in test else ""
        if "mae" in test:  # ratings: how far off first, then the rounded stars' accuracy
            headline = f"MAE {test['mae']:.3f}, QWK {test['quadratic_weighted_kappa']:.3f}, "
        line += (
            f"; test {headline}accuracy {test['accuracy']:.3f}, macro-F1 {test['macro_f1']:.3f} "
            f"({test['num_samples']} reviews)"
        )
        baseline_test = (metrics.get("baseline") or {}).get("scores", {}).get("test")
        if baseline_test:
            line += f"; {describe_comparison(test, baseline_test)}"
    print(line, file=sys.stderr)
    print(f"model saved to {output_dir}", file=sys.stderr)
