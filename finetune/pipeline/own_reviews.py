"""``finetune train --train_file reviews.csv --text_column review --label_column stars``: no recipe needed.

A first run on one's own file should not start with writing YAML. Without a
recipe, the flags name the data and this module fills in the rest with the
settings measured on reviews (those of ``recipes/quickstart.yaml``, fewer
epochs), holds validation and test reviews out of the file (stratified,
seeded), and prints what it decided with the recipe that reproduces it; the
run writes that recipe to ``OUTPUT_DIR/recipe.yaml``, so a first run becomes
a recipe to edit. Flags given always win over these defaults, and the
defaults follow them: turn evaluation off and they keep the last model rather
than a best one nothing measured.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..config.tasks import ORDERED_TASKS
from ..data.columns import column_values
from ..errors import FinetuneError

# Flags that name where the reviews come from: with one of them, no recipe is needed.
DATA_SOURCE_FLAGS = ("train_file", "dataset_dir", "dataset_name")
DATA_FILE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json")

# The quickstart recipe's optimizer settings (chosen on reviews, see recipes/quickstart.yaml), with
# 4 epochs rather than 8: a user's file is usually larger than the quickstart's 458 training reviews.
# Its head warm-up is left out: it counts updates (51, most of the quickstart's first epoch), so on
# another file's size it would be a different share of the run, measured nowhere.
DEFAULTS: dict[str, str] = {
    "test_split_percentage": "10",
    "validation_split_percentage": "10",
    "per_device_train_batch_size": "8",
    "per_device_eval_batch_size": "32",
    "gradient_accumulation_steps": "2",
    "num_train_epochs": "4",
    "learning_rate": "8e-5",
    "warmup_steps": "0.1",
    "weight_decay": "0.01",
    "lr_scheduler_type": "linear",
    "class_weighting": "sqrt",
    "train_sampling_strategy": "group_by_length",
    "eval_strategy": "epoch",
    "save_strategy": "epoch",
    "save_total_limit": "2",
    "load_best_model_at_end": "true",
    "metric_for_best_model": "macro_f1",
    "logging_steps": "5",
    "report_to": "none",
}
# How a flag says yes (HfArgumentParser's string_to_bool; a bare flag reads as True).
TRUE_WORDS = ("true", "yes", "t", "y", "1")
# A rating column the numbers of which are a scale of stars or points.
RATING_SCALES = ((1, 5), (1, 10), (0, 5), (0, 10))


def needs_no_recipe(recipe: str | None, flags: list[str]) -> bool:
    """True when there is no recipe and the flags say where the reviews are."""
    from ..config.recipes import flag_names

    return recipe is None and bool(flag_names(flags) & set(DATA_SOURCE_FLAGS))


def refuse_data_file_as_recipe(recipe: str | None) -> None:
    """A data file passed where the recipe goes gets the command that trains on it."""
    if recipe is not None and Path(recipe).suffix.lower() in DATA_FILE_SUFFIXES:
        raise FinetuneError(
            f"{recipe} is a data file, not a recipe; train on it with: finetune train --train_file {recipe} "
            "--text_column TEXT --label_column LABEL"
        )


def flags_without_recipe(flags: list[str]) -> list[str]:
    """``flags`` plus a default for every setting they leave open; prints what was decided and the recipe."""
    from ..config.recipes import flag_names, flag_values

    given = flag_names(flags)
    defaults, notes = best_model_defaults(flag_values(flags))
    ratings_task = _value(flags, "task") in ORDERED_TASKS
    if ratings_task:
        _fit_defaults_to_ratings(defaults)
    added: dict[str, str] = {key: value for key, value in defaults.items() if key not in given}
    if "output_dir" not in given:
        added["output_dir"] = f"runs/{_run_name(flags)}"
    tags = "label_separator" in given or _holds_tag_lists(flags)
    if tags and "task" not in given:
        # Several tags per review: said in the recipe it prints, so the run reads as what it is.
        added["task"] = "multi_label"
    if tags and added.get("metric_for_best_model") == "macro_f1":
        added["metric_for_best_model"] = "micro_f1"  # the headline with several tags per review
    if tags and "class_names" not in given:
        # The tags in the order their outputs will have, written down so a rerun on new data keeps it.
        names = _train_tag_names(flags, flag_values(flags).get("label_separator"))
        if names:
            added["class_names"] = names
    # A ratings task reads the stars as numbers: no classes to bin them into.
    if not given & {"label_bins", "class_names"} and not tags and not ratings_task:
        ratings = _rating_values(flags)
        if ratings is not None:
            # One class per rating keeps what the file says; the note offers the usual grouping.
            added["label_bins"] = ",".join(f"{value}={value}" for value in ratings)
            notes.append(_label_bins_suggestion(ratings))
    decided = [*flags, *(token for key, value in added.items() for token in (f"--{key}", *_tokens(value)))]
    _print_decisions(decided, added, notes)
    return decided


def _fit_defaults_to_ratings(defaults: dict[str, str]) -> None:
    """A regression or ordinal run's defaults: no class weights, and the best model the one nearest the stars."""
    # Class weights weigh the classes of a softmax; a rating's loss has none.
    defaults.pop("class_weighting", None)
    if "metric_for_best_model" in defaults:
        defaults["metric_for_best_model"] = "mae"
        defaults["greater_is_better"] = "false"  # an error: the smaller, the better


