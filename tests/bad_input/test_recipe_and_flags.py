"""Bad input, recipe and flags: a missing recipe, broken YAML, unknown keys, values out of range, flags that conflict.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from finetune.errors import FinetuneError

from .common import GOOD_ROWS, PROJECT, recipe_with, run_cli, snapshot, write_csv


def test_missing_recipe(capsys):
    assert "recipe not found: missing.yaml" in run_cli(["train", "missing.yaml"], capsys)


def test_broken_yaml(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: [3e-5\n")
    assert "is not valid YAML at line" in run_cli(["train", recipe], capsys)


def test_unknown_key(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, num_train_epoch=3)], capsys)
    assert "unknown key 'num_train_epoch'" in message and "did you mean 'num_train_epochs'?" in message


def test_zero_accumulation_steps(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, gradient_accumulation_steps=0)], capsys)
    assert message == (
        "error: gradient_accumulation_steps must be >= 1 (got 0); "
        "set it in the recipe or pass --gradient_accumulation_steps 4"
    )


@pytest.mark.parametrize("argv", [["train", "missing.yaml"], ["evaluate", "/nonexistent/run"]])
def test_real_process_exits_2_without_traceback(argv):
    result = subprocess.run(
        [sys.executable, "-m", "finetune", *argv], capture_output=True, text=True, cwd=PROJECT, timeout=120
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ")


@pytest.mark.parametrize(
    ("fields", "flags", "message"),
    [
        (
            {"learning_rate": "nan"},
            [],
            "learning_rate must be a finite number >= 0 (got nan); set it in the recipe or pass --learning_rate 5e-5",
        ),
        (
            {},
            ["--learning_rate", "-5e-5"],
            "learning_rate must be a finite number >= 0 (got -5e-05); set it in the recipe "
            "or pass --learning_rate 5e-5",
        ),
        (
            {"learning_rate": "[1e-4, 2e-4]"},
            [],
            "learning_rate takes one value, not a list (1e-4 2e-4); give it one, e.g. --learning_rate 1e-4",
        ),
        (
            {"per_device_train_batch_size": 0},
            [],
            "per_device_train_batch_size must be >= 1 (got 0); set it in the recipe or pass "
            "--per_device_train_batch_size 8",
        ),
        (
            {"per_device_eval_batch_size": 0},
            [],
            "per_device_eval_batch_size must be >= 1 (got 0); set it in the recipe or pass "
            "--per_device_eval_batch_size 8",
        ),
        (
            {"num_train_epochs": 0},
            [],
            "num_train_epochs must be > 0 (got 0.0); pass --num_train_epochs 3, or --max_steps N to count updates "
            "instead",
        ),
        (
            {"adam_epsilon": 0},
            [],
            "adam_epsilon must be a finite number > 0 (got 0.0); set it in the recipe or pass --adam_epsilon 1e-8",
        ),
        (
            {},
            ["--n_accumulate", "2", "--gradient_accumulation_steps", "4"],
            "the flags set both --n_accumulate and --gradient_accumulation_steps; keep one of them",
        ),
        ({"output_dir": "''"}, [], "output_dir is empty; set output_dir in the recipe or pass --output_dir runs/NAME"),
        (
            {},
            ["--dataloader_num_workers", "-1"],
            "dataloader_num_workers must be >= 0 (got -1); pass 0 to collate in the training process, or e.g. "
            "--dataloader_num_workers 2 for two loader processes",
        ),
        (
            {"dataloader_num_workers": 1},
            ["--dataloader_prefetch_factor", "0"],
            "dataloader_prefetch_factor must be >= 1 (got 0): the batches each loader worker collates ahead; "
            "try 2, or leave it out",
        ),
        # Stock fields each once a traceback from Trainer, the DataLoader, the scheduler or torch.compile, after
        # the data was read (finetune/config/stock_values.py).
        (
            {},
            ["--dataloader_persistent_workers", "true"],
            "dataloader_persistent_workers keeps loader worker processes between epochs, and there are none; "
            "pass --dataloader_num_workers 2 with it, or drop it",
        ),
        (
            {},
            ["--eval_accumulation_steps", "0"],
            "eval_accumulation_steps must be >= 1 (got 0); try 16 to move predictions to the CPU every 16 batches, "
            "or leave it out",
        ),
        (
            {},
            ["--neftune_noise_alpha", "-1"],
            "neftune_noise_alpha must be > 0 (got -1.0); try 5, or leave it out for no noise",
        ),
        (
            {},
            ["--label_names", "stars"],
            "label_names must be left out (got ['stars']): batches here carry their labels as 'labels'; "
            "to choose the data's label column, set label_column",
        ),
        (
            {},
            ["--optim_args", "eps"],
            "optim_args takes key=value pairs joined by commas (got 'eps'); e.g. --optim_args "
            "'key1=value1,key2=value2', or leave it out",
        ),
        (
            {"lr_scheduler_type": "cosine"},
            ["--lr_scheduler_kwargs", '{"num_cycle": 0.3}'],
            "lr_scheduler_kwargs: lr_scheduler_type cosine has no num_cycle; it takes num_cycles, last_epoch, "
            "or pick another lr_scheduler_type",
        ),
        (
            {"lr_scheduler_type": "cosine_with_min_lr"},
            [],
            # (Braces doubled: the expected text goes through str.format.)
            "lr_scheduler_type cosine_with_min_lr with lr_scheduler_kwargs {{}} cannot run (One of min_lr or "
            "min_lr_rate should be set through the `lr_scheduler_kwargs`); its options: num_cycles, last_epoch, "
            """min_lr, min_lr_rate, as --lr_scheduler_kwargs '{{"name": value}}'""",
        ),
        (
            # Once a ZeroDivisionError at the run's last update, after all its training.
            {"lr_scheduler_type": "polynomial"},
            ["--lr_scheduler_kwargs", '{"power": -1}'],
            "lr_scheduler_type polynomial with lr_scheduler_kwargs {{'power': -1}} cannot run (0.0 cannot be raised "
            "to a negative power)",
        ),
        ({}, ["--adam_beta2", "1"], "adam_beta2 must be in [0, 1) (got 1.0); try --adam_beta2 0.999"),
        (
            {"activation_checkpointing": "true"},
            ["--activation_checkpointing_kwargs", '{"reentrant": false}'],
            "activation_checkpointing_kwargs has no reentrant; it takes use_reentrant,",
        ),
        (
            {},
            ["--report_to", "tensorbord"],
            "report_to: unknown integration tensorbord; choose from none, all, azure_ml,",
        ),
        (
            {},
            ["--torch_compile_mode", "reduce_overhead"],
            "torch_compile_mode must be one of default, lite, reduce-overhead, max-autotune-no-cudagraphs, "
            "max-autotune (got 'reduce_overhead'); try reduce-overhead, or leave it out",
        ),
        (
            {"max_length": 1024},
            [],
            "is more than the 128 positions model '{model}' can read; set max_length to 128 or less",
        ),
        ({}, ["--folds", "1"], "--folds must be >= 2 (got 1); e.g. --folds 5"),
        (
            {},
            ["--folds", "3", "--seeds", "2"],
            "--seeds and --folds cannot be combined; cross-validate with --folds, then --seeds",
        ),
        (
            {"cross_validation_fold": 1},
            [],
            "cross_validation_folds and cross_validation_fold go together; set both, "
            "or run every fold with 'finetune train RECIPE --folds 5'",
        ),
        (
            {"cross_validation_folds": 5, "cross_validation_fold": 5},
            [],
            "cross_validation_fold must be between 0 and 4 (got 5) for 5 folds",
        ),
        # Each was once a traceback: numpy's seeding, and torch's loss at the first batch.
        ({"seed": -1}, [], "seed must be a whole number from 0 to 4294967295 (got -1); pass --seed 42"),
        ({}, ["--data_seed", "-1"], "data_seed must be a whole number from 0 to 4294967295 (got -1)"),
        (
            {"seed": 4294967295},
            ["--seeds", "2"],
            "--seeds 2 from seed 4294967295 passes the largest seed, 4294967295; pass a smaller --seed",
        ),
        (
            {"label_smoothing_factor": 1.5},
            [],
            "label_smoothing_factor must be in [0, 1) (got 1.5); try 0.1, or 0 for none",
        ),
        (
            {"padding_free": "true"},
            ["--torch_compile_backend", "aot_eager"],
            "torch_compile cannot compile packed rows (a new graph for nearly every update); with torch_compile "
            "set padding_free: false and keep micro_batch_tokens, whose padded pieces compile once",
        ),
        ({"pad_to_multiple_of": 0}, [], "pad_to_multiple_of must be >= 1 (got 0); try 64, or leave it out"),
        (
            {"pad_to_multiple_of": 64},
            ["--padding_free", "true"],
            "pad_to_multiple_of pads micro-batches and padding_free packs them without padding; set one of them",
        ),
    ],
    ids=[
        "lr-nan",
        "lr-negative-flag",
        "lr-list",
        "train-batch-0",
        "eval-batch-0",
        "epochs-0",
        "adam-epsilon-0",
        "both-spellings-of-n",
        "output-dir-empty",
        "loader-workers-negative",
        "prefetch-factor-0",
        "persistent-workers-without-workers",
        "eval-accumulation-0",
        "neftune-negative",
        "label-names",
        "optim-args-without-value",
        "scheduler-kwarg-misspelt",
        "scheduler-without-its-options",
        "scheduler-failing-at-its-end",
        "adam-beta-1",
        "checkpointing-kwarg-misspelt",
        "report-to-misspelt",
        "compile-mode-misspelt",
        "max-length-past-positions",
        "folds-1",
        "folds-and-seeds",
        "fold-without-folds",
        "fold-out-of-range",
        "seed-negative",
        "data-seed-negative",
        "seeds-past-the-largest",
        "label-smoothing-past-1",
        "packed-and-compiled",
        "pad-to-multiple-0",
        "pad-to-multiple-and-packed",
    ],
)
def test_recipe_values_refused_before_anything_is_read(tmp_path, tiny_model_dir, capsys, fields, flags, message):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, **fields), *flags], capsys)
    assert message.format(model=tiny_model_dir) in error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("learning_rate: 1e-4\nlearning_rate: 2e-4\n".encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
        (
            "# café\nlearning_rate: 1e-4\n".encode("latin-1"),
            "is not UTF-8 (byte 0xe9 at offset 5, likely Latin-1 or Windows-1252); save it as UTF-8",
        ),
        (bytes(range(256)) * 4, "is binary data, not text; check that the path names the right file"),
        (b"learning_rate: 1e-4\nseed: 1\nlearning_rate: 2e-4\n", "sets 'learning_rate' twice (lines 1 and 3)"),
    ],
    ids=["utf-16", "latin-1", "binary", "duplicate-key"],
)
def test_recipe_file_that_is_not_one(tmp_path, capsys, content, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(content)
    assert f"recipe {recipe} {message}" in run_cli(["train", recipe], capsys)


def test_seeds_with_a_checkpoint_path_is_refused(tmp_path, tiny_model_dir, capsys):
    # The path was dropped without a word and every seed trained from the beginning.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    flags = ["--seeds", "2", "--resume_from_checkpoint", str(tmp_path / "elsewhere" / "checkpoint-9")]
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), *flags], capsys) == (
        f"error: with --seeds each seed goes on from its own folder, so resume_from_checkpoint takes only auto "
        f"(got {tmp_path / 'elsewhere' / 'checkpoint-9'}); pass --resume_from_checkpoint auto, or train that one "
        "run without --seeds"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_seeds_refuse_a_later_folder_before_training_or_deleting(
    tmp_path, tiny_model_dir, capsys, monkeypatch, overwrite
):
    # A later seed's folder that train() refuses (here a file) was found only after the earlier seeds
    # trained; with --overwrite_output_dir the earlier seeds.json was deleted first.
    import finetune.pipeline.run as train_module

    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    runs = tmp_path / "run"
    runs.mkdir()
    if overwrite:
        (runs / "seeds.json").write_text('{"earlier": true}\n', encoding="utf-8")
    (runs / "seed-43").write_text("not a run\n", encoding="utf-8")
    before = snapshot(runs)
    trained = []
    monkeypatch.setattr(train_module, "train", lambda recipe, flags: trained.append(flags) or {})
    flags = ["--seeds", "2", *(["--overwrite_output_dir"] if overwrite else [])]
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), *flags], capsys) == (
        f"error: output_dir {runs / 'seed-43'} is a file, not a folder; choose another --output_dir"
    )
    assert trained == [] and snapshot(runs) == before


@pytest.mark.parametrize(
    ("class_weights", "message"),
    [
        ("balanced", r"class_weights must be a list of numbers, one per class \(got 'balanced'\); for a strategy"),
        ([1.0, 1.0], r"class_weights has 2 weights and the model 3 classes; give one weight per class"),
        ([1.0, 1.0, 1.0, 1.0], r"class_weights has 4 weights and the model 3 classes"),
        ([[1.0, 1.0, 1.0]], r"class_weights must be a flat list of numbers, one per class"),
        ([0.0, 0.0, 0.0], r"class_weights must be finite numbers >= 0, not all 0 \(got \[0.0, 0.0, 0.0\]\)"),
        ([float("nan"), 1.0, 1.0], r"class_weights must be finite numbers >= 0, not all 0 \(got \[nan, 1.0, 1.0\]\)"),
        ([-1.0, 1.0, 1.0], r"class_weights must be finite numbers >= 0"),
    ],
    ids=["a-strategy-name", "too-few", "too-many", "nested", "all-zero", "nan", "negative"],
)
def test_class_weights_from_python_are_checked_when_the_trainer_is_built(
    tmp_path, tiny_model_dir, tokenizer, class_weights, message
):
    # They failed only inside train() (IndexError, torch's shape error, ZeroDivisionError) or trained in silence.
    from helpers import quiet_args, review_dataset
    from transformers import BertForSequenceClassification

    from finetune import ReviewTrainer

    with pytest.raises(FinetuneError, match=message):
        ReviewTrainer(
            model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
            args=quiet_args(tmp_path),
            train_dataset=review_dataset(tokenizer, 4),
            class_weights=class_weights,
        )


@pytest.mark.parametrize("flags", [["--cross_validation_folds", "3"], ["--cross_validation_fold", "1"]])
def test_folds_with_its_own_fold_flags_says_they_conflict(tmp_path, tiny_model_dir, capsys, flags):
    # Once silently overridden by --folds; then refused with advice to pass --folds, which was passed.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), "--folds", "2", *flags], capsys) == (
        "error: --folds 2 runs every fold itself, so cross_validation_folds and cross_validation_fold must not "
        "be set too; drop them, or leave out --folds to train one fold"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", ["--activation_checkpointing", "--gradient_checkpointing"])
def test_checkpointing_a_model_that_cannot_recompute_is_refused(tmp_path, capsys, flag):
    # Once a traceback from transformers after the data was read: MPNet's classifier has no checkpointing.
    from transformers import MPNetConfig, MPNetForSequenceClassification

    config = MPNetConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    MPNetForSequenceClassification(config).save_pretrained(tmp_path / "mpnet")
    capsys.readouterr()  # the save's progress bar
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tmp_path / "mpnet", pooling="cls")
    assert run_cli(["train", recipe, flag, "true"], capsys) == (
        "error: activation_checkpointing: MPNetForSequenceClassification cannot recompute its layers in transformers; "
        "drop --activation_checkpointing (or --gradient_checkpointing), and to save memory lower micro_batch_tokens "
        "or per_device_train_batch_size instead"
    )
    assert not (tmp_path / "run").exists()


def test_liger_kernel_without_its_package_is_refused(tmp_path, tiny_model_dir, capsys, monkeypatch):
    # Once an ImportError traceback from Trainer.train, after the data was read.
    monkeypatch.setattr("transformers.utils.is_liger_kernel_available", lambda: False)
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    assert run_cli(["train", recipe_with(tmp_path, tiny_model_dir), "--use_liger_kernel", "true"], capsys) == (
        "error: use_liger_kernel needs liger-kernel, which is not installed; pip install liger-kernel, or set "
        "use_liger_kernel: false (its kernels are for decoder LLMs such as Llama, not BERT-family encoders)"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max_steps", "2", "--max_steps", "3"], "--max_steps is given twice (--max_steps 2, then --max_steps 3)"),
        (["--max-steps=2", "--max_steps", "3"], "--max_steps is given twice (--max-steps=2, then --max_steps 3)"),
    ],
    ids=["recipe-field", "two-spellings"],
)
def test_a_recipe_flag_given_twice_is_refused_as_a_recipe_key_given_twice(
    tmp_path, tiny_model_dir, capsys, flags, message
):
    """Once the last silently won (issue 73)."""
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir), *flags], capsys)
    assert error == f"error: {message}; give it once"
    assert not (tmp_path / "run").exists()


def test_a_command_flag_given_twice_is_refused(tiny_model_dir, capsys):
    error = run_cli(["predict", tiny_model_dir, "--batch_size", "2", "--batch_size", "3"], capsys)
    assert error == "error: --batch_size is given twice (--batch_size 2, then --batch_size 3); give it once"


@pytest.mark.parametrize(
    ("kind", "says"),
    [("folder", "is a folder, not a recipe file"), ("device", "is a device"), ("pipe", "is a pipe")],
)
def test_a_recipe_path_that_is_no_file_says_what_it_is(tmp_path, capsys, kind, says):
    """A folder, /dev/null or a FIFO was "recipe not found" (issue 73)."""
    import os

    path = {"folder": tmp_path, "device": "/dev/null", "pipe": tmp_path / "fifo"}[kind]
    if kind == "pipe":
        os.mkfifo(path)
    error = run_cli(["train", path], capsys)
    assert error.startswith(f"error: recipe {path} {says}") and "not found" not in error, error
    assert "pass a recipe YAML file" in error


@pytest.mark.parametrize(
    ("content", "what"),
    [("42\n", "a number (42)"), ("- a\n- b\n", "a list"), ("just words\n", "text ('just words')")],
    ids=["number", "list", "text"],
)
def test_a_recipe_that_is_no_mapping_says_what_a_recipe_is(tmp_path, capsys, content, what):
    """``42`` was "must be a mapping of 'key: value' lines, not a int" (issue 73)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(content)
    assert run_cli(["train", recipe], capsys) == (
        f"error: recipe {recipe} holds {what}, not settings; a recipe is a mapping of keys to values, one "
        "'key: value' per line, e.g. learning_rate: 5e-5"
    )


def test_a_bad_boolean_reads_as_one_sentence(tmp_path, tiny_model_dir, capsys):
    """It ended in "(case insensitive).; fix it" (issue 73)."""
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, tiny_model_dir), "--fp16", "maybe"], capsys)
    assert error.endswith("1/0 (case insensitive); fix it in the recipe or pass --fp16 with a valid value"), error
    assert ".;" not in error


def test_a_token_budget_below_the_longest_review_is_said_once(tmp_path, tiny_model_dir, capsys):
    """``--micro_batch_tokens 1`` trained with every micro-batch over its budget, without a word (issue 73)."""
    from finetune.cli import main

    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tiny_model_dir, max_steps=1, save_strategy="no", baseline="false", report_to="none")
    assert main(["train", str(recipe), "--micro_batch_tokens", "1", "--disable_tqdm", "true"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "micro_batch_tokens" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: micro_batch_tokens 1 is below the longest training review (")
    assert "each a micro-batch of its own, over the budget; set --micro_batch_tokens" in warnings[0]
