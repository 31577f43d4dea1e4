"""Issue 13: Trainer features that must work with ReviewTrainer as they do with stock Trainer.

Each test checks one break found by running transformers' own Trainer tests on
ReviewTrainer, against stock Trainer on the same arguments (the independent
reference) or against the full-batch reference of the accumulation contract.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import transformers
from helpers import flat_parameters, quiet_args, review_dataset, sgd_args
from test_exactness import reference_full_batch_steps
from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer, TrainerCallback
from transformers.testing_utils import CaptureLogger

from finetune import ReviewTrainer


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


class _Streamed(torch.utils.data.IterableDataset):
    """A streaming review set: the samples of ``dataset`` in order, with no ``__len__``."""

    def __init__(self, dataset):
        self.rows = [dict(row) for row in dataset]

    def __iter__(self):
        return iter(self.rows)


class _RecordLearningRates(TrainerCallback):
    """The LR each optimizer step used, read from the optimizer."""

    def __init__(self):
        self.used = []

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.used.append(optimizer.param_groups[0]["lr"])


# ---------------------------------------------------------------- 1. IterableDataset


def test_iterable_dataset_with_max_steps_trains_exactly(initial_model, tokenizer, tmp_path, capsys):
    # 9 samples, micro-batch 3, n=2: each pass is windows of 6 and 3 samples; 4 updates = two passes.
    dataset = review_dataset(tokenizer, 9)
    collator = DataCollatorWithPadding(tokenizer)
    model = copy.deepcopy(initial_model)
    trainer = ReviewTrainer(
        model=model,
        args=sgd_args(tmp_path, micro_batch=3, accumulation_steps=2, max_steps=4, disable_tqdm=False),
        train_dataset=_Streamed(dataset),
        data_collator=collator,
    )
    result = trainer.train()
    assert result.global_step == 4
    expected = reference_full_batch_steps(initial_model, dataset, collator, window_samples=6, epochs=2)
    assert float((flat_parameters(model) - expected).norm() / expected.norm()) < 1e-6
    bar = capsys.readouterr().err
    assert "4/4" in bar and "update" in bar  # with no epoch length, the bar counts updates out of max_steps


# ------------------------------------------------------ 2. metric-stepped schedulers


@pytest.mark.parametrize(
    ("scheduler", "kwargs"),
    [
        ("reduce_lr_on_plateau", {"patience": 0, "factor": 0.5}),
        ("greedy", {"patience": 0, "factor": 0.5, "min_lr": 1e-6, "max_lr": 1.0}),
    ],
)
def test_metric_stepped_scheduler_steps_after_evaluation_like_stock(
    initial_model, tokenizer, tmp_path, scheduler, kwargs
):
    train, valid = review_dataset(tokenizer, 8, seed=1), review_dataset(tokenizer, 4, seed=2)
    rates = {}
    # The same updates on both sides: stock with micro-batch 4, ours with 2 x 2 (stock's n > 1 updates differ).
    for trainer_class, micro_batch, n in ((Trainer, 4, 1), (ReviewTrainer, 2, 2)):
        recorder = _RecordLearningRates()
        trainer_class(
            model=copy.deepcopy(initial_model),
            args=quiet_args(
                tmp_path / trainer_class.__name__,
                per_device_train_batch_size=micro_batch,
                gradient_accumulation_steps=n,
                num_train_epochs=3,
                learning_rate=0.05,
                lr_scheduler_type=scheduler,
                lr_scheduler_kwargs=kwargs,
                eval_strategy="steps",
                eval_steps=1,
                train_sampling_strategy="sequential",
            ),
            train_dataset=train,
            eval_dataset=valid,
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[recorder],
        ).train()
        rates[trainer_class] = recorder.used
    assert len(rates[ReviewTrainer]) == 6
    assert rates[ReviewTrainer] == pytest.approx(rates[Trainer], rel=1e-9)
    assert len(set(rates[Trainer])) > 1  # the metric moved the rate, so the comparison means something


# ------------------------------------------------------------------------ 3. NEFTune


def test_neftune_hook_is_removed_after_training(initial_model, tokenizer, tmp_path):
    left = {}
    for trainer_class in (Trainer, ReviewTrainer):
        model = copy.deepcopy(initial_model)
        trainer = trainer_class(
            model=model,
            args=quiet_args(tmp_path, per_device_train_batch_size=4, max_steps=1, neftune_noise_alpha=5.0),
            train_dataset=review_dataset(tokenizer, 4),
            data_collator=DataCollatorWithPadding(tokenizer),
        )
        embeddings = model.get_input_embeddings()
        trainer.train()
        left[trainer_class] = (len(embeddings._forward_hooks), hasattr(embeddings, "neftune_noise_alpha"))
    assert left[ReviewTrainer] == left[Trainer] == (0, False)


# ---------------------------------------------------------------- 4. memory metrics


def test_memory_metrics_are_reported_like_stock(initial_model, tokenizer, tmp_path):
    keys = {}
    for trainer_class in (Trainer, ReviewTrainer):
        result = trainer_class(
            model=copy.deepcopy(initial_model),
            args=quiet_args(tmp_path, per_device_train_batch_size=4, max_steps=1, skip_memory_metrics=False),
            train_dataset=review_dataset(tokenizer, 4),
            data_collator=DataCollatorWithPadding(tokenizer),
        ).train()
        keys[trainer_class] = sorted(key for key in result.metrics if "_mem_" in key)
    assert keys[ReviewTrainer] == keys[Trainer]
    assert "train_mem_cpu_alloc_delta" in keys[ReviewTrainer]


# ------------------------------------------------------------------------ 5. banner


def _banner(trainer_class, model, dataset, collator, output_dir) -> list[str]:
    """The "Running training" lines a trainer logs at info level."""
    trainer = trainer_class(
        model=model,
        args=quiet_args(
            output_dir,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=3,
            num_train_epochs=1,
            log_level="info",
        ),
        train_dataset=dataset,
        data_collator=collator,
    )
    try:
        with CaptureLogger(transformers.utils.logging.get_logger("transformers.trainer")) as captured:
            trainer.train()
    finally:
        transformers.utils.logging.set_verbosity_warning()
    lines = captured.out.splitlines()
    start = lines.index("***** Running training *****")
    return lines[start : start + 9]


def test_training_banner_is_logged_like_stock(initial_model, tokenizer, tmp_path):
    dataset, collator = review_dataset(tokenizer, 6), DataCollatorWithPadding(tokenizer)
    stock = _banner(Trainer, copy.deepcopy(initial_model), dataset, collator, tmp_path / "stock")
    ours = _banner(ReviewTrainer, copy.deepcopy(initial_model), dataset, collator, tmp_path / "ours")
    # The same lines and numbers; ours adds the effective batch's factors (micro-batch x n x processes).
    effective = "  Total train batch size (w. parallel, distributed & accumulation) = 6"
    assert effective in stock
    assert ours == [effective + " (2 x 3 x 1)" if line == effective else line for line in stock]


# --------------------------------------------------------- 6. overriding training_step


def _counting(trainer_class):
    class Counting(trainer_class):
        """A user's subclass that overrides training_step and calls super()."""

        calls = 0

        def training_step(self, model, inputs, num_items_in_batch=None):
            type(self).calls += 1
            return super().training_step(model, inputs, num_items_in_batch)

    return Counting


