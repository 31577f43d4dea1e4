"""Recipes: every shipped recipe parses; flags override; mistakes name the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from finetune import FinetuneError
from finetune.config.recipes import flag_names, flag_value, load_recipe
from finetune.config.tasks import ORDERED_TASKS

PROJECT = Path(__file__).parent.parent
RECIPES = sorted((PROJECT / "recipes").glob("*.yaml"))


def write(tmp_path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.name for path in RECIPES])
def test_every_recipe_parses_and_says_how_to_run_it(recipe):
    lines = recipe.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ")
    # A student's recipe runs under its teacher: finetune distill TEACHER_RUN recipes/NAME.
    command = re.compile(rf"finetune (train|distill \S+) recipes/{re.escape(recipe.name)}")
    assert any(command.search(line) for line in lines if line.startswith("#"))
    run = load_recipe(str(recipe))
    assert run.training.gradient_accumulation_steps >= 1
    # A ratings recipe's levels are the stars its data holds; every other recipe names its classes.
    assert run.data.class_names or run.data.task in ORDERED_TASKS


def test_quickstart_values_and_yaml_floats():
    run = load_recipe(str(PROJECT / "recipes" / "quickstart.yaml"))
    assert run.model.model_name_or_path == "all-minilm-l6-v2"
    assert run.data.class_names == ["negative", "neutral", "positive"]
    assert run.data.label_bins == {"negative": [1.0, 2.0], "neutral": [3.0, 3.0], "positive": [4.0, 5.0]}
    assert isinstance(run.training.learning_rate, float)


def test_flags_override_recipe(tmp_path):
    recipe = write(tmp_path, "learning_rate: 1e-4\nnum_train_epochs: 2\n")
    run = load_recipe(recipe, ["--learning_rate", "3e-5", "--num_train_epochs=4", "--no_remove_unused_columns"])
    assert run.training.learning_rate == 3e-5  # "1e-4" alone would be a string to YAML
    assert run.training.num_train_epochs == 4
    assert run.training.remove_unused_columns is False


def test_bare_no_means_the_no_strategy(tmp_path):
    run = load_recipe(write(tmp_path, "save_strategy: no\neval_strategy: no\n"))
    assert run.training.save_strategy == "no" and run.training.eval_strategy == "no"


@pytest.mark.parametrize("spelling", ["n_accumulate: 4", "gradient_accumulation_steps: 4"])
def test_n_accumulate_is_an_alias(tmp_path, spelling):
    assert load_recipe(write(tmp_path, spelling)).training.gradient_accumulation_steps == 4


def test_n_accumulate_flag(tmp_path):
    assert load_recipe(None, ["--n_accumulate", "3"]).training.gradient_accumulation_steps == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gradient_accumulation_steps: 0", "gradient_accumulation_steps must be >= 1 (got 0); set it in the recipe"),
        ("n_accumulate: -2", "gradient_accumulation_steps must be >= 1 (got -2)"),
        ("gradient_accumulation_steps: 2.5", "gradient_accumulation_steps: invalid int value: '2.5'"),
        ("learning_rat: 3e-5", "unknown key 'learning_rat' in {recipe}; did you mean 'learning_rate'?"),
        ("n_accumulate: 2\ngradient_accumulation_steps: 2", "sets both n_accumulate and gradient_accumulation_steps"),
        ("eval_strategy: sometimes", "eval_strategy: invalid choice"),
        ("learning_rate: [1, 2", "is not valid YAML at line"),
        ("- just\n- a list", "holds a list, not settings; a recipe is a mapping of keys to values"),
        ("label_bins: {a: [1, 3], b: [2, 4]}", "label_bins ranges overlap"),
        # Once accepted, keeping the last range: ratings of 4 fell outside every bin and were dropped.
        ("label_bins: 'negative=1-2,positive=4-5,positive=5'", "label_bins names 'positive' twice; give each"),
        ('label_bins: \'{"a": [1, 2], "a": [3]}\'', "label_bins names 'a' twice"),
    ],
)
def test_recipe_mistakes_name_the_field(tmp_path, text, message):
    recipe = write(tmp_path, text)
    with pytest.raises(FinetuneError) as error:
        load_recipe(recipe)
    assert message.format(recipe=recipe) in str(error.value)
    assert "\n" not in str(error.value)


def test_gradient_accumulation_steps_checked_in_python_too(tmp_path):
    from finetune import FinetuneTrainingArguments

    with pytest.raises(ValueError, match="gradient_accumulation_steps must be >= 1"):
        FinetuneTrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=0)


def test_review_trainer_rejects_stock_arguments_with_bad_n(tmp_path, tiny_model_dir):
    from transformers import BertForSequenceClassification, TrainingArguments

    from finetune import ReviewTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    args.gradient_accumulation_steps = 0
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be >= 1"):
        ReviewTrainer(model=BertForSequenceClassification.from_pretrained(tiny_model_dir), args=args)


def test_missing_recipe():
    with pytest.raises(FinetuneError, match=r"recipe not found: nope\.yaml"):
        load_recipe("nope.yaml")


def test_unknown_flag_suggests():
    with pytest.raises(FinetuneError, match="unknown flag '--per_device_batch_size'; did you mean"):
        load_recipe(None, ["--per_device_batch_size", "8"])


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.name for path in RECIPES])
def test_every_recipe_steps_with_fused_adamw(recipe, tmp_path, tiny_model_dir):
    # Issue 47: one fused kernel per parameter group instead of a loop over tensors; transformers 5's default optim,
    # which a recipe (or a later transformers default) could silently turn off.
    import torch
    from transformers import BertForSequenceClassification

    from finetune import ReviewTrainer

    flags = ["--output_dir", str(tmp_path), "--eval_strategy", "no", "--load_best_model_at_end", "false"]
    flags += ["--class_weighting", "none"]  # weights are counted from a training set this test does not build
    args = load_recipe(str(recipe), flags).training
    assert args.optim == "adamw_torch_fused"
    trainer = ReviewTrainer(model=BertForSequenceClassification.from_pretrained(tiny_model_dir), args=args)
    optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is True


def test_the_fields_and_values_flags_set_in_either_spelling():
    flags = ["--max-steps=4", "--task", "ordinal", "--learning_rate=-5e-5", "--tasks", "x"]
    assert flag_names(flags) == {"max_steps", "task", "learning_rate", "tasks"}
    assert flag_value(flags, "max_steps") == "4"
    assert flag_value(flags, "task") == "ordinal"  # not --tasks' x
    assert flag_value(flags, "learning_rate") == "-5e-5"
    assert flag_value(flags, "seed") is None
    assert flag_value(["--task"], "task") is None  # a flag with nothing after it sets nothing here
