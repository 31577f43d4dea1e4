"""``finetune evaluate`` on a multi_label run: every model's tags scored, compared on micro-F1 with paired tests.

Each model's tags are its probabilities at its run's thresholds
(``tag_thresholds.json``, tuned on validation when the run trained). The best
is the one with the highest micro-F1 (every review-tag pair counted once); every
other model, and the TF-IDF one-vs-rest baseline, gets a paired bootstrap test
against it on the same resamples of the same reviews.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config.output_files import write_output_text
from ..errors import FinetuneError
from ..evaluation.model_names import distinct_names


@dataclass(frozen=True)
class TagEvaluation:
    """How evaluate scores tags: its flags, and the run's validation reviews (read only for the baseline)."""

    batch_size: int
    baseline: bool
    resamples: int
    seed: int
    raw_csv: bool
    validation: Callable[[], Any]  # the run's validation ScoringData, or None without that split


def evaluate_tags(
    models: list[Path],
    scoring: Any,
    tag_names: list[str],
    where: tuple[Path, str],
    settings: TagEvaluation,
) -> list[dict[str, Any]]:
    """Score multi_label ``models`` (checked by the caller) on ``scoring``'s reviews; print and write the results.

    ``where`` is the results folder and the name the files are written under (the split, or ``data-<stem>``).
    """
    from ..evaluation.multi_label import paired_tag_comparison, predicted_tags

    resamples, seed = settings.resamples, settings.seed
    truth = np.asarray(scoring.labels, dtype=np.float64).reshape(len(scoring.labels), len(tag_names)) > 0.5
    scored = [_score_tags(model_dir, scoring, truth, tag_names, settings) for model_dir in models]
    reports = [report for report, _, _ in scored]
    predictions = [predicted_tags(probabilities, thresholds) for _, probabilities, thresholds in scored]
    best = max(range(len(reports)), key=lambda index: reports[index]["micro_f1"])
    for index, report in enumerate(reports):
        report["best"] = index == best
    if settings.baseline and scoring.train_texts:
        baseline_report, baseline_predicted = _score_tag_baseline(scoring, truth, tag_names, settings)
        baseline_report["best_vs_baseline"] = _lead(reports[best], baseline_report)
        reports.append(baseline_report)
        predictions.append(baseline_predicted)
    for index, report in enumerate(reports):
        if index != best:
            report["vs_best"] = paired_tag_comparison(predictions[best], predictions[index], truth, resamples, seed)
    print(format_tag_table(reports))
    _write_tag_results(*where, scoring, scored[best], reports, settings.raw_csv)
    return reports