def test_overridden_training_step_is_called_per_micro_batch_and_stays_exact(initial_model, tokenizer, tmp_path):
    # 10 samples in micro-batches of 2, n=3: 5 micro-batches, windows of 6 and 4 samples.
    dataset, collator = review_dataset(tokenizer, 10), DataCollatorWithPadding(tokenizer)
    stock, ours = _counting(Trainer), _counting(ReviewTrainer)
    stock(
        model=copy.deepcopy(initial_model),
        args=sgd_args(tmp_path / "stock", micro_batch=2, accumulation_steps=3),
        train_dataset=dataset,
        data_collator=collator,
    ).train()
    model = copy.deepcopy(initial_model)
    ours(
        model=model,
        args=sgd_args(tmp_path / "ours", micro_batch=2, accumulation_steps=3),
        train_dataset=dataset,
        data_collator=collator,
    ).train()
    assert ours.calls == stock.calls == 5
    expected = reference_full_batch_steps(initial_model, dataset, collator, window_samples=6)
    assert float((flat_parameters(model) - expected).norm() / expected.norm()) < 1e-6


# ------------------------------------------ 7. Trainer's loop hooks, overridden by a subclass


def _with_loop_hooks(trainer_class):
    class WithLoopHooks(trainer_class):
        """A user's subclass overriding the window hook and the log/evaluate/save hook, calling super()."""

        windows_asked: ClassVar[list[int]] = []
        hook_calls = 0

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            type(self).windows_asked.append(num_batches)
            return super().get_batch_samples(epoch_iterator, num_batches, device)

        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, *args, **kwargs):
            type(self).hook_calls += 1
            if self.control.should_log:
                self.log({"my_metric": float(epoch)})
            return super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, *args, **kwargs)

    return WithLoopHooks


