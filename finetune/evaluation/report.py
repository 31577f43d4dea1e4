"""What a run leaves for people to look at: pictures of training and scoring, and the numbers behind them.

``finetune train`` writes ``report/`` in the run folder (``loss.png``,
``lr.png``, ``grad_norm.png``, ``confusion_matrix_test.png``,
``history.csv``, ``metrics.json``); ``finetune evaluate`` draws a confusion
matrix and the scores per checkpoint with :func:`plot_confusion_matrix` and
:func:`plot_checkpoints`.

Figures are drawn on matplotlib's Agg canvas without pyplot, so nothing
needs a display and no global backend state is touched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..config.output_files import output_file, write_output_text
from .figures import CONFUSION_INCHES, FIGURE_INCHES, new_figure, save_figure

REPORT_DIR = "report"
UPDATE_AXIS_LABEL = "update (optimizer step)"
# Trainer's closing log entry (runtime, mean loss of the run) is a summary, not a point in time.
_SUMMARY_KEYS = ("train_runtime", "train_loss")


class UpdateRecorder(TrainerCallback):
    """Records the epoch and learning rate of every update.

    ``log_history`` holds them only every ``logging_steps`` updates, which
    would hide the shape of a short warmup; this keeps the schedule as stepped.
    """

    def __init__(self) -> None:
        self.updates: list[dict[str, float]] = []
        self._learning_rate = math.nan

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, optimizer: Any = None, **kwargs
    ) -> None:
        """Read the learning rate before the update: the scheduler steps after it."""
        if optimizer is not None:
            self._learning_rate = float(optimizer.param_groups[0]["lr"])

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        """One row per update, numbered as ``state.global_step`` (the step ``log_history`` uses)."""
        self.updates.append({"step": state.global_step, "epoch": state.epoch, "learning_rate": self._learning_rate})


# ------------------------------------------------------------------ numbers


def effective_batch(args: TrainingArguments) -> dict[str, int]:
    """Reviews per update and its factors: micro-batch x accumulation steps x processes."""
    per_device = args.per_device_train_batch_size
    accumulation = args.gradient_accumulation_steps
    world_size = args.world_size
    return {
        "effective_batch": per_device * accumulation * world_size,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        "world_size": world_size,
    }


def batch_caption(batch: dict[str, int]) -> str:
    """``effective batch 16 = 8 x 2 x 1``."""
    return (
        f"effective batch {batch['effective_batch']} = {batch['per_device_train_batch_size']} x "
        f"{batch['gradient_accumulation_steps']} x {batch['world_size']}"
    )


def recipe_name(recipe: str | None) -> str:
    """The recipe file's stem, or ``python`` for a run built from arguments in code."""
    return Path(recipe).stem if recipe else "python"


def history_rows(log_history: Sequence[dict[str, Any]], updates: Sequence[dict[str, float]]) -> list[dict[str, Any]]:
    """One row per update and one per evaluation, in step order, ``kind`` saying which.

    Update rows carry the learning rate of every update (from
    :class:`UpdateRecorder`); ``loss`` and ``grad_norm`` only on the updates
    ``log_history`` logged, where ``loss`` is the mean over the updates since
    the previous log. Evaluation rows carry ``eval_*`` metrics.
    """
    update_rows: dict[int, dict[str, Any]] = {
        int(update["step"]): {"kind": "update", **update, "step": int(update["step"])} for update in updates
    }
    evaluation_rows = []
    for entry in log_history:
        if any(key in entry for key in _SUMMARY_KEYS):
            continue
        if any(key.startswith("eval_") for key in entry):
            evaluation_rows.append({"kind": "evaluation", **entry})
        elif "loss" in entry:
            # A run resumed from a checkpoint has only logged rows for the updates before it.
            row = update_rows.setdefault(int(entry["step"]), {"kind": "update", "step": int(entry["step"])})
            row.update({key: entry[key] for key in ("loss", "grad_norm") if key in entry})
            for key in ("epoch", "learning_rate"):
                if key in entry:
                    row.setdefault(key, entry[key])
    rows = [*update_rows.values(), *evaluation_rows]
    # Stable sort: at the same step the update comes before the evaluation that followed it.
    return sorted(rows, key=lambda row: (row["step"], row["kind"] == "evaluation"))


