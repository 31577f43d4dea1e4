"""``finetune bench --scaling``: how each stage of a run grows with the number of reviews.

``finetune train --max_steps 20`` (``--updates``) on nested subsets of one
source of reviews (``--sizes``, 1/8, 1/4, 1/2 and all of them by default),
each in a fresh process, with the recipe's settings and no checkpoints. Each
subset is the first n of a seeded shuffle of every split file, in the files'
own proportions, so a smaller subset lies inside every larger one, and the
run splits it as the recipe says. A recipe's ``max_*_samples`` are dropped:
the subsets set the size. The source is a recipe's data, a file of reviews
(with the defaults of ``finetune train --train_file``), or ``--synthetic N``
reviews written on demand (:mod:`finetune.data.synthetic`).

It prints the wall-clock breakdown of every run (seconds per stage, per size)
and, for each stage, its growth exponent: the least-squares slope of log
seconds on log reviews (1 for a cost in proportion to the reviews, 2 for one
growing as their square, near 0 for a fixed cost). A stage is flagged as
growing faster than linearly when its exponent is above
:func:`faster_than_linear_above`; a stage under ``MIN_JUDGED_SECONDS`` at the
largest size is not judged, since a fixed cost and the timer's noise are all
there is to see. Timings are for reading, never for asserting.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..config.output_files import OUTPUT_FLAG, check_output_file, write_output_text
from ..errors import FinetuneError

DEFAULT_SIZES = "1/8,1/4,1/2,1"
# Where the recipe's reviews come from: replaced by each subset's folder.
SOURCE_KEYS = ("dataset_name", "dataset_config_name", "dataset_dir", "train_file", "validation_file", "test_file")
# Caps on a split's reviews, which would stop the splits from growing with the subsets.
SAMPLE_CAPS = ("max_train_samples", "max_eval_samples", "max_test_samples")
# How the synthetic reviews are read: 5 classes, one per star rating. The recipe's own columns and classes go.
SYNTHETIC_DATA = {"text_column": "review", "label_column": "stars", "label_bins": "1=1,2=2,3=3,4=4,5=5"}
SYNTHETIC_DROPPED = ("title_column", "class_names", "extra_train_file", "title_as_review")
READABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".parquet")
# What writing one synthetic review costs, measured on 20,000 (2 CPU cores, Zen 1): its CSV bytes and time.
SYNTHETIC_BYTES_PER_REVIEW = 351
SYNTHETIC_SECONDS_PER_REVIEW = 77e-6
# Past this the reviews alone take gigabytes and minutes before the first run (then each size trains on them).
MAX_SYNTHETIC_REVIEWS = 10_000_000

# The tolerance of the verdict. Timings on a shared machine move by about +-20% from run to run, so between
# the smallest and the largest size the ratio of two timings may be off by up to 1.2 / 0.8 = 1.5, which moves
# an exponent by up to log(1.5) / log(span): 0.19 over an 8x span, 0.58 over 2x. A sort (n log n) grows with
# a local exponent of 1 + 1 / ln(n), about 1.1 at 10^4 reviews, and is fine: 0.15 more is allowed for it.
NOISE_RATIO = 1.5
NLOGN_ALLOWANCE = 0.15
# Below this at the largest size a stage is a fixed cost plus the timer's noise: not judged.
MIN_JUDGED_SECONDS = 0.5
# A square (exponent 2) is flagged over any span above 1.6x; the sizes must span at least this much.
MIN_SPAN = 2.0
# The flags every run gets before the user's: the steps the bench asks for, no checkpoints, no bars.
NO_CHECKPOINTS = ("--save_strategy", "no", "--load_best_model_at_end", "false", "--disable_tqdm", "true")


@dataclass
class ScalingSource:
    """Where the subsets come from and what each run is given besides its subset's folder."""

    files: dict[str, Path]  # split -> the source file
    description: str
    recipe_values: dict[str, Any] = field(default_factory=dict)  # the recipe's keys, less its source
    flags: list[str] = field(default_factory=list)  # the bench's flags and the user's overrides
    notes: list[str] = field(default_factory=list)


