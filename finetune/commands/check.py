"""``finetune check RECIPE DATASET [--seeds N]``: a recipe's settings trained and scored on reviews it was not tuned on.

A recipe's lead over the TF-IDF baseline is measured on the data its settings
were chosen on, so part of it may be luck of that data. A check dataset
(``purpose="check"`` in the catalog) is reviews no recipe was tuned on: the
check keeps the recipe's model, training and truncation settings and swaps
its data fields for the check dataset's (its columns, and the ``label_bins``
that map its ratings onto the recipe's classes). The check draws about as
many reviews as the recipe's own data holds (a seeded random draw,
``max_train_samples``), held out into validation and test in the recipe's
own proportions (stratified, drawn with the seed, as every run draws them),
so the lead is measured at the size it was tuned at. Each seed trains, and
fits the baseline, on its own draw; the summary is the usual ``seeds.json``
/ ``seeds.md`` (see :mod:`finetune.pipeline.repeats`), the lead taken seed by seed.

The settings it trains with are written out as ``OUTPUT_DIR/check-recipe.yaml``,
a plain recipe: ``finetune train OUTPUT_DIR/check-recipe.yaml`` trains the
same run again, and a stopped check goes on from where it stopped.

A distillation recipe (``unlabeled_from``, ``distill_alpha``, ...) is checked
as a student: ``--teacher RUN`` names a teacher trained on the check data (a
check of the teacher's recipe, ``finetune check TEACHER_RECIPE DATASET``), every
seed is its student on the teacher's draw (``split_seed``), and the reviews
the recipe took from its own source to be labelled come from the check
dataset's reviews outside the draw instead (``unlabeled_from``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import FinetuneError

if TYPE_CHECKING:
    from ..config.arguments import DataArguments
    from ..data.splits import ReviewData
    from ..fetching.catalog import CatalogEntry
    from ..pipeline.teacher import TeacherRun

CHECK_RECIPE = "check-recipe.yaml"
# The fields that say where a recipe's reviews are and how their columns become classes: the check replaces them.
SOURCE_FIELDS = (
    "dataset_name",
    "dataset_config_name",
    "dataset_dir",
    "train_file",
    "validation_file",
    "test_file",
    "extra_train_file",
)
COLUMN_FIELDS = ("text_column", "title_column", "label_column", "class_names", "label_bins")
# Where a student's unlabelled reviews come from: the check dataset's reviews outside the draw replace them.
UNLABELED_FIELDS = ("unlabeled_file", "unlabeled_from")
FOLD_FIELDS = ("cross_validation_folds", "cross_validation_fold")
# The size of the draw and its held-out shares: the check sets them from the recipe's own data; flags may override.
SAMPLE_FIELDS = (
    "max_train_samples",
    "max_eval_samples",
    "max_test_samples",
    "test_split_percentage",
    "validation_split_percentage",
)


def check(
    recipe: str, dataset: str, overrides: list[str] | None = None, seeds: int = 1, teacher: str | None = None
) -> dict[str, Any]:
    """Train ``recipe``'s settings on the check dataset ``dataset`` with ``seeds`` seeds; returns the seeds summary.

    ``overrides`` are recipe flags, as for ``finetune train`` (``--output_dir``,
    ``--max_train_samples`` for another draw size); the data source, columns
    and classes come from the check dataset and cannot be overridden. With
    ``teacher`` (a run trained on ``dataset``), every seed is its student.
    """
    from ..config.recipes import flag_names, load_recipe, read_recipe_file
    from ..data.ratings import reads_numbers
    from ..data.splits import load_review_data
    from ..pipeline.flags import without_flags
    from ..pipeline.repeats import run_repeats, seed_repeats

    # Arguments: the check dataset, the flags it allows, the teacher where the recipe needs one.
    overrides = list(overrides or [])
    entry = checked_arguments(recipe, dataset, overrides, seeds)
    recipe_values = read_recipe_file(recipe)
    teacher_run = open_check_teacher(teacher, recipe, entry.name, recipe_values, overrides)
    # --max_unlabeled sizes the check's unlabelled draw, which a recipe with an unlabeled_file would refuse.
    recipe_flags = without_flags(overrides, {"--max_unlabeled": True})

    # The recipe's own data, as it trains on it: its classes, and its split sizes, which the draw copies.
    own = load_recipe(recipe, without_flags(recipe_flags, {f"--{name}": True for name in SAMPLE_FIELDS}))
    refuse_tags(recipe, entry.name, own.data.task == "multi_label" or own.data.label_separator is not None)
    columns = check_columns(entry, own.data)
    # A ratings recipe reads the check data's stars as numbers too: no classes to map its bins onto.
    stars = reads_numbers(own.data)
    if own.data.class_names and not stars:  # named by the recipe: checked before its data is read (or downloaded)
        check_label_bins(entry, list(own.data.class_names), recipe)
    own_data = load_review_data(own.data, seed=own.training.seed)
    refuse_tags(recipe, entry.name, own_data.multi_label)  # tags inferred from lists in the data
    label_bins = None if stars else check_label_bins(entry, own_data.label_names, recipe)
    own_rows = own_split_sizes(own_data)

    # The check recipe: the recipe's values with the check data's fields, written beside the runs.
    run = load_recipe(recipe, recipe_flags)
    given_output = "output_dir" in flag_names(overrides)
    output_dir = Path(run.training.output_dir if given_output else f"{run.training.output_dir}-check-{entry.name}")
    values = check_recipe_values(recipe_values, entry.name, columns, label_bins, own_rows)
    if teacher_run is not None:
        # The student draws the teacher's split, whatever seed it trains with, so no test review taught the teacher.
        values["split_seed"] = teacher_run.split_seed
    values["output_dir"] = str(output_dir)
    text = _header(recipe, entry, own_rows, values, teacher_run) + yaml.safe_dump(
        values, sort_keys=False, allow_unicode=True
    )
    check_recipe = output_dir / CHECK_RECIPE
    _write_check_recipe(check_recipe, text, run.training.overwrite_output_dir)
    print(
        f"checking {recipe} on {entry.name}: {values['max_train_samples']} reviews drawn per seed "
        f"(its own data: {_sizes(own_rows)}); settings in {check_recipe}",
        file=sys.stderr,
    )

    # Train and score every seed (a student of the teacher, with one), the baseline beside each, and summarise.
    plan = seed_repeats(str(check_recipe), overrides, seeds)
    return run_repeats(str(check_recipe), overrides, plan, teacher=teacher_run)


def checked_arguments(recipe: str, dataset: str, overrides: list[str], seeds: int) -> CatalogEntry:
    """The check dataset's catalog entry, once it is one and no flag names what the check replaces."""
    from ..config.recipes import flag_names
    from ..fetching.catalog import CATALOG, get_entry

    entry = get_entry(dataset)
    if entry.purpose != "check":
        checks = ", ".join(name for name, known in CATALOG.items() if known.purpose == "check")
        raise FinetuneError(
            f"{dataset} is a dataset recipes are tuned on, not a check dataset; check a recipe on one no recipe "
            f"was tuned on: {checks} (see 'finetune data list')"
        )
    refused = sorted(flag_names(overrides) & {*SOURCE_FIELDS, *COLUMN_FIELDS, *FOLD_FIELDS, *UNLABELED_FIELDS})
    if refused:
        raise FinetuneError(
            f"finetune check reads the reviews, columns and classes from {dataset}, so --{refused[0]} cannot be "
            f"given; drop it (to train on other data, use 'finetune train {recipe} --{refused[0]} ...')"
        )
    if seeds < 1:
        raise FinetuneError(f"--seeds must be >= 1 (got {seeds}); e.g. --seeds 3")
    return entry


