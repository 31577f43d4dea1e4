"""Train one recipe several times (other seeds, or other held-out folds) and summarise: mean and spread.

``--seeds``, ``--folds`` and ``finetune check``'s draws are all this (a
:class:`RepeatPlan`, made by :func:`seed_repeats` or :func:`fold_repeats`): a
list of runs that differ in a few flags, each trained into its own folder,
then every run's scores, the TF-IDF baseline's on the same reviews, the run's
lead over it, the training seconds, and their mean and sample standard
deviation, written as ``<kind>s.json`` and ``<kind>s.md`` beside the runs.
The lead is taken run by run: where the runs score different reviews (other
folds, or a test split drawn with the seed), the baseline moves with them,
and the paired difference is what says whether the model is better.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.launch import launched_rank
from ..config.output_files import write_output_text
from ..errors import FinetuneError, TrainingInterrupted
from .flags import HOW_TO_RUN_FLAGS, without_flags


@dataclass
class Repeat:
    """One run of the recipe: its key (a seed, a fold), the flags that make it so, and where it trains."""

    key: int
    flags: list[str]
    output_dir: Path


@dataclass
class RepeatPlan:
    """The runs of one recipe that differ in a few flags, and where and how their summary is written."""

    kind: str  # what a run's key is ("seed", "fold"); names the summary files <kind>s.json, <kind>s.md
    scored_on: str  # the reviews each run is scored on ("test", "fold")
    repeats: list[Repeat]
    folder: Path  # where the runs' folders and the summary go
    overwrite: bool  # train every run again (--overwrite_output_dir)
    repeat_flags: list[str]  # how the user asked for the repeats: ["--seeds", "3"]


def seed_repeats(recipe: str | None, overrides: list[str], seeds: int) -> RepeatPlan:
    """``seeds`` runs with consecutive seeds from the recipe's, each in ``OUTPUT_DIR/seed-<seed>``, scored on test."""
    from ..config.arguments import MAX_SEED
    from ..config.recipes import load_recipe

    if seeds < 1:
        raise FinetuneError(f"--seeds must be >= 1 (got {seeds}); e.g. --seeds 3")
    run = load_recipe(recipe, overrides)  # every flag checked before the first run starts
    folder = Path(run.training.output_dir)
    first_seed = run.training.seed
    if first_seed + seeds - 1 > MAX_SEED:
        raise FinetuneError(
            f"--seeds {seeds} from seed {first_seed} passes the largest seed, {MAX_SEED}; pass a smaller --seed"
        )
    repeats = [
        Repeat(seed, ["--seed", str(seed)], folder / f"seed-{seed}") for seed in range(first_seed, first_seed + seeds)
    ]
    return RepeatPlan("seed", "test", repeats, folder, run.training.overwrite_output_dir, ["--seeds", str(seeds)])


def fold_repeats(recipe: str | None, overrides: list[str], folds: int) -> RepeatPlan:
    """One run per fold of the train split, each in ``OUTPUT_DIR/fold-<k>``, scored on the fold it did not train on."""
    from ..config.recipes import flag_names, load_recipe, read_recipe_file

    if folds < 2:
        raise FinetuneError(f"--folds must be >= 2 (got {folds}); e.g. --folds 5")
    named = (set(read_recipe_file(recipe)) if recipe else set()) | flag_names(overrides)
    if named & {"cross_validation_folds", "cross_validation_fold"}:
        # --folds sets both for every fold it runs; the recipe's or flags' own would be overridden unseen.
        raise FinetuneError(
            f"--folds {folds} runs every fold itself, so cross_validation_folds and cross_validation_fold must not "
            "be set too; drop them, or leave out --folds to train one fold"
        )
    # Every flag checked (the fold flags too) before the first run starts.
    run = load_recipe(recipe, [*overrides, *_fold_flags(folds, 0)])
    folder = Path(run.training.output_dir)
    repeats = [Repeat(fold, _fold_flags(folds, fold), folder / f"fold-{fold}") for fold in range(folds)]
    return RepeatPlan("fold", "fold", repeats, folder, run.training.overwrite_output_dir, ["--folds", str(folds)])


