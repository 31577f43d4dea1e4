"""``finetune evaluate``: score a model folder, or every checkpoint of a run, on labelled reviews."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.output_files import write_output_text
from ..config.tasks import ORDERED_TASKS
from ..data.columns import column_values
from ..data.encoding import ReviewEncoding
from ..errors import FinetuneError
from ..evaluation.rating_checkpoints import evaluate_ratings, holds_ratings, rating_level_names
from .evaluate_tags import TagEvaluation, evaluate_tags, refuse_tag_calibration


def evaluate(
    path: str | list[str],
    data: str | None = None,
    split: str = "test",
    batch_size: int = 32,
    baseline: bool = True,
    resamples: int = 1000,
    seed: int = 0,
    calibrate: bool = False,
    explain: bool = True,
    raw_csv: bool = False,
) -> list[dict[str, Any]]:
    """Score ``path`` (a model folder or a run folder) and print a table; returns one report per model.

    Every score comes with a 95% percentile bootstrap interval (``resamples``
    resamples of the reviews, ``seed``), and every model but the best with a
    paired test against the best on the same resamples; the best model's
    largest losses go to ``errors_<split>.csv`` and its calibration (ECE) to a
    reliability diagram; with ``explain`` (the default) each listed mistake
    gets the words behind its wrong label (a second or two a mistake on a CPU).
    With ``calibrate``, a temperature fitted on the run's validation split is
    folded into the folder's own model (:func:`calibrate_model`). The errors file's
    cells that a spreadsheet would run as a formula are written after a ``'``, and
    a ``data`` CSV loses that ``'`` (:mod:`finetune.config.csv_cells`), unless ``raw_csv``.

    A run folder's every ``checkpoint-*`` is scored with the final model, the best by macro-F1 marked
    (micro-F1 for tags: :mod:`.evaluate_tags`; MAE for ratings), on the run's ``split`` or a ``data``
    file with its columns; with ``baseline`` the TF-IDF baseline fit on the run's train split is a last
    row. Several paths compare runs: each run's own model on the first run's data, written to
    ``<first run>/comparison/``.
    """
    paths = [path] if isinstance(path, str) else list(path)
    if holds_ratings(Path(paths[0])):  # in stars: evaluation/rating_checkpoints.py
        return _evaluate_ratings(paths, data, split, batch_size, baseline, resamples, seed, calibrate)
    models = _models_to_score(paths, calibrate)
    tags = _tag_models(models, calibrate)  # several tags per review: read at thresholds, compared on micro-F1
    label_names = _shared_label_names(models)
    # Checked before anything is scored or written: a refused calibration leaves the folder as it was.
    calibration_data = _calibration_data(models[-1], label_names) if calibrate else None
    scoring = load_labelled_texts(models[0], data, split, label_names, raw_csv=raw_csv)  # shared: read once
    # A file's results are data-<its stem>: a test.csv must not replace the run's own test-split results.
    scored_on = f"data-{Path(data).stem}" if data else split
    if tags:
        settings = TagEvaluation(batch_size, baseline, resamples, seed, raw_csv, _validation_reader(models[0]))
        return evaluate_tags(models, scoring, label_names, (_results_folder(paths), scored_on), settings)
    # Each model is checked as it loads (check_model_folder): a broken one stops the command before any file is written.
    scored = [_score(model_dir, scoring, label_names, batch_size) for model_dir in models]
    folder = _results_folder(paths)
    reports, best = _compared(scored, scoring, label_names, baseline, resamples, seed)
    probabilities = [probs for _, probs in scored]
    print(format_table(reports))
    written = write_errors_and_calibration(
        folder, scored_on, scoring, probabilities[best], label_names, reports[best], explain, raw_csv
    )
    if calibrate:
        written.append(calibrate_model(models[-1], calibration_data, batch_size, probabilities[-1], scoring.labels))
    _write_reports(folder, scored_on, reports, label_names, written)
    return reports


def _evaluate_ratings(
    paths: list[str],
    data: str | None,
    split: str,
    batch_size: int,
    baseline: bool,
    resamples: int,
    seed: int,
    calibrate: bool,
) -> list[dict[str, Any]]:
    """A star-rating run: its models scored in stars (:mod:`.evaluate_ratings`), refused for what needs classes."""
    if calibrate:
        raise FinetuneError("--calibrate fits a softmax's temperature, and this run rates stars; drop --calibrate")
    if len(paths) > 1:
        raise FinetuneError("comparing ratings runs is not done yet; evaluate each run on its own")
    models = _models_to_score(paths, calibrate, ratings=True)
    scoring = load_labelled_texts(models[0], data, split, rating_level_names(models[0]))
    scored_on = f"data-{Path(data).stem}" if data else split
    return evaluate_ratings(models, scoring, scored_on, batch_size, baseline, resamples, seed)


def _results_folder(paths: list[str]) -> Path:
    """Where the results go: the run's folder, or ``<first run>/comparison/`` when runs are compared."""
    folder = Path(paths[0])
    if len(paths) > 1:
        folder = folder / "comparison"
        folder.mkdir(exist_ok=True)
    return folder


