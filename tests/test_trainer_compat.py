"""ReviewTrainer as a drop-in: the same arguments through stock Trainer and ReviewTrainer give the same run.

For a grid of strategies each side records every callback event, the updates
at which it evaluated and saved, and the learning rate of every optimizer
step; stock Trainer 5.23 is the reference. Where the run depends on evaluation
metrics (best checkpoint, early stopping, hyperparameter search) n is 1: with
n > 1 stock's updates are n times ours for BERT classifiers (see the README's
"Where ReviewTrainer differs from Trainer"), so its metrics would differ.

Trainer features that do not touch accumulation (logging_first_step,
eval_on_start, tokens seen, gradient checkpointing, drop_last, max_steps, bf16,
auto_find_batch_size, a compute_loss_func, optimizers passed in, ...) are run
at n = 1 through both: the final weights must be identical and every logged
figure equal.
"""

from __future__ import annotations

import copy
import importlib.util
from collections import Counter

import pytest
import torch
from helpers import quiet_args, review_dataset
from transformers import (
    BertForSequenceClassification,
    DataCollatorWithPadding,
    EarlyStoppingCallback,
    Trainer,
    TrainerCallback,
)

from finetune import ReviewTrainer

EVENTS = [
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_substep_end",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_step_end",
    "on_evaluate",
    "on_prediction_step",
    "on_save",
    "on_log",
]


class RecordRun(TrainerCallback):
    """Counts every callback event; notes the updates that evaluated and saved and each step's learning rate."""

    def __init__(self):
        self.events = Counter()
        self.evaluated_at = []
        self.saved_at = []
        self.rates = []

    def __getattribute__(self, name):
        if name in EVENTS:
            return lambda args, state, control, **kwargs: self._record(name, state, kwargs)
        return super().__getattribute__(name)

    def _record(self, event, state, kwargs):
        self.events[event] += 1
        if event == "on_evaluate":
            self.evaluated_at.append(state.global_step)
        elif event == "on_save":
            self.saved_at.append(state.global_step)
        elif event == "on_optimizer_step":
            self.rates.append(kwargs["optimizer"].param_groups[0]["lr"])

    def summary(self):
        return {
            "events": dict(self.events),
            "evaluated_at": self.evaluated_at,
            "saved_at": self.saved_at,
            "rates": self.rates,
        }


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def splits(tokenizer):
    # 6 reviews in micro-batches of 2 are 3 micro-batches: with n=2, windows of 2 and 1 (a partial one).
    return review_dataset(tokenizer, 6, seed=3), review_dataset(tokenizer, 4, seed=4)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"]))


needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft not installed (.[lora])")

