"""Evaluation batches of reviews sorted by length: each review scored as alone, results in dataset order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import quiet_args, review_dataset
from transformers import BertForSequenceClassification, DataCollatorWithPadding

from finetune import ReviewTrainer
from finetune.training.sorted_evaluation import LengthSortedSampler, in_dataset_order

SAMPLES = 37  # not a multiple of the batch: a short last batch


class RecordingCollator(DataCollatorWithPadding):
    """The trainer's collator, remembering the token count of each review it was handed, batch by batch."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.batches = []

    def __call__(self, features):
        self.batches.append([len(feature["input_ids"]) for feature in features])
        return super().__call__(features)


def _reference_logits(model, dataset) -> np.ndarray:
    """Each review through the model on its own: no padding, no batch."""
    model.eval()
    with torch.no_grad():
        rows = [
            model(input_ids=torch.tensor([row["input_ids"]]), attention_mask=torch.tensor([row["attention_mask"]]))
            .logits[0]
            .numpy()
            for row in dataset
        ]
    return np.stack(rows)


def _trainer(model_dir, tokenizer, tmp_path, collator, **args):
    return ReviewTrainer(
        model=BertForSequenceClassification.from_pretrained(model_dir),
        args=quiet_args(tmp_path, per_device_eval_batch_size=8, **args),
        data_collator=collator,
        processing_class=tokenizer,
    )


@pytest.mark.parametrize("strategy", ["random", "group_by_length"])
def test_predict_scores_longest_first_and_returns_dataset_order(tiny_model_dir, tokenizer, tmp_path, strategy):
    dataset = review_dataset(tokenizer, SAMPLES, seed=8, max_words=40)
    collator = RecordingCollator(tokenizer)
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, collator, train_sampling_strategy=strategy)
    output = trainer.predict(dataset)

    scored = [length for batch in collator.batches for length in batch]
    assert scored == sorted((len(ids) for ids in dataset["input_ids"]), reverse=True)
    assert output.label_ids.tolist() == list(dataset["labels"])
    reference = _reference_logits(BertForSequenceClassification.from_pretrained(tiny_model_dir), dataset)
    np.testing.assert_allclose(output.predictions, reference, atol=1e-5)


def test_metrics_see_dataset_order_and_the_loss_is_the_unsorted_loss(tiny_model_dir, tokenizer, tmp_path):
    dataset = review_dataset(tokenizer, SAMPLES, seed=9, max_words=40)
    labels = list(dataset["labels"])
    seen = {}

    def compute_metrics(prediction):
        seen["labels"] = prediction.label_ids.tolist()
        seen["logits"] = prediction.predictions
        return {"in_order": float(prediction.label_ids.tolist() == labels)}

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, DataCollatorWithPadding(tokenizer))
    trainer.compute_metrics = compute_metrics
    metrics = trainer.evaluate(dataset)
    assert metrics["eval_in_order"] == 1.0
    reference_model = BertForSequenceClassification.from_pretrained(tiny_model_dir)
    reference = _reference_logits(reference_model, dataset)
    np.testing.assert_allclose(seen["logits"], reference, atol=1e-5)
    expected_loss = torch.nn.functional.cross_entropy(torch.tensor(reference), torch.tensor(labels)).item()
    assert metrics["eval_loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_batches_left_unconcatenated_are_kept_in_stock_order(tiny_model_dir, tokenizer, tmp_path):
    dataset = review_dataset(tokenizer, SAMPLES, seed=10, max_words=40)
    collator = RecordingCollator(tokenizer)
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, collator, eval_do_concat_batches=False)
    trainer.predict(dataset)
    assert [length for batch in collator.batches for length in batch] == [len(ids) for ids in dataset["input_ids"]]


def test_results_go_back_to_row_order_nested_or_not():
    sampler = LengthSortedSampler([3, 9, 5, 9, 1])
    assert list(sampler) == [1, 3, 2, 0, 4]  # longest first, ties in row order
    scored = np.array([10.0, 30.0, 20.0, 0.0, 40.0])  # the rows' values in the order they were scored
    rows = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    np.testing.assert_array_equal(in_dataset_order(scored, sampler.order), rows)
    nested = in_dataset_order({"logits": (scored, scored[:, None])}, sampler.order)
    np.testing.assert_array_equal(nested["logits"][0], rows)
    np.testing.assert_array_equal(nested["logits"][1], rows[:, None])
    other = np.arange(3)
    assert in_dataset_order(other, sampler.order) is other and in_dataset_order(None, sampler.order) is None