def best_model_defaults(given: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """DEFAULTS fitted to the evaluation and saving the flags ask for, and a note saying why where they differ.

    The defaults keep the best model: evaluate and save each epoch, load the
    best checkpoint at the end. That needs evaluations and checkpoints at the
    same moments, so where the flags turn evaluation or saving off or move it,
    the defaults give way and the last model is kept. ``given`` is the flags'
    ``{field: raw value}``; a value given is never changed, and where the user
    asked for ``load_best_model_at_end`` the defaults stay as they are, so a
    contradiction is refused when the arguments are checked, as in a recipe.
    """
    defaults = dict(DEFAULTS)
    if "load_best_model_at_end" in given and str(given["load_best_model_at_end"]).lower() in TRUE_WORDS:
        return defaults, []
    evaluated = str(given.get("eval_strategy", defaults["eval_strategy"])).lower()
    if evaluated == "no" and "save_strategy" not in given:
        defaults["save_strategy"] = "no"  # nothing measures which checkpoint is best: none each epoch
    saved = str(given.get("save_strategy", defaults["save_strategy"])).lower()
    if saved == "no":
        del defaults["save_total_limit"]
    if "load_best_model_at_end" not in given and evaluated != "no" and saved in (evaluated, "best"):
        return defaults, []  # evaluations and checkpoints together: the best model is kept
    defaults["load_best_model_at_end"] = "false"
    # Without best-model loading, Trainer would still name a "best" checkpoint (and the model card with it).
    del defaults["metric_for_best_model"]
    decided = [] if "load_best_model_at_end" in given else ["no best-model loading"]
    if evaluated == "no" and "save_strategy" not in given:
        decided.append("no checkpoint each epoch (pass --save_strategy epoch for one)")
    if not decided:
        return defaults, []  # the user chose not to load the best model: nothing of theirs to explain
    if evaluated == "no":
        reason = "evaluation is off (--eval_strategy no)"
    elif saved == "no":
        reason = "no checkpoints are saved (--save_strategy no)"
    else:
        reason = f"evaluations (eval_strategy {evaluated}) and checkpoints (save_strategy {saved}) do not coincide"
    return defaults, [f"{reason}, so the last model is kept: {' and '.join(decided)}"]


def recipe_text(flags: list[str]) -> str:
    """The YAML recipe that ``flags`` amount to, with the command that trains it in its opening comment."""
    from ..config.recipes import flag_values

    lines = [
        "# Made by 'finetune train' from flags (no recipe was given). Train it again, or edit it first:",
        "#   finetune train recipe.yaml",
        *(f"{key}: {_yaml_value(value)}" for key, value in flag_values(flags).items()),
    ]
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    """A flag's raw value as YAML: a word as written (the recipe loader reads it as the flag would), a list."""
    if value is True:
        return "true"
    if isinstance(value, list):
        return "[" + ", ".join(value) + "]"
    return str(value)


def _value(flags: list[str], name: str) -> str | None:
    from ..config.recipes import flag_values

    value = flag_values(flags).get(name)
    return value if isinstance(value, str) else None


def _run_name(flags: list[str]) -> str:
    source = _value(flags, "train_file") or _value(flags, "dataset_dir") or _value(flags, "dataset_name") or "reviews"
    path = Path(source)
    return (path.stem if path.suffix else path.name) or "reviews"


def _train_labels(flags: list[str]) -> tuple[str, str, list[Any]] | None:
    """The train file, its label column and the column's values, where the flags name a readable file with it."""
    from ..data.sources import read_table

    train_file, column = _value(flags, "train_file"), _value(flags, "label_column") or "label"
    if not train_file or not Path(train_file).is_file() or Path(train_file).suffix.lower() not in DATA_FILE_SUFFIXES:
        return None  # reading the data says what is wrong with it
    try:
        table = read_table(Path(train_file))
    except FinetuneError:
        return None
    if column not in table.column_names:
        return None
    return train_file, column, column_values(table, column)


def _tokens(value: str | list[str]) -> list[str]:
    """A decided setting's value as command-line tokens: a list (the tag names) is one token each."""
    return list(value) if isinstance(value, list) else [value]


def _train_tag_names(flags: list[str], separator: str | None) -> list[str]:
    """Every tag on the train file's reviews, sorted (cells split by ``separator``, or lists); [] where unreadable."""
    labels = _train_labels(flags)
    if labels is None:
        return []
    names: set[str] = set()
    for value in labels[2]:
        if isinstance(value, list):
            names.update(str(tag).strip() for tag in value)
        elif separator and isinstance(value, str):
            names.update(tag.strip() for tag in value.split(separator))
    return sorted(name for name in names if name)


def _holds_tag_lists(flags: list[str]) -> bool:
    """Whether the train file's labels are lists (several tags per review, from JSON Lines or Parquet)."""
    labels = _train_labels(flags)
    return labels is not None and any(isinstance(value, list) for value in labels[2])


def _rating_values(flags: list[str]) -> list[int] | None:
    """The ratings of a train file's label column when they are whole numbers on a 5- or 10-point scale."""
    labels = _train_labels(flags)
    if labels is None:
        return None
    train_file, column, raw_values = labels
    values = {value for value in raw_values if value is not None and str(value).strip() != ""}
    if len(values) == 1:
        raise FinetuneError(
            f"{train_file}: every label in '{column}' is {next(iter(values))!r}, and a classifier needs at least "
            "2 classes; check --label_column, or add reviews of the other classes"
        )
    try:
        numbers = {float(value) for value in values}
    except (TypeError, ValueError):
        return None
    if not numbers or any(not number.is_integer() for number in numbers):
        return None
    ratings = sorted(int(number) for number in numbers)
    if ratings == list(range(len(ratings))) and ratings[0] == 0 and len(ratings) < 3:
        return None  # 0 / 1 labels are class ids already
    fits_a_scale = any(low <= ratings[0] and ratings[-1] <= high for low, high in RATING_SCALES)
    return ratings if fits_a_scale and len(ratings) >= 3 else None


def _label_bins_suggestion(ratings: list[int]) -> str:
    top = max(ratings)
    bins = "negative=1-2,neutral=3,positive=4-5" if top <= 5 else "negative=1-4,neutral=5-6,positive=7-10"
    return (
        f"the label column holds ratings {ratings[0]} to {top}: one class per rating here; to train "
        f"negative / neutral / positive instead, pass --label_bins '{bins}'"
    )


def _print_decisions(flags: list[str], added: dict[str, Any], notes: list[str]) -> None:
    from ..config.recipes import flag_values

    shown = ", ".join(f"{key} {value}" for key, value in added.items() if key not in ("label_bins", "class_names"))
    print("no recipe given: training from the flags, with these settings decided for you", file=sys.stderr)
    print(f"  model: the packaged MiniLM unless --model_name_or_path; {shown}", file=sys.stderr)
    if "label_bins" in added:
        print(f"  label_bins: {added['label_bins']}", file=sys.stderr)
    if "class_names" in added:
        separator = flag_values(flags).get("label_separator")
        read = f"split at {separator!r}" if separator else "lists"
        print(f"  tags ({read}): {', '.join(added['class_names'])}", file=sys.stderr)
    for note in notes:
        print(f"  note: {note}", file=sys.stderr)
    print("  the recipe that reproduces this run (written to the run folder as recipe.yaml):", file=sys.stderr)
    for line in recipe_text(flags).splitlines()[2:]:
        print(f"    {line}", file=sys.stderr)