GRID = {
    "steps": dict(n=2, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=3, logging_steps=1),
    "epoch": dict(n=2, eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch"),
    "best": dict(
        n=1,
        num_train_epochs=1,
        learning_rate=0.05,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="best",
        metric_for_best_model="loss",
    ),
    "early_stopping": dict(
        n=1,
        num_train_epochs=4,
        learning_rate=0.05,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        early_stopping=True,
    ),
    "cosine": dict(n=2, lr_scheduler_type="cosine", warmup_steps=2, logging_steps=2),
    "adafactor": dict(n=2, optim="adafactor", eval_strategy="epoch"),
    "lora": pytest.param(
        dict(n=2, lora=True, learning_rate=1e-2, eval_strategy="epoch", save_strategy="epoch"), marks=needs_peft
    ),
}


def _run(trainer_class, initial_model, tokenizer, splits, output_dir, n, lora=False, early_stopping=False, **fields):
    """Train one side of the comparison and return what its callback recorded."""
    recorder = RecordRun()
    callbacks = [recorder, *([EarlyStoppingCallback(early_stopping_patience=1)] if early_stopping else [])]
    values = dict(
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=n,
        num_train_epochs=2,
        learning_rate=1e-3,
        logging_strategy="steps",
        train_sampling_strategy="sequential",
    )
    values.update(fields)
    model = copy.deepcopy(initial_model)
    trainer_class(
        model=_lora(model) if lora else model,
        args=quiet_args(output_dir, **values),
        train_dataset=splits[0],
        eval_dataset=splits[1],
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=callbacks,
    ).train()
    return recorder.summary()


@pytest.mark.parametrize("fields", GRID.values(), ids=GRID.keys())
def test_same_run_as_stock_trainer(initial_model, tokenizer, splits, tmp_path, fields):
    stock = _run(Trainer, initial_model, tokenizer, splits, tmp_path / "stock", **fields)
    ours = _run(ReviewTrainer, initial_model, tokenizer, splits, tmp_path / "ours", **fields)
    assert ours["events"] == stock["events"]
    assert ours["evaluated_at"] == stock["evaluated_at"]
    assert ours["saved_at"] == stock["saved_at"]
    assert ours["rates"] == pytest.approx(stock["rates"], rel=1e-9)
    assert stock["events"]["on_optimizer_step"] > 0
    if fields.get("save_strategy") == "best":
        # Saving the best is compared only if stock skipped saving after some evaluation.
        assert len(stock["saved_at"]) < len(stock["evaluated_at"])
    if fields.get("early_stopping"):
        # Early stopping is compared only if stock stopped before the last of its 4 x 3 updates.
        assert stock["events"]["on_optimizer_step"] < 4 * 3


def test_hyperparameter_search_like_stock(initial_model, tokenizer, splits, tmp_path):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    outcomes = {}
    for trainer_class in (Trainer, ReviewTrainer):
        recorder = RecordRun()
        trainer = trainer_class(
            model_init=lambda trial: copy.deepcopy(initial_model),
            args=quiet_args(
                tmp_path / trainer_class.__name__,
                per_device_train_batch_size=2,
                num_train_epochs=1,
                eval_strategy="epoch",
                save_strategy="epoch",
            ),
            train_dataset=splits[0],
            eval_dataset=splits[1],
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[recorder],
        )
        best = trainer.hyperparameter_search(
            hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)},
            n_trials=2,
            direction="minimize",
            backend="optuna",
            sampler=optuna.samplers.TPESampler(seed=0),
        )
        outcomes[trainer_class] = (best, recorder.summary())
    (stock_best, stock_run), (our_best, our_run) = outcomes[Trainer], outcomes[ReviewTrainer]
    assert our_best.hyperparameters == stock_best.hyperparameters
    assert our_best.objective == pytest.approx(stock_best.objective, rel=1e-5)
    assert our_run == {**stock_run, "rates": pytest.approx(stock_run["rates"], rel=1e-9)}
    assert stock_run["events"]["on_train_begin"] == 2  # one per trial


def _mean_over_its_items(outputs, labels, num_items_in_batch=None):
    """A user's ``compute_loss_func``: summed cross-entropy over the batch's items, divided by their count."""
    loss = torch.nn.functional.cross_entropy(outputs["logits"], labels, reduction="sum")
    return loss / (labels.numel() if num_items_in_batch is None else num_items_in_batch)


def _sgd_with_decaying_rate(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {"optimizers": (optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step)))}


# Trainer features with no bearing on accumulation, each at n = 1 on full micro-batches: weights,
# logs and counters must come out as stock's (fields, then Trainer keyword arguments made from the model).
FEATURES = {
    "logging_first_step": (dict(logging_first_step=True, logging_steps=3), None),
    "eval_on_start": (dict(eval_on_start=True, eval_strategy="epoch"), None),
    "num_input_tokens_seen": (dict(include_num_input_tokens_seen=True), None),
    "gradient_checkpointing": (dict(gradient_checkpointing=True), None),
    "dataloader_drop_last": (dict(dataloader_drop_last=True, per_device_train_batch_size=3), None),
    "max_steps": (dict(max_steps=5), None),
    "bf16": (dict(bf16=True), None),
    "auto_find_batch_size": (dict(auto_find_batch_size=True), None),
    "torch_empty_cache_steps": (dict(torch_empty_cache_steps=1), None),
    "compute_loss_func": ({}, lambda model: {"compute_loss_func": _mean_over_its_items}),
    "optimizers": ({}, _sgd_with_decaying_rate),
    "optimizer_cls_and_kwargs": ({}, lambda model: {"optimizer_cls_and_kwargs": (torch.optim.SGD, {"lr": 0.2})}),
    # The epoch's log line holds the grad norm and learning rate of the epoch's last update.
    "logging_strategy_epoch": (dict(logging_strategy="epoch"), None),
}
# What a log line holds that depends on the run, not on the clock.
LOGGED = ("loss", "grad_norm", "learning_rate", "epoch", "step", "eval_loss", "num_input_tokens_seen", "train_loss")