def _score_tags(
    model_dir: Path, scoring: Any, truth: np.ndarray, tag_names: list[str], settings: TagEvaluation
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """One model's tag report on the scored reviews, its probabilities and the thresholds it was read at."""
    from ..evaluation.inference import load_inference_model, predict_probabilities, warn_if_model_changed
    from ..evaluation.multi_label import tag_report
    from ..evaluation.tag_thresholds import tag_thresholds, thresholds_file
    from ..training.runs import checkpoint_step

    model, tokenizer = load_inference_model(model_dir, tags_read=True)
    warn_if_model_changed(model_dir, "its scores")
    probabilities = predict_probabilities(model, tokenizer, scoring.texts, settings.batch_size, scoring.encoding)
    thresholds = tag_thresholds(model_dir, tag_names)
    source = str(thresholds_file(model_dir) or "none saved (0.5 for every tag)")
    report = tag_report(probabilities, truth, tag_names, thresholds, source, settings.resamples, settings.seed)
    return {"model": str(model_dir), "step": checkpoint_step(model_dir), **report}, probabilities, thresholds


def _score_tag_baseline(
    scoring: Any, truth: np.ndarray, tag_names: list[str], settings: TagEvaluation
) -> tuple[dict[str, Any], np.ndarray]:
    """The one-vs-rest TF-IDF baseline fit on the run's train split, its thresholds tuned on the run's validation."""
    from ..evaluation.baseline import DESCRIPTION, TfidfBaseline
    from ..evaluation.multi_label import DEFAULT_THRESHOLD, predicted_tags, tag_report, tune_thresholds

    baseline = TfidfBaseline(len(tag_names), multi_label=True).fit(scoring.train_texts, scoring.train_labels)
    validation = settings.validation()
    if validation is not None:
        thresholds = tune_thresholds(baseline.probabilities(validation.texts), np.asarray(validation.labels) > 0.5)
        tuned_on = "validation"
    else:
        thresholds, tuned_on = np.full(len(tag_names), DEFAULT_THRESHOLD), "none (0.5 for every tag)"
    probabilities = baseline.probabilities(scoring.texts)
    report = tag_report(probabilities, truth, tag_names, thresholds, tuned_on, settings.resamples, settings.seed)
    description = DESCRIPTION.replace("logistic regression", "one-vs-rest logistic regression per tag")
    head = {"model": "TF-IDF baseline", "kind": "baseline", "description": description, "step": None}
    return {**head, "train_reviews": baseline.train_reviews, **report}, predicted_tags(probabilities, thresholds)


def _lead(best: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """The best model minus the baseline in micro-F1, subset accuracy and macro-F1."""
    return {metric: round(best[metric] - baseline[metric], 4) for metric in ("micro_f1", "accuracy", "macro_f1")}


def format_tag_table(reports: list[dict[str, Any]]) -> str:
    """A markdown table of the tag reports with 95% intervals, the best starred, the others tested against it."""
    from ..evaluation.multi_label import describe_tag_comparison

    lines = [
        "| model | step | micro-F1 [95% interval] | macro-F1 [95% interval] | subset accuracy | best "
        "| against the best (paired) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = distinct_names([report["model"] for report in reports if report.get("kind") != "baseline"])
    for report in reports:
        versus = describe_tag_comparison(report["vs_best"]) if "vs_best" in report else "-"
        scores = (
            f"{_with_interval(report, 'micro_f1')} | {_with_interval(report, 'macro_f1')} | {report['accuracy']:.4f}"
        )
        if report.get("kind") == "baseline":
            lead = report["best_vs_baseline"]
            mark = f"best leads by {lead['micro_f1']:+.4f} micro-F1"
            lines.append(f"| {report['model']} | - | {scores} | {mark} | {versus} |")
            continue
        step = "final" if report["step"] is None else str(report["step"])
        lines.append(f"| {names[report['model']]} | {step} | {scores} | {'*' if report['best'] else ''} | {versus} |")
    return "\n".join(lines)


def _with_interval(report: dict[str, Any], metric: str) -> str:
    low, high = report["intervals"][metric]
    return f"{report[metric]:.4f} [{low:.3f}, {high:.3f}]"


def _write_tag_results(
    folder: Path,
    scored_on: str,
    scoring: Any,
    best: tuple[dict[str, Any], np.ndarray, np.ndarray],
    reports: list[dict[str, Any]],
    raw_csv: bool,
) -> None:
    """The JSON and markdown results, the best model's errors file and its two tag pictures; then say so."""
    from ..evaluation.errors import largest_tag_errors, write_tag_errors
    from ..evaluation.tag_pictures import plot_tag_cooccurrence, plot_tag_f1

    best_report, probabilities, thresholds = best
    tag_names = list(best_report["per_class"])
    errors = largest_tag_errors(scoring.texts, scoring.labels, probabilities, thresholds, tag_names)
    written = [write_tag_errors(folder / f"errors_{scored_on}.csv", errors, raw_csv=raw_csv)]
    title = f"{Path(best_report['model']).name} on {scored_on}: {best_report['num_samples']} reviews"
    shown = [(Path(best_report["model"]).name, best_report)]
    shown += [("TF-IDF baseline", report) for report in reports if report.get("kind") == "baseline"]
    for name, draw in (
        (f"tag_f1_{scored_on}.png", lambda path: plot_tag_f1(path, shown, tag_names, title)),
        (
            f"tag_cooccurrence_{scored_on}.png",
            lambda path: plot_tag_cooccurrence(path, best_report["cooccurrence"], tag_names, title),
        ),
    ):
        draw(folder / name)
        written.append(folder / name)
    table = folder / f"evaluation_{scored_on}.md"
    write_output_text(table, format_tag_table(reports) + "\n")
    out = folder / f"evaluation_{scored_on}.json"
    write_output_text(out, json.dumps(reports, indent=2) + "\n")
    print(f"saved to {out}", file=sys.stderr)
    print(f"also wrote {', '.join(path.name for path in [*written, table])}", file=sys.stderr)


def refuse_tag_calibration(calibrate: bool) -> None:
    """``--calibrate`` fits one softmax temperature; a multi_label run's sigmoids are tuned by their thresholds."""
    if calibrate:
        raise FinetuneError(
            "--calibrate fits a softmax temperature, and this run has several tags per review (a sigmoid each, "
            "read at thresholds tuned on validation); leave out --calibrate"
        )
