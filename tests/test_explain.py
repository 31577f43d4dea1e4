"""Explanations: one score per word with exact spans, for the label the model predicts, and not arbitrary.

The last point is tested on a tiny BERT (mean-pooling head, as ``pooling: mean``
runs have) trained for a few seconds on sentences whose label one cue word
decides, placed at a random position among filler words: the cue must rank first.
"""

from __future__ import annotations

import copy
import csv
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from finetune.cli import main
from finetune.errors import FinetuneError
from finetune.evaluation.explain import (
    NO_GRADIENTS,
    ReviewExplanation,
    WordAttribution,
    explain_reviews,
)
from finetune.evaluation.faithfulness import comprehensiveness, delete_words
from finetune.evaluation.inference import predict_probabilities

FILLER = [
    "the",
    "box",
    "came",
    "on",
    "monday",
    "and",
    "my",
    "sister",
    "opened",
    "it",
    "in",
    "the",
    "kitchen",
    "with",
    "a",
    "knife",
    "after",
    "lunch",
]
# Label 0 has "awful" somewhere in it, label 2 "excellent", label 1 neither.
CUES = {0: "awful", 2: "excellent"}
REVIEWS = [
    "The blender didn't work, refund please!!",
    "Great café — loved it; 5/5 would buy again.",
    "ok",
    "  spaces   before and after  ",
]


def cue_sentence(rng: random.Random, label: int, pads: bool = False) -> str:
    words = rng.sample(FILLER, 6)
    if pads:
        # [PAD] read as one more filler word: the all-[PAD] baseline is then a review with no cue (label 1).
        words[rng.randrange(len(words))] = "[PAD]"
    if label in CUES:
        words.insert(rng.randrange(len(words) + 1), CUES[label])
    return " ".join(words)


