"""Contract 4-6: the scheduler counts updates; clipping and the shown loss do not depend on n."""

from __future__ import annotations

import copy
from typing import ClassVar

import pytest
from helpers import quiet_args, review_dataset
from transformers import BertForSequenceClassification, DataCollatorWithPadding, TrainerCallback

import finetune.training.trainer as trainer_module
from finetune import ReviewTrainer


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


class _RecordLearningRates(TrainerCallback):
    """The LR each optimizer step actually used, read from the optimizer."""

    def __init__(self):
        self.used = []

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.used.append(optimizer.param_groups[0]["lr"])


def expected_linear_rates(peak: float, total: int, warmup: int) -> list[float]:
    """Linear warmup from 0 then linear decay to 0, one value per update (the textbook schedule)."""
    rates = []
    for update in range(total):
        if update < warmup:
            rates.append(peak * update / warmup)
        else:
            rates.append(peak * (total - update) / (total - warmup))
    return rates


@pytest.mark.parametrize(("samples", "micro_batch", "n", "epochs", "warmup"), [(20, 2, 3, 2, 2), (9, 4, 2, 3, 0)])
def test_linear_schedule_steps_once_per_update(
    initial_model, tokenizer, tmp_path, samples, micro_batch, n, epochs, warmup
):
    recorder = _RecordLearningRates()
    trainer = ReviewTrainer(
        model=copy.deepcopy(initial_model),
        args=quiet_args(
            tmp_path,
            per_device_train_batch_size=micro_batch,
            gradient_accumulation_steps=n,
            num_train_epochs=epochs,
            learning_rate=1e-3,
            lr_scheduler_type="linear",
            warmup_steps=warmup,
        ),
        train_dataset=review_dataset(tokenizer, samples),
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[recorder],
    )
    trainer.train()
    micro_batches = -(-samples // micro_batch)
    total = epochs * -(-micro_batches // n)
    assert recorder.used == pytest.approx(expected_linear_rates(1e-3, total, warmup), abs=1e-12)
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-15)  # ends on the final update


def test_max_steps_counts_updates(initial_model, tokenizer, tmp_path):
    recorder = _RecordLearningRates()
    trainer = ReviewTrainer(
        model=copy.deepcopy(initial_model),
        args=quiet_args(
            tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3, max_steps=5, learning_rate=1e-3
        ),
        train_dataset=review_dataset(tokenizer, 10),  # 5 micro-batches = 2 updates an epoch
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[recorder],
    )
    result = trainer.train()
    assert result.global_step == 5
    assert recorder.used == pytest.approx(expected_linear_rates(1e-3, 5, 0))


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def _train_recording_bar(initial_model, tokenizer, tmp_path, micro_batch, n, logging_steps, monkeypatch, **overrides):
    shown = []

    class RecordingBar(trainer_module.EpochProgressBar):
        def advance(self, micro_batches, train_loss, learning_rate):
            shown.append(train_loss)
            super().advance(micro_batches, train_loss, learning_rate)

    monkeypatch.setattr(trainer_module, "EpochProgressBar", RecordingBar)
    values = dict(
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=n,
        num_train_epochs=1,
        learning_rate=0.0,  # the model stays put, so every n sees the same losses
        logging_strategy="steps",
        logging_steps=logging_steps,
        train_sampling_strategy="sequential",
    )
    values.update(overrides)
    trainer = ReviewTrainer(
        model=copy.deepcopy(initial_model),
        args=quiet_args(tmp_path, **values),
        train_dataset=review_dataset(tokenizer, 16),
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    result = trainer.train()
    return trainer, result, shown


def test_shown_and_logged_loss_do_not_depend_on_n(initial_model, tokenizer, tmp_path, monkeypatch):
    # n=1 logging every 4 updates and n=4 logging every update cover the same 8 samples per log.
    one, one_result, one_bar = _train_recording_bar(initial_model, tokenizer, tmp_path, 2, 1, 4, monkeypatch)
    four, four_result, four_bar = _train_recording_bar(initial_model, tokenizer, tmp_path, 2, 4, 1, monkeypatch)
    assert _logged(one, "loss") == pytest.approx(_logged(four, "loss"), rel=1e-6)
    assert len(_logged(one, "loss")) == 2
    assert one_result.training_loss == pytest.approx(four_result.training_loss, rel=1e-6)
    assert one_bar[-1] == pytest.approx(four_bar[-1], rel=1e-6)
    assert one_bar[-1] == pytest.approx(one_result.training_loss, rel=1e-6)


class _RecordShownLoss(trainer_module.EpochProgressBar):
    """The bar, remembering the Train_Loss text a person saw after each refresh, per epoch."""

    shown: ClassVar[list[tuple[int, str]]] = []

    def _refresh(self, steps, train_loss, learning_rate):
        super()._refresh(steps, train_loss, learning_rate)
        self.shown.append((self._epoch, self._bar.postfix.split("Train_Loss=")[1].split(",")[0]))


@pytest.mark.parametrize("budget", [None, 30], ids=["by-count", "token-budget"])
def test_the_bar_shows_no_loss_before_it_has_one(initial_model, tokenizer, tmp_path, monkeypatch, budget):
    """Issue 51: never a fake 0 at an epoch's start; the first number is the first window's mean loss."""
    _RecordShownLoss.shown = []
    monkeypatch.setattr(trainer_module, "EpochProgressBar", _RecordShownLoss)
    dataset = review_dataset(tokenizer, 12)
    model = copy.deepcopy(initial_model)
    trainer = ReviewTrainer(
        model=model,
        args=quiet_args(
            tmp_path,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=3,
            num_train_epochs=2,
            learning_rate=0.0,  # the model stays put, so the reference below sees the same weights
            train_sampling_strategy="sequential",
            micro_batch_tokens=budget,
        ),
        train_dataset=dataset,
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    trainer.train()
    # Independent: the first window's 6 reviews, each scored alone by the model in training mode.
    model.train()
    collator = DataCollatorWithPadding(tokenizer)
    losses = [model(**collator([dataset[row]]).to(model.device)).loss.item() for row in range(6)]
    first_window_mean = f"{sum(losses) / len(losses):.4f}"
    for epoch in (1, 2):
        texts = [text for shown_epoch, text in _RecordShownLoss.shown if shown_epoch == epoch]
        numbers = [text for text in texts if text != "-"]
        assert texts[0] == "-"  # before the epoch's first update: nothing measured yet
        assert "0.0000" not in texts
        assert numbers[0] == first_window_mean
        assert texts.index(numbers[0]) == texts.count("-")  # every "-" comes before the first number


def test_grad_norm_does_not_depend_on_n(initial_model, tokenizer, tmp_path, monkeypatch):
    common = dict(max_grad_norm=1.0)
    whole, _, _ = _train_recording_bar(initial_model, tokenizer, tmp_path, 8, 1, 1, monkeypatch, **common)
    accumulated, _, _ = _train_recording_bar(initial_model, tokenizer, tmp_path, 2, 4, 1, monkeypatch, **common)
    assert _logged(whole, "grad_norm") == pytest.approx(_logged(accumulated, "grad_norm"), rel=1e-5)
    assert all(norm > 0 for norm in _logged(whole, "grad_norm"))


class _NaNOnSecondWindow(ReviewTrainer):
    """A user's compute_loss that goes non-finite on the second window's micro-batches."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss * float("nan") if self.state.global_step == 1 else loss


def test_non_finite_update_is_skipped_and_does_not_advance_the_scheduler(initial_model, tokenizer, tmp_path):
    from helpers import flat_parameters

    recorder = _RecordLearningRates()
    model = copy.deepcopy(initial_model)
    trainer = _NaNOnSecondWindow(
        model=model,
        args=quiet_args(
            tmp_path,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            num_train_epochs=1,
            learning_rate=1e-2,
        ),
        train_dataset=review_dataset(tokenizer, 12),  # 6 micro-batches = 3 updates
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=[recorder],
    )
    result = trainer.train()
    assert result.global_step == 3
    assert trainer.skipped_updates == 1
    assert len(recorder.used) == 2  # no optimizer step on the bad window
    assert recorder.used == pytest.approx([1e-2, 1e-2 * 2 / 3])  # the scheduler did not move on it
    assert bool(flat_parameters(model).isfinite().all())