def open_check_teacher(
    teacher: str | None, recipe: str, dataset: str, recipe_values: dict[str, Any], overrides: list[str]
) -> TeacherRun | None:
    """The checked teacher run for a student's check; an error if a distillation recipe has none, or it has other data.

    A distillation recipe trained without its teacher would not be its settings, and a teacher trained on the
    recipe's own data would carry what that data taught into the check.
    """
    from ..config.recipes import flag_names
    from ..pipeline.arguments import DISTILL_FIELDS
    from ..pipeline.teacher import TeacherRun

    named = [name for name in DISTILL_FIELDS if name in {*recipe_values, *flag_names(overrides)}]
    how = (
        f"check the teacher's recipe first ('finetune check TEACHER_RECIPE {dataset} --output_dir TEACHER_CHECK'), "
        f"then 'finetune check {recipe} {dataset} --teacher TEACHER_CHECK/seed-SEED'"
    )
    if teacher is None:
        if named:
            raise FinetuneError(
                f"{recipe} distills a teacher ({', '.join(named)}), so its check needs a teacher trained on "
                f"{dataset}: {how}"
            )
        return None
    teacher_run = TeacherRun.open(teacher)
    if teacher_run.dataset_name != dataset:
        trained_on = teacher_run.dataset_name or "files of its own"
        raise FinetuneError(f"the teacher {teacher} trained on {trained_on}, not on the check data {dataset}: {how}")
    return teacher_run


def refuse_tags(recipe: str, dataset: str, multi_label: bool) -> None:
    """Refuse a recipe with several tags per review: a check dataset's ratings map onto one class per review."""
    if multi_label:
        raise FinetuneError(
            f"{recipe} trains several tags per review (multi_label), and finetune check maps {dataset}'s ratings "
            "onto one class per review; measure a tags recipe's spread with finetune train RECIPE --seeds 3"
        )


