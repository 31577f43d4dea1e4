"""``finetune evaluate``: score a model folder, or every checkpoint of a run, on labelled reviews."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.encoding import ReviewEncoding
from ..errors import FinetuneError


def evaluate(
    path: str,
    data: str | None = None,
    split: str = "test",
    batch_size: int = 32,
    baseline: bool = True,
) -> list[dict[str, Any]]:
    """Score ``path`` (a model folder or a run folder) and print a table; returns one report per model.

    For a run folder every ``checkpoint-*`` is scored as well as the final
    model, and the best by macro-F1 is marked. The data is the run's
    ``split`` (from its recipe) unless ``data`` names a file with the same columns.
    With ``baseline`` (and the run's train split at hand) the TF-IDF baseline,
    fit on that split, is scored on the same reviews and added as a last row.
    """
    from ..training.runs import checkpoints, require_model_folder

    folder = Path(path)
    if not folder.exists():
        raise FinetuneError(f"{path} not found; pass a run folder (output_dir) or a checkpoint-* folder")
    models = checkpoints(folder)
    if (folder / "config.json").is_file() or not models:
        models.append(folder)
    for model_dir in models:
        require_model_folder(model_dir)

    # Every checkpoint of a run shares its classes and data: read the data once.
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(models[0])
    label_names = [config.id2label[index] for index in range(config.num_labels)]
    scoring = load_labelled_texts(models[0], data, split, label_names)
    reports = [_score(model_dir, scoring, label_names, batch_size) for model_dir in models]
    best = max(range(len(reports)), key=lambda index: reports[index]["macro_f1"])
    for index, report in enumerate(reports):
        report["best"] = index == best
    if baseline and scoring.train_texts:
        # The obvious alternative on the same reviews, fit on the run's own train split.
        reports.append(_score_baseline(scoring, label_names, reports[best]))
    print(format_table(reports))
    scored_on = Path(data).stem if data else split
    out_name = f"evaluation_{scored_on}.json"
    (folder / out_name).write_text(json.dumps(reports, indent=2) + "\n", encoding="utf-8")
    print(f"saved to {folder / out_name}", file=sys.stderr)
    written = write_pictures_and_table(folder, scored_on, reports, label_names)
    print(f"also wrote {', '.join(path.name for path in written)}", file=sys.stderr)
    return reports


def write_pictures_and_table(
    folder: Path, scored_on: str, reports: list[dict[str, Any]], label_names: list[str]
) -> list[Path]:
    """Write the table as markdown, the best model's confusion matrix and the scores per checkpoint.

    The files go beside ``evaluation_<scored_on>.json``; the checkpoint
    picture only when a run's checkpoints were scored. Returns the files written.
    """
    from ..evaluation.report import plot_checkpoints, plot_confusion_matrix

    table = folder / f"evaluation_{scored_on}.md"
    table.write_text(format_table(reports) + "\n", encoding="utf-8")
    best = next(report for report in reports if report.get("best"))
    confusion = folder / f"confusion_matrix_{scored_on}.png"
    title = (
        f"{Path(best['model']).name} on {scored_on}: {best['num_samples']} reviews, "
        f"accuracy {best['accuracy']:.3f}, macro-F1 {best['macro_f1']:.3f}"
    )
    plot_confusion_matrix(confusion, best["confusion_matrix"], label_names, title)
    written = [table, confusion]
    models = [report for report in reports if report.get("kind") != "baseline"]
    if len(models) > 1 and any(report["step"] is not None for report in models):
        progress = folder / f"checkpoints_{scored_on}.png"
        plot_checkpoints(progress, models, f"{folder.resolve().name} on {scored_on} ({best['num_samples']} reviews)")
        written.append(progress)
    return written


def _score(model_dir: Path, scoring: ScoringData, label_names: list[str], batch_size: int) -> dict[str, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..evaluation.inference import predict_probabilities
    from ..evaluation.metrics import classification_report
    from ..training.runs import checkpoint_step

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    probabilities = predict_probabilities(model, tokenizer, scoring.texts, batch_size, scoring.encoding)
    report = classification_report(probabilities.argmax(-1), scoring.labels, label_names)
    return {"model": str(model_dir), "step": checkpoint_step(model_dir), **report}


@dataclass
class ScoringData:
    """The reviews to score a model on, and the run's training reviews (for the baseline) when at hand."""

    texts: list[str]
    labels: list[int]
    encoding: ReviewEncoding
    train_texts: list[str] = field(default_factory=list)
    train_labels: list[int] = field(default_factory=list)


def load_labelled_texts(model_dir: Path, data: str | None, split: str, label_names: list[str]) -> ScoringData:
    """Texts and label ids to score ``model_dir`` on, read as its run's recipe says.

    The run's train split comes along when its data can be read (for a
    ``--data`` file too), so the baseline can be fit on what the model saw.
    """
    from ..config.arguments import DataArguments
    from ..data.splits import load_labelled_file, load_review_data
    from ..training.runs import find_run_config

    run_config = find_run_config(model_dir)
    if run_config is None and data is None:
        raise FinetuneError(f"{model_dir} has no {split} data on record; pass --data FILE with text and label columns")
    fields = dict(run_config["data"]) if run_config else {}
    fields["class_names"] = label_names if not fields.get("label_bins") else None
    data_args = DataArguments(**fields)
    encoding = ReviewEncoding.from_fields(fields)
    if data is not None:
        if not Path(data).is_file():
            raise FinetuneError(f"data file not found: {data}; check the path")
        scored = load_labelled_file(Path(data), data_args, label_names)
        scoring = ScoringData(list(scored["text"]), list(scored["labels"]), encoding)
        if run_config is not None:
            with contextlib.suppress(FinetuneError, OSError):
                train = load_review_data(data_args, seed=run_config.get("seed", 42)).splits["train"]
                scoring.train_texts, scoring.train_labels = list(train["text"]), list(train["labels"])
        return scoring
    splits = load_review_data(data_args, seed=run_config.get("seed", 42)).splits
    if split not in splits:
        raise FinetuneError(f"the run's data has no '{split}' split; pass --split validation or --data FILE")
    return ScoringData(
        list(splits[split]["text"]),
        list(splits[split]["labels"]),
        encoding,
        list(splits["train"]["text"]),
        list(splits["train"]["labels"]),
    )


def _score_baseline(scoring: ScoringData, label_names: list[str], best: dict[str, Any]) -> dict[str, Any]:
    """The TF-IDF baseline's report on the scored reviews, with the best model's lead over it."""
    from ..evaluation.baseline import DESCRIPTION, TfidfBaseline, compare
    from ..evaluation.metrics import classification_report

    baseline = TfidfBaseline(len(label_names)).fit(scoring.train_texts, scoring.train_labels)
    report = classification_report(baseline.predict(scoring.texts), scoring.labels, label_names)
    return {
        "model": "TF-IDF baseline",
        "kind": "baseline",
        "description": DESCRIPTION,
        "train_reviews": baseline.train_reviews,
        "step": None,
        **report,
        "best_vs_baseline": compare(best, report),
    }


def format_table(reports: list[dict[str, Any]]) -> str:
    """A markdown table of the reports, the best marked with a star."""
    lines = ["| model | step | accuracy | macro-F1 | best |", "| --- | --- | --- | --- | --- |"]
    for report in reports:
        if report.get("kind") == "baseline":
            lead = report["best_vs_baseline"]
            lines.append(
                f"| {report['model']} | - | {report['accuracy']:.4f} | {report['macro_f1']:.4f} | "
                f"best leads by {lead['accuracy']:+.4f} / {lead['macro_f1']:+.4f} |"
            )
            continue
        step = "final" if report["step"] is None else str(report["step"])
        mark = "*" if report.get("best") else ""
        lines.append(
            f"| {Path(report['model']).name} | {step} | {report['accuracy']:.4f} | {report['macro_f1']:.4f} | {mark} |"
        )
    return "\n".join(lines)