def _write_reports(
    folder: Path, scored_on: str, reports: list[dict[str, Any]], label_names: list[str], written: list[Path]
) -> None:
    """``evaluation_<scored_on>.json``, the pictures and the table; then say what was written."""
    out_name = f"evaluation_{scored_on}.json"
    write_output_text(folder / out_name, json.dumps(reports, indent=2) + "\n")
    written += write_pictures_and_table(folder, scored_on, reports, label_names)
    # Said once every file is written: a failure part-way must not follow a line saying it was saved.
    print(f"saved to {folder / out_name}", file=sys.stderr)
    print(f"also wrote {', '.join(path.name for path in written)}", file=sys.stderr)


def _compared(
    scored: list[tuple[dict[str, Any], Any]],
    scoring: Any,
    label_names: list[str],
    baseline: bool,
    resamples: int,
    seed: int,
) -> tuple[list[dict[str, Any]], int]:
    """Each model's report marked best or not (and the baseline's, last), with intervals; and the best's index."""
    reports = [report for report, _ in scored]
    best = max(range(len(reports)), key=lambda index: reports[index]["macro_f1"])
    for index, report in enumerate(reports):
        report["best"] = index == best
    predictions = [probs.argmax(-1) for _, probs in scored]
    if baseline and scoring.train_texts:
        # The obvious alternative on the same reviews, fit on the run's own train split.
        baseline_report, baseline_predictions = _score_baseline(scoring, label_names, reports[best])
        reports.append(baseline_report)
        predictions.append(baseline_predictions)
    add_uncertainty(reports, predictions, scoring.labels, label_names, best, resamples, seed)
    return reports, best


def _models_to_score(paths: list[str], calibrate: bool, ratings: bool = False) -> list[Path]:
    """The model folders to score: the runs named, or one run's checkpoints and final model; each checked."""
    from ..evaluation.inference import require_inference_folder
    from ..training.model_check import check_model_config, refuse_rating_model
    from ..training.runs import checkpoints, refuse_while_training

    for given in paths:
        if not Path(given).exists():
            raise FinetuneError(f"{given} not found; pass a run folder (output_dir) or a checkpoint-* folder")
        refuse_while_training(Path(given), "finetune evaluate")
    folder = Path(paths[0])
    if len(paths) > 1:
        models = [Path(given) for given in paths]
        seen: dict[Path, Path] = {}
        for model_dir in models:
            first = seen.setdefault(model_dir.resolve(), model_dir)
            if first is not model_dir:
                also = "" if str(first) == str(model_dir) else f" (as {first} too)"
                raise FinetuneError(f"{model_dir} is named twice{also}; name each run once")
        if calibrate:
            raise FinetuneError("--calibrate takes one run; calibrate each run on its own")
    else:
        models = checkpoints(folder)
        if (folder / "config.json").is_file() or not models:
            models.append(folder)
    for model_dir in models:
        require_inference_folder(model_dir)
        if not ratings:
            refuse_rating_model(model_dir, "finetune evaluate reads")
        # The weights are checked as each model loads to be scored; its classes before they are compared.
        check_model_config(model_dir)
    return models


