"""``finetune train RECIPE --seeds N``: the recipe once per seed, then the mean and spread of its test scores.

Fine-tuning on a few hundred reviews varies a lot with the seed (the new
head's initialisation, dropout, the order, the held-out validation reviews),
so one run's score says little. Seeds ``seed, seed + 1, ...`` each train into
``OUTPUT_DIR/seed-<seed>``; ``OUTPUT_DIR/seeds.json`` and ``seeds.md`` hold
every run's test accuracy and macro-F1, the TF-IDF baseline's on the same
split, the run's lead over it, the training seconds, and their mean and
sample standard deviation. The lead is taken run by run: where the seed also
draws the held-out split (``test_split_percentage``), the baseline moves with
it, and the paired difference is what says whether the model is better.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from ..errors import FinetuneError

SUMMARY_JSON = "seeds.json"
SUMMARY_TABLE = "seeds.md"
# What each run contributes to the summary: (name in the table, where it is in train()'s metrics).
_FIGURES = {
    "test accuracy": ("test", "accuracy"),
    "test macro-F1": ("test", "macro_f1"),
    "baseline accuracy": ("baseline_test", "accuracy"),
    "baseline macro-F1": ("baseline_test", "macro_f1"),
    "train seconds": ("train", "train_wall_seconds"),
}
# Each run's lead over the baseline on its own test split: (name, model's figure, baseline's).
_LEADS = {
    "accuracy vs baseline": ("test accuracy", "baseline accuracy"),
    "macro-F1 vs baseline": ("test macro-F1", "baseline macro-F1"),
}
# The table's columns: the scores, the leads, then the seconds.
_COLUMNS = [*(name for name in _FIGURES if name != "train seconds"), *_LEADS, "train seconds"]


def train_seeds(recipe: str | None, overrides: list[str] | None, seeds: int) -> dict[str, Any]:
    """Train ``recipe`` with ``seeds`` consecutive seeds; returns (and writes) the per-run figures and their summary."""
    from ..config.recipes import load_recipe
    from .train import train

    if seeds < 1:
        raise FinetuneError(f"--seeds must be >= 1 (got {seeds}); e.g. --seeds 3")
    overrides = list(overrides or [])
    run = load_recipe(recipe, overrides)  # every flag checked before the first run starts
    folder = Path(run.training.output_dir)
    first_seed = run.training.seed
    summary_path = folder / SUMMARY_JSON
    if summary_path.exists() and not run.training.overwrite_output_dir:
        raise FinetuneError(
            f"{summary_path} already exists; pass --overwrite_output_dir to run the seeds again, "
            "or choose another output_dir"
        )

    runs = []
    for seed in range(first_seed, first_seed + seeds):
        print(f"seed {seed} ({seed - first_seed + 1} of {seeds}) -> {folder / f'seed-{seed}'}", file=sys.stderr)
        # Given last, these win over a --seed (the first seed) or --output_dir among the overrides.
        flags = [*overrides, "--seed", str(seed), "--output_dir", str(folder / f"seed-{seed}")]
        metrics = train(recipe, flags)
        runs.append({"seed": seed, "output_dir": str(folder / f"seed-{seed}"), **_figures(metrics)})

    summary = {
        "recipe": recipe,
        "overrides": overrides,
        "seeds": [entry["seed"] for entry in runs],
        "runs": runs,
        "mean": {name: _mean([entry[name] for entry in runs]) for name in _COLUMNS},
        "sd": {name: _sd([entry[name] for entry in runs]) for name in _COLUMNS},
    }
    table = format_summary(summary)
    folder.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (folder / SUMMARY_TABLE).write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"saved to {summary_path} and {folder / SUMMARY_TABLE}", file=sys.stderr)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """A markdown table: one row per seed, then mean and sample standard deviation."""
    names = _COLUMNS
    lines = ["| seed | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for entry in summary["runs"]:
        lines.append(f"| {entry['seed']} | " + " | ".join(_cell(entry[name], name) for name in names) + " |")
    mean, sd = summary["mean"], summary["sd"]
    spreads = [f"{_cell(mean[name], name)} ± {_cell(sd[name], name, signed=False)}" for name in names]
    lines.append("| mean ± sd | " + " | ".join(spreads) + " |")
    return "\n".join(lines)


def _figures(metrics: dict[str, Any]) -> dict[str, float | None]:
    sources = {
        "test": metrics.get("test") or {},
        "baseline_test": ((metrics.get("baseline") or {}).get("scores") or {}).get("test") or {},
        "train": metrics,
    }
    figures = {name: sources[source].get(key) for name, (source, key) in _FIGURES.items()}
    for name, (model, baseline) in _LEADS.items():
        known = figures[model] is not None and figures[baseline] is not None
        figures[name] = figures[model] - figures[baseline] if known else None
    return figures


def _mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.fmean(known) if known else None


def _sd(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.stdev(known) if len(known) > 1 else None


def _cell(value: float | None, name: str, signed: bool = True) -> str:
    if value is None:
        return "-"
    if name in _LEADS and signed:
        return f"{value:+.3f}"
    return f"{value:.0f}" if name == "train seconds" else f"{value:.3f}"