def _fold_flags(folds: int, fold: int) -> list[str]:
    return ["--cross_validation_folds", str(folds), "--cross_validation_fold", str(fold)]


def run_repeats(recipe: str | None, overrides: list[str], plan: RepeatPlan, teacher: Any = None) -> dict[str, Any]:
    """Train every run of ``plan``, then write and print the summary; returns it.

    With ``teacher`` (a :class:`finetune.pipeline.teacher.TeacherRun`) every run is its student.
    A run already finished in its folder with the same recipe values and flags
    is not trained again (unless ``plan.overwrite``): its scores are read back, so a
    stopped ``--seeds 3`` goes on from where it stopped.
    """
    resume = _checked_resume(recipe, overrides, plan)
    # Every folder is looked at before any training (or deleting), so a refusal costs no run's time or file.
    planned = [_planned_run(recipe, overrides, plan, repeat, resume, teacher) for repeat in plan.repeats]
    if plan.overwrite:
        # Asked to run them all again: an earlier summary must not stop a stopped rerun from going on.
        for earlier in (plan.folder / f"{plan.kind}s.json", plan.folder / f"{plan.kind}s.md"):
            earlier.unlink(missing_ok=True)
    runs = []
    for number, (repeat, flags, metrics) in enumerate(planned, start=1):
        where = f"{plan.kind} {repeat.key} ({number} of {len(plan.repeats)})"
        if metrics is not None:
            print(
                f"{where}: finished before in {repeat.output_dir} with the same recipe and flags; "
                "its scores are reused",
                file=sys.stderr,
            )
        else:
            print(f"{where} -> {repeat.output_dir}", file=sys.stderr)
            metrics = _train_repeat(recipe, overrides, plan, flags, teacher)
        runs.append({plan.kind: repeat.key, "output_dir": str(repeat.output_dir), **_figures(metrics, plan.scored_on)})
    return _write_summary(recipe, overrides, plan, runs)


def _checked_resume(recipe: str | None, overrides: list[str], plan: RepeatPlan) -> str | None:
    """The recipe's ``resume_from_checkpoint`` (only ``auto`` or None), refused where it cannot mean every run."""
    from ..config.recipes import load_recipe

    kind = plan.kind
    resume = load_recipe(recipe, overrides).training.resume_from_checkpoint
    if resume is not None and str(resume) != "auto":
        # One checkpoint cannot be where every run goes on from; it was dropped without a word.
        raise FinetuneError(
            f"with --{kind}s each {kind} goes on from its own folder, so resume_from_checkpoint takes only auto "
            f"(got {resume}); pass --resume_from_checkpoint auto, or train that one run without --{kind}s"
        )
    summary_path = plan.folder / f"{kind}s.json"
    # With "auto" the user asks to go on: the finished runs are reused and the summary rewritten to
    # cover them all (e.g. --seeds 3 after --seeds 1 trains two more).
    if summary_path.exists() and not plan.overwrite and resume is None:
        raise FinetuneError(
            f"{summary_path} already exists; pass --resume_from_checkpoint auto to reuse the finished {kind}s and "
            f"train the rest, --overwrite_output_dir to run the {kind}s again, or choose another output_dir"
        )
    return resume