def test_overridden_loop_hooks_are_called_like_stock(initial_model, tokenizer, tmp_path):
    # 10 samples in micro-batches of 2 over 2 epochs, n=1: 5 windows an epoch.
    dataset, collator = review_dataset(tokenizer, 10), DataCollatorWithPadding(tokenizer)
    seen = {}
    for trainer_class in (Trainer, ReviewTrainer):
        subclass = _with_loop_hooks(trainer_class)
        trainer = subclass(
            model=copy.deepcopy(initial_model),
            args=quiet_args(
                tmp_path / trainer_class.__name__,
                per_device_train_batch_size=2,
                num_train_epochs=2,
                logging_strategy="steps",
                logging_steps=2,
                train_sampling_strategy="sequential",
            ),
            train_dataset=dataset,
            data_collator=collator,
        )
        trainer.train()
        logged = [entry["my_metric"] for entry in trainer.state.log_history if "my_metric" in entry]
        seen[trainer_class] = (subclass.windows_asked, subclass.hook_calls, logged)
    assert seen[ReviewTrainer] == seen[Trainer]
    assert seen[Trainer][0] == [1] * 10 and seen[Trainer][1] == 12 and len(seen[Trainer][2]) == 5


def test_windows_are_drawn_through_get_batch_samples(initial_model, tokenizer, tmp_path):
    # 10 samples in micro-batches of 2, n=3: windows ask for 3 micro-batches, then the 2 left.
    dataset, collator = review_dataset(tokenizer, 10), DataCollatorWithPadding(tokenizer)
    subclass = _with_loop_hooks(ReviewTrainer)
    model = copy.deepcopy(initial_model)
    subclass(
        model=model,
        args=sgd_args(tmp_path, micro_batch=2, accumulation_steps=3),
        train_dataset=dataset,
        data_collator=collator,
    ).train()
    assert subclass.windows_asked == [3, 2]
    expected = reference_full_batch_steps(initial_model, dataset, collator, window_samples=6)
    assert float((flat_parameters(model) - expected).norm() / expected.norm()) < 1e-6


# ------------------------------------------------ 8. a stop asked for inside a window


class _StopInsideSecondWindow(TrainerCallback):
    """Asks the run to stop after the first micro-batch of the second window; counts optimizer steps."""

    def __init__(self):
        self.optimizer_steps = 0

    def on_substep_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            control.should_training_stop = True

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer_steps += 1


def test_stop_inside_a_window_makes_no_further_update_like_stock(initial_model, tokenizer, tmp_path):
    # 8 samples in micro-batches of 2, n=2: stock stops right after the substep, without an update.
    dataset, collator = review_dataset(tokenizer, 8), DataCollatorWithPadding(tokenizer)
    counts = {}
    for trainer_class in (Trainer, ReviewTrainer):
        recorder = _StopInsideSecondWindow()
        model = copy.deepcopy(initial_model)
        trainer = trainer_class(
            model=model,
            args=sgd_args(tmp_path / trainer_class.__name__, micro_batch=2, accumulation_steps=2),
            train_dataset=dataset,
            data_collator=collator,
            callbacks=[recorder],
        )
        trainer.train()
        counts[trainer_class] = (trainer.state.global_step, recorder.optimizer_steps)
        if trainer_class is ReviewTrainer:
            # Only the first window was applied, and the stopped window's gradients were not kept.
            expected = reference_full_batch_steps(initial_model, dataset.select(range(4)), collator, window_samples=4)
            assert float((flat_parameters(model) - expected).norm() / expected.norm()) < 1e-6
            assert all(parameter.grad is None for parameter in model.parameters())
    assert counts[ReviewTrainer] == counts[Trainer] == (1, 1)


class _StopInsideFirstWindowOfEpoch2(TrainerCallback):
    """Asks the run to stop after the first micro-batch of epoch 2 (update 5 of a run of 4 updates an epoch)."""

    def on_substep_end(self, args, state, control, **kwargs):
        if state.global_step == 4:
            control.should_training_stop = True