def write_history_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """``rows`` as CSV: ``kind, step, epoch, learning_rate, loss, grad_norm``, then the ``eval_*`` columns."""
    import pandas as pd

    leading = ["kind", "step", "epoch", "learning_rate", "loss", "grad_norm"]
    table = pd.DataFrame(list(rows))
    for column in leading:
        if column not in table:
            table[column] = math.nan
    table = table[leading + [column for column in table.columns if column not in leading]]
    with output_file(path) as handle:
        table.to_csv(handle, index=False)


# ----------------------------------------------------------------- the run


def write_run_report(
    output_dir: str | Path,
    args: TrainingArguments,
    state: TrainerState,
    updates: Sequence[dict[str, float]],
    recipe: str | None,
    train_metrics: dict[str, Any],
    test_report: dict[str, Any] | None = None,
    baseline: dict[str, Any] | None = None,
) -> Path:
    """Write ``report/`` in ``output_dir``: the training pictures, ``history.csv`` and ``metrics.json``.

    ``baseline`` is the TF-IDF baseline's result (``BaselineResult.to_dict()``); with a
    test report it adds ``vs_baseline``, this model minus the baseline on test.

    Returns the report folder.
    """
    folder = Path(output_dir) / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    rows = history_rows(state.log_history, updates)
    write_history_csv(rows, folder / "history.csv")

    batch = effective_batch(args)
    update_rows = [row for row in rows if row["kind"] == "update"]
    evaluation_rows = [row for row in rows if row["kind"] == "evaluation"]
    warmup_updates = args.get_warmup_steps(state.max_steps) if state.max_steps else 0
    heading = f"recipe {recipe_name(recipe)}, {batch_caption(batch)}"
    pictures = _draw_training(folder, args, state, update_rows, evaluation_rows, heading, warmup_updates)
    pictures.update(_draw_test(folder, test_report, baseline))

    metrics = {
        "recipe": recipe,
        "recipe_name": recipe_name(recipe),
        "batch": batch,
        "updates": state.global_step,
        "epochs": state.epoch,
        "warmup_updates": warmup_updates,
        "logging_steps": state.logging_steps,
        "metric_for_best_model": args.metric_for_best_model,
        "best_metric": state.best_metric,
        "best_model_checkpoint": state.best_model_checkpoint,
        "train": train_metrics,
        "last_evaluation": evaluation_rows[-1] if evaluation_rows else None,
        "test": test_report,
        "baseline": baseline,
        "vs_baseline": _versus_baseline(test_report, baseline),
        "pictures": pictures,
    }
    write_output_text(folder / "metrics.json", json.dumps(metrics, indent=2, default=str) + "\n")
    return folder


def _draw_training(
    folder: Path,
    args: TrainingArguments,
    state: TrainerState,
    update_rows: Sequence[dict[str, Any]],
    evaluation_rows: Sequence[dict[str, Any]],
    heading: str,
    warmup_updates: int,
) -> dict[str, str]:
    """The loss, learning-rate and gradient-norm pictures of a run in ``folder``; each picture's caption by name."""
    # Updates are the x axis; epochs run in proportion to them (exactly at each epoch's end).
    epochs_per_update = state.epoch / state.global_step if state.global_step and state.epoch else None
    plot_loss(
        folder / "loss.png",
        update_rows,
        evaluation_rows,
        heading,
        _loss_interval(args, state, update_rows),
        weighted=getattr(args, "class_weighting", "none") != "none",
        epochs_per_update=epochs_per_update,
    )
    plot_learning_rate(folder / "lr.png", update_rows, heading, warmup_updates, epochs_per_update)
    plot_grad_norm(folder / "grad_norm.png", update_rows, heading, args.max_grad_norm, epochs_per_update)
    return {
        "loss.png": "training loss per logged update and evaluation loss per evaluation (history.csv)",
        "lr.png": "learning rate of every update, as stepped (history.csv, learning_rate)",
        "grad_norm.png": "gradient norm before clipping, per logged update (history.csv, grad_norm)",
    }


def _draw_test(folder: Path, test_report: dict[str, Any] | None, baseline: dict[str, Any] | None) -> dict[str, str]:
    """The test pictures in ``folder``: the confusion matrix, or for tags each tag's F1 and their co-occurrence."""
    if test_report is None:
        return {}
    if test_report.get("task") == "multi_label":
        from .tag_pictures import draw_tag_pictures

        return draw_tag_pictures(folder, test_report, ((baseline or {}).get("scores") or {}).get("test"))
    if test_report.get("confusion_matrix") is None:
        return {}
    plot_confusion_matrix(
        folder / "confusion_matrix_test.png",
        test_report["confusion_matrix"],
        list(test_report["per_class"]),
        _score_title("the final model on test", test_report),
    )
    return {"confusion_matrix_test.png": "test confusion matrix of the saved model (metrics.json, test)"}