@pytest.fixture(scope="module")
def cue_model(tokenizer):
    """A tiny BERT with the mean-pooling head, trained until the cue words decide its label (a few seconds).

    Integrated Gradients explains a prediction against its all-[PAD] baseline; in training, [PAD] never
    counts otherwise, so the baseline's label would be whatever the untrained [PAD] vector gives (a cue
    class, for this seed). Reading [PAD] as a filler word makes the baseline a review with no cue.
    """
    from transformers import BertConfig, BertForSequenceClassification

    from finetune.training.pooling import add_mean_pooling_layer

    torch.manual_seed(0)
    rng = random.Random(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    model = add_mean_pooling_layer(BertForSequenceClassification(config))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        labels = [rng.randrange(3) for _ in range(16)]
        batch = tokenizer([cue_sentence(rng, label, pads=True) for label in labels], padding=True, return_tensors="pt")
        loss = model(**batch, labels=torch.tensor(labels)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def test_every_word_once_in_order_with_its_span(tiny_model_dir, tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    explanations = explain_reviews(model, tokenizer, REVIEWS, batch_size=3, max_length=32)
    assert [[word.word for word in explanation.words] for explanation in explanations] == [
        ["The", "blender", "didn't", "work", "refund", "please"],
        ["Great", "café", "loved", "it", "5", "5", "would", "buy", "again"],
        ["ok"],
        ["spaces", "before", "and", "after"],
    ]
    for review, explanation in zip(REVIEWS, explanations):
        assert all(review[word.start : word.end] == word.word for word in explanation.words)
        assert [word.start for word in explanation.words] == sorted(word.start for word in explanation.words)
    # Every word piece lands in a word: apostrophes and accents split pieces, not words.
    assert all(word.score != 0.0 for explanation in explanations for word in explanation.words)


def test_the_label_and_probabilities_are_the_models(tiny_model_dir, tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    explanations = explain_reviews(model, tokenizer, REVIEWS, max_length=32)
    with torch.no_grad():
        logits = model(**tokenizer(REVIEWS, padding=True, return_tensors="pt")).logits
    expected = torch.softmax(logits, dim=-1).numpy()
    names = [model.config.id2label[index] for index in range(3)]
    assert [explanation.label for explanation in explanations] == [names[row] for row in expected.argmax(1)]
    got = np.array([[explanation.probabilities[name] for name in names] for explanation in explanations])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_words_past_max_length_score_zero(tiny_model_dir, tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    # A copy cutting on the right: the session's tokenizer is shared, and encoding with
    # truncation_side left (another test) leaves it cutting on the left.
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.truncation_side = "right"
    review = " ".join(f"word{index}" for index in range(40))  # "word12" is 2 pieces: 80 pieces in all
    (explanation,) = explain_reviews(model, tokenizer, [review], max_length=16)
    assert len(explanation.words) == 40
    read = [word for word in explanation.words if word.score != 0.0]
    # [CLS] + 14 pieces + [SEP]: the first 7 words, each of 2 pieces.
    assert [word.word for word in read] == [f"word{index}" for index in range(7)]


def test_top_words_are_the_highest_positive_scores():
    words = [WordAttribution("a", 0, 1, -0.5), WordAttribution("b", 2, 3, 0.2), WordAttribution("c", 4, 5, 0.9)]
    explanation = ReviewExplanation("x", {"x": 1.0}, words, top_k=5)
    assert [word.word for word in explanation.top_words()] == ["c", "b"]
    assert [word.word for word in explanation.top_words(1)] == ["c"]


def test_the_cue_word_ranks_first(cue_model, tokenizer):
    rng = random.Random(1)
    labels = [0, 2] * 6
    sentences = [cue_sentence(rng, label) for label in labels]
    explanations = explain_reviews(cue_model, tokenizer, sentences, max_length=32)
    names = [cue_model.config.id2label[label] for label in labels]
    assert [explanation.label for explanation in explanations] == names
    assert [explanation.top_words(1)[0].word for explanation in explanations] == [CUES[label] for label in labels]


def test_deleting_the_top_word_takes_more_probability_than_a_random_word(cue_model, tokenizer):
    rng = random.Random(2)
    sentences = [cue_sentence(rng, label) for label in [0, 2] * 5]
    explanations = explain_reviews(cue_model, tokenizer, sentences, max_length=32)
    names = [cue_model.config.id2label[index] for index in range(3)]

    def probability_of(texts, labels):
        probabilities = predict_probabilities(cue_model, tokenizer, texts, 16)
        return probabilities[np.arange(len(texts)), [names.index(label) for label in labels]]

    (row,) = comprehensiveness(sentences, explanations, probability_of, ks=[1], resamples=200)
    assert row["reviews"] == 10
    assert row["top_k_drop"] > 0.5 and row["random_drop"] < 0.3
    assert row["interval"][0] > 0


def test_delete_words_leaves_one_space():
    text = "it broke, awful, really awful"
    words = [WordAttribution("awful", 10, 15, 1.0), WordAttribution("really", 17, 23, 0.1)]
    assert delete_words(text, words) == "it broke, , awful"


def test_an_int8_export_without_fp32_is_refused(tokenizer):
    from finetune.export.onnxruntime import OnnxClassifier

    exported = OnnxClassifier.__new__(OnnxClassifier)  # no session needed: refused before any inference
    exported.config = SimpleNamespace(num_labels=3, id2label={0: "a", 1: "b", 2: "c"})
    with pytest.raises(FinetuneError) as error:
        explain_reviews(exported, tokenizer, ["fine"])
    assert str(error.value) == NO_GRADIENTS


def test_an_int8_export_with_fp32_fallback_is_explained_with_its_fp32_model(cue_model, tiny_model_dir, tokenizer):
    from transformers import AutoModelForSequenceClassification

    from finetune.export.fallback import Int8WithFallback

    # The tiny random model stands in for int8; with a margin of 1 every review is a close call for fp32.
    stand_in = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    sentences = ["my sister opened it awful", "excellent box after lunch"]
    explanations = explain_reviews(Int8WithFallback(stand_in, cue_model, 1.0), tokenizer, sentences, max_length=32)
    assert [explanation.top_words(1)[0].word for explanation in explanations] == ["awful", "excellent"]


def test_predict_explain_adds_top_words(tiny_model_dir, tmp_path):
    (tmp_path / "in.csv").write_text('review\n"Broke after two days, refund."\n""\nLove it\n', encoding="utf-8")
    assert (
        main(
            [
                "predict",
                str(tiny_model_dir),
                "--input",
                str(tmp_path / "in.csv"),
                "--output",
                str(tmp_path / "out.csv"),
                "--explain",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader((tmp_path / "out.csv").open(encoding="utf-8")))
    assert list(rows[0]) == [
        "review",
        "label",
        "probability",
        "prob_LABEL_0",
        "prob_LABEL_1",
        "prob_LABEL_2",
        "top_words",
    ]
    assert rows[1]["top_words"] == "" and rows[1]["label"] == ""
    for row in (rows[0], rows[2]):
        cells = row["top_words"].split("; ")
        assert 1 <= len(cells) <= 5
        for cell in cells:
            word, score = cell.rsplit(" (", 1)
            assert word in row["review"] and float(score.rstrip(")")) > 0

    assert (
        main(
            [
                "predict",
                str(tiny_model_dir),
                "--input",
                str(tmp_path / "in.csv"),
                "--output",
                str(tmp_path / "out.jsonl"),
                "--explain",
            ]
        )
        == 0
    )
    first = json.loads((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert [cell["word"] for cell in first["top_words"]] == [
        cell.rsplit(" (", 1)[0] for cell in rows[0]["top_words"].split("; ")
    ]


def test_predict_explain_on_an_int8_export_without_fp32_is_one_line(tiny_model_dir, tmp_path, capsys):
    import shutil

    from finetune.export.onnxruntime import ONNX_FILE

    export = tmp_path / "int8"
    shutil.copytree(tiny_model_dir, export)
    (export / ONNX_FILE).write_bytes(b"not read: refused before the model loads")
    (tmp_path / "in.csv").write_text("review\nfine\n", encoding="utf-8")
    status = main(
        [
            "predict",
            str(export),
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.csv"),
            "--explain",
        ]
    )
    assert status == 2
    assert capsys.readouterr().err.strip() == f"error: {export}: {NO_GRADIENTS}"
    assert not (tmp_path / "out.csv").exists()


def test_errors_file_gives_each_mistake_its_top_words(run_copy):
    (run_copy / "scored.csv").write_text(
        "review,stars\nreview 1 was great,5\nreview 2 was awful,1\nreview 3 was fine,3\nlovely value,4\n",
        encoding="utf-8",
    )
    assert (
        main(
            [
                "evaluate",
                str(run_copy / "run"),
                "--data",
                str(run_copy / "scored.csv"),
                "--no_baseline",
                "--resamples",
                "10",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader((run_copy / "run" / "errors_data-scored.csv").open(encoding="utf-8")))
    assert list(rows[0])[-1] == "top_words" and len(rows) == 4
    mistakes = [row for row in rows if row["predicted"] != row["true"]]
    # A mistake may have no word that pushed toward its label (the baseline alone gives it): then its cell is empty.
    assert any(row["top_words"] for row in mistakes), "the 2-update tiny run gets some of these wrong"
    for row in rows:
        if row["predicted"] == row["true"]:
            assert row["top_words"] == ""
        elif row["top_words"]:
            assert all(cell.rsplit(" (", 1)[0] in row["text"] for cell in row["top_words"].split("; "))


def test_evaluate_no_explain_leaves_top_words_empty_and_explains_nothing(run_copy, monkeypatch):
    import finetune.evaluation.explain as explain_module

    def refuse(*args, **kwargs):
        raise AssertionError("--no_explain must not explain")

    monkeypatch.setattr(explain_module, "explain_predictions", refuse)
    (run_copy / "scored.csv").write_text(
        "review,stars\nreview 1 was great,5\nreview 2 was awful,1\nreview 3 was fine,3\nlovely value,4\n",
        encoding="utf-8",
    )
    command = ["evaluate", str(run_copy / "run"), "--data", str(run_copy / "scored.csv"), "--no_baseline"]
    assert main([*command, "--resamples", "10", "--no_explain"]) == 0
    rows = list(csv.DictReader((run_copy / "run" / "errors_data-scored.csv").open(encoding="utf-8")))
    assert len(rows) == 4 and any(row["predicted"] != row["true"] for row in rows)
    assert [row["top_words"] for row in rows] == [""] * 4


def test_explains_under_inference_mode(tiny_model_dir, tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    # A server answers requests under inference_mode; the explanation needs gradients all the same.
    with torch.inference_mode():
        inside = explain_reviews(model, tokenizer, REVIEWS[:2], max_length=32)
    assert inside == explain_reviews(model, tokenizer, REVIEWS[:2], max_length=32)
