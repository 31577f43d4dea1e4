"""Text the tokenizer cannot encode: a lone surrogate (``"bad \\ud800 x"``, legal in JSON, not Unicode text).

Once a TypeError traceback from the tokenizer in ``finetune predict`` and a 500
from the server (issue 48, family 3). Now refused per review in one line naming
the line (exit 2, nothing written) or a 422 naming the index, or read with
U+FFFD in its place where the user asks (``--on_bad_text replace``).
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from finetune.cli import main
from finetune.data.bad_text import first_bad_character, repair_text

BAD = "bad \ud800 x"


def jsonl(path, reviews: list[str]) -> None:
    """``reviews`` as JSON Lines, as Python writes them (a lone surrogate becomes a \\ud800 escape)."""
    path.write_text("".join(json.dumps({"id": index, "review": text}) + "\n" for index, text in enumerate(reviews)))


def test_lone_surrogates_are_found_and_repaired():
    assert first_bad_character(BAD) == 4 and first_bad_character("fine 😀") is None
    assert repair_text(BAD) == "bad \ufffd x" and repair_text("a\udfffb\ud83d") == "a\ufffdb\ufffd"


@pytest.mark.parametrize("to_stdout", [False, True], ids=["file", "stdout"])
def test_predict_refuses_the_line_in_one_line_and_writes_nothing(tiny_model_dir, tmp_path, capsys, to_stdout):
    source = tmp_path / "reviews.jsonl"
    jsonl(source, ["fine", BAD, "also fine"])
    output = tmp_path / "out.csv"
    command = ["predict", str(tiny_model_dir), "--input", str(source)] + (
        [] if to_stdout else ["--output", str(output)]
    )
    assert main(command) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"error: {source} line 2: 'review' holds a lone surrogate (U+D800) at character 5, which is not Unicode "
        "text; fix that line (often an emoji cut in half), or pass --on_bad_text replace to read it as U+FFFD"
    )
    assert captured.out == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["reviews.jsonl"]


def test_predict_on_bad_text_replace_reads_it_as_u_fffd(tiny_model_dir, tmp_path, capsys):
    source = tmp_path / "reviews.jsonl"
    # A pair of surrogates escaped in JSON is one character (an emoji), not bad text.
    source.write_text('{"review": "fine \\ud83d\\ude00"}\n' + json.dumps({"review": BAD}) + "\n", encoding="utf-8")
    assert main(["predict", str(tiny_model_dir), "--input", str(source), "--on_bad_text", "replace"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(captured.out)))
    assert [row["review"] for row in rows] == ["fine 😀", "bad \ufffd x"]
    assert all(row["label"] for row in rows)
    assert "note: 1 review held text that is not Unicode (line 2), read with U+FFFD in its place" in captured.err


@pytest.mark.parametrize("route", ["/predict", "/explain"])
def test_the_server_answers_422_naming_the_review(token_server, route):
    from serving import AUTH, request

    # Sent as a JSON escape, as a client's JSON library writes a lone surrogate.
    body = b'{"reviews": ["fine", "bad \\ud800 x"]}'
    status, answer = request(token_server.port, "POST", route, body, AUTH)
    assert status == 422, answer
    assert answer == {
        "error": "reviews[1] holds a lone surrogate (U+D800) at character 5, which is not Unicode text; "
        "send UTF-8 text (a \\ud800-\\udbff escape must be followed by a \\udc00-\\udfff one, as in an emoji)"
    }
    assert request(token_server.port, "POST", route, {"reviews": ["fine"]}, AUTH)[0] == 200


def test_a_bad_line_past_the_first_batch_is_refused_before_any_row_is_printed(tiny_model_dir, tmp_path, capsys):
    import finetune.pipeline.review_rows as predict_module

    source = tmp_path / "reviews.jsonl"
    jsonl(source, ["fine"] * 5 + [BAD])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(predict_module, "READ_ROWS", 2)  # the bad line is read in the third batch
        assert main(["predict", str(tiny_model_dir), "--input", str(source)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "line 6: 'review' holds a lone surrogate" in captured.err


def test_a_lone_surrogate_is_refused_by_index_from_python(tiny_model_dir, tokenizer):
    """predict_probabilities called from Python names the review, where the tokenizer would raise a TypeError."""
    from transformers import BertForSequenceClassification

    from finetune.errors import FinetuneError
    from finetune.evaluation.inference import predict_probabilities

    model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    with pytest.raises(FinetuneError, match=r"^review 1 holds a lone surrogate \(U\+D800\) at character 5"):
        predict_probabilities(model, tokenizer, ["fine", "bad \ud800 x"])