def test_stop_inside_a_window_leaves_every_checkpoint_exact(tiny_dropout_model_dir, tokenizer, tmp_path):
    # Stock saves again at the epoch's end, over checkpoint-4, with the random state the abandoned window
    # drew: resumed from it, a run with dropout drifts (relative 1e-3). Ours keeps checkpoint-4 exact.
    dataset, collator = review_dataset(tokenizer, 16), DataCollatorWithPadding(tokenizer)

    def run(output_dir, resume=None, callbacks=()):
        model = BertForSequenceClassification.from_pretrained(tiny_dropout_model_dir)
        args = quiet_args(
            output_dir,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            num_train_epochs=2,
            learning_rate=1e-3,
            save_strategy="epoch",
            train_sampling_strategy="sequential",
        )
        trainer = ReviewTrainer(
            model=model, args=args, train_dataset=dataset, data_collator=collator, callbacks=list(callbacks)
        )
        trainer.train(resume_from_checkpoint=resume)
        return flat_parameters(model)

    uninterrupted = run(tmp_path / "whole")
    run(tmp_path / "stopped", callbacks=[_StopInsideFirstWindowOfEpoch2()])
    stopped = tmp_path / "stopped"
    assert sorted(path.name for path in stopped.glob("checkpoint-*")) == ["checkpoint-4"]
    assert (stopped / "checkpoint-4" / "rng_state.pth").read_bytes() == (
        tmp_path / "whole" / "checkpoint-4" / "rng_state.pth"
    ).read_bytes()
    assert torch.equal(run(stopped, resume=str(stopped / "checkpoint-4")), uninterrupted)


# ------------------------------------------- 9. checkpoints: the best one, the Hub, no update left


def test_a_new_best_checkpoint_names_itself_in_its_state_like_stock(initial_model, tokenizer, tmp_path):
    dataset, valid = review_dataset(tokenizer, 8, seed=3), review_dataset(tokenizer, 4, seed=4)
    recorded = {}
    for trainer_class in (Trainer, ReviewTrainer):
        output_dir = tmp_path / trainer_class.__name__
        trainer_class(
            model=copy.deepcopy(initial_model),
            args=quiet_args(
                output_dir,
                per_device_train_batch_size=2,
                num_train_epochs=1,
                learning_rate=1e-3,
                eval_strategy="steps",
                eval_steps=1,
                save_strategy="steps",
                save_steps=1,
                metric_for_best_model="loss",
                load_best_model_at_end=True,
                train_sampling_strategy="sequential",
            ),
            train_dataset=dataset,
            eval_dataset=valid,
            data_collator=DataCollatorWithPadding(tokenizer),
        ).train()
        recorded[trainer_class] = {
            folder.name: (json.loads((folder / "trainer_state.json").read_text())["best_model_checkpoint"] or "").split(
                "/"
            )[-1]
            for folder in sorted(output_dir.glob("checkpoint-*"))
        }
    assert recorded[ReviewTrainer] == recorded[Trainer]
    assert any(name == best for name, best in recorded[Trainer].items())  # some checkpoint was a new best


def test_checkpoints_are_pushed_to_the_hub_like_stock(initial_model, tokenizer, tmp_path, monkeypatch):
    pushed = {Trainer: [], ReviewTrainer: []}
    # No network: the Hub calls are replaced by recorders, on the Trainer class both sides inherit from.
    monkeypatch.setattr(Trainer, "init_hf_repo", lambda self, token=None, private=None: None)
    monkeypatch.setattr(
        Trainer, "_push_from_checkpoint", lambda self, folder: pushed[type(self)].append(Path(folder).name)
    )
    monkeypatch.setattr(Trainer, "_finish_current_push", lambda self: None)
    for trainer_class in (Trainer, ReviewTrainer):
        trainer_class(
            model=copy.deepcopy(initial_model),
            args=quiet_args(
                tmp_path / trainer_class.__name__,
                per_device_train_batch_size=2,
                num_train_epochs=1,
                save_strategy="steps",
                save_steps=2,
                push_to_hub=True,
                hub_model_id="me/reviews",
                hub_strategy="every_save",
            ),
            train_dataset=review_dataset(tokenizer, 8),
            data_collator=DataCollatorWithPadding(tokenizer),
        ).train()
    assert pushed[ReviewTrainer] == pushed[Trainer] == ["checkpoint-2", "checkpoint-4"]


def test_train_loss_of_a_run_with_no_update_left_is_stocks(initial_model, tokenizer, tmp_path):
    # A finished run resumed from its last checkpoint makes no update.
    losses = {}
    for trainer_class in (Trainer, ReviewTrainer):
        output_dir = tmp_path / trainer_class.__name__
        for resume in (None, str(output_dir / "checkpoint-4")):
            result = trainer_class(
                model=copy.deepcopy(initial_model),
                args=quiet_args(output_dir, per_device_train_batch_size=2, num_train_epochs=1, save_strategy="epoch"),
                train_dataset=review_dataset(tokenizer, 8),
                data_collator=DataCollatorWithPadding(tokenizer),
            ).train(resume_from_checkpoint=resume)
        losses[trainer_class] = result.training_loss
    assert losses[ReviewTrainer] == losses[Trainer] == 0.0