def bench_scaling(
    recipe: str | None,
    overrides: list[str] | None = None,
    sizes: str | None = None,
    max_reviews: int | None = None,
    updates: int = 20,
    synthetic: int | None = None,
    output: str | None = None,
) -> dict[str, Any]:
    """Train on nested subsets of ``recipe``'s reviews (or a reviews file, or ``synthetic`` reviews); return the report.

    ``sizes`` are fractions of the reviews (``1/8``, ``0.25``, ``1``) or counts
    (``25000``), smallest first; ``max_reviews`` caps the reviews drawn from the
    source before the fractions apply. The report is printed, and saved as JSON to ``output``.
    """
    requested = parse_sizes(sizes or DEFAULT_SIZES)
    _check_options(recipe, updates, max_reviews, synthetic, output)
    workdir = Path(tempfile.mkdtemp(prefix="finetune-bench-scaling-"))
    try:
        source = _scaling_source(recipe, list(overrides or []), updates, synthetic, workdir)
        runs, load = _run_sizes(source, requested, max_reviews, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    import torch

    from ..evaluation.baseline_process import available_cores

    report: dict[str, Any] = {
        "mode": "scaling",
        "source": source.description,
        "recipe": recipe if recipe and not _is_reviews_file(recipe) else None,
        "overrides": list(overrides or []),
        "updates": updates,
        "max_reviews": max_reviews,
        "threads": torch.get_num_threads(),
        "cores": available_cores(),
        "load_average_at_start": load,
        "runs": runs,
    }
    # The whole process too, timed from outside: the stages plus the process's launch and exit.
    stages = [{**run["time_breakdown"], "process": run["process_seconds"]} for run in runs]
    report.update(judge_growth([run["reviews"] for run in runs], stages))
    text = format_scaling_report(report)
    print(text)
    if output:
        write_output_text(output, json.dumps(report, indent=2) + "\n", instead=OUTPUT_FLAG)
        print(f"saved to {output}", file=sys.stderr)
    return report


def _check_options(
    recipe: str | None, updates: int, max_reviews: int | None, synthetic: int | None, output: str | None
) -> None:
    """Refuse no updates, fewer than two reviews, a file with --synthetic, and an output that cannot be written."""
    if updates < 1:
        raise FinetuneError(f"--updates must be >= 1 (got {updates}); try --updates 20")
    if max_reviews is not None and max_reviews < 2:
        raise FinetuneError(f"--max_reviews must be >= 2 (got {max_reviews}); e.g. --max_reviews 8000")
    if recipe is not None and synthetic is not None and _is_reviews_file(recipe):
        raise FinetuneError(f"give a reviews file ({recipe}) or --synthetic N, not both")
    if synthetic is not None and synthetic > MAX_SYNTHETIC_REVIEWS:
        raise FinetuneError(
            f"--synthetic {synthetic:,} would write {synthetic_cost(synthetic)} before the first run; the most is "
            f"{MAX_SYNTHETIC_REVIEWS:,} (about {_size(MAX_SYNTHETIC_REVIEWS * SYNTHETIC_BYTES_PER_REVIEW)}); "
            "try --synthetic 200000"
        )
    if output:
        check_output_file(output)


def _run_sizes(
    source: ScalingSource, requested: list[Fraction | int], max_reviews: int | None, workdir: Path
) -> tuple[list[dict[str, Any]], float]:
    """Train once per size, on nested subsets drawn in one seeded order; each size's record, and the load at start."""
    import numpy as np

    tables = {split: _read_rows(path) for split, path in source.files.items()}
    available = sum(len(table) for table in tables.values())
    drawn = min(available, max_reviews or available)
    reviews = resolve_sizes(requested, drawn, capped=drawn < available)
    seed = _seed(source)
    orders = {split: np.random.default_rng(seed).permutation(len(table)) for split, table in tables.items()}
    split_rows = {split: len(table) for split, table in tables.items()}
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} on {os.cpu_count()} cores; timings will be noisy", file=sys.stderr)
    for note in source.notes:
        print(f"note: {note}", file=sys.stderr)
    runs = []
    for index, total in enumerate(reviews, start=1):
        counts = split_counts(total, split_rows)
        print(f"scaling: {sum(counts.values()):,} reviews ({index}/{len(reviews)})", file=sys.stderr)
        runs.append(_run_size(source, tables, orders, counts, workdir / f"size-{index}"))
        # Other work on the machine shows here: a size whose load is well above the run's own threads
        # was timed beside something else, and its seconds say less.
        runs[-1]["load_average_after"] = round(os.getloadavg()[0], 2)
    return runs, load


