"""Your own reviews in one command: ``finetune train --train_file FILE --text_column T --label_column L``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.config.recipes import load_recipe

PROJECT = Path(__file__).parent.parent
TRAIN = PROJECT / "data" / "reviews" / "train.csv"


@pytest.fixture(scope="module")
def own_run(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("own") / "mine"
    # The line, with the tiny model and one quick epoch so the suite stays fast.
    argv = ["train", "--train_file", str(TRAIN), "--text_column", "review", "--label_column", "stars"]
    argv += ["--output_dir", str(folder), "--model_name_or_path", str(tiny_model_dir), "--max_length", "64"]
    argv += ["--num_train_epochs", "1", "--use_cpu", "true", "--disable_tqdm", "true"]
    argv += ["--ignore_mismatched_sizes", "true"]  # the tiny model's head has 3 classes, the stars 5
    return folder, argv


def test_trains_without_a_recipe_and_writes_the_recipe_that_reproduces_it(own_run, capsys):
    folder, argv = own_run
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "no recipe given: training from the flags" in err
    # 1-5 stars: one class per rating, and the usual grouping offered.
    assert "the label column holds ratings 1 to 5" in err
    assert "--label_bins 'negative=1-2,neutral=3,positive=4-5'" in err
    run = json.loads((folder / "finetune_run.json").read_text())
    assert run["class_names"] == ["1", "2", "3", "4", "5"]
    # Validation and test drawn from the file (10% each of 458 reviews).
    assert run["data_report"]["rows"] == {"train": 366, "test": 46, "validation": 46}
    assert (folder / "test_report.json").is_file()

    recipe = folder / "recipe.yaml"
    assert recipe.read_text().startswith("# Made by 'finetune train' from flags")
    again = load_recipe(str(recipe))
    assert again.data.train_file == str(TRAIN) and again.data.label_column == "stars"
    assert again.data.class_names == ["1", "2", "3", "4", "5"]
    assert again.training.output_dir == str(folder) and again.training.num_train_epochs == 1
    assert again.training.learning_rate == 8e-5 and again.training.class_weighting == "sqrt"

    # Trained again from the recipe alone (into another folder): the same run, to the bit.
    other = folder.parent / "again"
    assert main(["train", str(recipe), "--output_dir", str(other)]) == 0
    assert (other / "test_report.json").read_text() == (folder / "test_report.json").read_text()
    assert (other / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes(), "weights differ"


def test_a_data_file_where_the_recipe_goes_names_the_command(capsys):
    assert main(["train", str(TRAIN)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {TRAIN} is a data file, not a recipe; train on it with: finetune train --train_file {TRAIN} "
        "--text_column TEXT --label_column LABEL"
    )


def test_flags_given_win_over_the_defaults(tmp_path, capsys):
    # A bad value of a defaulted field is the user's value, checked as always (nothing written).
    argv = ["train", "--train_file", str(TRAIN), "--text_column", "review", "--label_column", "stars"]
    argv += ["--output_dir", str(tmp_path / "out"), "--gradient_accumulation_steps", "0"]
    assert main(argv) == 2
    assert "gradient_accumulation_steps must be >= 1 (got 0)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("rows", "flags", "message"),
    [
        ("review,stars\ngood,5\nbad,1\n", ["--text_column", "review"], "no column 'label' (columns: review, stars)"),
        (
            "review,stars\ngood,5\nbad,1\n",
            ["--text_column", "review", "--label_column", "rating"],
            "has no column 'rating' (columns: review, stars)",
        ),
        (
            "review,stars\ngood,5\nfine,5\n",
            ["--text_column", "review", "--label_column", "stars"],
            "every label in 'stars' is 5, and a classifier needs at least 2 classes",
        ),
        ("", ["--text_column", "review", "--label_column", "stars"], "is empty (0 bytes)"),
    ],
    ids=["no-label-column-named", "label-column-missing", "one-class", "empty-file"],
)
def test_bad_own_data_is_one_line(tmp_path, capsys, rows, flags, message):
    data = tmp_path / "mine.csv"
    data.write_text(rows, encoding="utf-8")
    assert main(["train", "--train_file", str(data), *flags, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert not (tmp_path / "out").exists()


def test_the_written_recipe_keeps_list_and_bare_flags(tmp_path):
    from finetune.pipeline.own_reviews import recipe_text

    # Several words after one flag are one list value; a flag with no value is true.
    flags = ["--train_file", str(TRAIN), "--text_column", "review", "--label_column", "stars"]
    flags += ["--class_names", "1", "2", "3", "4", "5", "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(flags))
    again = load_recipe(str(recipe))
    assert again.data.class_names == ["1", "2", "3", "4", "5"] and again.training.use_cpu is True


def tiny_reviews(folder: Path) -> Path:
    """30 short reviews, 10 of each of 3 classes (the tiny model's head), as a CSV."""
    rows = ["review,label"]
    for index in range(30):
        label = ("negative", "neutral", "positive")[index % 3]
        rows.append(f"{label} review number {index},{label}")
    path = folder / "mine.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def tiny_own_argv(folder: Path, tiny_model_dir: Path, *flags: str) -> list[str]:
    """The recipe-less line on ``tiny_reviews``, with the tiny model and 2 updates."""
    argv = ["train", "--train_file", str(tiny_reviews(folder)), "--text_column", "review", "--label_column", "label"]
    argv += ["--output_dir", str(folder / "out"), "--model_name_or_path", str(tiny_model_dir), "--max_length", "16"]
    return [*argv, "--max_steps", "2", "--use_cpu", "true", "--disable_tqdm", "true", *flags]


def test_evaluation_turned_off_keeps_the_last_model(tmp_path, tiny_model_dir, capsys):
    # load_best_model_at_end was a default, not the user's choice: it follows --eval_strategy no instead of refusing.
    assert main(tiny_own_argv(tmp_path, tiny_model_dir, "--eval_strategy", "no")) == 0
    err = capsys.readouterr().err
    decided = err.split("decided for you", 1)[1].split("the recipe that reproduces", 1)[0]
    assert "save_strategy no" in decided and "load_best_model_at_end false" in decided
    assert "metric_for_best_model" not in decided and "save_total_limit" not in decided
    assert (
        "note: evaluation is off (--eval_strategy no), so the last model is kept: no best-model loading and no "
        "checkpoint each epoch (pass --save_strategy epoch for one)" in decided
    )
    folder = tmp_path / "out"
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("checkpoint-*"))
    again = load_recipe(str(folder / "recipe.yaml"))
    assert again.training.eval_strategy == "no" and again.training.save_strategy == "no"
    assert again.training.load_best_model_at_end is False and again.training.metric_for_best_model is None
    assert json.loads((folder / "report" / "metrics.json").read_text())["best_model_checkpoint"] is None


