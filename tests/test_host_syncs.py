"""Host syncs: the counter sees each read of a tensor into Python, and ReviewTrainer makes one per update.

A GPU waits for Python at every such read, so a read per micro-batch would
stall it n times an update. The counter is checked on hand-made reads, then
on both trainers: stock Trainer reads each micro-batch's loss (its NaN filter),
ReviewTrainer keeps losses and class-weighted sample counts on the device and
reads them once, with the gradient norm, per update.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import TEST_ON_CPU, quiet_args, review_dataset
from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer

from finetune import ReviewTrainer
from finetune.bench.host_syncs import HostReadsWindow, counting_host_reads

DEVICE_TYPE = "cpu" if TEST_ON_CPU else "cuda"
MICRO_BATCH, N_ACCUMULATE, UPDATES = 2, 4, 3


def test_counts_each_read_while_counting_and_leaves_tensor_as_it_was():
    value = torch.tensor(2.0)
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([parameter])
    item_before = torch.Tensor.item
    with counting_host_reads("cpu") as counter:
        value.item()  # not counting yet
        counter.counting = True
        value.item(), float(value), value.tolist(), bool(value), int(value), parameter.sum().item()
        # The optimizer's step count and the sampler's seed are host tensors on a GPU too: not counted.
        parameter.sum().backward()
        optimizer.step()
        optimizer.step()
        list(torch.utils.data.DataLoader(range(4), shuffle=True))
        counter.counting = False
        value.item()
    assert counter.count == 6
    assert torch.Tensor.item is item_before and "item" not in torch.Tensor.__dict__


def test_a_cpu_dropout_mask_s_seed_is_not_counted_a_read_of_the_model_s_is():
    """Packed rows draw dropout masks on the host from a seed read each, a path a GPU run does not take."""
    from finetune.fast_path.dropout_masks import dropout_keep

    with counting_host_reads("cpu") as counter:
        counter.counting = True
        dropout_keep((4, 8), 0.1)
        assert counter.count == 0
        torch.ones(()).random_().item()  # the same read made anywhere else counts
        assert counter.count == 1


def test_packed_training_with_dropout_reads_nothing_in_the_model(tiny_dropout_model_dir, tokenizer, tmp_path):
    model = BertForSequenceClassification.from_pretrained(tiny_dropout_model_dir)
    ours, _ = _counted_run(ReviewTrainer, tokenizer, model, tmp_path, padding_free=True, micro_batch_tokens=64)
    assert ours.model_count == 0
    assert ours.count == UPDATES


def _reads_per_update(trainer_class, tokenizer, model, tmp_path, **overrides):
    counter, _ = _counted_run(trainer_class, tokenizer, model, tmp_path, **overrides)
    return counter.count / UPDATES


def _counted_run(trainer_class, tokenizer, model, tmp_path, **overrides):
    args = quiet_args(
        tmp_path,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=N_ACCUMULATE,
        max_steps=UPDATES,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        **overrides,
    )
    with counting_host_reads(DEVICE_TYPE) as counter:
        trainer = trainer_class(
            model=copy.deepcopy(model),
            args=args,
            train_dataset=review_dataset(tokenizer, MICRO_BATCH * N_ACCUMULATE * UPDATES),
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[HostReadsWindow(counter)],
        )
        assert trainer.train().global_step == UPDATES
    return counter, trainer.model


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("class_weighting", ["none", "balanced"])
def test_review_trainer_reads_the_device_once_per_update(initial_model, tokenizer, tmp_path, class_weighting):
    # With class weights each micro-batch's mass is a sum of its labels' weights: kept on the device too.
    reads = _reads_per_update(ReviewTrainer, tokenizer, initial_model, tmp_path, class_weighting=class_weighting)
    assert reads == 1


@pytest.mark.parametrize("budget", [None, 24], ids=["by-count", "by-tokens"])
def test_the_model_reads_nothing_in_review_trainer_s_run(initial_model, tokenizer, tmp_path, budget):
    """transformers' mask code asks each padded batch whether it has padding (a read); ReviewTrainer's run does not.

    Stock Trainer, the control, reads once a micro-batch inside the model; ReviewTrainer's pieces (several a
    window at a budget of 24 tokens) make none, and the model's own SDPA mask code is back after the run.
    """
    stock, _ = _counted_run(Trainer, tokenizer, initial_model, tmp_path)
    assert stock.model_count >= N_ACCUMULATE * UPDATES
    ours, trained = _counted_run(ReviewTrainer, tokenizer, initial_model, tmp_path, micro_batch_tokens=budget)
    assert ours.model_count == 0
    assert ours.count == UPDATES
    assert trained.config._attn_implementation == "sdpa"


def test_stock_trainer_reads_every_micro_batch(initial_model, tokenizer, tmp_path):
    # The negative control: the counter does see a loop that reads each micro-batch's loss.
    assert _reads_per_update(Trainer, tokenizer, initial_model, tmp_path) >= N_ACCUMULATE


def test_class_weights_are_copied_to_the_device_once_per_run(initial_model, tokenizer, tmp_path):
    # A copy from host memory to a GPU waits for every kernel queued before it: made in each micro-batch's
    # loss, it would be a sync per micro-batch that the reads above do not count.
    args = quiet_args(
        tmp_path,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=N_ACCUMULATE,
        max_steps=UPDATES,
        class_weighting="balanced",
    )
    trainer = ReviewTrainer(
        model=copy.deepcopy(initial_model),
        args=args,
        train_dataset=review_dataset(tokenizer, MICRO_BATCH * N_ACCUMULATE * UPDATES),
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    copies = []
    host_weights = trainer.class_weights
    copy_to = host_weights.to
    host_weights.to = lambda *args, **kwargs: copies.append(args) or copy_to(*args, **kwargs)
    assert trainer.train().global_step == UPDATES
    assert len(copies) == 1
