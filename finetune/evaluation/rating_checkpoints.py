"""``finetune evaluate`` on a star-rating run (``regression``, ``ordinal``): every model scored in stars, best by MAE.

As for classes (``finetune/commands/evaluate.py``): each checkpoint and the final model are
scored on the run's split (or ``--data``), each score with a 95% bootstrap
interval; the model with the lowest MAE is marked best and every other is
tested against it on the same resamples (the paired MAE difference); the
ridge baseline, fitted on the run's train split, is the last row. The reports
go to ``evaluation_<split>.json`` and the table to stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..config.output_files import write_output_text
from ..errors import FinetuneError


def holds_ratings(path: Path) -> bool:
    """Whether ``path`` (a model or run folder; else its first checkpoint) holds a star-rating model."""
    from ..config.tasks import ORDERED_TASKS, task_of_folder
    from ..training.runs import checkpoints

    for folder in [path, *checkpoints(path)[:1]]:
        if (folder / "config.json").is_file():
            return task_of_folder(folder) in ORDERED_TASKS  # an unreadable config: the folder's checks say so
    return False


def rating_level_names(model_dir: Path) -> list[str]:
    """The rating levels a run recorded (``finetune_run.json``), in order."""
    from ..training.runs import find_run_config, recorded_class_names

    level_names = recorded_class_names(find_run_config(model_dir) or {})
    if level_names is None:
        raise FinetuneError(f"{model_dir} has no rating levels on record (finetune_run.json); evaluate a run folder")
    return level_names


def evaluate_ratings(
    models: list[Path], scoring: Any, scored_on: str, batch_size: int, baseline: bool, resamples: int, seed: int
) -> list[dict[str, Any]]:
    """Score each of ``models`` (checked folders of one ratings run) in stars on ``scoring`` (its texts and levels).

    Returns the reports, the best (lowest MAE) marked, the ridge baseline last.
    """
    level_names = rating_level_names(models[0])
    scored = [_score_stars(model_dir, scoring, level_names, batch_size) for model_dir in models]
    reports = [report for report, _ in scored]
    best = min(range(len(reports)), key=lambda index: reports[index]["mae"])
    for index, (report, errors) in enumerate(scored):
        report["best"] = index == best
        if index != best:
            report["vs_best"] = _paired(scored[best][1], errors, resamples, seed)
    if baseline and scoring.train_texts:
        reports.append(_ridge_row(scoring, level_names, reports[best], scored[best][1], resamples, seed))
    print(format_star_table(reports))
    folder = Path(models[0]) if len(models) == 1 else Path(models[0]).parent
    out = folder / f"evaluation_{scored_on}.json"
    write_output_text(out, json.dumps(reports, indent=2) + "\n")
    print(f"saved to {out}", file=sys.stderr)
    return reports


def _score_stars(model_dir: Path, scoring: Any, level_names: list[str], batch_size: int) -> tuple[dict[str, Any], Any]:
    """One model's ordered report on the scored reviews, and each review's absolute error in stars."""
    import numpy as np

    from ..training.ordered_heads import StarReader, from_outputs
    from ..training.runs import checkpoint_step
    from .inference import load_inference_model, predict_probabilities, warn_if_model_changed
    from .ordered import ordered_report

    model, tokenizer = load_inference_model(model_dir, ratings_read=True)
    warn_if_model_changed(model_dir, "its scores")
    # Read as predict and serve read it: a checkpoint whose config lost its scale is refused in one line.
    stars = StarReader.of_config(model.config, model_dir)
    task, scale = stars.task, stars.scale
    outputs = predict_probabilities(model, tokenizer, scoring.texts, batch_size, scoring.encoding)
    predicted_ratings, predicted_levels = from_outputs(outputs, task, scale)
    true_levels = np.asarray(scoring.labels, dtype=np.int64)
    true_ratings = np.asarray(scale.levels)[true_levels]
    report = ordered_report(true_ratings, predicted_ratings, true_levels, predicted_levels, level_names, task)
    return {"model": str(model_dir), "step": checkpoint_step(model_dir), **report}, np.abs(
        predicted_ratings - true_ratings
    )


def _paired(best_errors: Any, errors: Any, resamples: int, seed: int) -> dict[str, Any]:
    from .ordered import paired_mae_difference

    return paired_mae_difference(best_errors, errors, resamples, seed)


def _ridge_row(
    scoring: Any, level_names: list[str], best: dict[str, Any], best_errors: Any, resamples: int, seed: int
) -> dict[str, Any]:
    """The ridge baseline fitted on the run's train split, scored on the same reviews, tested against the best."""
    import numpy as np

    from ..data.ratings import RatingScale
    from .ordered import ordered_report
    from .rating_baseline import RidgeRatings

    scale = RatingScale.of_train(level_names, scoring.train_labels)
    levels = np.asarray(scale.levels)
    ridge = RidgeRatings(scale.levels).fit(scoring.train_texts, levels[np.asarray(scoring.train_labels)])
    predicted_ratings, predicted_levels = ridge.ratings_and_levels(scoring.texts, best["task"])
    true_levels = np.asarray(scoring.labels, dtype=np.int64)
    report = ordered_report(
        levels[true_levels], predicted_ratings, true_levels, predicted_levels, level_names, best["task"]
    )
    errors = np.abs(predicted_ratings - levels[true_levels])
    return {
        "model": "TF-IDF ridge baseline",
        "kind": "baseline",
        "step": None,
        **report,
        "vs_best": _paired(best_errors, errors, resamples, seed),
    }


def format_star_table(reports: list[dict[str, Any]]) -> str:
    """A markdown table of the ratings reports with 95% intervals, the best starred, the others against it."""
    lines = [
        "| model | step | MAE [95% interval] | off-by-one | QWK | accuracy | macro-F1 | best | MAE vs best (paired) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for report in reports:
        interval = report["intervals"]["mae"]
        versus = report.get("vs_best")
        against = (
            f"{versus['mae_difference']:+.3f} [{versus['mae_interval'][0]:+.3f}, {versus['mae_interval'][1]:+.3f}]"
            + ("" if versus["distinguishable"] else ", not distinguishable")
            if versus
            else "-"
        )
        name = report["model"] if report.get("kind") == "baseline" else Path(report["model"]).name
        step = "-" if report.get("kind") == "baseline" else "final" if report["step"] is None else str(report["step"])
        lines.append(
            f"| {name} | {step} | {report['mae']:.3f} [{interval[0]:.3f}, {interval[1]:.3f}] | "
            f"{report['off_by_one_accuracy']:.3f} | {report['quadratic_weighted_kappa']:.3f} | "
            f"{report['accuracy']:.3f} | {report['macro_f1']:.3f} | {'*' if report.get('best') else ''} | {against} |"
        )
    return "\n".join(lines)
