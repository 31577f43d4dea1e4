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
FOLD_FIELDS = ("cross_validation_folds", "cross_validation_fold")
# The size of the draw and its held-out shares: the check sets them from the recipe's own data; flags may override.
SAMPLE_FIELDS = (
    "max_train_samples",
    "max_eval_samples",
    "max_test_samples",
    "test_split_percentage",
    "validation_split_percentage",
)


def check(recipe: str, dataset: str, overrides: list[str] | None = None, seeds: int = 1) -> dict[str, Any]:
    """Train ``recipe``'s settings on the check dataset ``dataset`` with ``seeds`` seeds; returns the seeds summary.

    ``overrides`` are recipe flags, as for ``finetune train`` (``--output_dir``,
    ``--max_train_samples`` for another draw size); the data source, columns
    and classes come from the check dataset and cannot be overridden.
    """
    from ..config.recipes import flag_names, load_recipe, read_recipe_file
    from ..data.splits import load_review_data
    from ..fetching.catalog import CATALOG, get_entry
    from ..pipeline.repeats import run_repeats, seed_repeats

    # Arguments: the check dataset, the flags it allows, the recipe as the flags leave it.
    entry = get_entry(dataset)
    if entry.purpose != "check":
        checks = ", ".join(name for name, known in CATALOG.items() if known.purpose == "check")
        raise FinetuneError(
            f"{dataset} is a dataset recipes are tuned on, not a check dataset; check a recipe on one no recipe "
            f"was tuned on: {checks} (see 'finetune data list')"
        )
    overrides = list(overrides or [])
    refused = sorted(flag_names(overrides) & {*SOURCE_FIELDS, *COLUMN_FIELDS, *FOLD_FIELDS})
    if refused:
        raise FinetuneError(
            f"finetune check reads the reviews, columns and classes from {dataset}, so --{refused[0]} cannot be "
            f"given; drop it (to train on other data, use 'finetune train {recipe} --{refused[0]} ...')"
        )
    if seeds < 1:
        raise FinetuneError(f"--seeds must be >= 1 (got {seeds}); e.g. --seeds 3")
    from ..pipeline.flags import without_flags

    # The recipe's own data, as it trains on it: its classes, and its split sizes, which the draw copies.
    own_flags = without_flags(overrides, {f"--{name}": True for name in SAMPLE_FIELDS})
    own = load_recipe(recipe, own_flags)
    columns = check_columns(entry, own.data)
    if own.data.class_names:  # named by the recipe: checked before its data is read (or downloaded)
        check_label_bins(entry, list(own.data.class_names), recipe)
    own_data = load_review_data(own.data, seed=own.training.seed)
    label_bins = check_label_bins(entry, own_data.label_names, recipe)
    own_rows = own_split_sizes(own_data)

    # The check recipe: the recipe's values with the check data's fields, written beside the runs.
    run = load_recipe(recipe, overrides)
    given_output = "output_dir" in flag_names(overrides)
    output_dir = Path(run.training.output_dir if given_output else f"{run.training.output_dir}-check-{entry.name}")
    values = check_recipe_values(read_recipe_file(recipe), entry.name, columns, label_bins, own_rows)
    values["output_dir"] = str(output_dir)
    text = _header(recipe, entry, own_rows, values) + yaml.safe_dump(values, sort_keys=False, allow_unicode=True)
    check_recipe = output_dir / CHECK_RECIPE
    _write_check_recipe(check_recipe, text, run.training.overwrite_output_dir)
    print(
        f"checking {recipe} on {entry.name}: {values['max_train_samples']} reviews drawn per seed "
        f"(its own data: {_sizes(own_rows)}); settings in {check_recipe}",
        file=sys.stderr,
    )

    # Train and score every seed, the baseline beside each, and summarise.
    return run_repeats(str(check_recipe), overrides, seed_repeats(str(check_recipe), overrides, seeds))


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
    label_bins: dict[str, list[float]],
    own_rows: dict[str, int],
) -> dict[str, Any]:
    """The recipe's ``values`` with its data fields replaced by the check dataset's, and the draw sized on its own."""
    replaced = {*SOURCE_FIELDS, *COLUMN_FIELDS, *FOLD_FIELDS, *SAMPLE_FIELDS}
    total = sum(own_rows.values())
    return {
        **{key: value for key, value in values.items() if key not in replaced},
        "dataset_name": dataset,
        **columns,
        "label_bins": label_bins,
        # The recipe's own size and shares: the lead is measured at the size the settings were tuned at.
        "max_train_samples": total,
        "test_split_percentage": _percent(own_rows.get("test", 0), total),
        "validation_split_percentage": _percent(own_rows.get("validation", 0), total),
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


def _header(recipe: str, entry: CatalogEntry, own_rows: dict[str, int], values: dict[str, Any]) -> str:
    return (
        f"# {recipe}'s settings on the check dataset {entry.name} ({entry.card}), which no recipe is tuned on.\n"
        f"# Written by 'finetune check {recipe} {entry.name}': a seeded draw of {values['max_train_samples']} "
        f"reviews, the size of the recipe's\n# own data ({_sizes(own_rows)}), held out in the same shares. "
        f"Train it again with 'finetune train {values['output_dir']}/{CHECK_RECIPE}'.\n"
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