def add_to_run_metrics(report_dir: str | Path, key: str, value: Any) -> None:
    """Add ``key`` to ``report_dir``'s ``metrics.json`` (known only once the report is written: the run's timing)."""
    path = Path(report_dir) / "metrics.json"
    metrics = json.loads(path.read_text(encoding="utf-8"))
    metrics[key] = value
    write_output_text(path, json.dumps(metrics, indent=2, default=str) + "\n")


def _versus_baseline(test_report: dict[str, Any] | None, baseline: dict[str, Any] | None) -> dict[str, float] | None:
    from .baseline import compare

    baseline_test = (baseline or {}).get("scores", {}).get("test")
    if test_report is None or baseline_test is None:
        return None
    return compare(test_report, baseline_test)


def _loss_interval(args: TrainingArguments, state: TrainerState, update_rows: Sequence[dict[str, Any]]) -> str:
    """How the plotted training loss is averaged, for the legend."""
    logged = sum(1 for row in update_rows if _finite(row.get("loss")))
    if logged and logged == len(update_rows):
        return "per update"
    if args.logging_strategy == "epoch":
        return "mean over each epoch"
    return f"mean over each {state.logging_steps} updates (logging_steps)"


def _score_title(what: str, report: dict[str, Any]) -> str:
    return (
        f"{what}: {report['num_samples']} reviews, accuracy {report['accuracy']:.3f}, macro-F1 {report['macro_f1']:.3f}"
    )


# ---------------------------------------------------------------- pictures


def plot_loss(
    path: Path,
    update_rows: Sequence[dict[str, Any]],
    evaluation_rows: Sequence[dict[str, Any]],
    heading: str,
    loss_interval: str,
    weighted: bool = False,
    epochs_per_update: float | None = None,
) -> None:
    """Training loss at the logged updates and evaluation loss at each evaluation, against updates."""
    figure, axes = new_figure(FIGURE_INCHES)
    train = _points(update_rows, "loss")
    evaluation = _points(evaluation_rows, "eval_loss")
    if train[0]:
        axes.plot(*train, marker="o", markersize=3, label=f"training loss, {loss_interval}")
    if evaluation[0]:
        axes.plot(*evaluation, marker="s", markersize=6, linestyle="--", label="evaluation loss (validation split)")
    kind = "class-weighted cross-entropy" if weighted else "cross-entropy"
    _finish(
        axes,
        f"Loss: {heading}",
        f"{kind} loss (mean per review)",
        epochs_per_update,
        empty="no loss was logged: set logging_steps and eval_strategy" if not (train[0] or evaluation[0]) else None,
    )
    save_figure(figure, path)


def plot_learning_rate(
    path: Path,
    update_rows: Sequence[dict[str, Any]],
    heading: str,
    warmup_updates: int,
    epochs_per_update: float | None = None,
) -> None:
    """The learning rate each update used, drawn as steps, with the warmup shaded."""
    from matplotlib.ticker import FuncFormatter

    figure, axes = new_figure(FIGURE_INCHES)
    steps, rates = _points(update_rows, "learning_rate")
    if steps:
        axes.plot(steps, rates, drawstyle="steps-post", marker="." if len(steps) <= 60 else None, label="learning rate")
        if warmup_updates:
            axes.axvspan(
                min(steps),
                warmup_updates + 1,
                color="tab:orange",
                alpha=0.15,
                label=f"warmup ({warmup_updates} updates)",
            )
        # Plain numbers on each tick: matplotlib's shared "1e-3" offset lands on the epoch axis.
        axes.yaxis.set_major_formatter(FuncFormatter(lambda rate, _: f"{rate:.3g}"))
    _finish(
        axes,
        f"Learning rate: {heading}",
        "learning rate (per update)",
        epochs_per_update,
        empty=None if steps else "no update was made",
    )
    axes.set_ylim(bottom=0)
    save_figure(figure, path)