def check_label_bins(entry: CatalogEntry, classes: list[str], recipe: str) -> dict[str, list[float]]:
    """The entry's ``label_bins`` for the recipe's ``classes``, in the recipe's class order; an error if it has none."""
    for bins in entry.check_label_bins:
        if set(bins) == set(classes) and len(bins) == len(classes):
            return {name: list(bins[name]) for name in classes}
    offered = " or ".join(f"({', '.join(bins)})" for bins in entry.check_label_bins)
    raise FinetuneError(
        f"{recipe} has the classes ({', '.join(classes)}), which {entry.name} cannot be mapped onto: its ratings "
        f"map to {offered}; check a recipe with one of those class sets"
    )


def check_columns(entry: CatalogEntry, own_data_args: DataArguments) -> dict[str, str]:
    """The check data's column fields for a recipe: its title only if the recipe reads titles too."""
    columns = dict(entry.check_columns)
    if not own_data_args.title_column or not columns.get("title_column"):
        # A recipe that reads no title reads none here either; one that does reads the check data's, if it has one.
        if own_data_args.title_as_review:
            raise FinetuneError(
                f"the recipe trains on titles (title_as_review) and {entry.name} has none; pass --title_as_review false"
            )
        columns.pop("title_column", None)
    return columns


def check_recipe_values(
    values: dict[str, Any],
    dataset: str,
    columns: dict[str, str],
    label_bins: dict[str, list[float]] | None,
    own_rows: dict[str, int],
) -> dict[str, Any]:
    """The recipe's ``values`` with its data fields replaced by the check dataset's, and the draw sized on its own."""
    replaced = {*SOURCE_FIELDS, *COLUMN_FIELDS, *FOLD_FIELDS, *SAMPLE_FIELDS, *UNLABELED_FIELDS}
    total = sum(own_rows.values())
    # A student's extra reviews to be labelled come from the check data too: its reviews outside the draw.
    unlabeled = {"unlabeled_from": dataset} if any(values.get(name) for name in UNLABELED_FIELDS) else {}
    return {
        **{key: value for key, value in values.items() if key not in replaced},
        "dataset_name": dataset,
        **columns,
        # A ratings recipe (no bins) reads the check data's stars as numbers.
        **({"label_bins": label_bins} if label_bins is not None else {}),
        # The recipe's own size and shares: the lead is measured at the size the settings were tuned at.
        "max_train_samples": total,
        "test_split_percentage": _percent(own_rows.get("test", 0), total),
        "validation_split_percentage": _percent(own_rows.get("validation", 0), total),
        **unlabeled,
    }


def own_split_sizes(own_data: ReviewData) -> dict[str, int]:
    """How many reviews a recipe's own run trains, validates and tests on (titles and extra_train_file not counted)."""
    rows = dict(own_data.report.rows)
    rows["train"] = rows.get("train", 0) - own_data.report.title_reviews - own_data.report.extra_train_reviews
    if not rows.get("test"):
        raise FinetuneError(
            "the recipe's own data has no test split, so there is no share of test reviews to copy; "
            "set test_split_percentage in the recipe"
        )
    return rows


def _percent(part: int, total: int) -> int:
    # At least 1% of a held-out split the recipe has, so a small one is not rounded away.
    return max(1, round(100 * part / total)) if part else 0


def _sizes(rows: dict[str, int]) -> str:
    return " / ".join(f"{count} {split}" for split, count in rows.items())


def _header(
    recipe: str, entry: CatalogEntry, own_rows: dict[str, int], values: dict[str, Any], teacher: TeacherRun | None
) -> str:
    command = "finetune train" if teacher is None else f"finetune distill {teacher.folder}"
    taught = "" if teacher is None else f" --teacher {teacher.folder}"
    return (
        f"# {recipe}'s settings on the check dataset {entry.name} ({entry.card}), which no recipe is tuned on.\n"
        f"# Written by 'finetune check {recipe} {entry.name}{taught}': a seeded draw of "
        f"{values['max_train_samples']} reviews, the size of the recipe's\n# own data ({_sizes(own_rows)}), held "
        f"out in the same shares. Train it again with '{command} {values['output_dir']}/{CHECK_RECIPE}'.\n"
    )


def _write_check_recipe(path: Path, text: str, overwrite: bool) -> None:
    """Write the check recipe; one already there with other settings is kept unless ``overwrite``."""
    from ..config.output_files import write_output_text

    if path.is_file():
        if path.read_text(encoding="utf-8", errors="replace") == text:
            return
        if not overwrite:
            raise FinetuneError(
                f"{path} holds another check's settings (another recipe, dataset or recipe version); pass "
                "--overwrite_output_dir to check again, or choose another --output_dir"
            )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FinetuneError(f"cannot make {path.parent} ({error.strerror or error}); choose another --output_dir")
    write_output_text(path, text, instead="--output_dir")
