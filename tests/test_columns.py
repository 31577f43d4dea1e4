"""Whole-column reads give what datasets' row-by-row reads give, and the hot paths no longer read row by row."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from helpers import quiet_args, review_dataset
from transformers import BertForSequenceClassification, DataCollatorWithPadding
from transformers.trainer_pt_utils import get_length_grouped_indices

from finetune import ReviewTrainer
from finetune.data.columns import column_values, token_counts
from finetune.data.splits import _class_counts, _hold_out


def _drawn(dataset: datasets.Dataset) -> datasets.Dataset:
    """A shuffled subset: rows reached through an indices mapping, as a drawn or held-out split is."""
    return dataset.shuffle(seed=3).select(range(len(dataset) - 7))


def _labelled(labels: list[int], classes: int) -> datasets.Dataset:
    features = datasets.Features({"text": datasets.Value("string"), "labels": datasets.ClassLabel(num_classes=classes)})
    return datasets.Dataset.from_dict({"text": [f"review {i}" for i in range(len(labels))], "labels": labels}, features)


def test_a_column_read_at_once_equals_the_rows_read_one_by_one(tokenizer):
    rows = _drawn(review_dataset(tokenizer, 60, seed=2))
    assert column_values(rows, "labels") == [row["labels"] for row in rows]
    assert column_values(rows, "input_ids") == [row["input_ids"] for row in rows]
    assert column_values({"labels": [2, 0]}, "labels") == [2, 0]


def test_token_counts_are_each_row_s_input_ids_length(tokenizer):
    rows = _drawn(review_dataset(tokenizer, 60, seed=4, max_words=40))
    assert token_counts(rows) == [len(row["input_ids"]) for row in rows]
    assert token_counts(rows, "attention_mask") == [len(row["attention_mask"]) for row in rows]


def test_class_counts_count_each_class_present_or_not():
    rows = _drawn(_labelled([0, 2, 2, 1, 2, 0, 2] * 3, classes=4))
    labels = [row["labels"] for row in rows]
    assert _class_counts(rows, 4) == [labels.count(class_id) for class_id in range(4)]


@pytest.mark.parametrize(("size", "held_out", "seed"), [(40, 8, 0), (97, 10, 42), (200, 3, 7)])
def test_a_stratified_hold_out_is_the_split_datasets_draws(size, held_out, seed):
    rng = np.random.default_rng(size)
    labels = [0, 1, 2, 2, 1, 0, *rng.choice(3, size=size + 1, p=[0.6, 0.3, 0.1]).tolist()]  # each class twice or more
    train = _drawn(_labelled(labels, classes=3))
    assert min(_class_counts(train, 3)) >= 2  # so both sides stratify, as the recipe's hold-out does
    ours = _hold_out(datasets.DatasetDict({"train": train}), "validation", held_out, ["a", "b", "c"], seed)
    theirs = train.train_test_split(test_size=held_out, seed=seed, stratify_by_column="labels")
    assert ours["train"]["text"][:] == theirs["train"]["text"][:]
    assert ours["validation"]["text"][:] == theirs["test"]["text"][:]


def test_group_by_length_sorts_stock_s_groups_without_decoding_a_row(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    dataset = _drawn(review_dataset(tokenizer, 90, seed=5, max_words=40))
    lengths = [len(row["input_ids"]) for row in dataset]
    trainer = ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(tiny_model_dir),
        args=quiet_args(
            tmp_path,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=3,
            train_sampling_strategy="group_by_length",
            seed=11,
        ),
        train_dataset=dataset,
        data_collator=DataCollatorWithPadding(tokenizer),
    )

    def decoded(self, *args, **kwargs):
        raise AssertionError("the sampler decoded the training rows one by one")

    monkeypatch.setattr(datasets.Dataset, "__iter__", decoded)
    sampler = trainer._get_train_sampler()
    monkeypatch.undo()
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        expected = get_length_grouped_indices(lengths, 12, generator=torch.Generator().manual_seed(11 + epoch))
        assert list(sampler) == expected