def test_resuming_a_finished_max_steps_run_makes_no_update(initial_model, tokenizer, tmp_path):
    # max_steps=3 ends mid-epoch (4 micro-batches an epoch). Stock Trainer, resumed from checkpoint-3, makes
    # a 4th update, as its stop is checked only after an update; the run was finished, so none is made here.
    dataset, collator = review_dataset(tokenizer, 8), DataCollatorWithPadding(tokenizer)
    steps = {}
    for trainer_class in (Trainer, ReviewTrainer):
        output_dir = tmp_path / trainer_class.__name__
        for resume in (None, str(output_dir / "checkpoint-3")):
            model = copy.deepcopy(initial_model)
            trainer = trainer_class(
                model=model,
                args=sgd_args(output_dir, micro_batch=2, accumulation_steps=1, max_steps=3, save_strategy="steps"),
                train_dataset=dataset,
                data_collator=collator,
            )
            trainer.train(resume_from_checkpoint=resume)
        steps[trainer_class] = trainer.state.global_step
        if trainer_class is ReviewTrainer:
            saved = BertForSequenceClassification.from_pretrained(output_dir / "checkpoint-3")
            assert torch.equal(flat_parameters(model), flat_parameters(saved))
    assert steps == {Trainer: 4, ReviewTrainer: 3}


# ------------------------------------------- 8. what stock's training_step does besides the loss


@pytest.mark.parametrize("every", [1, 2])
def test_torch_empty_cache_steps_empties_the_cache_as_often_as_stock(
    initial_model, tokenizer, tmp_path, monkeypatch, every
):
    import finetune.training.trainer as review_trainer_module

    calls = {Trainer: 0, ReviewTrainer: 0}
    for trainer_class, module in ((Trainer, transformers.trainer), (ReviewTrainer, review_trainer_module)):

        def count(trainer_class=trainer_class):
            calls[trainer_class] += 1

        monkeypatch.setattr(module, "clear_device_cache", count)
        trainer_class(
            model=copy.deepcopy(initial_model),
            args=sgd_args(tmp_path / trainer_class.__name__, 2, 2, torch_empty_cache_steps=every),
            train_dataset=review_dataset(tokenizer, 16),  # 8 micro-batches, 4 updates
            data_collator=DataCollatorWithPadding(tokenizer),
        ).train()
    assert calls[ReviewTrainer] == calls[Trainer] == 8 // every


def test_lomo_is_told_the_learning_rate_in_backward_as_stock_tells_it(initial_model, tokenizer, tmp_path):
    # LOMO updates the weights inside backward, from the learning rate Accelerate hands it there.
    # (lomo-optim is not installed here: the optimizer is AdamW, and only the switch is LOMO's.)
    batch = DataCollatorWithPadding(tokenizer)([dict(row) for row in review_dataset(tokenizer, 4)])
    seen = {}
    for trainer_class in (Trainer, ReviewTrainer):
        trainer = trainer_class(
            model=copy.deepcopy(initial_model),
            args=quiet_args(tmp_path / trainer_class.__name__, learning_rate=3e-4, warmup_steps=2),
            train_dataset=review_dataset(tokenizer, 8),
        )
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        trainer.optimizer.step()  # no gradients yet: changes nothing, but lets the scheduler step
        trainer.lr_scheduler.step()  # half-way through the warm-up: lr 1.5e-4
        trainer.args.optim = "lomo"
        trainer.current_gradient_accumulation_steps = 1  # stock's loop sets it per window
        trainer.accelerator.backward = lambda loss, trainer_class=trainer_class, **kwargs: seen.update(
            {trainer_class: kwargs}
        )
        trainer.training_step(trainer.model, dict(batch))
    assert seen[ReviewTrainer] == seen[Trainer] == {"learning_rate": pytest.approx(1.5e-4)}


def test_current_gradient_accumulation_steps_is_each_windows_length_as_stock(initial_model, tokenizer, tmp_path):
    seen = {}
    for trainer_class in (Trainer, ReviewTrainer):

        class Recording(trainer_class):
            recorded_as = trainer_class

            def training_step(self, model, inputs, num_items_in_batch=None):
                seen.setdefault(self.recorded_as, []).append(self.current_gradient_accumulation_steps)
                return super().training_step(model, inputs, num_items_in_batch)

        Recording(
            model=copy.deepcopy(initial_model),
            args=sgd_args(tmp_path / trainer_class.__name__, 2, 2),
            train_dataset=review_dataset(tokenizer, 10),  # 5 micro-batches: windows of 2, 2 and 1
            data_collator=DataCollatorWithPadding(tokenizer),
        ).train()
    assert seen[ReviewTrainer] == seen[Trainer] == [2, 2, 2, 2, 1]