def plot_grad_norm(
    path: Path,
    update_rows: Sequence[dict[str, Any]],
    heading: str,
    max_grad_norm: float,
    epochs_per_update: float | None = None,
) -> None:
    """The gradient norm before clipping at the logged updates, with the clipping threshold."""
    figure, axes = new_figure(FIGURE_INCHES)
    steps, norms = _points(update_rows, "grad_norm")
    if steps:
        axes.plot(steps, norms, marker="o", markersize=3, label="gradient norm of the update (before clipping)")
        if max_grad_norm and max_grad_norm > 0:
            axes.axhline(
                max_grad_norm, color="tab:red", linestyle=":", label=f"clipped above max_grad_norm = {max_grad_norm:g}"
            )
    _finish(
        axes,
        f"Gradient norm: {heading}",
        "global L2 norm of the gradient",
        epochs_per_update,
        empty=None if steps else "no gradient norm was logged: set logging_steps",
    )
    axes.set_ylim(bottom=0)
    save_figure(figure, path)


def plot_confusion_matrix(path: Path, matrix: Sequence[Sequence[int]], label_names: Sequence[str], title: str) -> None:
    """Counts and row shares per cell: true class on y, predicted class on x."""
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    figure, axes = new_figure(CONFUSION_INCHES)
    image = axes.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    colorbar = figure.colorbar(image, ax=axes, shrink=0.8)
    colorbar.set_label("share of the true class's reviews (row)")
    ticks = range(len(label_names))
    axes.set_xticks(ticks, labels=label_names, rotation=30 if len(label_names) > 3 else 0, ha="center")
    axes.set_yticks(ticks, labels=label_names)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    for row in ticks:
        for column in ticks:
            # Dark cells get white text so every number stays legible.
            color = "white" if shares[row, column] > 0.55 else "black"
            axes.text(
                column,
                row,
                f"{int(counts[row, column])}\n{shares[row, column]:.0%}",
                ha="center",
                va="center",
                color=color,
                fontsize=11,
            )
    axes.set_title(f"Confusion matrix\n{title}\neach cell: reviews, share of the row", fontsize=11)
    save_figure(figure, path)


def plot_checkpoints(path: Path, reports: Sequence[dict[str, Any]], title: str) -> None:
    """Accuracy and macro-F1 of each checkpoint against its update step, the best marked."""
    from matplotlib.ticker import MaxNLocator

    figure, axes = new_figure(FIGURE_INCHES)
    scored = sorted((report for report in reports if report["step"] is not None), key=lambda report: report["step"])
    steps = [report["step"] for report in scored]
    for key, marker, name in (("accuracy", "o", "accuracy"), ("macro_f1", "s", "macro-F1")):
        values = [report[key] for report in scored]
        errors = _interval_errors(scored, key)
        label = f"{name}, 95% bootstrap interval" if errors is not None else name
        axes.errorbar(steps, values, yerr=errors, marker=marker, capsize=4, label=label)
    notes = []
    best = next((report for report in reports if report.get("best")), None)
    if best is not None and best["step"] is not None:
        axes.plot(
            [best["step"]],
            [best["macro_f1"]],
            marker="*",
            markersize=18,
            color="gold",
            markeredgecolor="black",
            linestyle="none",
            label=f"best by macro-F1: {Path(best['model']).name}",
        )
    elif best is not None:
        notes.append("best by macro-F1: the final model")
    for report in reports:
        if report["step"] is None:
            notes.append(f"final model: accuracy {report['accuracy']:.3f}, macro-F1 {report['macro_f1']:.3f}")
    if len(scored) <= 12:
        # Few points: their values, read off the picture, say more than the axis does.
        for report in scored:
            for key, offset in (("accuracy", 8), ("macro_f1", -16)):
                axes.annotate(
                    f"{report[key]:.3f}",
                    (report["step"], report[key]),
                    textcoords="offset points",
                    xytext=(0, offset),
                    ha="center",
                    fontsize=9,
                )
    axes.margins(x=0.08, y=0.15)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(UPDATE_AXIS_LABEL)
    axes.set_ylabel("score (0 to 1)")
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    axes.set_title("\n".join([f"Checkpoints: {title}", *notes]), fontsize=11)
    save_figure(figure, path)