def _tag_models(models: list[Path], calibrate: bool) -> bool:
    """Whether the models hold several tags per review (all do); a mix of kinds, or calibrating tags, is refused."""
    from ..config.tasks import MULTI_LABEL, task_of_folder

    kinds = {model_dir: task_of_folder(model_dir) == MULTI_LABEL for model_dir in models}
    if len(set(kinds.values())) > 1:
        tagged = ", ".join(str(model_dir) for model_dir, tags in kinds.items() if tags)
        raise FinetuneError(
            f"{tagged} predict several tags per review and the others one label; compare runs of one kind"
        )
    if all(kinds.values()):
        refuse_tag_calibration(calibrate)
    return all(kinds.values())


def _validation_reader(model_dir: Path) -> Callable[[], ScoringData | None]:
    """What reads the run's validation reviews when asked (the tag baseline's thresholds): None without that split."""

    def read() -> ScoringData | None:
        try:
            return load_labelled_texts(model_dir, None, "validation", _label_names(model_dir))
        except MissingSplit:
            return None

    return read


def _shared_label_names(models: list[Path]) -> list[str]:
    """The class names every model shares, in id order; models with other classes are refused."""
    label_names = _label_names(models[0])
    for model_dir in models[1:]:
        if _label_names(model_dir) != label_names:
            raise FinetuneError(
                f"{model_dir} has classes {_label_names(model_dir)}, {models[0]} has {label_names}; "
                "compare runs trained on the same classes"
            )
    return label_names


def _label_names(model_dir: Path) -> list[str]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    return [config.id2label[index] for index in range(config.num_labels)]


def add_uncertainty(
    reports: list[dict[str, Any]],
    predictions: list[Any],
    labels: list[int],
    label_names: list[str],
    best: int,
    resamples: int,
    seed: int,
) -> None:
    """Give each report its bootstrap intervals, and each but the best its paired comparison with the best."""
    from ..evaluation.bootstrap import paired_comparison, score_intervals

    for index, (report, predicted) in enumerate(zip(reports, predictions)):
        report["intervals"] = score_intervals(predicted, labels, label_names, resamples, seed)
        if index != best:
            report["vs_best"] = paired_comparison(
                predictions[best], predicted, labels, len(label_names), resamples, seed
            )


class MissingSplit(FinetuneError):
    """The run's data has no such split (a ``FinetuneError``, so the CLI still prints one line)."""


def _calibration_data(model_dir: Path, label_names: list[str]) -> ScoringData:
    """The run's validation reviews, which ``--calibrate`` fits its temperature on; refused for an int8 export."""
    from ..evaluation.inference import is_exported_folder

    if is_exported_folder(model_dir):
        raise FinetuneError(f"{model_dir} is an int8 export; calibrate the PyTorch model, then export it again")
    try:
        return load_labelled_texts(model_dir, None, "validation", label_names)
    except MissingSplit:
        raise FinetuneError(
            f"--calibrate fits a temperature on the run's validation split, and {model_dir}'s run has none "
            "(validation_split_percentage: 0 trains on all of train); train with a validation split "
            "(e.g. --validation_split_percentage 10) or leave out --calibrate"
        ) from None