def _planned_run(
    recipe: str | None, overrides: list[str], plan: RepeatPlan, repeat: Repeat, resume: str | None, teacher: Any
) -> tuple[Repeat, list[str], dict[str, Any] | None]:
    """A run's flags, and its metrics if it finished before; refused where train() would refuse its folder."""
    from ..training.runs import check_output_dir, holds_run

    # Given last, these win over the same flags among the overrides.
    flags = [*overrides, *repeat.flags, "--output_dir", str(repeat.output_dir)]
    if not holds_run(repeat.output_dir):
        # "--resume_from_checkpoint auto" goes on with the stopped run; the ones not begun start afresh.
        flags = without_flags(flags, {"--resume_from_checkpoint": True})
    overwrite = plan.overwrite
    metrics = None if overwrite else finished_run_metrics(recipe, flags, repeat.output_dir, _fingerprint(teacher))
    if metrics is None and not overwrite and _holds_finished_report(repeat.output_dir):
        # Going on would "resume" its last checkpoint and keep its model: refused, as train refuses
        # a folder with a run in it.
        raise FinetuneError(
            f"{repeat.output_dir} already holds a run finished with other recipe values, flags or data files; "
            f"pass --overwrite_output_dir to run the {plan.kind}s again, or choose another output_dir"
        )
    if metrics is None:
        # What train() would refuse (a file, someone else's files, an earlier run) is refused here, first.
        check_output_dir(
            str(repeat.output_dir), overwrite, resuming=resume is not None and holds_run(repeat.output_dir)
        )
    return repeat, flags, metrics


def _train_repeat(
    recipe: str | None, overrides: list[str], plan: RepeatPlan, flags: list[str], teacher: Any
) -> dict[str, Any]:
    """Train one run (a teacher's student, with one); a stop says how to go on with them all."""
    from . import run

    try:
        return run.train(recipe, flags) if teacher is None else teacher.train_student(recipe, flags)
    except TrainingInterrupted as stop:
        # The single run's advice would finish that run alone; this one finishes them all.
        flags_again = without_flags([*overrides, *plan.repeat_flags], HOW_TO_RUN_FLAGS)
        command = " ".join([*_command(teacher), *([recipe] if recipe else []), *flags_again])
        stopped = str(stop).split("; resume with:")[0]
        raise TrainingInterrupted(
            f"{stopped}; the {plan.kind}s finished so far are kept; go on with: {command} "
            "--resume_from_checkpoint auto",
            stop.exit_status,
        ) from None


