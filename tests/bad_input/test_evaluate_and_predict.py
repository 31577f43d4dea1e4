"""Bad input, evaluate and predict: bad batch sizes, inputs and outputs, export, tune, bench and baseline outputs.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import FinetuneError

from .common import GOOD_ROWS, recipe_with, run_cli, run_recipe, snapshot, unwritable_folder, write_csv


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


def test_predict_unclosed_quote_is_refused_not_swallowing_the_rows_after_it(tiny_model_dir, tmp_path, capsys):
    # Without csv's strict mode the quote runs to the end of the file: three reviews became one.
    write_csv(tmp_path / "in.csv", 'review\n"Broke after two days\nGreat value\nWorks fine\n')
    message = run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys)
    assert "in.csv row 2: unexpected end of data; check that row's quotes" in message


def test_predict_input_that_is_a_folder(tiny_model_dir, tmp_path, capsys):
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path], capsys) == (
        f"error: --input {tmp_path} is a folder; pass a CSV, TSV or JSONL file in it"
    )


def test_predict_output_of_an_unknown_type_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    write_csv(tmp_path / "in.csv", "review\nfine\n")
    output = tmp_path / "out.parquet"
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv", "--output", output], capsys) == (
        f"error: --output {output}: unknown file type .parquet; end it in .csv, .tsv or .jsonl (or .json for JSONL)"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.csv"]


@pytest.mark.parametrize("command", ["predict", "evaluate"])
@pytest.mark.parametrize("batch_size", ["0", "-1"])
def test_batch_size_below_one(tiny_model_dir, capsys, command, batch_size):
    assert run_cli([command, tiny_model_dir, "--batch_size", batch_size], capsys) == (
        f"error: argument --batch_size: must be >= 1 (got {batch_size}); see 'finetune {command} --help'"
    )


def test_calibrate_without_a_validation_split_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    recipe = run_recipe(tmp_path, tiny_model_dir, validation_split_percentage=0, save_strategy="no")
    assert main(["train", str(recipe)]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path / "run")
    error = run_cli(["evaluate", tmp_path / "run", "--calibrate"], capsys)
    assert error == (
        f"error: --calibrate fits a temperature on the run's validation split, and {tmp_path / 'run'}'s run has "
        "none (validation_split_percentage: 0 trains on all of train); train with a validation split "
        "(e.g. --validation_split_percentage 10) or leave out --calibrate"
    )
    assert snapshot(tmp_path / "run") == before  # no errors_test.csv, no picture, the model untouched
    # Scoring a split the run does not have names the ones it has.
    assert run_cli(["evaluate", tmp_path / "run", "--split", "validation"], capsys) == (
        "error: the run's data has no 'validation' split (it has train); pass --data FILE"
    )


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        (["--resamples", "10000000"], "argument --resamples: at most 1,000,000 (got 10,000,000)"),
        (["--seed", "-3"], "argument --seed: must be >= 0 (got -3)"),
    ],
    ids=["ten-million-resamples", "negative-seed"],
)
def test_evaluate_bootstrap_flags_out_of_range(tiny_model_dir, capsys, flag, expected):
    # Ten million resamples of even 111 reviews once took more memory than the machine has (killed).
    assert expected in run_cli(["evaluate", tiny_model_dir, *flag], capsys)


def test_evaluate_the_same_run_twice(tiny_model_dir, tmp_path, capsys):
    assert run_cli(["evaluate", tiny_model_dir, tiny_model_dir], capsys) == (
        f"error: {tiny_model_dir} is named twice; name each run once"
    )
    (tmp_path / "link").symlink_to(tiny_model_dir)
    assert run_cli(["evaluate", tiny_model_dir, tmp_path / "link"], capsys) == (
        f"error: {tmp_path / 'link'} is named twice (as {tiny_model_dir} too); name each run once"
    )


def test_tune_into_a_folder_that_is_not_a_search(tmp_path, tiny_model_dir, capsys):
    # A trained run's folder once took a search's trials.journal and trainer/ beside its model.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    run_dir = tmp_path / "a-run"
    shutil.copytree(tiny_model_dir, run_dir)
    before, names = snapshot(run_dir), sorted(run_dir.rglob("*"))
    message = run_cli(["tune", recipe_with(tmp_path, tiny_model_dir), "--trials", "1", "--output", run_dir], capsys)
    assert message == (
        f"error: --output {run_dir} already holds files and no trials.journal, so it is not a search to resume; "
        "choose another --output"
    )
    assert snapshot(run_dir) == before and sorted(run_dir.rglob("*")) == names


@pytest.mark.parametrize("command", [["bench"], ["baseline"], ["bench", "--scaling"]], ids=" ".join)
def test_report_output_refused_before_the_work(tmp_path, tiny_model_dir, capsys, command):
    # bench once ran every system for minutes, then died on a missing --output folder with a traceback.
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tiny_model_dir)
    missing = tmp_path / "missing" / "report.json"
    assert run_cli([command[0], recipe, *command[1:], "--output", missing], capsys) == (
        f"error: --output {missing}: folder {missing.parent} does not exist; create it or choose another --output"
    )
    earlier = tmp_path / "report.json"
    earlier.write_text("an earlier report\n", encoding="utf-8")
    assert run_cli([command[0], recipe, *command[1:], "--output", earlier], capsys) == (
        f"error: {earlier} already exists; choose another --output or remove it"
    )
    assert earlier.read_text(encoding="utf-8") == "an earlier report\n"


def test_predict_output_into_a_missing_folder(tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "missing" / "out.csv"
    assert run_cli(["predict", tiny_model_dir, "--output", output], capsys) == (
        f"error: --output {output}: folder {output.parent} does not exist; create it or choose another --output"
    )


def test_predict_output_into_an_unwritable_folder(tiny_model_dir, tmp_path, capsys):
    output = unwritable_folder(tmp_path) / "out.csv"
    error = run_cli(["predict", tiny_model_dir, "--output", output], capsys)
    assert error.startswith(f"error: --output {output}: cannot write in {output.parent} (")
    assert error.endswith("); choose another --output")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"review\ncaf\xe9 au lait,\n", "in.csv is not UTF-8 (byte 0xe9 at offset 10, likely Latin-1 or Windows-1252)"),
        (b'{"text": "caf\xe9"}\n', "in.jsonl is not UTF-8 (byte 0xe9 at offset 13, likely Latin-1 or Windows-1252)"),
        (b"\xff\xfer\x00e\x00v\x00i\x00e\x00w\x00\n\x00", "in.csv is UTF-16 text; save it as UTF-8"),
    ],
    ids=["latin1-csv", "latin1-jsonl", "utf16-csv"],
)
def test_predict_input_not_utf8(tiny_model_dir, tmp_path, capsys, data, expected):
    name = "in.jsonl" if b"{" in data else "in.csv"
    (tmp_path / name).write_bytes(data)
    assert expected in run_cli(["predict", tiny_model_dir, "--input", tmp_path / name], capsys)


@pytest.mark.parametrize(
    ("stdin", "expected"),
    [
        (b"fine\ncaf\xe9\n", "error: stdin is not UTF-8 (byte 0xe9, likely Latin-1 or Windows-1252)"),
        # What `predict < /dev/zero` reads: one endless line, refused at the cap, not read whole.
        (b"\x00" * 300_000, "error: stdin line 1 is longer than 100,000 characters, too long for a review"),
        # Both were once called "likely Latin-1".
        (bytes(range(256)) * 4, "error: stdin is binary data, not text; check what is piped in"),
        ("great\n".encode("utf-16"), "error: stdin is UTF-16 text; save it as UTF-8"),
    ],
    ids=["latin1-stdin", "endless-line", "binary-stdin", "utf16-stdin"],
)
def test_predict_stdin_not_text(tiny_model_dir, monkeypatch, capsys, stdin, expected):
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    assert run_cli(["predict", tiny_model_dir], capsys).startswith(expected)


def test_predict_csv_field_too_long(tiny_model_dir, tmp_path, capsys):
    write_csv(tmp_path / "in.csv", 'review\n"' + "a" * 100_001 + '"\n')
    message = run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys)
    assert "in.csv row 2: field larger than field limit (100000); a field may hold at most 100,000" in message


@pytest.mark.parametrize("batch_size", [0, -1])
def test_predict_probabilities_refuses_batch_below_one_from_python(tiny_model_dir, batch_size):
    from finetune.evaluation.inference import load_inference_model, predict_probabilities

    model, tokenizer = load_inference_model(Path(tiny_model_dir))
    with pytest.raises(FinetuneError) as error:
        predict_probabilities(model, tokenizer, ["fine"], batch_size=batch_size)
    assert str(error.value) == f"batch_size must be a whole number >= 1 (got {batch_size}); pass --batch_size 32"


def test_predict_output_that_cannot_be_opened_from_python(tiny_model_dir, tmp_path):
    from finetune.commands.predict import predict

    (tmp_path / "in.csv").write_text("review\nfine\n", encoding="utf-8")
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    with pytest.raises(
        FinetuneError, match=r"^cannot write .*a-file/out.csv \(Not a directory\); choose another --output$"
    ):
        predict(str(tiny_model_dir), str(tmp_path / "in.csv"), str(tmp_path / "a-file" / "out.csv"))


def test_predict_failing_mid_stream_keeps_the_earlier_output(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"text": "fine"}\n' * 1500 + "not json\n", encoding="utf-8")
    output = tmp_path / "out.csv"
    output.write_text("an earlier output\n", encoding="utf-8")
    argv = ["predict", tiny_model_dir, "--input", tmp_path / "in.jsonl", "--output", output, "--overwrite"]
    assert "in.jsonl is not JSON Lines (line 1501)" in run_cli(argv, capsys)
    assert output.read_text(encoding="utf-8") == "an earlier output\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.jsonl", "out.csv"]


def test_export_from_inside_the_run_folder(tmp_path, tiny_model_dir, monkeypatch, capsys):
    # "finetune export . --int8" once failed with a traceback: Path(".") has no name to add "-int8" to.
    pytest.importorskip("onnxruntime")
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run_dir)
    monkeypatch.chdir(run_dir)
    assert main(["export", ".", "--int8", "--backend", "onnxruntime"]) == 0
    assert (tmp_path / "run-int8" / "config.json").is_file()
    # Reached through a symlink, the copy goes beside the link, named after it.
    (tmp_path / "latest").symlink_to(run_dir)
    monkeypatch.chdir(tmp_path)
    assert main(["export", "latest", "--int8", "--backend", "onnxruntime"]) == 0
    assert (tmp_path / "latest-int8" / "config.json").is_file()


def test_evaluate_on_a_file_named_test_keeps_the_runs_test_results(run_copy, capsys):
    # --data other/test.csv once wrote evaluation_test.json, errors_test.csv and the pictures over the
    # run's own test-split results.
    run_dir = run_copy / "run"
    assert main(["evaluate", str(run_dir), "--split", "train", "--no_baseline", "--resamples", "10"]) == 0
    own = {path.name: path.read_bytes() for path in run_dir.glob("*_train.*")}
    assert "evaluation_train.json" in own
    other = run_copy / "other"
    other.mkdir()
    write_csv(other / "train.csv", GOOD_ROWS)
    flags = ["--no_baseline", "--resamples", "10"]
    assert main(["evaluate", str(run_dir), "--data", str(other / "train.csv"), *flags]) == 0
    assert {path.name: path.read_bytes() for path in run_dir.glob("*_train.*")} == own
    assert json.loads((run_dir / "evaluation_data-train.json").read_text())[0]["model"].endswith("checkpoint-1")
    assert (run_dir / "errors_data-train.csv").is_file()


def test_tune_journal_damaged_before_its_last_line_is_refused_and_kept(tmp_path, tiny_model_dir, capsys):
    # Only a last line cut short is a kill's mark (set aside, the search resumes); a bad line before it is not.
    pytest.importorskip("optuna")
    search = tmp_path / "search"
    search.mkdir()
    journal = search / "trials.journal"
    journal.write_bytes(b'{"op_code": 0, "worker_id": "w"}\n{"op_code": 5, "wor\n{"op_code": 1}\n')
    before = snapshot(search)
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    assert run_cli(["tune", recipe_with(tmp_path, tiny_model_dir), "--trials", "1", "--output", search], capsys) == (
        f"error: {journal} line 2 is damaged (not JSON), so the search cannot resume from it; "
        "choose another --output to search afresh"
    )
    assert snapshot(search) == before


def test_predict_input_naming_a_column_twice(tiny_model_dir, tmp_path, capsys):
    # The second 'review' column was read silently; train refuses such a file.
    (tmp_path / "in.csv").write_text("review,review\nfirst,second\n", encoding="utf-8")
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv"], capsys) == (
        f"error: {tmp_path / 'in.csv'} has two columns named 'review'; rename one in its header row"
    )


def test_predict_output_naming_a_folder(tiny_model_dir, tmp_path, capsys):
    # "--output out/" once wrote a file named "out".
    (tmp_path / "in.csv").write_text("review\ngreat\n", encoding="utf-8")
    output = f"{tmp_path / 'out'}/"
    assert run_cli(["predict", tiny_model_dir, "--input", tmp_path / "in.csv", "--output", output], capsys) == (
        f"error: --output {output} names a folder; give a file name, e.g. {output}predictions.csv"
    )
    assert not (tmp_path / "out").exists()


def test_evaluate_data_without_the_runs_column_names_a_fix_evaluate_has(run_copy, capsys):
    # The fix named was "--text_column NAME", a flag evaluate does not take.
    write_csv(run_copy / "other.csv", "text,stars\ngreat,5\n")
    assert run_cli(["evaluate", run_copy / "run", "--data", run_copy / "other.csv"], capsys) == (
        f"error: {run_copy / 'other.csv'} has no column 'review' (columns: text, stars); "
        "name the column 'review' in the file, as in the data the run was trained on"
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            {"text": ["x"]},
            "in.jsonl row 2: 'text' holds a list (['x']); a review must be text: fix the row, or pass "
            "--text_column with another column",
        ),
        (
            {"text": {"body": "x"}},
            "in.jsonl row 2: 'text' holds a mapping ({'body': 'x'}); a review must be text: fix the row, or pass "
            "--text_column with another column",
        ),
    ],
    ids=["list-review", "mapping-review"],
)
def test_predict_jsonl_review_that_is_not_text_is_refused_as_train_refuses_it(
    tiny_model_dir, tmp_path, capsys, line, message
):
    """Once scored as its str() with exit 0, while train refuses the same row (issue 73)."""
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps(line) + "\n")
    output = tmp_path / "out.jsonl"
    argv = ["predict", tiny_model_dir, "--input", tmp_path / "in.jsonl", "--output", output]
    assert run_cli(argv, capsys) == f"error: {tmp_path}/{message}"
    assert not output.exists()


def test_predict_nul_byte_on_stdin_is_refused_as_in_a_file(tiny_model_dir, monkeypatch, capsys):
    """``printf 'good\\x00bad\\n' | finetune predict RUN`` was scored, and its CSV held a raw NUL (issue 73)."""
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"fine\ngood\x00bad\n"), encoding="utf-8"))
    status = main(["predict", str(tiny_model_dir)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err.strip() == (
        "error: stdin is binary data, not text (a NUL byte in line 2); check what is piped in"
    )
    assert "\x00" not in captured.out