def calibrate_model(
    model_dir: Path, validation: ScoringData, batch_size: int, scored_probabilities: Any, scored_labels: list[int]
) -> Path:
    """Fit a temperature on ``validation`` and fold it into ``model_dir``'s classifier; write calibration.json.

    The last linear layer's weights and bias are divided by T, so the saved
    logits are already the calibrated ones: ``finetune predict`` and
    ``transformers.pipeline`` use them with no code of their own. Predicted
    classes do not change. Fitting again on a calibrated model finds T near 1.
    """
    from ..evaluation.calibration import (
        expected_calibration_error,
        fit_temperature,
        scale_classifier,
        temperature_scaled,
    )
    from ..evaluation.inference import load_inference_model, predict_probabilities
    from ..training.runs import record_model_fingerprint

    model, tokenizer = load_inference_model(model_dir)
    probabilities = predict_probabilities(model, tokenizer, validation.texts, batch_size, validation.encoding)
    temperature = fit_temperature(probabilities, validation.labels)
    record_path = model_dir / "calibration.json"
    earlier = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {}
    record = {
        "method": "temperature scaling, folded into the last linear layer (weights and bias divided by T)",
        "temperature": temperature,
        # A second calibration scales the already scaled logits: the total is the product.
        "total_temperature": temperature * earlier.get("total_temperature", 1.0),
        "fitted_on": f"validation, {len(validation.labels)} reviews",
        "validation_ece_before": expected_calibration_error(probabilities, validation.labels),
        "validation_ece_after": expected_calibration_error(
            temperature_scaled(probabilities, temperature), validation.labels
        ),
        "scored_ece_before": expected_calibration_error(scored_probabilities, scored_labels),
        "scored_ece_after": expected_calibration_error(
            temperature_scaled(scored_probabilities, temperature), scored_labels
        ),
    }
    scale_classifier(model, temperature).save_pretrained(model_dir)
    # The rescaled model is the run's model now: no warning that it is not the one training saved.
    record_model_fingerprint(model_dir)
    write_output_text(record_path, json.dumps(record, indent=2) + "\n")
    print(
        f"calibrated {model_dir}: T = {temperature:.3f}, validation ECE {record['validation_ece_before']:.3f} -> "
        f"{record['validation_ece_after']:.3f}, scored split {record['scored_ece_before']:.3f} -> "
        f"{record['scored_ece_after']:.3f}",
        file=sys.stderr,
    )
    return record_path


def write_errors_and_calibration(
    folder: Path,
    scored_on: str,
    scoring: ScoringData,
    probabilities: Any,
    label_names: list[str],
    best: dict[str, Any],
    explain: bool = True,
    raw_csv: bool = False,
) -> list[Path]:
    """The best model's largest losses as ``errors_<scored_on>.csv`` and its reliability diagram; ECE into ``best``.

    With ``explain`` each listed mistake's ``top_words`` is filled; without, the column stays empty.
    With ``raw_csv`` the errors file's cells are written as they are, formulas included.
    """
    from ..evaluation.calibration import calibration_table, expected_calibration_error
    from ..evaluation.errors import write_largest_losses
    from ..evaluation.report import plot_reliability

    errors = folder / f"errors_{scored_on}.csv"
    explainer = _mistake_explainer(Path(best["model"]), scoring.encoding) if explain else None
    write_largest_losses(
        errors, scoring.texts, scoring.labels, probabilities, label_names, explainer=explainer, raw_csv=raw_csv
    )
    best["ece"] = expected_calibration_error(probabilities, scoring.labels)
    reliability = folder / f"reliability_{scored_on}.png"
    plot_reliability(
        reliability,
        calibration_table(probabilities, scoring.labels),
        f"{Path(best['model']).name} on {scored_on}: {len(scoring.labels)} reviews, ECE {best['ece']:.3f}",
    )
    return [errors, reliability]


def _mistake_explainer(model_dir: Path, encoding: ReviewEncoding) -> Any:
    """What fills ``errors_<split>.csv``'s ``top_words``: the words behind each mistake's wrong label.

    None (the column left empty, with a note) for an int8 export that keeps no fp32 model to take gradients of.
    """
    from ..evaluation.explain import can_explain_folder, explain_predictions, format_top_words
    from ..evaluation.inference import load_inference_model

    if not can_explain_folder(model_dir):
        print(
            f"note: errors file without top words: {model_dir} is an int8 export with no fp32 model to explain "
            "with (export with --fp32_fallback 0.1, or evaluate the run folder)",
            file=sys.stderr,
        )
        return None

    def explain(texts: list[str], probabilities: Any) -> list[str]:
        # Loaded again rather than kept from scoring: a run's checkpoints are not all held in memory.
        model, tokenizer = load_inference_model(model_dir)
        explanations = explain_predictions(model, tokenizer, texts, probabilities, max_length=encoding.max_length)
        return [format_top_words(explanation) for explanation in explanations]

    return explain


