"""``finetune compare-tasks RECIPE``: the stars treated three ways on one split, side by side.

The recipe is trained as ``single_label`` (one class per star, the stars as
``label_bins``), ``regression`` and ``ordinal``, each in
``OUTPUT_DIR/<task>``, with the recipe's seed (so the same held-out reviews
and the same start), and every run is scored in stars on its test split
(:mod:`finetune.evaluation.ordered`; a classifier's under ``ordered``). One
table of MAE, RMSE, off-by-one accuracy, quadratic weighted kappa, accuracy
and macro-F1, with the TF-IDF ridge baseline as a last row, is printed and
written to ``OUTPUT_DIR/tasks.md`` and ``tasks.json``: which way suits the data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..config.output_files import write_output_text
from ..config.tasks import ORDERED_TASKS, ORDINAL, REGRESSION, SINGLE_LABEL
from ..errors import FinetuneError

TASKS = (SINGLE_LABEL, REGRESSION, ORDINAL)
# The table's columns: (key in an ordered report, heading).
COLUMNS = (
    ("mae", "MAE"),
    ("rmse", "RMSE"),
    ("off_by_one_accuracy", "off-by-one"),
    ("quadratic_weighted_kappa", "QWK"),
    ("accuracy", "accuracy"),
    ("macro_f1", "macro-F1"),
)


def compare_tasks(recipe: str | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Train ``recipe`` as each of :data:`TASKS` and return (and write) the table's rows."""
    from ..pipeline.run import train

    overrides = list(overrides or [])
    folder, level_names = _checked(recipe, overrides)
    rows: dict[str, dict[str, Any]] = {}
    baseline: dict[str, Any] | None = None
    for task in TASKS:
        flags = [*overrides, *_task_flags(task, level_names), "--output_dir", str(folder / task)]
        print(f"task {task} -> {folder / task}", file=sys.stderr)
        metrics = train(recipe, flags)
        test = metrics.get("test") or {}
        rows[task] = test.get("ordered", test) if task == SINGLE_LABEL else test
        if task == REGRESSION:
            baseline = ((metrics.get("baseline") or {}).get("scores") or {}).get("test")
    if baseline:
        rows["TF-IDF ridge baseline"] = baseline
    summary = {"recipe": recipe, "overrides": overrides, "levels": level_names, "rows": _figures(rows)}
    table = format_task_table(summary["rows"])
    write_output_text(folder / "tasks.json", json.dumps(summary, indent=2) + "\n")
    write_output_text(folder / "tasks.md", table + "\n")
    print(table)
    print(f"saved to {folder / 'tasks.json'} and {folder / 'tasks.md'}", file=sys.stderr)
    return summary


def _checked(recipe: str | None, overrides: list[str]) -> tuple[Path, list[str]]:
    """The comparison's folder and the star levels, read from the train split; refused where a task is fixed."""
    from ..config.recipes import flag_names, flag_value, load_recipe, read_recipe_file
    from ..data.splits import load_review_data

    values = read_recipe_file(recipe) if recipe else {}
    named = set(values) | flag_names(overrides)
    # A ratings recipe names its own task (regression or ordinal); the comparison replaces it run by run.
    # Classes or tags fix what a label is, which the comparison cannot undo.
    fixed = sorted(named & {"label_bins", "class_names"})
    flagged_task = flag_value(overrides, "task")
    if values.get("task", REGRESSION) not in ORDERED_TASKS or flagged_task not in (None, *ORDERED_TASKS):
        fixed = sorted({*fixed, "task"})
    if fixed:
        raise FinetuneError(
            f"compare-tasks sets the task and reads the stars as numbers itself, and the recipe sets "
            f"{', '.join(fixed)} to classes or tags; drop {' and '.join(fixed)} for the comparison"
        )
    run = load_recipe(recipe, [*overrides, "--task", REGRESSION])
    data = load_review_data(run.data, seed=run.training.seed)  # refuses a column that is no ratings
    return Path(run.training.output_dir), data.label_names


def _task_flags(task: str, level_names: list[str]) -> list[str]:
    """What makes a run of ``task``: the stars as classes, or the task and no class weights (a rating has none)."""
    if task == SINGLE_LABEL:
        # The task named too: a ratings recipe's own task would otherwise stay.
        return ["--task", SINGLE_LABEL, "--label_bins", ",".join(f"{name}={name}" for name in level_names)]
    return ["--task", task, "--class_weighting", "none"]


def _figures(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row's scores and their 95% intervals, as the table shows them."""
    return {
        name: {
            **{key: report.get(key) for key, _ in COLUMNS},
            "intervals": {key: (report.get("intervals") or {}).get(key) for key, _ in COLUMNS},
        }
        for name, report in rows.items()
    }


def format_task_table(rows: dict[str, dict[str, Any]]) -> str:
    """A markdown table: one row per task (and the baseline), each score with its 95% interval."""
    lines = ["| task | " + " | ".join(heading for _, heading in COLUMNS) + " |", "| --- |" + " --- |" * len(COLUMNS)]
    for name, figures in rows.items():
        cells = []
        for key, _ in COLUMNS:
            value, interval = figures[key], figures["intervals"][key]
            shown = "-" if value is None else f"{value:.3f}"
            cells.append(shown + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
