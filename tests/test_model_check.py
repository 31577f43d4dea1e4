"""A folder that loads is not a model that works (issue 34): the model-folder check and the smaller fixes beside it.

Each case was found by breaking a copy of a trained run: weights that do not fit
config.json (a base model's, another model_type, fewer layers, another number of
classes or positions), class names reordered in id2label, NaN in config.json or in
the weights; each is refused by predict, evaluate, export and resume in one line,
exit 2, before anything is written. Also: the saved model's fingerprint and the
warning when it changed, a text column that is the label column (refused) or
only numbers (a warning), empty reviews in predict, an ASCII locale, a JSONL file
with a byte-order mark.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from bad_input.common import run_recipe

from finetune.cli import main
from finetune.errors import FinetuneError

PROJECT = Path(__file__).parent.parent
CLASSES = ["negative", "neutral", "positive"]
SCORED_ROWS = "review,stars\ngreat,5\nawful,1\nfine,3\n"


@pytest.fixture
def trained(finished_run) -> Path:
    """The shared finished 2-update run (tests/conftest.py); tests that change it use ``copy``."""
    return finished_run


@pytest.fixture
def copy(run_copy) -> Path:
    """A copy of the finished run in ``tmp_path``, with reviews to score beside it."""
    (run_copy / "scored.csv").write_text(SCORED_ROWS, encoding="utf-8")
    return run_copy


def run_cli(argv: list, capsys) -> str:
    status = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- breaking a model folder


def edit_config(**changes: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config.update(changes)
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # NaN is written as NaN, as json allows

    return edit


def base_model_weights(folder: Path) -> None:
    """The encoder's weights without the classification head, as a base model (the packaged MiniLM) has them."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    model.base_model.save_pretrained(folder / "base")
    shutil.move(folder / "base" / "model.safetensors", folder / "model.safetensors")
    shutil.rmtree(folder / "base")


def nan_in_the_weights(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    weights["classifier.weight"][0, 0] = math.nan
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def reordered(names: list[str]) -> dict[str, object]:
    return {"id2label": dict(enumerate(names)), "label2id": {name: index for index, name in enumerate(names)}}


RUN_FAULTS = {
    # Issue 34, 1: the packaged MiniLM's weights over a run's gave random labels, exit 0.
    "base-model-weights": (
        base_model_weights,
        "model.safetensors lacks classifier.bias, classifier.weight: this folder holds a base model, not a trained run",
    ),
    "other-model-type": (
        edit_config(model_type="roberta"),
        "model.safetensors lacks 41 weights the model needs (classifier.dense.bias, classifier.dense.weight, "
        "classifier.out_proj.bias and 38 more) and holds 41 the model has no place for",
    ),
    "fewer-layers": (
        edit_config(num_hidden_layers=1),
        "model.safetensors holds 16 the model has no place for (bert.encoder.layer.1.attention.output.LayerNorm.bias",
    ),
    # 2: predict named every label wrongly while evaluate still scored 0.847.
    "classes-reordered": (
        edit_config(**reordered(["positive", "neutral", "negative"])),
        "config.json names the classes positive, neutral, negative (id2label), but the run was trained on "
        "negative, neutral, positive in that order (finetune_run.json), so labels would be misnamed; restore "
        "config.json from a copy of the run or one of its checkpoint-* folders",
    ),
    "two-classes": (
        edit_config(**reordered(["negative", "positive"])),
        "config.json names the classes negative, positive (id2label), but the run was trained on",
    ),
    # 3: every probability NaN, every label "negative", exit 0.
    "nan-in-config": (
        edit_config(layer_norm_eps=math.nan),
        "config.json has layer_norm_eps: nan, which no model can compute with; restore config.json",
    ),
    "nan-in-weights": (nan_in_the_weights, "gives NaN or infinite probabilities on a short review"),
    # 4: a RuntimeError traceback about ignore_mismatched_sizes.
    "fewer-positions": (
        edit_config(max_position_embeddings=64),
        "model.safetensors holds bert.embeddings.position_embeddings.weight of shape [128, 32] where config.json "
        "asks for [64, 32]: config.json does not describe these weights",
    ),
}


def command_line(command: str, model: Path, folder: Path) -> list:
    return {
        "predict": ["predict", model, "--input", folder / "scored.csv", "--output", folder / "predictions.csv"],
        "evaluate": ["evaluate", model, "--data", folder / "scored.csv", "--resamples", "10", "--no_baseline"],
        "export": ["export", model, "--int8", "--backend", "onnxruntime"],
    }[command]


@pytest.mark.parametrize("command", ["predict", "evaluate", "export"])
@pytest.mark.parametrize(("fault", "message"), RUN_FAULTS.values(), ids=RUN_FAULTS.keys())
def test_a_run_whose_model_does_not_work_is_refused_before_anything_is_written(copy, capsys, command, fault, message):
    run = copy / "run"
    fault(run)
    capsys.readouterr()  # what breaking the folder printed
    before = snapshot(copy)
    error = run_cli(command_line(command, run, copy), capsys)
    assert message in error, error
    assert snapshot(copy) == before
    assert not (copy / "run-int8").exists()


# A model folder that is no run (no finetune_run.json): its id2label has no recorded order to
# match, so another number of classes is found as weights of another shape.
MODEL_FAULTS = {
    "two-classes": (
        edit_config(**reordered(["negative", "positive"])),
        "model.safetensors holds classifier.bias of shape [3] where config.json asks for [2] (and 1 more weights "
        "of another size): config.json does not describe these weights (edited, or copied from another model); "
        "restore config.json from a copy of the run or one of its checkpoint-* folders",
    ),
    "fewer-positions": (
        edit_config(max_position_embeddings=64),
        "holds bert.embeddings.position_embeddings.weight of shape [128, 32] where config.json asks for [64, 32]",
    ),
}


@pytest.mark.parametrize("command", ["predict", "evaluate", "export"])
@pytest.mark.parametrize(("fault", "message"), MODEL_FAULTS.values(), ids=MODEL_FAULTS.keys())
def test_a_size_that_does_not_fit_is_one_line_not_a_traceback(
    tmp_path, tiny_model_dir, capsys, command, fault, message
):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    fault(model)
    capsys.readouterr()
    # A model that is not a run is scored on a "text" column, its labels its class ids.
    (tmp_path / "scored.csv").write_text("text,label\ngreat,1\nawful,0\nfine,1\n", encoding="utf-8")
    before = snapshot(tmp_path)
    error = run_cli(command_line(command, model, tmp_path), capsys)
    assert message in error, error
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "model-int8").exists()