# ------------------------------------------------------------------ sizes


def parse_sizes(text: str) -> list[Fraction | int]:
    """``"1/8,1/4,1/2,1"`` or ``"25000,50000"``: fractions (a ``/``, a point, or 1 for all) or counts of reviews."""
    example = f"e.g. --sizes {DEFAULT_SIZES} or --sizes 25000,50000,100000"
    sizes: list[Fraction | int] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            if "/" in item or "." in item or item == "1":
                fraction = Fraction(item)
                if not 0 < fraction <= 1:
                    raise ValueError
                sizes.append(fraction)
            else:
                count = int(item)
                if count < 2:
                    raise ValueError
                sizes.append(count)
        except (ValueError, ZeroDivisionError):
            raise FinetuneError(
                f"--sizes takes fractions of the reviews (above 0, at most 1) or counts (2 or more), "
                f"separated by commas; got {item!r} in {text!r} ({example})"
            ) from None
    if len(sizes) < 2:
        raise FinetuneError(f"--sizes needs at least two sizes to measure growth ({example})")
    return sizes


def resolve_sizes(sizes: Sequence[Fraction | int], available: int, capped: bool = False) -> list[int]:
    """Each size as a count of reviews out of ``available``; checked: increasing, in range, spanning ``MIN_SPAN``."""
    where = "--max_reviews" if capped else "the source"
    counts = [round(size * available) if isinstance(size, Fraction) else size for size in sizes]
    if counts[-1] > available:
        raise FinetuneError(
            f"--sizes asks for {counts[-1]:,} reviews and {where} gives {available:,}; ask for at most {available:,}"
        )
    if counts[0] < 2 or any(later <= earlier for earlier, later in itertools.pairwise(counts)):
        shown = ", ".join(f"{count:,}" for count in counts)
        raise FinetuneError(
            f"--sizes must grow from the first to the last, from 2 reviews or more (out of {available:,} here they "
            f"are {shown}); list them smallest first, e.g. --sizes {DEFAULT_SIZES}"
        )
    if counts[-1] / counts[0] < MIN_SPAN:
        raise FinetuneError(
            f"--sizes span {counts[-1] / counts[0]:.2f}x ({counts[0]:,} to {counts[-1]:,} reviews), too little to "
            f"tell growth from noise; make the largest at least {MIN_SPAN:.0f}x the smallest"
        )
    return counts


def split_counts(total: int, split_rows: dict[str, int]) -> dict[str, int]:
    """``total`` reviews shared among the splits in proportion to their rows (at least 1 each)."""
    rows = sum(split_rows.values())
    return {split: max(1, round(total * count / rows)) for split, count in split_rows.items()}


# ------------------------------------------------------------------ growth


def growth_exponent(reviews: Sequence[float], seconds: Sequence[float]) -> float:
    """The least-squares slope of log(seconds) on log(reviews): 1 in proportion, 2 as the square, 0 fixed."""
    import numpy as np

    slope, _ = np.polyfit(np.log(np.asarray(reviews, dtype=float)), np.log(np.asarray(seconds, dtype=float)), 1)
    return float(slope)