@pytest.mark.parametrize(("fields", "make_kwargs"), FEATURES.values(), ids=FEATURES.keys())
def test_trainer_feature_gives_stock_trainers_run(initial_model, tokenizer, tmp_path, fields, make_kwargs):
    # 8 reviews in micro-batches of 2: every batch full, so a per-sample mean is also the mean of the batches'.
    train, evaluation = review_dataset(tokenizer, 8, seed=3), review_dataset(tokenizer, 4, seed=4)
    runs = {}
    for trainer_class in (Trainer, ReviewTrainer):
        model = copy.deepcopy(initial_model)
        values = dict(
            per_device_train_batch_size=2,
            per_device_eval_batch_size=2,
            num_train_epochs=2,
            learning_rate=1e-3,
            logging_strategy="steps",
            logging_steps=1,
            train_sampling_strategy="sequential",
        )
        values.update(fields)
        trainer = trainer_class(
            model=model,
            args=quiet_args(tmp_path / trainer_class.__name__, **values),
            train_dataset=train,
            eval_dataset=evaluation,
            data_collator=DataCollatorWithPadding(tokenizer),
            **(make_kwargs(model) if make_kwargs else {}),
        )
        trainer.train()
        logs = [{key: entry[key] for key in LOGGED if key in entry} for entry in trainer.state.log_history]
        weights = torch.cat([parameter.detach().flatten() for parameter in trainer.model.parameters()])
        runs[trainer_class] = (weights, logs, trainer.state.global_step, trainer.state.num_input_tokens_seen)
    (stock_weights, stock_logs, *stock_counts), (our_weights, our_logs, *our_counts) = runs.values()
    assert torch.equal(our_weights, stock_weights)
    assert our_counts == stock_counts
    assert len(our_logs) == len(stock_logs) and stock_logs
    assert [sorted(entry) for entry in our_logs] == [sorted(entry) for entry in stock_logs]
    for ours, stock in zip(our_logs, stock_logs):
        assert ours == pytest.approx(stock, rel=1e-6)


@pytest.mark.parametrize(
    "make_kwargs",
    [
        lambda model: {"compute_loss_func": _mean_over_its_items},
        _sgd_with_decaying_rate,
        lambda model: {"optimizer_cls_and_kwargs": (torch.optim.SGD, {"lr": 0.2})},
    ],
    ids=["compute_loss_func", "optimizers", "optimizer_cls_and_kwargs"],
)
@pytest.mark.parametrize(("n", "micro_batch"), [(2, 2), (4, 1)])
def test_user_loss_and_optimizers_accumulate_to_stocks_full_batch(
    initial_model, tokenizer, tmp_path, make_kwargs, n, micro_batch
):
    # Stock Trainer at n = 1 on micro-batches of 4 is the reference update; ReviewTrainer at n x micro-batch = 4
    # with the user's loss function or optimizer must make the same updates.
    train = review_dataset(tokenizer, 8, seed=3)
    weights = {}
    for name, trainer_class, accumulation, batch in (("stock", Trainer, 1, 4), ("ours", ReviewTrainer, n, micro_batch)):
        model = copy.deepcopy(initial_model)
        trainer = trainer_class(
            model=model,
            args=quiet_args(
                tmp_path / name,
                per_device_train_batch_size=batch,
                gradient_accumulation_steps=accumulation,
                num_train_epochs=2,
                learning_rate=1e-3,
                train_sampling_strategy="sequential",
            ),
            train_dataset=train,
            data_collator=DataCollatorWithPadding(tokenizer),
            **make_kwargs(model),
        )
        trainer.train()
        assert trainer.state.global_step == 4
        weights[name] = torch.cat([parameter.detach().flatten() for parameter in trainer.model.parameters()])
    moved = (weights["stock"] - torch.cat([p.detach().flatten() for p in initial_model.parameters()])).abs().max()
    assert moved > 1e-3  # the updates are large next to the tolerance
    torch.testing.assert_close(weights["ours"], weights["stock"], rtol=0, atol=1e-5)
