"""Bad input: one line naming the problem and the fix, exit status 2, no traceback, nothing on disk touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main

PROJECT = Path(__file__).parent.parent


def recipe_with(tmp_path: Path, model_dir: Path, **fields) -> Path:
    values = {
        "model_name_or_path": str(model_dir),
        "train_file": str(tmp_path / "train.csv"),
        "text_column": "review",
        "label_column": "stars",
        "label_bins": "negative=1-2,neutral=3,positive=4-5",
        "output_dir": str(tmp_path / "run"),
        "use_cpu": "true",
    }
    values.update(fields)
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


def write_csv(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


GOOD_ROWS = "review,stars\ngreat,5\nawful,1\nfine,3\nlovely,4\nbad,2\nokay,3\n"


def run_cli(argv, capsys) -> str:
    status = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


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


def test_missing_data_file(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert f"train file not found: {tmp_path / 'train.csv'}" in message


def test_missing_text_column(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, text_column="body")], capsys)
    assert "has no column 'body' (columns: review, stars); set text_column" in message


def test_missing_label_column(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, label_column="rating")], capsys)
    assert "has no column 'rating'" in message and "set label_column" in message


def test_empty_dataset(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", "review,stars\n")
    assert "has no rows" in run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("weird,7\n", "row 8: rating 7 is outside label_bins negative=1-2, neutral=3, positive=4-5; fix the row"),
        ('"  ",4\n', "row 8: empty 'review'; fix the row"),
        ("no stars,\n", "row 8: no label in 'stars'; fix the row"),
    ],
    ids=["outside-bins", "empty-text", "missing-label"],
)
def test_strict_stops_at_a_row_that_would_be_dropped(tmp_path, tiny_model_dir, capsys, bad_row, message):
    write_csv(tmp_path / "train.csv", GOOD_ROWS + bad_row)
    recipe = recipe_with(tmp_path, tiny_model_dir, strict="true")
    error = run_cli(["train", recipe], capsys)
    assert message in error and error.endswith("or drop strict: true to drop and count such rows")
    assert not (tmp_path / "run").exists()


def test_every_row_dropped(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", "review,stars\ngreat,7\nawful,0\n")
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert "every row was dropped (2 label outside label_bins); check text_column" in message


def test_two_data_sources(tmp_path, tiny_model_dir, capsys):
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir, dataset_name="drugscom")], capsys)
    assert "names two data sources (dataset_name 'drugscom' and train_file); keep one" in message


def test_unknown_dataset_name(tmp_path, tiny_model_dir, capsys):
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file="null", dataset_name="drugscon")
    message = run_cli(["train", recipe], capsys)
    assert "drugscon" in message and "drugscom" in message and "finetune data list" in message


def test_hub_dataset_offline(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = recipe_with(tmp_path, tiny_model_dir, train_file="null", dataset_name="yelp_review_full")
    status = main(["train", str(recipe)])
    err = capsys.readouterr().err.strip().splitlines()
    # One line saying where it loads from, then the one-line error.
    assert status == 2 and len(err) == 2 and err[-1].startswith("error: "), err
    assert "cannot reach the Hugging Face Hub to load 'Yelp/yelp_review_full'" in err[-1]
    assert "replace dataset_name in the recipe with train_file/test_file" in err[-1]


@pytest.mark.parametrize(
    ("train_rows", "test_rows", "message"),
    [
        ("great,positive\nawful,negative\n", "hm,mixed\n", "row 2: unknown label 'mixed' (known: negative, positive)"),
        ("great,1\nawful,0\n", "hm,5\n", "label 5 is out of range for 2 classes (0..1)"),
    ],
    ids=["unknown-name", "id-out-of-range"],
)
def test_label_not_among_the_classes(tmp_path, tiny_model_dir, capsys, train_rows, test_rows, message):
    write_csv(tmp_path / "train.csv", "review,label\n" + train_rows)
    write_csv(tmp_path / "test.csv", "review,label\n" + test_rows)
    recipe = recipe_with(
        tmp_path, tiny_model_dir, label_column="label", label_bins="null", test_file=str(tmp_path / "test.csv")
    )
    assert message in run_cli(["train", recipe], capsys)


def test_output_dir_holding_a_run_is_kept(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-5").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    (run_dir / "checkpoint-5" / "model.safetensors").write_bytes(b"weights")
    before = snapshot(run_dir)
    message = run_cli(["train", recipe_with(tmp_path, tiny_model_dir)], capsys)
    assert "already holds a run; pass --overwrite_output_dir" in message
    assert snapshot(run_dir) == before


def test_checkpoint_folder_without_model(tmp_path, capsys):
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "config.json").write_text("{}")
    message = run_cli(["evaluate", tmp_path], capsys)
    assert "has a config.json but no weights" in message


def test_evaluate_empty_folder(tmp_path, capsys):
    assert "holds no model (no config.json)" in run_cli(["evaluate", tmp_path], capsys)


def test_predict_missing_input(tiny_model_dir, capsys):
    assert "input file not found: nope.csv" in run_cli(["predict", tiny_model_dir, "--input", "nope.csv"], capsys)


def test_predict_row_with_unquoted_commas(tiny_model_dir, tmp_path, capsys):
    write_csv(tmp_path / "in.csv", "review\nBroke after two days, returned it.\n")
    message = run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys)
    assert "row 2 has more fields than the header; quote texts that contain commas" in message


@pytest.mark.parametrize("argv", [["train", "missing.yaml"], ["evaluate", "/nonexistent/run"]])
def test_real_process_exits_2_without_traceback(argv):
    result = subprocess.run(
        [sys.executable, "-m", "finetune", *argv], capture_output=True, text=True, cwd=PROJECT, timeout=120
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ")