def write_pictures_and_table(
    folder: Path, scored_on: str, reports: list[dict[str, Any]], label_names: list[str]
) -> list[Path]:
    """Write the table as markdown, the best model's confusion matrix and the scores per checkpoint.

    The files go beside ``evaluation_<scored_on>.json``; the checkpoint
    picture only when a run's checkpoints were scored. Returns the files written.
    """
    from ..evaluation.report import plot_checkpoints, plot_confusion_matrix, plot_scores

    table = folder / f"evaluation_{scored_on}.md"
    write_output_text(table, format_table(reports) + "\n")
    best = next(report for report in reports if report.get("best"))
    confusion = folder / f"confusion_matrix_{scored_on}.png"
    title = (
        f"{Path(best['model']).name} on {scored_on}: {best['num_samples']} reviews, "
        f"accuracy {best['accuracy']:.3f}, macro-F1 {best['macro_f1']:.3f}"
    )
    written = [table]
    if best.get("confusion_matrix") is not None:  # None past CONFUSION_MATRIX_MAX_CLASSES classes
        plot_confusion_matrix(confusion, best["confusion_matrix"], label_names, title)
        written.append(confusion)
    if all("intervals" in report for report in reports):
        scores = folder / f"scores_{scored_on}.png"
        # A run's checkpoints: the best against the baseline; runs compared: every run.
        compared = all(report["step"] is None for report in reports)
        shown = [report for report in reports if compared or report.get("best") or report.get("kind") == "baseline"]
        plot_scores(scores, shown, label_names, f"{scored_on}, {best['num_samples']} reviews")
        written.append(scores)
    models = [report for report in reports if report.get("kind") != "baseline"]
    if len(models) > 1 and any(report["step"] is not None for report in models):
        progress = folder / f"checkpoints_{scored_on}.png"
        plot_checkpoints(progress, models, f"{folder.resolve().name} on {scored_on} ({best['num_samples']} reviews)")
        written.append(progress)
    return written


def _score(
    model_dir: Path, scoring: ScoringData, label_names: list[str], batch_size: int
) -> tuple[dict[str, Any], Any]:
    """The report of the model in ``model_dir`` on the scored reviews, and its probabilities."""
    from ..evaluation.inference import load_inference_model, predict_probabilities, warn_if_model_changed
    from ..evaluation.metrics import classification_report
    from ..training.runs import checkpoint_step

    model, tokenizer = load_inference_model(model_dir)
    warn_if_model_changed(model_dir, "its scores")
    probabilities = predict_probabilities(model, tokenizer, scoring.texts, batch_size, scoring.encoding)
    report = classification_report(probabilities.argmax(-1), scoring.labels, label_names)
    return {"model": str(model_dir), "step": checkpoint_step(model_dir), **report}, probabilities


@dataclass
class ScoringData:
    """The reviews to score a model on, and the run's training reviews (for the baseline) when at hand."""

    texts: list[str]
    labels: list[int]
    encoding: ReviewEncoding
    train_texts: list[str] = field(default_factory=list)
    train_labels: list[int] = field(default_factory=list)