def _write_summary(
    recipe: str | None, overrides: list[str], plan: RepeatPlan, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """Every run's figures and their mean and sample standard deviation, written and printed; returns them."""
    # A multi_label recipe's runs report micro-F1, its headline, which gets columns of its own; star
    # ratings (or classes that are stars) MAE and kappa too, beside the ridge's MAE.
    tags = any(_micro_columns(plan.scored_on)[0] in entry for entry in runs)
    ordered = any(entry.get(_ORDERED_NAMES[0].format(plan.scored_on)) is not None for entry in runs)
    kind, columns = plan.kind, _columns(plan.scored_on, tags, ordered)
    summary = {
        **({"task": "multi_label"} if tags else {}),
        "recipe": recipe,
        "overrides": overrides,
        f"{kind}s": [entry[kind] for entry in runs],
        "scored_on": plan.scored_on,
        **({"ordered": True} if ordered else {}),
        "runs": runs,
        "mean": {name: _mean([entry[name] for entry in runs]) for name in columns},
        "sd": {name: _sd([entry[name] for entry in runs]) for name in columns},
    }
    table = format_summary(summary, kind)
    if launched_rank() != 0:
        # Under torchrun every process trains each run; the launcher's rank 0 alone writes and says the summary.
        return summary
    plan.folder.mkdir(parents=True, exist_ok=True)
    summary_path, table_path = plan.folder / f"{kind}s.json", plan.folder / f"{kind}s.md"
    write_output_text(summary_path, json.dumps(summary, indent=2) + "\n")
    write_output_text(table_path, table + "\n")
    print(table)
    print(f"saved to {summary_path} and {table_path}", file=sys.stderr)
    return summary


def _fingerprint(teacher: Any) -> str | None:
    return None if teacher is None else teacher.fingerprint


def _command(teacher: Any) -> list[str]:
    return ["finetune", "train"] if teacher is None else ["finetune", "distill", str(teacher.folder)]


def finished_run_metrics(
    recipe: str | None, flags: list[str], output_dir: Path, teacher_fingerprint: str | None = None
) -> dict[str, Any] | None:
    """The metrics of the run finished in ``output_dir`` if it was trained from these recipe values and flags.

    Finished means its report (``report/metrics.json``, written after the test
    scores) is there and newer than ``finetune_run.json`` (written when a run
    starts); the same means ``finetune_run.json`` records the values and data
    paths this recipe and these flags give now (the recipe file read again, so
    an edited recipe trains again) and the same data files, byte for byte; and
    distilled from the teacher whose weights have ``teacher_fingerprint``, or not
    distilled when it is None.
    """
    from ..config.recipes import load_recipe, recipe_from_values, typed_values
    from ..training.runs import RUN_CONFIG, changed_data_files, data_fields_on_record

    if not _holds_finished_report(output_dir):
        return None
    config_path, metrics_path = output_dir / RUN_CONFIG, output_dir / "report" / "metrics.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        report = json.loads(metrics_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        config = report = None
    if not (isinstance(config, dict) and isinstance(report, dict)):
        return None  # damaged: trained again, and train() says what is in the way
    distilled = config.get("distillation")
    recorded_teacher = distilled.get("teacher_fingerprint") if isinstance(distilled, dict) else None
    if recorded_teacher != teacher_fingerprint:
        return None  # a student of another teacher, or a plain run where a student is wanted (or the reverse)

    def what_is_trained(values: dict[str, Any]) -> dict[str, Any]:
        # Where the run is (output_dir) is not what it trained: a moved or copied folder holds the same run.
        return {
            key: value for key, value in values.items() if f"--{key}" not in HOW_TO_RUN_FLAGS and key != "output_dir"
        }

    run = load_recipe(recipe, flags)
    try:
        # The recorded values parsed as the wanted ones are: a flag's "8e-5" is a recipe's 8.0e-5.
        recorded = recipe_from_values(config.get("recipe_values") or {})
    except FinetuneError:
        return None  # values this version no longer takes: trained again
    if what_is_trained(typed_values(recorded)) != what_is_trained(typed_values(run)):
        return None
    # The data fields with their paths made absolute, as the run recorded them: a relative
    # train_file read from another folder is other data.
    if config.get("data") != json.loads(json.dumps(data_fields_on_record(run.data), default=str)):
        return None
    # The files' contents too: a file edited in place keeps its path. A record from before the
    # checksums were kept has none, and such a run on local files trains again.
    if changed_data_files({"data_sha256": config.get("data_sha256", {})}, run.data):
        return None
    return {**(report.get("train") or {}), "test": report.get("test"), "baseline": report.get("baseline")}


def _holds_finished_report(output_dir: Path) -> bool:
    """Whether the run in ``output_dir`` finished: its report is there and newer than its finetune_run.json.

    finetune_run.json is written when a run starts, the report when it ends: an older report is an
    earlier run's, left beside one that --overwrite_output_dir began and did not finish.
    """
    from ..training.runs import RUN_CONFIG

    config_path, metrics_path = output_dir / RUN_CONFIG, output_dir / "report" / "metrics.json"
    if not (config_path.is_file() and metrics_path.is_file()):
        return False
    return metrics_path.stat().st_mtime_ns >= config_path.stat().st_mtime_ns


def format_summary(summary: dict[str, Any], kind: str) -> str:
    """A markdown table: one row per run, then mean and sample standard deviation."""
    names = _columns(
        summary.get("scored_on", "test"), summary.get("task") == "multi_label", summary.get("ordered", False)
    )
    lines = [f"| {kind} | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for entry in summary["runs"]:
        lines.append(f"| {entry[kind]} | " + " | ".join(_cell(entry[name], name) for name in names) + " |")
    mean, sd = summary["mean"], summary["sd"]
    spreads = [f"{_cell(mean[name], name)} ± {_cell(sd[name], name, signed=False)}" for name in names]
    lines.append("| mean ± sd | " + " | ".join(spreads) + " |")
    return "\n".join(lines)


# Each run's lead over the baseline on its own reviews: (name, the model's figure, the baseline's).
_LEADS = ("accuracy vs baseline", "macro-F1 vs baseline")
_SECONDS = "train seconds"
_MICRO_F1_LEAD = "micro-F1 vs baseline"


def _figure_sources(scored_on: str) -> dict[str, tuple[str, str]]:
    """What each run contributes: (name in the table, where it is in train()'s metrics)."""
    return {
        f"{scored_on} accuracy": ("test", "accuracy"),
        f"{scored_on} macro-F1": ("test", "macro_f1"),
        "baseline accuracy": ("baseline_test", "accuracy"),
        "baseline macro-F1": ("baseline_test", "macro_f1"),
        _SECONDS: ("train", "train_wall_seconds"),
    }


# A ratings run's (or a star classifier's) own figures: its MAE and kappa, and the ridge baseline's.
_ORDERED_NAMES = ("{} MAE", "{} QWK", "baseline MAE", "baseline QWK")


def _columns(scored_on: str, tags: bool = False, ordered: bool = False) -> list[str]:
    """The table's columns: the scores, the leads, then the seconds (first micro-F1's three for tags, MAE and
    kappa for stars)."""
    scores = [name for name in _figure_sources(scored_on) if name != _SECONDS]
    micro = _micro_columns(scored_on) if tags else []
    stars = [name.format(scored_on) for name in _ORDERED_NAMES] if ordered else []
    return [*stars, *micro, *scores, *_LEADS, _SECONDS]


def _micro_columns(scored_on: str) -> list[str]:
    """A multi_label run's headline (every review-tag pair counted once): its micro-F1, the baseline's, the lead."""
    return [f"{scored_on} micro-F1", "baseline micro-F1", _MICRO_F1_LEAD]


def _figures(metrics: dict[str, Any], scored_on: str) -> dict[str, Any]:
    """One run's row: its scores, the baseline's, the leads over it and the seconds."""
    sources = {
        "test": metrics.get("test") or {},
        "baseline_test": ((metrics.get("baseline") or {}).get("scores") or {}).get("test") or {},
        "train": metrics,
    }
    figures = {name: sources[source].get(key) for name, (source, key) in _figure_sources(scored_on).items()}
    figures.update(_ordered_figures(sources, scored_on))
    compared = ((f"{scored_on} accuracy", "baseline accuracy"), (f"{scored_on} macro-F1", "baseline macro-F1"))
    for name, (model, baseline) in zip(_LEADS, compared):
        known = figures[model] is not None and figures[baseline] is not None
        figures[name] = figures[model] - figures[baseline] if known else None
    micro, baseline_micro = sources["test"].get("micro_f1"), sources["baseline_test"].get("micro_f1")
    if micro is not None:
        lead = micro - baseline_micro if baseline_micro is not None else None
        figures.update(zip(_micro_columns(scored_on), (micro, baseline_micro, lead)))
    return figures


def _ordered_figures(sources: dict[str, dict[str, Any]], scored_on: str) -> dict[str, Any]:
    """A ratings run's MAE and kappa (a star classifier's, read as stars) and the ridge's; none for classes."""
    test = sources["test"].get("ordered") or sources["test"]
    if test.get("mae") is None:
        return {}
    baseline = sources["baseline_test"]
    values = (
        test["mae"],
        test.get("quadratic_weighted_kappa"),
        baseline.get("mae"),
        baseline.get("quadratic_weighted_kappa"),
    )
    return {name.format(scored_on): value for name, value in zip(_ORDERED_NAMES, values)}


def _mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.fmean(known) if known else None


def _sd(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.stdev(known) if len(known) > 1 else None


def _cell(value: float | None, name: str, signed: bool = True) -> str:
    if value is None:
        return "-"
    if name in (*_LEADS, _MICRO_F1_LEAD) and signed:
        return f"{value:+.3f}"
    return f"{value:.0f}" if name == _SECONDS else f"{value:.3f}"