def plot_scores(path: Path, reports: Sequence[dict[str, Any]], label_names: Sequence[str], title: str) -> None:
    """Accuracy, macro-F1 and each class's F1 per model, each with its 95% bootstrap interval drawn."""
    import numpy as np

    figure, axes = new_figure(FIGURE_INCHES)
    metrics = ["accuracy", "macro_f1", *label_names]
    names = ["accuracy", "macro-F1", *(f"F1 {name}" for name in label_names)]
    width = 0.8 / max(len(reports), 1)
    for number, report in enumerate(reports):
        values, lows, highs = [], [], []
        for metric in metrics[:2]:
            values.append(report[metric])
            lows.append(report["intervals"][metric][0])
            highs.append(report["intervals"][metric][1])
        for name in label_names:
            values.append(report["per_class"][name]["f1"])
            lows.append(report["intervals"]["per_class_f1"][name][0])
            highs.append(report["intervals"]["per_class_f1"][name][1])
        values, lows, highs = (np.asarray(series) for series in (values, lows, highs))
        positions = np.arange(len(metrics)) + (number - (len(reports) - 1) / 2) * width
        axes.errorbar(
            positions,
            values,
            yerr=np.vstack([values - lows, highs - values]).clip(min=0),
            marker="o",
            linestyle="none",
            capsize=4,
            label=_model_label(report),
        )
    axes.set_xticks(range(len(metrics)), labels=names)
    axes.set_ylabel("score (0 to 1), bars: 95% bootstrap interval")
    axes.set_ylim(0, 1.05)
    axes.grid(alpha=0.3, axis="y")
    axes.legend(loc="lower left", fontsize=9)
    axes.set_title(f"Scores with 95% intervals: {title}", fontsize=11)
    save_figure(figure, path)


def plot_reliability(path: Path, table: Sequence[dict[str, float]], title: str) -> None:
    """Accuracy against mean confidence per confidence bin (a reliability diagram), the diagonal for reference."""
    figure, axes = new_figure(CONFUSION_INCHES)
    axes.plot([0, 1], [0, 1], linestyle=":", color="gray", label="perfect calibration")
    centres = [(row["low"] + row["high"]) / 2 for row in table]
    widths = [row["high"] - row["low"] for row in table]
    axes.bar(
        centres,
        [row["accuracy"] for row in table],
        width=widths,
        edgecolor="black",
        alpha=0.6,
        label="accuracy of the bin's reviews",
    )
    axes.plot(
        [row["confidence"] for row in table],
        [row["accuracy"] for row in table],
        marker="o",
        color="tab:red",
        label="at the bin's mean confidence",
    )
    for centre, row in zip(centres, table):
        axes.annotate(str(row["reviews"]), (centre, 0.02), ha="center", fontsize=8)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.05)
    axes.set_xlabel("confidence (probability of the predicted class)")
    axes.set_ylabel("accuracy")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    axes.set_title(f"Reliability diagram\n{title}\n(numbers at the bottom: reviews per bin)", fontsize=11)
    save_figure(figure, path)


# ------------------------------------------------------------------ helpers


def _model_label(report: dict[str, Any]) -> str:
    if report.get("kind") == "baseline":
        return "TF-IDF baseline"
    name = report.get("run") or Path(report["model"]).name
    return f"{name} (best)" if report.get("best") else name


def _interval_errors(reports: Sequence[dict[str, Any]], key: str) -> Any:
    """``yerr`` for errorbar from the reports' intervals (distances below and above), or None without them."""
    if not all("intervals" in report for report in reports):
        return None
    below = [max(report[key] - report["intervals"][key][0], 0.0) for report in reports]
    above = [max(report["intervals"][key][1] - report[key], 0.0) for report in reports]
    return [below, above]


def _finish(axes: Any, title: str, ylabel: str, epochs_per_update: float | None, empty: str | None) -> None:
    axes.set_xlabel(UPDATE_AXIS_LABEL)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if empty:
        axes.text(0.5, 0.5, empty, transform=axes.transAxes, ha="center", va="center", color="gray")
    else:
        axes.legend(loc="best")
    if epochs_per_update:
        top = axes.secondary_xaxis("top", functions=_scale(epochs_per_update))
        top.set_xlabel("epoch")
    axes.set_title(title, fontsize=11)


def _scale(factor: float) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    return (lambda updates: updates * factor), (lambda epochs: epochs / factor)


def _points(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    chosen = [(row["step"], float(row[key])) for row in rows if _finite(row.get(key))]
    return [step for step, _ in chosen], [value for _, value in chosen]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