@pytest.mark.parametrize(
    ("fault", "message"),
    [RUN_FAULTS["base-model-weights"], RUN_FAULTS["fewer-layers"], RUN_FAULTS["classes-reordered"]],
    ids=["base-model-weights", "fewer-layers", "classes-reordered"],
)
def test_resuming_a_checkpoint_whose_model_does_not_work_is_refused(copy, capsys, fault, message):
    checkpoint = copy / "run" / "checkpoint-2"
    fault(checkpoint)
    capsys.readouterr()
    before = snapshot(copy / "run")
    error = run_cli(["train", copy / "recipe.yaml", "--resume_from_checkpoint", "auto"], capsys)
    assert message in error and "checkpoint-2" in error, error
    assert snapshot(copy / "run") == before


def test_the_check_from_python_returns_the_model_it_loaded(trained):
    from finetune.training.model_check import check_model_folder

    model = check_model_folder(trained / "run")
    assert [model.config.id2label[index] for index in range(3)] == CLASSES
    assert not model.training
    with pytest.raises(FinetuneError, match="names the classes negative, neutral, positive"):
        check_model_folder(trained / "run", expected_class_names=["positive", "neutral", "negative"])


# --------------------------------------------------------------------------- the saved model's fingerprint


def test_a_run_records_its_classes_and_the_fingerprint_of_its_saved_model(trained):
    record = json.loads((trained / "run" / "finetune_run.json").read_text(encoding="utf-8"))
    assert record["class_names"] == CLASSES
    assert record["model_sha256"] == {
        name: sha256(trained / "run" / name) for name in ("model.safetensors", "config.json")
    }


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_model_changed_since_training_is_named_in_a_warning(copy, capsys, command):
    run = copy / "run"
    assert main([str(arg) for arg in command_line(command, run, copy)]) == 0
    assert "warning" not in capsys.readouterr().err
    (copy / "predictions.csv").unlink(missing_ok=True)
    # An edit that still loads (the check passes): the model is not the one training saved.
    edit_config(finetuning_note="edited by hand")(run)
    assert main([str(arg) for arg in command_line(command, run, copy)]) == 0
    assert (
        f"warning: config.json in {run} changed since training saved them (other bytes than finetune_run.json records)"
    ) in capsys.readouterr().err


def test_calibrating_records_the_new_fingerprint_and_keeps_the_run_finished(copy, capsys):
    run = copy / "run"
    began = (run / "finetune_run.json").stat().st_mtime_ns
    assert main(["evaluate", str(run), "--data", str(copy / "scored.csv"), "--resamples", "10", "--calibrate"]) == 0
    record = json.loads((run / "finetune_run.json").read_text(encoding="utf-8"))
    assert record["model_sha256"]["model.safetensors"] == sha256(run / "model.safetensors")
    # 'finetune train --seeds' counts a run as finished when its report is not older than this record.
    assert (run / "finetune_run.json").stat().st_mtime_ns == began
    capsys.readouterr()
    assert main(["predict", str(run), "--input", str(copy / "scored.csv"), "--output", str(copy / "out.csv")]) == 0
    assert "warning" not in capsys.readouterr().err


# --------------------------------------------------------------------------- the recipe's columns


@pytest.mark.parametrize(
    ("option", "fix"), [("text_column", "--text_column review"), ("title_column", "--title_column title")]
)
def test_the_label_column_as_the_text_is_refused_before_anything_is_written(
    tmp_path, tiny_model_dir, capsys, option, fix
):
    recipe = run_recipe(tmp_path, tiny_model_dir, **{option: "stars"})
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


def test_a_load_error_without_a_message_is_still_one_line():
    """The cause quoted in the line is the error's first line, or its type's name where it says nothing.

    Before one ``first_line`` served every such message, model loading took ``splitlines()[0]`` of the
    message itself, an IndexError on an empty one.
    """
    from finetune.errors import FinetuneError
    from finetune.training.modeling import _explain_loading_errors

    with (
        pytest.raises(FinetuneError, match=r"cannot load model 'folder' \(OSError\); offline"),
        _explain_loading_errors("folder"),
    ):
        raise OSError("")
    with pytest.raises(FinetuneError, match=r"\(first\); offline"), _explain_loading_errors("folder"):
        raise OSError("first\nsecond")