def load_labelled_texts(
    model_dir: Path, data: str | None, split: str, label_names: list[str], raw_csv: bool = False
) -> ScoringData:
    """Texts and label ids to score ``model_dir`` on, read as its run's recipe says.

    The run's train split comes along when its data can be read (for a
    ``--data`` file too), so the baseline can be fit on what the model saw. A
    ``data`` CSV's cells lose the ``'`` that guards a formula, unless ``raw_csv``.
    """
    from ..config.arguments import DataArguments
    from ..data.splits import load_labelled_file
    from ..training.runs import changed_data_files, find_run_config, load_run_data, run_folder

    run_config = find_run_config(model_dir)
    if run_config is None and data is None:
        raise FinetuneError(f"{model_dir} has no {split} data on record; pass --data FILE with text and label columns")
    fields = dict(run_config["data"]) if run_config else {}
    if fields.get("task") not in ORDERED_TASKS:  # a ratings run reads its stars as numbers, not as classes
        fields["class_names"] = label_names if not fields.get("label_bins") else None
    data_args = DataArguments(**fields)
    encoding = ReviewEncoding.from_fields(fields)
    if data is not None:
        if not Path(data).is_file():
            raise FinetuneError(f"data file not found: {data}; check the path")
        scored = load_labelled_file(Path(data), data_args, label_names, unguard_csv=not raw_csv)
        scoring = ScoringData(column_values(scored, "text"), column_values(scored, "labels"), encoding)
        if run_config is not None:
            with contextlib.suppress(FinetuneError, OSError):
                train = load_run_data(run_config, data_args).splits["train"]
                scoring.train_texts, scoring.train_labels = column_values(train, "text"), column_values(train, "labels")
        return scoring
    splits = load_run_data(run_config, data_args).splits
    changed = changed_data_files(run_config, data_args)
    if changed:
        print(
            f"warning: {', '.join(changed)} changed since {run_folder(model_dir)} was trained "
            "(other bytes than on record); the scores are on the files as they are now",
            file=sys.stderr,
        )
    if split not in splits:
        choices = [f"--split {name}" for name in splits if name != "train"] + ["--data FILE"]
        raise MissingSplit(
            f"the run's data has no '{split}' split (it has {', '.join(splits)}); pass {' or '.join(choices)}"
        )
    return ScoringData(
        column_values(splits[split], "text"),
        column_values(splits[split], "labels"),
        encoding,
        column_values(splits["train"], "text"),
        column_values(splits["train"], "labels"),
    )


def _score_baseline(scoring: ScoringData, label_names: list[str], best: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The TF-IDF baseline's report on the scored reviews, with the best model's lead over it; and its predictions."""
    from ..evaluation.baseline import DESCRIPTION, TfidfBaseline, compare
    from ..evaluation.metrics import classification_report

    baseline = TfidfBaseline(len(label_names)).fit(scoring.train_texts, scoring.train_labels)
    predictions = baseline.predict(scoring.texts)
    report = classification_report(predictions, scoring.labels, label_names)
    return {
        "model": "TF-IDF baseline",
        "kind": "baseline",
        "description": DESCRIPTION,
        "train_reviews": baseline.train_reviews,
        "step": None,
        **report,
        "best_vs_baseline": compare(best, report),
    }, predictions


def format_table(reports: list[dict[str, Any]]) -> str:
    """A markdown table of the reports with 95% intervals, the best starred, the others tested against it."""
    from ..evaluation.bootstrap import describe_comparison
    from ..evaluation.model_names import distinct_names

    lines = [
        "| model | step | accuracy [95% interval] | macro-F1 [95% interval] | best | against the best (paired) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    names = distinct_names([report["model"] for report in reports if report.get("kind") != "baseline"])
    for report in reports:
        versus = describe_comparison(report["vs_best"]) if "vs_best" in report else "-"
        scores = f"{_with_interval(report, 'accuracy')} | {_with_interval(report, 'macro_f1')}"
        if report.get("kind") == "baseline":
            lead = report["best_vs_baseline"]
            lines.append(
                f"| {report['model']} | - | {scores} | "
                f"best leads by {lead['accuracy']:+.4f} / {lead['macro_f1']:+.4f} | {versus} |"
            )
            continue
        step = "final" if report["step"] is None else str(report["step"])
        mark = "*" if report.get("best") else ""
        lines.append(f"| {names[report['model']]} | {step} | {scores} | {mark} | {versus} |")
    return "\n".join(lines)


def _with_interval(report: dict[str, Any], metric: str) -> str:
    interval = report.get("intervals", {}).get(metric)
    if interval is None:
        return f"{report[metric]:.4f}"
    return f"{report[metric]:.4f} [{interval[0]:.3f}, {interval[1]:.3f}]"
