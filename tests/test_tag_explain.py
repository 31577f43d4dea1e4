"""``finetune predict --explain`` on a multi_label run: the words behind each tag given, attributed to that tag's logit.

The scores are checked against a hand-made gradient-times-input of the tag's
logit with respect to the word embeddings (torch autograd, the fast tokenizer's
own word ids): no Captum and no finetune code in the reference.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_multi_label_run import tag_recipe
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.cli import main
from finetune.evaluation.explain import explain_tag_predictions

pytest.importorskip("captum", reason="explanations need captum")

TAGS = ["delivery", "price", "size"]
REVIEWS = ["the cheap courier was late", "it runs small and tight okay"]


@pytest.fixture(scope="module")
def tag_run(tmp_path_factory, tiny_model_dir) -> Path:
    folder = tmp_path_factory.mktemp("explained-tags")
    assert main(["train", str(tag_recipe(folder, tiny_model_dir, num_train_epochs=2))]) == 0
    return folder / "run"


def reference_word_scores(model, tokenizer, review: str, tag: int) -> list[float]:
    """Gradient of the tag's logit times the word embeddings, summed per piece, then per word (word_ids)."""
    captured = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["embeddings"] = output

    handle = model.get_input_embeddings().register_forward_hook(keep)
    try:
        encoded = tokenizer(review, return_tensors="pt")
        model.zero_grad()
        model(**encoded).logits[0, tag].backward()
    finally:
        handle.remove()
    embeddings = captured["embeddings"]
    pieces = (embeddings.grad * embeddings).sum(dim=-1)[0].detach().numpy()
    word_ids = encoded.word_ids(0)
    words = [0.0] * (max(index for index in word_ids if index is not None) + 1)
    for piece, word in zip(pieces, word_ids):
        if word is not None:
            words[word] += float(piece)
    return words


def test_each_tag_given_is_explained_by_its_own_logit(tag_run):
    model = AutoModelForSequenceClassification.from_pretrained(tag_run).eval()
    tokenizer = AutoTokenizer.from_pretrained(tag_run)
    # Every tag given to the first review, only "size" to the second: several pairs, and a review's tag set honoured.
    probabilities = np.array([[0.9, 0.9, 0.9], [0.1, 0.2, 0.8]])
    explained = explain_tag_predictions(
        model, tokenizer, REVIEWS, probabilities, [0.5, 0.5, 0.5], method="gradient_x_input", batch_size=2
    )
    assert [explanation.labels for explanation in explained] == [TAGS, ["size"]]
    for review, explanation in zip(REVIEWS, explained):
        assert explanation.scores == pytest.approx(dict(zip(TAGS, probabilities[REVIEWS.index(review)])))
        for tag, words in explanation.words.items():
            assert [word.word for word in words] == review.split()
            expected = reference_word_scores(model, tokenizer, review, TAGS.index(tag))
            assert [word.score for word in words] == pytest.approx(expected, rel=1e-3, abs=1e-5)
    # Each tag has words of its own: the check would fail if every tag were explained by one output.
    first = explained[0].words
    assert [word.score for word in first["delivery"]] != pytest.approx([word.score for word in first["price"]])


def test_predict_explain_gives_the_words_behind_each_tag_it_gives(tag_run, tmp_path, capsys):
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text("".join(json.dumps({"review": review}) + "\n" for review in REVIEWS), encoding="utf-8")
    output = tmp_path / "explained.jsonl"
    # --threshold 0.01: every tag is given, so every tag is explained.
    command = ["predict", str(tag_run), "--input", str(reviews), "--output", str(output), "--explain"]
    assert main([*command, "--threshold", "0.01"]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    for row in rows:
        assert row["labels"] == TAGS and list(row["top_words"]) == TAGS
        # A tag given at 0.01 may have no word pushing toward it (its logit below the blank review's): none listed.
        for words in row["top_words"].values():
            assert len(words) <= 5 and all(word["word"] in row["review"].split() for word in words)
            assert all(word["score"] >= 0 for word in words)  # positive, rounded to 4 places
    assert any(words for row in rows for words in row["top_words"].values())
    # In CSV, one cell: each tag given and its words, in the order of the labels column.
    output_csv = tmp_path / "explained.csv"
    assert main(["predict", str(tag_run), "--input", str(reviews), "--output", str(output_csv), "--explain"]) == 0
    for row in csv.DictReader(output_csv.open(encoding="utf-8")):
        given = [tag for tag in row["labels"].split("|") if tag]
        explained = [part.split(":")[0] for part in row["top_words"].split(" | ")] if row["top_words"] else []
        assert explained == given
    capsys.readouterr()


def test_a_review_with_no_tag_has_no_words_and_costs_no_attribution(tag_run):
    model = AutoModelForSequenceClassification.from_pretrained(tag_run).eval()
    tokenizer = AutoTokenizer.from_pretrained(tag_run)
    explained = explain_tag_predictions(model, tokenizer, REVIEWS, np.zeros((2, 3)), [0.5, 0.5, 0.5])
    assert [(explanation.labels, explanation.words) for explanation in explained] == [([], {}), ([], {})]
    assert torch.is_grad_enabled()
