"""Issue 34: a recipe that feeds the model its labels, and predict's inputs and output (empty reviews, encodings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main

PROJECT = Path(__file__).parent.parent
TRAIN_ROWS = "review,stars\n" + "".join(
    f"review {index} was {word},{stars}\n"
    for index, (word, stars) in enumerate(
        [("great", 5), ("awful", 1), ("fine", 3), ("lovely", 4), ("bad", 2), ("okay", 3)] * 5
    )
)


def write_recipe(folder: Path, model_dir: Path, **fields: str) -> Path:
    """A recipe for 2 updates of 4 reviews, a checkpoint after each, on 30 reviews of ``folder/train.csv``."""
    (folder / "train.csv").write_text(TRAIN_ROWS, encoding="utf-8")
    values = {
        "model_name_or_path": str(model_dir),
        "train_file": str(folder / "train.csv"),
        "text_column": "review",
        "label_column": "stars",
        "label_bins": "negative=1-2,neutral=3,positive=4-5",
        "max_length": 32,
        "output_dir": str(folder / "run"),
        "per_device_train_batch_size": 4,
        "max_steps": 2,
        "save_strategy": "steps",
        "save_steps": 1,
        "eval_strategy": "no",
        "logging_strategy": "no",
        "baseline": "false",
        "disable_tqdm": "true",
        "report_to": "none",
        "use_cpu": "true",
    }
    values.update(fields)
    path = folder / "recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


def run_cli(argv: list, capsys) -> str:
    status = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# --------------------------------------------------------------------------- the recipe's columns


@pytest.mark.parametrize(
    ("option", "fix"), [("text_column", "--text_column review"), ("title_column", "--title_column title")]
)
def test_the_label_column_as_the_text_is_refused_before_anything_is_written(
    tmp_path, tiny_model_dir, capsys, option, fix
):
    recipe = write_recipe(tmp_path, tiny_model_dir, **{option: "stars"})
    error = run_cli(["train", recipe], capsys)
    holding = "texts" if option == "text_column" else "titles"
    assert error == (
        f"error: {option} and label_column are both 'stars', so the model would read the label it is to predict; "
        f"set {option} to the column of the review {holding} (e.g. {fix})"
    )
    assert not (tmp_path / "run").exists()


def test_a_text_column_of_numbers_is_warned_about(tmp_path, capsys):
    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_review_data

    rows = "".join(f"{index},{stars},review {index}\n" for index, stars in enumerate([1, 3, 5] * 4))
    (tmp_path / "train.csv").write_text("id,stars,review\n" + rows, encoding="utf-8")
    fields = dict(
        train_file=str(tmp_path / "train.csv"),
        label_column="stars",
        label_bins="negative=1-2,neutral=3,positive=4-5",
        validation_split_percentage=0,
    )
    load_review_data(DataArguments(text_column="id", **fields))
    assert (
        f"warning: text_column 'id' of {tmp_path / 'train.csv'} holds only numbers, not review text; "
        "check that text_column names the column of the reviews"
    ) in capsys.readouterr().err
    load_review_data(DataArguments(text_column="review", **fields))
    assert "warning" not in capsys.readouterr().err


# --------------------------------------------------------------------------- predict's input and output


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("reviews.csv", 'text,id\ngreat,1\n"",2\n,3\n   ,4\nawful,5\n'),
        (
            "reviews.jsonl",
            '{"text": "great", "id": 1}\n{"text": "", "id": 2}\n{"text": null, "id": 3}\n'
            '{"text": "   ", "id": 4}\n{"text": "awful", "id": 5}\n',
        ),
    ],
    ids=["csv", "jsonl"],
)
def test_an_empty_review_gets_an_empty_label_and_a_note(tiny_model_dir, tmp_path, capsys, name, content):
    (tmp_path / name).write_text(content, encoding="utf-8")
    output = tmp_path / f"out{Path(name).suffix}"
    assert main(["predict", str(tiny_model_dir), "--input", str(tmp_path / name), "--output", str(output)]) == 0
    assert "note: 3 of 5 reviews are empty (review 2, 3, 4) and got an empty label" in capsys.readouterr().err
    if name.endswith(".csv"):
        import csv

        results = list(csv.DictReader(output.open(encoding="utf-8")))
        assert [row["label"] == "" for row in results] == [False, True, True, True, False]
        assert [row["probability"] for row in results[1:4]] == ["", "", ""]
    else:
        results = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
        assert [row["label"] == "" for row in results] == [False, True, True, True, False]
        assert [row["probability"] for row in results[1:4]] == [None, None, None]
    assert [str(row["id"]) for row in results] == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("locale", [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "LANG": "C"}], ids=["ascii", "C"])
def test_predict_writes_utf8_whatever_the_locale(tiny_model_dir, locale):
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONIOENCODING", "LC_ALL", "LANG")}
    env.update(locale, PYTHONPATH=str(PROJECT), PYTHONUTF8="0")
    result = subprocess.run(
        [sys.executable, "-m", "finetune", "predict", str(tiny_model_dir)],
        input="Très bien, ça marche 😀\n".encode(),
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert "Très bien, ça marche 😀" in result.stdout.decode("utf-8")


def test_a_jsonl_input_with_a_byte_order_mark_is_read(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "reviews.jsonl").write_bytes('\ufeff{"text": "great"}\n{"text": "awful"}\n'.encode())
    output = tmp_path / "out.jsonl"
    argv = ["predict", str(tiny_model_dir), "--input", str(tmp_path / "reviews.jsonl"), "--output", str(output)]
    assert main(argv) == 0
    assert [json.loads(line)["text"] for line in output.read_text(encoding="utf-8").splitlines()] == ["great", "awful"]