def faster_than_linear_above(span: float) -> float:
    """The exponent above which a stage grows faster than linearly, over sizes ``span`` (largest / smallest) apart."""
    return 1 + NLOGN_ALLOWANCE + math.log(NOISE_RATIO) / math.log(span)


def judge_growth(reviews: Sequence[int], breakdowns: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Each stage's growth exponent and verdict, the limit used, and the stages growing faster than linearly."""
    span = reviews[-1] / reviews[0]
    limit = faster_than_linear_above(span)
    growth: dict[str, dict[str, Any]] = {}
    for stage in breakdowns[0]:
        seconds = [breakdown[stage] for breakdown in breakdowns]
        exponent = growth_exponent(reviews, seconds) if min(seconds) > 0 else None
        if max(seconds) == 0:
            verdict = "no time"
        elif exponent is None or seconds[-1] < MIN_JUDGED_SECONDS:
            verdict = "too short to judge"
        else:
            verdict = "FASTER THAN LINEAR" if exponent > limit else "at most linear"
        growth[stage] = {"seconds": seconds, "exponent": exponent, "verdict": verdict}
    faster = [stage for stage, row in growth.items() if row["verdict"] == "FASTER THAN LINEAR"]
    return {"span": span, "faster_than_linear_above": limit, "growth": growth, "faster_than_linear": faster}


def format_scaling_report(report: dict[str, Any]) -> str:
    """The report as text: what ran, a table of seconds per stage and size with each exponent, then the verdict."""
    from ..training.run_clock import LABELS as PART_LABELS

    labels = {**PART_LABELS, "process": "process (from outside)"}
    reviews = [run["reviews"] for run in report["runs"]]
    lines = [
        f"bench --scaling: {report['source']}; finetune train --max_steps {report['updates']} at each size, "
        f"each in a fresh process, no checkpoints",
        f"{report['threads']} torch threads on {report['cores']} cores, "
        f"load average {report['load_average_at_start']:.1f} at start",
        "",
        "| stage | " + " | ".join(f"{count:,} reviews" for count in reviews) + " | exponent | growth |",
        "| --- " * (len(reviews) + 3) + "|",
    ]
    for stage, row in report["growth"].items():
        if max(row["seconds"]) < 0.05 and stage != "total":
            continue  # took no measurable time at any size (as the run's own breakdown line leaves it out)
        exponent = "-" if row["exponent"] is None else f"{row['exponent']:.2f}".replace("-0.00", "0.00")
        cells = " | ".join(f"{seconds:.1f}" for seconds in row["seconds"])
        lines.append(f"| {labels.get(stage, stage)} | {cells} | {exponent} | {row['verdict']} |")
    loads = " | ".join(f"{run.get('load_average_after', float('nan')):.1f}" for run in report["runs"])
    lines.append(f"| load average after (1 min) | {loads} | | |")
    limit, span = report["faster_than_linear_above"], report["span"]
    rule = (
        f"exponent above {limit:.2f} over this {span:.1f}x span: 1 + {NLOGN_ALLOWANCE} for n log n + "
        f"+-20% timing noise; stages under {MIN_JUDGED_SECONDS} s at the largest size not judged"
    )
    if report["faster_than_linear"]:
        named = ", ".join(
            f"{labels.get(stage, stage)} ({report['growth'][stage]['exponent']:.2f})"
            for stage in report["faster_than_linear"]
        )
        lines += ["", f"growing faster than linearly: {named} ({rule})"]
    else:
        lines += ["", f"no stage grows faster than linearly ({rule})"]
    return "\n".join(lines)


# ------------------------------------------------------------------ the source and the runs


def synthetic_cost(count: int) -> str:
    """What writing ``count`` synthetic reviews costs, in words: ``about 351 GB of reviews (about 21 h)``."""
    seconds = count * SYNTHETIC_SECONDS_PER_REVIEW
    if seconds < 1:
        duration = "under a second"
    elif seconds < 120:
        duration = f"about {seconds:.0f} s"
    elif seconds < 2 * 3600:
        duration = f"about {seconds / 60:.0f} min"
    else:
        duration = f"about {seconds / 3600:.0f} h"
    return f"about {_size(count * SYNTHETIC_BYTES_PER_REVIEW)} of reviews ({duration})"


def _size(size_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.2g} {unit}" if size_bytes < 10 * scale else f"{size_bytes / scale:.0f} {unit}"
    return f"{size_bytes:.0f} bytes"


def _is_reviews_file(path: str) -> bool:
    return Path(path).suffix.lower() in READABLE_SUFFIXES


def _scaling_source(
    recipe: str | None, overrides: list[str], updates: int, synthetic: int | None, workdir: Path
) -> ScalingSource:
    """The source's files and what every run is given: a recipe's values less its source, and the flags."""
    from ..config.recipes import read_recipe_file, recipe_from_values
    from ..pipeline.flags import without_flags
    from ..pipeline.own_reviews import flags_without_recipe

    if recipe is None and synthetic is None:
        raise FinetuneError(
            "finetune bench --scaling needs a recipe, a reviews file or --synthetic N, e.g. "
            "finetune bench recipes/imdb.yaml --scaling --max_reviews 8000"
        )
    bench_flags = ["--max_steps", str(updates), *NO_CHECKPOINTS, *overrides]
    source_file = Path(recipe) if recipe is not None and _is_reviews_file(recipe) else None
    if synthetic is not None:
        from ..data.synthetic import write_synthetic_reviews

        print(f"writing {synthetic:,} synthetic reviews: {synthetic_cost(synthetic)}", file=sys.stderr)
        source_file = write_synthetic_reviews(workdir / "synthetic.csv", synthetic)
        description = f"{synthetic:,} synthetic reviews (seed 0)"
    elif source_file is not None:
        if not source_file.is_file():
            raise FinetuneError(f"reviews file not found: {recipe}; check the path")
        description = str(recipe)
    if recipe is None or _is_reviews_file(recipe):
        # The defaults of 'finetune train --train_file FILE', decided once; each run reads its subset's folder.
        given = ["--train_file", str(source_file), *(_synthetic_flags() if synthetic else []), *bench_flags]
        flags = without_flags(flags_without_recipe(given), {"--train_file": True})
        recipe_from_values({"dataset_dir": str(workdir)}, flags)  # bad overrides: one line now, not per run
        return ScalingSource({"train": source_file}, description, {}, flags)

    notes: list[str] = []
    values = read_recipe_file(recipe)
    run = recipe_from_values(values, overrides, recipe)
    dropped = [key for key in (*SOURCE_KEYS, *SAMPLE_CAPS) if key in values]
    capped = [f"{key} {values[key]}" for key in SAMPLE_CAPS if key in values]
    if capped:
        notes.append(f"the recipe's {', '.join(capped)} dropped: the subsets set the number of reviews")
    if synthetic is not None:
        dropped += [key for key in (*SYNTHETIC_DROPPED, *SYNTHETIC_DATA) if key in values]
        values = {key: value for key, value in values.items() if key not in dropped}
        values.update(SYNTHETIC_DATA)
        recipe_from_values({**values, "dataset_dir": str(workdir)}, bench_flags, recipe)
        return ScalingSource({"train": source_file}, f"{description}, {recipe}'s settings", values, bench_flags, notes)
    files = _recipe_files(run.data)
    if values.get("extra_train_file"):
        notes.append(f"the recipe's extra_train_file {values['extra_train_file']} trains whole at every size")
    values = {key: value for key, value in values.items() if key not in dropped}
    recipe_from_values({**values, "dataset_dir": str(workdir)}, bench_flags, recipe)
    described = ", ".join(f"{split} {path}" for split, path in files.items())
    return ScalingSource(files, f"{recipe} ({described})", values, bench_flags, notes)


def _synthetic_flags() -> list[str]:
    return [token for key, value in SYNTHETIC_DATA.items() for token in (f"--{key}", value)]


def _recipe_files(data_args: Any) -> dict[str, Path]:
    """The local file of each split a recipe reads: its own files, or a catalog entry's (fetched once)."""
    from ..data.sources import resolve_data_files
    from ..fetching import dataset as fetch
    from ..fetching.catalog import CATALOG

    name = data_args.dataset_name
    if not name:
        return resolve_data_files(data_args)
    entry = CATALOG.get(name)
    if entry is None or entry.source == "hub":
        raise FinetuneError(
            f"--scaling reads local files, and {name} comes from the Hugging Face Hub; export it to a CSV and "
            "pass that file, or use a recipe on a fetched dataset ('finetune data list')"
        )
    if entry.source == "project":
        return resolve_data_files(data_args, dataset_dir=str(fetch.dataset_folder(entry)))
    fetch.fetch(entry, cache_dir=data_args.data_cache_dir)
    return fetch.split_paths(entry, cache_dir=data_args.data_cache_dir)


def _read_rows(path: Path) -> Any:
    """A split file as a table of strings, cells as written (a subset written back reads as the source does)."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
    if suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_json(path, lines=suffix == ".jsonl")


def _seed(source: ScalingSource) -> int:
    from ..config.recipes import recipe_from_values

    return recipe_from_values({**source.recipe_values, "dataset_dir": "."}, source.flags).training.seed


def _run_size(
    source: ScalingSource, tables: dict[str, Any], orders: dict[str, Any], counts: dict[str, int], folder: Path
) -> dict[str, Any]:
    """Write the subset (the first ``counts`` of each split's shuffle), train on it in a fresh process, clean up."""
    import yaml

    from ..fetching.child_process import run_python_module
    from ..training.run_clock import format_breakdown

    reviews_dir = folder / "reviews"
    reviews_dir.mkdir(parents=True)
    for split, count in counts.items():
        tables[split].iloc[orders[split][:count]].to_csv(reviews_dir / f"{split}.csv", index=False)
    recipe_path = folder / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump({**source.recipe_values, "dataset_dir": str(reviews_dir)}), encoding="utf-8")
    run_dir = folder / "run"
    arguments = ["train", str(recipe_path), *source.flags, "--output_dir", str(run_dir)]
    # A datasets cache of its own, removed with the work folder: every size reads its file as a first run does.
    env = {**os.environ, "HF_DATASETS_CACHE": str(folder / "datasets-cache")}
    started = time.perf_counter()
    finished = run_python_module("finetune", arguments, "running the scaling bench", env=env)
    process_seconds = time.perf_counter() - started
    reviews = sum(counts.values())
    if finished.returncode != 0:
        lines = [line for line in finished.stderr.splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if line.startswith("error: ")), lines[-1] if lines else "")
        raise FinetuneError(f"the run on {reviews:,} reviews failed: {said.removeprefix('error: ')}")
    metrics = json.loads((run_dir / "report" / "metrics.json").read_text(encoding="utf-8"))
    shutil.rmtree(folder, ignore_errors=True)  # the model and the subset: disk is freed size by size
    # Each size's breakdown as it comes: a bench stopped part-way still shows the sizes it ran.
    breakdown = format_breakdown(metrics["time_breakdown"]).replace(":\n  ", ": ")
    print(f"scaling: {reviews:,} reviews done in {process_seconds:.0f}s; {breakdown}", file=sys.stderr)
    return {
        "reviews": reviews,
        "splits": counts,
        "process_seconds": round(process_seconds, 3),
        "time_breakdown": metrics["time_breakdown"],
    }