@pytest.mark.parametrize(
    ("flags", "decided"),
    [
        (["--eval_strategy", "no", "--save_strategy", "epoch"], {"load_best_model_at_end": False}),
        (["--save_strategy", "no"], {"eval_strategy": "epoch", "load_best_model_at_end": False}),
        (["--eval_strategy", "steps"], {"save_strategy": "epoch", "load_best_model_at_end": False}),
        (["--eval_strategy", "steps", "--save_strategy", "steps"], {"load_best_model_at_end": True}),
        ([], {"eval_strategy": "epoch", "save_strategy": "epoch", "load_best_model_at_end": True}),
    ],
    ids=["eval-off-save-each-epoch", "save-off", "eval-steps", "eval-and-save-steps", "nothing-given"],
)
def test_the_best_model_defaults_follow_the_evaluation_and_save_flags(tmp_path, flags, decided, capsys):
    from finetune.pipeline.own_reviews import flags_without_recipe

    argv = ["--train_file", str(TRAIN), "--text_column", "review", "--label_column", "stars"]
    recipe = load_recipe(None, flags_without_recipe([*argv, "--output_dir", str(tmp_path / "out"), *flags]))
    for name, value in decided.items():
        assert getattr(recipe.training, name) == value, name
    # Without best-model loading, no metric names a "best" checkpoint the run did not keep.
    best = recipe.training.load_best_model_at_end
    assert (recipe.training.metric_for_best_model == "macro_f1") is best


def test_load_best_model_at_end_asked_for_without_evaluation_is_refused(tmp_path, tiny_model_dir, capsys):
    # The user's own choice contradicts their flags: today's one-line refusal, nothing written.
    flags = ("--load_best_model_at_end", "true", "--eval_strategy", "no")
    assert main(tiny_own_argv(tmp_path, tiny_model_dir, *flags)) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: load_best_model_at_end needs eval_strategy and save_strategy to match, but found eval_strategy no "
        "and save_strategy epoch; pass --save_strategy no --load_best_model_at_end false to keep the last model, "
        "or --eval_strategy epoch to keep the best"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("lines", "suffix", "flags"),
    [
        (['{"review": "cheap, late", "tags": ["price", "delivery"]}', '{"review": "ok", "tags": []}'], ".jsonl", []),
        (["review,tags", '"cheap, late",price|delivery', "small,size"], ".csv", ["--label_separator", "|"]),
    ],
    ids=["jsonl-lists", "csv-separated"],
)
def test_tags_without_a_recipe_say_their_names_and_write_them_into_the_recipe(tmp_path, lines, suffix, flags, capsys):
    from finetune.pipeline.own_reviews import flags_without_recipe

    train = tmp_path / f"tags{suffix}"
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["--train_file", str(train), "--text_column", "review", "--label_column", "tags", *flags]
    recipe = load_recipe(None, flags_without_recipe([*argv, "--output_dir", str(tmp_path / "out")]))
    expected = ["delivery", "price"] if suffix == ".jsonl" else ["delivery", "price", "size"]
    assert recipe.data.task == "multi_label" and recipe.data.class_names == expected
    assert recipe.training.metric_for_best_model == "micro_f1"
    printed = capsys.readouterr().err
    assert f"tags ({'lists' if suffix == '.jsonl' else 'split at ' + repr('|')}): {', '.join(expected)}" in printed
    assert f"class_names: [{', '.join(expected)}]" in printed


@pytest.mark.parametrize("task", ["ordinal", "regression"])
def test_a_star_column_trains_as_ordered_ratings_without_a_recipe(tmp_path, tiny_model_dir, capsys, task):
    """``finetune train --train_file my.csv --label_column stars --task ordinal``: no bins, no class weights, MAE."""
    folder = tmp_path / "stars"
    argv = ["train", "--train_file", str(TRAIN), "--text_column", "review", "--label_column", "stars"]
    argv += ["--task", task, "--output_dir", str(folder), "--model_name_or_path", str(tiny_model_dir)]
    argv += ["--max_length", "32", "--num_train_epochs", "1", "--use_cpu", "true", "--disable_tqdm", "true"]
    argv += ["--ignore_mismatched_sizes", "true"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "label_bins" not in err and "metric_for_best_model mae" in err
    again = load_recipe(str(folder / "recipe.yaml"))
    assert again.data.task == task and again.data.label_bins is None
    assert again.training.class_weighting == "none" and again.training.metric_for_best_model == "mae"
    assert again.training.greater_is_better is False
    report = json.loads((folder / "test_report.json").read_text())
    assert report["task"] == task and {"mae", "quadratic_weighted_kappa"} <= set(report)
