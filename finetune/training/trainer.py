"""``ReviewTrainer``: ``transformers.Trainer`` with an exact gradient-accumulation loop.

Stock ``Trainer`` divides each micro-batch loss by the number of micro-batches
in the window, or (for models that accept ``num_items_in_batch``, BERT
classifiers included) by nothing at all, which makes updates n times too large.
Here each micro-batch's loss is its share of the window's items (what the loss
averages over: reviews, label tokens, next tokens), so every update equals one
full-batch step on the window's samples, whatever the size of the last
micro-batch or window. See the README's
"Accumulation contract" for what is promised and tested.

Everything else (optimizer and scheduler creation, Accelerate, evaluation,
checkpoints, callbacks) is Trainer's own; only the inner loop is replaced.

``_run_accumulation_loop`` reads top to bottom: epochs, windows, micro-batches,
one update per window. Its terms:

- **stock**: what ``transformers.Trainer`` itself does; tests/test_drop_in.py
  and test_trainer_compat.py run both and compare.
- **micro-batch**: what the dataloader yields on one process
  (``per_device_train_batch_size`` reviews); a **micro-step** is its forward
  and backward.
- **window**: the ``gradient_accumulation_steps`` (n) micro-batches of one
  update; an epoch's last window may be shorter and is trained, not dropped.
- **update**: one optimizer and scheduler step on the window's gradient;
  ``state.global_step`` counts updates.
- **items**: what a micro-batch's loss averages over (``loss_items`` in
  accumulation.py): its reviews, label tokens or next tokens, or with class
  weights their summed weights. ``training_step`` is given the window's items
  on all processes as ``num_items_in_batch``, as stock passes them, and
  backpropagates the micro-batch's **share** of the window's mean loss (its
  summed item losses over the window's items), so a window's gradient is
  that of one full batch.
- **global micro-batch**: micro-batch k of every process together; with N
  processes it holds one process's micro-batch k of N x b. A process's part of
  it is its **share**; an **empty share** is none at all (the epoch's last
  global micro-batch may be short).
- **stand-in**: what a process with an empty share forwards, with weight 0
  (the training set's first sample), since every process must join the
  window's gradient all-reduce.
- **ran dry**: an ``IterableDataset`` pass that gave no batch; the run stops.
- **stopped in a window**: a callback stopped between two micro-steps; as
  stock, that window makes no update.

How N processes share a window: docs/development.md, "The loop on several processes".
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import skip_first_batches
from accelerate.utils import DistributedType
from accelerate.utils.memory import clear_device_cache
from torch import nn
from transformers import ProgressCallback, Trainer
from transformers.integrations.neftune import deactivate_neftune
from transformers.optimization import GreedyLR
from transformers.trainer_pt_utils import LengthGroupedSampler, get_model_param_count
from transformers.trainer_utils import SaveStrategy, TrainOutput, has_length, speed_metrics
from transformers.training_args import OptimizerNames
from transformers.utils import logging

from ..config.arguments import validate_accumulation_steps
from ..config.tasks import MULTI_LABEL, ORDERED_TASKS, ORDINAL, task_of_model
from ..data.class_weights import (
    class_weights_for,
    positive_weights_for,
    training_label_rows,
    training_labels,
    validate_class_weights,
)
from ..data.collation import faster_collator
from ..data.columns import column_values, token_counts
from ..errors import FinetuneError
from ..fast_path.packed_attention import attention_group_limit
from ..fast_path.readings import position_offset, reading_for_scores, reading_for_training
from .accumulation import (
    epochs_to_run,
    loss_items,
    takes_item_count,
    total_updates,
    updates_per_epoch,
    weighted_share,
)
from .checkpointing import CrashSafeCheckpoints
from .cuda_graphs import OwnedGradients, copied_tensors, uses_cuda_graphs
from .device_copies import to_device_without_waiting
from .distributed import SeedableLengthGroupedSampler, stand_in_batch, with_empty_shares
from .layers import encoder_parameters, freeze_lower_layers, layerwise_parameter_groups
from .micro_batches import cut_window, keep_features
from .ordered_heads import corn_loss, regression_loss
from .progress import EpochProgressBar, EvaluationProgressCallback
from .sorted_evaluation import LengthSortedSampler, in_dataset_order, prediction_in_dataset_order, sorted_order

# Trainer's own logger, so that the banner and warnings below follow transformers' verbosity
# (`log_level`, `transformers.logging.set_verbosity_info()`) and land where stock Trainer's do.
logger = logging.get_logger("transformers.trainer")

# Schedulers that step on an evaluation metric: Trainer's _evaluate steps them after each
# evaluation, so the loop must not step them on updates.
METRIC_STEPPED_SCHEDULERS = (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR)


class ReviewTrainer(CrashSafeCheckpoints, Trainer):
    """A drop-in ``Trainer`` whose ``train()`` runs an exact accumulation loop.

    ``gradient_accumulation_steps`` (``n_accumulate``) micro-batches make one
    window; the optimizer and the LR scheduler step once per window, and
    ``state.global_step`` counts windows (updates).

    ``class_weights`` (one per class), or ``class_weighting: balanced`` (or
    ``sqrt``) in the arguments, turns the loss into a class-weighted cross-entropy: each
    review's loss counts with its class's weight, and the window's loss is the
    weighted mean over all its reviews, as for one full batch. A model with
    ``problem_type="multi_label_classification"`` (several tags per review) is
    trained with binary cross-entropy per tag, and the weights are each tag's
    ``pos_weight`` (``balanced``: its negatives over its positives). A rating
    model (``regression``, ``ordinal``) is trained with its own loss
    (:mod:`.ordered_heads`), counted in its own items (``loss_items``).

    On N processes (DDP through ``torchrun`` or ``accelerate launch``) with
    micro-batch b it makes the same updates as one process with N x b;
    docs/development.md ("The loop on several processes") says how.
    """

    def __init__(self, *args: Any, class_weights: Sequence[float] | torch.Tensor | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        validate_accumulation_steps(self.args.gradient_accumulation_steps)
        # The same batches, padded without tokenizer.pad's Python loops (on a GPU the host pads between kernels).
        self.data_collator = faster_collator(self.data_collator)
        # Our loop draws its own per-epoch bar; keep stock evaluation bars.
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(EvaluationProgressCallback)
        trainable_layers = getattr(self.args, "trainable_layers", None)
        if trainable_layers is not None:
            freeze_lower_layers(self.model, trainable_layers)
        self.skipped_updates = 0
        self.nonfinite_in_a_row = 0
        # Wall-clock seconds train() spent evaluating and saving checkpoints (finetune train's breakdown).
        self.seconds_in = {"evaluation": 0.0, "checkpoint_saves": 0.0}
        # Several tags per review: a sigmoid and binary cross-entropy per tag, and class weights are per-tag
        # pos_weight (transformers' own problem_type, so the saved folder loads and scores as stock).
        self.task = task_of_model(self.model.config)
        self.multi_label = self.task == MULTI_LABEL
        strategy = getattr(self.args, "class_weighting", "none")
        if strategy != "none" and self.task in ORDERED_TASKS:
            raise FinetuneError(
                f"class_weighting weighs classes of a softmax, and this is a {self.task} run (ordered ratings); "
                "set class_weighting: none"
            )
        if class_weights is None and strategy != "none":
            # Only then is the train split read: an evaluation-only or iterable dataset has no labels column.
            num_labels = self.model.config.num_labels
            if self.multi_label:
                class_weights = positive_weights_for(strategy, training_label_rows(self.train_dataset), num_labels)
            else:
                class_weights = class_weights_for(strategy, training_labels(self.train_dataset), num_labels)
        if class_weights is not None:
            class_weights = validate_class_weights(class_weights, self.model.config.num_labels)
        self.class_weights = None if class_weights is None else torch.as_tensor(class_weights, dtype=torch.float32)
        self._class_weights_on_device: torch.Tensor | None = None  # a copy where the labels are, made once
        # What a rank with no sample in a global micro-batch forwards, weighted 0 (set when training starts).
        self._stand_in: dict[str, Any] | None = None
        # How windows are cut into pieces (see micro_batches.py): a token budget (halved on out-of-memory)
        # and whether pieces are packed rows. Neither set: the dataloader's micro-batches, as stock.
        self.micro_batch_tokens: int | None = getattr(self.args, "micro_batch_tokens", None)
        self.padding_free: bool = bool(getattr(self.args, "padding_free", False))
        # MPNet's attention through SDPA (see fast_path/mpnet.py); stock TrainingArguments get it too.
        self.fused_attention: bool = bool(getattr(self.args, "fused_attention", True))
        self._piece_collator: Any = None  # the run's collator, applied to each piece once a window is cut
        # A packed row's position ids start where the model's do (RoBERTa's and MPNet's after their padding id).
        self._position_offset = position_offset(self.model) if self.padding_free else 0
        # How many attention scores a packed row's group of reviews may hold (on a CPU, under malloc's mmap
        # threshold); set when training starts, on the device it trains on.
        self._attention_group_scores: int | None = None
        # Under CUDA graphs a window's gradients, and evaluation's outputs, are copied out of the graph's memory
        # before the next replay overwrites them (see cuda_graphs.py); None without CUDA graphs.
        self._under_cuda_graphs = uses_cuda_graphs(self.args)
        self._owned_gradients = OwnedGradients() if self._under_cuda_graphs else None

    @property
    def cuts_windows(self) -> bool:
        """Whether windows are cut into pieces here (by tokens, or packed) rather than taken as the loader made them."""
        return self.micro_batch_tokens is not None or self.padding_free

    # ------------------------------------------------------------------- data

    def get_train_dataloader(self) -> Any:
        """Trainer's training dataloader, sharded without padding: the last global micro-batch may be short.

        An ``IterableDataset`` keeps Accelerate's padding: with no length, ranks
        cannot agree in advance on how many rounds an epoch has, and padding
        keeps them in step (as in stock Trainer).
        """
        even_batches = self.accelerator.even_batches
        # even_batches would fill the last global micro-batch with repeats of the epoch's first
        # samples, training them twice; with_empty_shares covers the ranks left without a share.
        self.accelerator.even_batches = not has_length(self.train_dataset) and even_batches
        collator = self.data_collator
        if self.cuts_windows:
            # The loader yields the features as they are; each piece is collated once the window is cut.
            self._piece_collator, self.data_collator = collator, keep_features
        try:
            return super().get_train_dataloader()
        finally:
            self.accelerator.even_batches = even_batches
            self.data_collator = collator

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        """Trainer's sampler, except that ``group_by_length`` is seeded per epoch and groups whole global windows.

        Stock ``LengthGroupedSampler`` shuffles with the global random state, which
        dropout also draws from: a resumed run (and every other rank) would draw
        another order. Seeded with ``seed + epoch``, the order is the same in all.
        """
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        # Sorted groups span a global window (N x b x n samples), as one process's span its window.
        window = self.args.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size
        if self.args.train_sampling_strategy == "group_by_length":
            # Read from the Arrow table at once: stock decodes every row for its length (2.6 s at 40,000 reviews).
            lengths = self._sample_lengths(train_dataset if train_dataset is not None else self.train_dataset)
            if lengths is not None:
                return SeedableLengthGroupedSampler(window, lengths, seed)
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is LengthGroupedSampler:
            return SeedableLengthGroupedSampler(window, sampler.lengths, seed)
        return sampler

    def _sample_lengths(self, dataset: Any) -> list[int] | None:
        """Each sample's length from a ``datasets.Dataset``'s length column or token lists; None for other datasets.

        Stock Trainer reads ``length_column_name`` as a lazy column (an Arrow lookup
        per sample in every sort) or decodes every row to measure its inputs; a
        slice of the column, or the Arrow list lengths, give the same numbers at once.
        """
        import datasets

        if not isinstance(dataset, datasets.Dataset):
            return None
        if self.args.length_column_name in dataset.column_names:
            return [int(length) for length in column_values(dataset, self.args.length_column_name)]
        input_name = self.processing_class.model_input_names[0] if self.processing_class is not None else "input_ids"
        if input_name not in dataset.column_names:
            return None
        return token_counts(dataset, input_name)

    def _get_eval_sampler(self, eval_dataset: Any) -> torch.utils.data.Sampler | None:
        """Evaluation and prediction in batches of reviews sorted by length (:mod:`.sorted_evaluation`).

        Kept stock where the results could not be put back in dataset order:
        metrics computed batch by batch, or predictions returned as a list of
        batches (``eval_do_concat_batches: false``).
        """
        lengths = None
        if not self.args.batch_eval_metrics and self.args.eval_do_concat_batches:
            lengths = self._sample_lengths(eval_dataset)
        if lengths is None:
            return super()._get_eval_sampler(eval_dataset)
        return LengthSortedSampler(lengths)

    def evaluation_loop(self, dataloader: Any, description: str, *args: Any, **kwargs: Any) -> Any:
        """Trainer's evaluation and prediction loop, reading the model more cheaply for the same logits.

        Read through :func:`..fast_path.readings.reading_for_scores`: a BERT or
        RoBERTa classifier's last layer computes only its first tokens, the head
        reading nothing else, so the logits (and the loss) are the same and about
        a sixth of the work goes; MPNet's attention goes through SDPA unless
        ``fused_attention`` is false. Rows scored sorted by length come back in
        dataset order (:mod:`.sorted_evaluation`).
        """
        order = sorted_order(dataloader)
        compute_metrics = self.compute_metrics
        if order is not None and compute_metrics is not None:
            # Metrics see the rows in dataset order, whatever order they were scored in.
            self.compute_metrics = lambda prediction: compute_metrics(prediction_in_dataset_order(prediction, order))
        try:
            with reading_for_scores(self.accelerator.unwrap_model(self.model), self.fused_attention):
                output = super().evaluation_loop(dataloader, description, *args, **kwargs)
        finally:
            self.compute_metrics = compute_metrics
        if order is None:
            return output
        return output._replace(
            predictions=in_dataset_order(output.predictions, order), label_ids=in_dataset_order(output.label_ids, order)
        )

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """Trainer's; under CUDA graphs the loss and logits are copied, as evaluation keeps them past the next batch."""
        outputs = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        return copied_tensors(outputs) if self._under_cuda_graphs else outputs

    # -------------------------------------------------------------- optimizer

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Trainer's optimizer; with ``layerwise_lr_decay`` or ``head_learning_rate``, one group per layer depth."""
        decay = getattr(self.args, "layerwise_lr_decay", 1.0)
        head_learning_rate = getattr(self.args, "head_learning_rate", None)
        if self.optimizer is not None or (decay == 1.0 and head_learning_rate is None):
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        groups = layerwise_parameter_groups(
            opt_model,
            self.args.learning_rate,
            decay,
            head_learning_rate,
            self.args.weight_decay,
            self.get_decay_parameter_names(opt_model),
        )
        if self.optimizer_cls_and_kwargs is not None:
            optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
        else:
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def _get_learning_rate(self) -> float:
        """The scheduled rate of ``learning_rate``: what the bar, the logs and ``report/lr.png`` show.

        Trainer reads the first parameter group, which is the head's (see
        ``layerwise_parameter_groups``). With a ``head_learning_rate`` of its own
        the head runs at another rate, and the schedule scales every group by the
        same factor, so the head's rate times learning_rate / head_learning_rate
        is the recipe's ``learning_rate`` as scheduled.
        """
        rate = super()._get_learning_rate()
        head_learning_rate = getattr(self.args, "head_learning_rate", None)
        groups = self.optimizer.param_groups if self.optimizer is not None else []
        # Only our groups carry a depth; a head rate of 0 (a frozen head) leaves nothing to scale from.
        if head_learning_rate and groups and "depth" in groups[0]:
            return rate * self.args.learning_rate / head_learning_rate
        return rate

    # ------------------------------------------------------------------ setup

    def _inner_training_loop(
        self,
        batch_size: int | None = None,
        args: Any = None,
        resume_from_checkpoint: str | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """Count updates, build optimizer and scheduler for them, then run the accumulation loop."""
        args = args or self.args
        self.accelerator.free_memory()
        if args.auto_find_batch_size:
            self._update_auto_batch_size(batch_size)
        train_dataloader = self.get_train_dataloader()
        micro_batches_per_epoch, updates_in_epoch, max_steps, num_epochs = self._count_updates(args, train_dataloader)

        # Trainer's own helpers build the state, the optimizer and a scheduler
        # sized in updates (warmup included), and prepare everything with Accelerate.
        epochs_trained, micro_batches_done = self._init_training_state(
            max_steps, updates_in_epoch, num_epochs, resume_from_checkpoint, trial
        )
        model, train_dataloader = self._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        self._log_training_banner(model, train_dataloader, num_epochs, updates_in_epoch, max_steps)
        if resume_from_checkpoint is not None:
            logger.info(
                f"  Resuming training from checkpoint with epoch {epochs_trained} and global step "
                f"{self.state.global_step}; skipping {micro_batches_done} micro-batches of that epoch"
            )
        with self._training_readings(model):
            return self._run_accumulation_loop(
                model=model,
                train_dataloader=train_dataloader,
                num_epochs=num_epochs,
                micro_batches_per_epoch=micro_batches_per_epoch,
                start_epoch=epochs_trained,
                micro_batches_done=micro_batches_done,
                resume_from_checkpoint=resume_from_checkpoint,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
            )

    def _count_updates(self, args: Any, train_dataloader: Any) -> tuple[int | None, int, int, int]:
        """``(micro_batches_per_epoch, updates_in_epoch, max_steps, num_epochs)`` of the run, in updates.

        ``micro_batches_per_epoch`` is None for an ``IterableDataset``, whose
        length is unknown: ``max_steps`` (which Trainer requires for one) then
        counts the run's updates, and an epoch is one pass, however many
        updates it holds.
        """
        accumulation_steps = args.gradient_accumulation_steps
        if not has_length(train_dataloader):
            return None, args.max_steps, args.max_steps, sys.maxsize
        # Global micro-batches: a rank left without a share of the last one still takes that step.
        micro_batches_per_epoch = self._max_over_processes(len(train_dataloader))
        if micro_batches_per_epoch == 0:
            raise ValueError("the training set gives no batches; give it at least one review")
        updates_in_epoch = updates_per_epoch(micro_batches_per_epoch, accumulation_steps)
        if accumulation_steps > micro_batches_per_epoch and args.should_log:
            warnings.warn(
                f"gradient_accumulation_steps={accumulation_steps} is more than the {micro_batches_per_epoch} "
                "micro-batches in an epoch: each epoch makes a single update from all of them",
                UserWarning,
                stacklevel=3,
            )
        max_steps = total_updates(micro_batches_per_epoch, accumulation_steps, args.num_train_epochs, args.max_steps)
        return micro_batches_per_epoch, updates_in_epoch, max_steps, epochs_to_run(max_steps, updates_in_epoch)

    @contextlib.contextmanager
    def _training_readings(self, model: nn.Module) -> Iterator[None]:
        """The run's cheaper readings of the model (:mod:`..fast_path`), for training only."""
        unwrapped = self.accelerator.unwrap_model(model)
        if self.padding_free:
            self._attention_group_scores = attention_group_limit(unwrapped, self.args.device)
        with reading_for_training(unwrapped, packed=self.padding_free, fused_attention=self.fused_attention):
            yield

    def _log_training_banner(
        self, model: nn.Module, train_dataloader: Any, num_epochs: int, updates_in_epoch: int, max_steps: int
    ) -> None:
        """Trainer's "***** Running training *****" lines, with this loop's counts and effective batch."""
        micro_batch = self._train_batch_size
        accumulation_steps = self.args.gradient_accumulation_steps
        processes = self.args.world_size
        effective_batch = micro_batch * accumulation_steps * processes
        if has_length(train_dataloader):
            examples = f"{self.num_examples(train_dataloader):,}"
            epochs = f"{num_epochs:,}"
        else:
            examples = f"{effective_batch * max_steps:,} (at most; an IterableDataset has no length)"
            epochs = "until max_steps (an IterableDataset has no length)"
        logger.info("***** Running training *****")
        logger.info(f"  Num examples = {examples}")
        logger.info(f"  Num Epochs = {epochs}")
        logger.info(f"  Num update steps per epoch = {updates_in_epoch:,}")
        logger.info(f"  Instantaneous batch size per device = {self.args.per_device_train_batch_size:,}")
        if self.args.per_device_train_batch_size != micro_batch:
            logger.info(f"  Training with DataParallel so batch size has been adjusted to: {micro_batch:,}")
        logger.info(
            "  Total train batch size (w. parallel, distributed & accumulation) = "
            f"{effective_batch:,} ({micro_batch} x {accumulation_steps} x {processes})"
        )
        logger.info(f"  Gradient Accumulation steps = {accumulation_steps}")
        logger.info(f"  Total optimization steps = {max_steps:,}")
        logger.info(f"  Number of trainable parameters = {get_model_param_count(model, trainable_only=True):,}")

    # ------------------------------------------------------------------- loop

    def _run_accumulation_loop(
        self,
        model: nn.Module,
        train_dataloader: Any,
        num_epochs: int,
        micro_batches_per_epoch: int | None,
        start_epoch: int,
        micro_batches_done: int,
        resume_from_checkpoint: str | None,
        trial: Any,
        ignore_keys_for_eval: list[str] | None,
    ) -> TrainOutput:
        """The training loop: epochs of windows of micro-batches, one update per window.

        ``micro_batches_per_epoch`` is None for an ``IterableDataset``: an epoch
        is then one pass over it, and ``max_steps`` ends the run.
        """
        run = _Run(time.time(), num_epochs, micro_batches_per_epoch, trial, ignore_keys_for_eval)
        self._start_run(model, train_dataloader, run)
        # A run resumed from its final checkpoint has nothing left to do. Stock Trainer makes one more
        # update when that checkpoint is mid-epoch (a max_steps run): its stop is checked after each update.
        finished = self.state.global_step >= self.state.max_steps > 0
        for index in range(start_epoch, start_epoch if finished else num_epochs):
            # Only the first epoch of a resumed run skips micro-batches and restores the random state.
            resumed = (micro_batches_done, resume_from_checkpoint) if index == start_epoch else (0, None)
            epoch = self._start_epoch(train_dataloader, run, index, *resumed)
            for window in self._windows(epoch.batches, epoch.micro_batches_left):
                self.control = self.callback_handler.on_step_begin(self.args, self.state, self.control)
                window_loss = self._accumulate_window(model, window, epoch.loss, epoch.bar)
                if window_loss is None:
                    # A callback stopped inside the window: as stock, the window makes no update.
                    model.zero_grad(set_to_none=True)
                    epoch.stopped_in_window = True
                    break
                epoch.micro_step += len(window)
                epoch.grad_norm, epoch.learning_rate = self._update(model, window_loss)
                epoch.loss.add(window_loss)
                self._count_update(run, epoch, window_loss)
                self.control = self.callback_handler.on_step_end(self.args, self.state, self.control)
                self._log_save_evaluate(model, run, epoch)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    break
            self._end_epoch(model, run, epoch)
            if self.control.should_training_stop:
                break
        return self._finalize_training(trial, None, run.start_time)

    def _start_run(self, model: nn.Module, train_dataloader: Any, run: _Run) -> None:
        """Reset the run's counters and loss trackers, pick the stand-in batch, then ``on_train_begin``."""
        self._initial_num_input_tokens_seen = self.state.num_input_tokens_seen
        self._initial_global_step = self.state.global_step
        self._globalstep_last_logged = self.state.global_step
        # On self, not on run: the Trainer hooks we override (_maybe_log_save_evaluate,
        # _finalize_training) keep their stock signatures and read them here.
        self._loss_since_log = _LossTracker()
        self._run_loss = _LossTracker()
        # What a rank forwards, with weight 0, for a global micro-batch in which it has no samples
        # (an IterableDataset keeps Accelerate's padding instead, see get_train_dataloader).
        self._stand_in = (
            stand_in_batch(train_dataloader) if self.accelerator.num_processes > 1 and run.length_known else None
        )
        if self._stand_in is not None and self.cuts_windows:
            self._stand_in = self._cut_window([self._stand_in], token_budget=None)[0]
        # What state.epoch's fraction counts: with no length, stock Trainer's stand-in of max_steps windows.
        run.epoch_micro_batches = (
            run.micro_batches_per_epoch
            if run.length_known
            else self.state.max_steps * self.args.gradient_accumulation_steps
        )
        model.zero_grad(set_to_none=True)

        self.control = self.callback_handler.on_train_begin(self.args, self.state, self.control)
        if self.args.eval_on_start:
            with self._timed("evaluation"):
                self._evaluate(run.trial, run.ignore_keys_for_eval, skip_scheduler=True)

    def _start_epoch(
        self, train_dataloader: Any, run: _Run, index: int, micro_batches_done: int, checkpoint: str | None
    ) -> _Epoch:
        """The epoch's batches (past ``micro_batches_done`` when resuming inside it), its bar, ``on_epoch_begin``."""
        batches = self._epoch_batches(train_dataloader, index)
        if micro_batches_done > 0:
            # Resuming inside an epoch: checkpoints sit on update boundaries, so skipping
            # whole windows lands exactly where the interrupted run stopped.
            batches = _started(skip_first_batches(batches, micro_batches_done))
            # Only now: starting the iterator above drew from the global random state, as the
            # interrupted run did at the start of the epoch, before the state it saved.
            self._load_rng_state(checkpoint)
        elif checkpoint is not None:
            self._load_rng_state(checkpoint)

        self.control = self.callback_handler.on_epoch_begin(self.args, self.state, self.control)
        bar = EpochProgressBar(
            index,
            run.num_epochs if run.length_known else None,
            run.micro_batches_per_epoch,
            disable=self.args.disable_tqdm or not self.is_world_process_zero(),
            max_steps=self.state.max_steps,
            updates_done=self.state.global_step,
        )
        # No loss yet: the bar shows "-" until this epoch's first update has read one.
        bar.advance(micro_batches_done, None, self._get_learning_rate())
        micro_batches_left = None
        if run.length_known:
            micro_batches_left = run.micro_batches_per_epoch - micro_batches_done
            batches = with_empty_shares(batches, micro_batches_left)
        return _Epoch(index, batches, micro_batches_done, micro_batches_left, bar, self.state.global_step)

    def _count_update(self, run: _Run, epoch: _Epoch, window_loss: _LossTracker) -> None:
        """Book one update: the loss trackers, ``global_step``, ``state.epoch`` and the bar."""
        self._run_loss.add(window_loss)
        self._loss_since_log.add(window_loss)
        self.state.global_step += 1
        self.state.epoch = epoch.index + epoch.micro_step / run.epoch_micro_batches
        # The window's last micro-batch, shown only now: its loss is known once the update has read it.
        epoch.bar.advance(1, epoch.loss.shown_mean(), epoch.learning_rate)
        epoch.bar.finish_update(epoch.loss.shown_mean(), epoch.learning_rate)

    def _end_epoch(self, model: nn.Module, run: _Run, epoch: _Epoch) -> None:
        """Close the bar, stop a run whose data ran dry, ``on_epoch_end``, then log, evaluate and save as asked."""
        epoch.bar.close()
        no_update = self.state.global_step == epoch.updates_before
        ran_dry = not run.length_known and no_update and not epoch.stopped_in_window
        if ran_dry and not self.control.should_training_stop:
            # An IterableDataset that ran dry: another pass would give nothing either.
            logger.warning(
                f"the training set gave no batches in epoch {epoch.index + 1}; stopping at update "
                f"{self.state.global_step} of max_steps {self.state.max_steps}"
            )
            self.control.should_training_stop = True

        self.control = self.callback_handler.on_epoch_end(self.args, self.state, self.control)
        if epoch.stopped_in_window:
            # Stock saves here, with the random state the abandoned window drew: a run resumed from
            # that checkpoint would drift from an uninterrupted one. The weights are those of the last
            # update boundary, whose checkpoint (if one was due) is exact, so no save is made here.
            self.control.should_save = False
        self._log_save_evaluate(model, run, epoch)

    def get_batch_samples(
        self, epoch_iterator: Iterator[Any], num_batches: int, device: torch.device
    ) -> tuple[list[Any], None]:
        """The next accumulation window: up to ``num_batches`` micro-batches from ``epoch_iterator``.

        Stock Trainer's hook, called once per window, so a subclass can change
        what a window holds. Stock also returns the items in the window; here
        the count is ``None``, since the loop counts a window's items once it
        is cut into pieces (``_accumulate_pieces``), on every process.
        The last window of an epoch may be shorter; it is trained, never dropped.
        """
        return list(itertools.islice(epoch_iterator, num_batches)), None

    def _windows(self, epoch_batches: Iterable[Any], micro_batches_left: int | None) -> Iterator[list[Any]]:
        """The epoch's windows, each drawn by ``get_batch_samples``.

        As stock, a window asks for n micro-batches, the last for what is left
        of the epoch, and no call is made past the epoch's end when its length
        is known (``micro_batches_left``); otherwise windows are drawn until
        the data runs out.
        """
        iterator = iter(epoch_batches)
        accumulation_steps = self.args.gradient_accumulation_steps
        while micro_batches_left is None or micro_batches_left > 0:
            wanted = accumulation_steps if micro_batches_left is None else min(accumulation_steps, micro_batches_left)
            window, _ = self.get_batch_samples(iterator, wanted, self.args.device)
            if not window:
                return
            # As stock sets it per window, for subclasses and callbacks that read it.
            self.current_gradient_accumulation_steps = len(window)
            if micro_batches_left is not None:
                micro_batches_left -= len(window)
            yield window
        # Run the dataloader to its end (nothing is left), so Accelerate closes the epoch's iteration.
        next(iterator, None)

    def _accumulate_window(
        self,
        model: nn.Module,
        window: list[dict[str, Any] | None],
        epoch_loss: _LossTracker,
        bar: EpochProgressBar,
    ) -> _LossTracker | None:
        """Forward and backward every micro-batch of one window, each as its share of the window's loss.

        A micro-batch's share is its items over the window's items on all
        processes (see ``_accumulate_pieces``). ``None`` is this rank's empty
        share of a global micro-batch.
        Returns ``None`` when a callback stops the epoch or the run inside the
        window (``on_substep_end``), as stock Trainer stops there too.
        """
        if not self.cuts_windows:
            return self._accumulate_pieces(model, window, epoch_loss, bar)
        while True:
            # The pieces are the micro-batches now; a rank with no sample in the window forwards the stand-in.
            pieces = self._cut_window(window, self.micro_batch_tokens) or [None]
            try:
                window_loss = self._accumulate_pieces(model, pieces, epoch_loss, bar)
            except torch.OutOfMemoryError:
                if self.micro_batch_tokens is None or self.micro_batch_tokens < 2:
                    raise
                self._halve_token_budget(model, bar)
                continue
            if window_loss is not None:
                # The bar counts the loader's micro-batches; all but the last are shown now, the last at the update.
                bar.advance(len(window) - 1, epoch_loss.shown_mean(), self._get_learning_rate())
            return window_loss

    def _cut_window(self, window: list[Any], token_budget: int | None) -> list[dict[str, Any]]:
        """The window's samples collated in pieces of at most ``token_budget`` tokens (packed with padding_free)."""
        return cut_window(
            window,
            token_budget,
            self._piece_collator,
            self.padding_free,
            self._position_offset,
            self._attention_group_scores,
            # A collator padding to a multiple (pad_to_multiple_of) makes pieces that wide: the budget counts it.
            None if self.padding_free else getattr(self._piece_collator, "pad_to_multiple_of", None),
        )

    def _halve_token_budget(self, model: nn.Module, bar: EpochProgressBar) -> None:
        """After an out-of-memory error inside a window: drop its gradients, halve the budget, say so once."""
        model.zero_grad(set_to_none=True)
        clear_device_cache()
        self.micro_batch_tokens //= 2
        message = (
            f"out of memory: micro_batch_tokens lowered to {self.micro_batch_tokens} and the window redone from its "
            "start (set micro_batch_tokens to this or less to start there)"
        )
        logger.warning(message)
        if not getattr(self, "_told_of_lower_budget", False):
            bar.write(message)
            self._told_of_lower_budget = True

    def _accumulate_pieces(
        self,
        model: nn.Module,
        window: list[dict[str, Any] | None],
        epoch_loss: _LossTracker,
        bar: EpochProgressBar,
    ) -> _LossTracker | None:
        """Forward and backward each micro-batch (or piece) of a window; see ``_accumulate_window``.

        The window's items are counted once, summed over processes, and given
        to every ``training_step`` as ``num_items_in_batch``.
        """
        micro_items = [0.0 if inputs is None else self._loss_items(inputs) for inputs in window]
        window_items = self._sum_over_processes(sum(micro_items))
        # Summed on the device and read once per update, in _update: a .item() per micro-batch
        # would stall a GPU on every micro-step.
        window_loss_sum = torch.zeros((), dtype=torch.float64, device=self.args.device)
        if self._owned_gradients is not None:
            self._owned_gradients.clear()  # the window starts with no gradient (zero_grad set them to None)
        for index, inputs in enumerate(window):
            is_update_step = index == len(window) - 1
            # Gradients are all-reduced once per update, on the window's last micro-batch.
            self.accelerator.gradient_state._set_sync_gradients(is_update_step)
            self._count_work(inputs)
            with self._sync_context(model, is_update_step)():
                if inputs is None:
                    self.training_step(model, self._stand_in, window_items)  # weighted 0: see training_step
                else:
                    share = self.training_step(model, inputs, window_items)
                    # The share is this micro-batch's summed item losses over the window's items.
                    window_loss_sum += share.double() * window_items
            if not is_update_step and self._owned_gradients is not None:
                self._owned_gradients.take(model.parameters())
            if not is_update_step:
                bar.advance(0 if self.cuts_windows else 1, epoch_loss.shown_mean(), self._get_learning_rate())
                self.control = self.callback_handler.on_substep_end(self.args, self.state, self.control)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    return None
        samples = sum(self._count_samples(inputs) for inputs in window if inputs is not None)
        # Still on the device (the items too, when counted there): _update reads them with the grad norm.
        return _LossTracker(window_loss_sum, sum(micro_items), samples)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """The micro-batch's mean loss, or with ``num_items_in_batch`` its share of the window's mean loss.

        The share is the micro-batch's summed item losses over
        ``num_items_in_batch`` (the window's items on all processes, as the
        training loop passes them; see ``loss_items``). The mean is Trainer's
        loss, with class weights the class-weighted cross-entropy, or a
        ``compute_loss_func``'s: one that takes ``num_items_in_batch`` is given
        it, and returns the share itself, as under stock Trainer.
        """
        if self.compute_loss_func is not None and self.class_weights is None and "labels" in inputs:
            loss, outputs = self._user_loss(model, inputs, num_items_in_batch)
        else:
            loss, outputs = self._mean_loss(model, inputs)
            if num_items_in_batch is not None:
                loss = weighted_share(loss, self._loss_items(inputs), num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _mean_loss(self, model: nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The micro-batch's mean loss and the model's outputs: Trainer's, or with class weights a weighted mean.

        With several tags per review the weights are each tag's ``pos_weight`` in binary cross-entropy.
        """
        if self.task in ORDERED_TASKS and "labels" in inputs:
            return self._rating_loss(model, inputs)
        if self.class_weights is None or "labels" not in inputs:
            # No num_items_in_batch for Trainer: it would pass it to the model, whose loss may ignore it
            # (BERT classifiers'), and multiply the loss by the number of processes.
            return super().compute_loss(model, inputs, return_outputs=True)
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if self.multi_label:
            # Each review's mean over its tags, then the mean over reviews: a review counts once (see loss_items).
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits.float(), labels.float(), pos_weight=self._class_weights_on(logits.device)
            )
            return loss, outputs
        # cross_entropy with weight= divides by the summed weights of the batch's labels,
        # which is what makes micro-batches add up to the full window (see loss_items).
        loss = nn.functional.cross_entropy(
            logits.float().view(-1, logits.shape[-1]),
            labels.view(-1),
            weight=self._class_weights_on(logits.device),
            label_smoothing=self.args.label_smoothing_factor,
        )
        return loss, outputs

    def _rating_loss(self, model: nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """A ratings run's mean loss (:mod:`.ordered_heads`): MSE or Huber per review, or CORN's per pair."""
        inputs = dict(inputs)
        # Popped, never given to the model: with labels BERT's forward would compute (and name) a loss of its own.
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if self.task == ORDINAL:
            return corn_loss(logits, labels), outputs
        return regression_loss(logits, labels, getattr(self.args, "regression_loss", "mse")), outputs

    def _user_loss(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any) -> tuple[torch.Tensor, Any]:
        """A ``compute_loss_func``'s loss: given the window's items if it takes them, else its mean weighted here."""
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        if takes_item_count(self.compute_loss_func):
            return self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch), outputs
        loss = self.compute_loss_func(outputs, labels)
        if num_items_in_batch is not None:
            loss = weighted_share(loss, self._loss_items({"labels": labels}), num_items_in_batch)
        return loss, outputs

    def _sync_context(self, model: nn.Module, is_update_step: bool) -> Any:
        """Where gradients are all-reduced: on the window's last micro-batch only (``no_sync`` before it).

        As in stock Trainer, ``sync_each_batch`` (an Accelerate option that
        trades communication for memory, e.g. with FSDP) reduces on every
        micro-batch. Under DeepSpeed Accelerate's ``no_sync`` does nothing:
        DeepSpeed reduces where ``sync_gradients`` marks the window's end.
        """
        if is_update_step or self.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch", False):
            return contextlib.nullcontext
        return functools.partial(self.accelerator.no_sync, model=model)

    def _count_work(self, inputs: dict[str, Any] | None) -> None:
        """Add a micro-batch's FLOs and tokens to Trainer's counts (``None``, an empty share, adds none)."""
        # A float even when 0: store_flos gathers every rank's count as one tensor, so the dtypes must agree.
        self.current_flos += float(self.floating_point_ops(inputs)) if inputs is not None else 0.0
        if inputs is not None:
            self._track_num_input_tokens(inputs)
        elif self.args.include_num_input_tokens_seen != "no":
            # Trainer's token count gathers over processes on every micro-batch; join it with none.
            self.accelerator.gather(torch.zeros((), dtype=torch.int64, device=self.args.device))

    def _prepare_input(self, data: Any) -> Any:
        """Trainer's, with a host tensor copied to a GPU without a host sync (see ``device_copies``).

        Trainer walks a batch's dicts, lists and tuples through this method, so
        each tensor comes here once. A window cut into pieces is collated on the
        host, piece by piece; a plain copy of each of a piece's tensors would
        make the host wait for every kernel queued before it. What the loader
        already moved (a window taken as the loader made it, evaluation
        batches) is on the device and left there; Trainer's DeepSpeed dtype
        cast still follows.
        """
        if isinstance(data, torch.Tensor) and self.args.device.type == "cuda":
            data = to_device_without_waiting(data, self.args.device)
        return super()._prepare_input(data)

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | float | None = None
    ) -> torch.Tensor:
        """One micro-batch: backpropagate its share of the window's loss; returns the share, detached.

        The loop calls this once per micro-batch, as stock Trainer does, with
        ``num_items_in_batch`` the window's items on all processes; called
        without it, the micro-batch is a window of its own. The share is what
        ``compute_loss`` returns when it takes ``num_items_in_batch`` (an
        override without it returns a mean, weighted here by the micro-batch's
        items). A subclass may override this and call ``super()``; the share
        it returns, times the window's items, is what the loop logs.
        """
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()  # schedule-free optimizers switch modes
        # A rank with no sample in a global micro-batch forwards the stand-in, weighted 0: it only joins DDP.
        is_stand_in = inputs is self._stand_in
        inputs = self._prepare_inputs(inputs)
        if num_items_in_batch is None:
            num_items_in_batch = self._loss_items(inputs)
        with self.compute_loss_context_manager():
            if takes_item_count(self.compute_loss):
                share = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            else:
                share = weighted_share(self.compute_loss(model, inputs), self._loss_items(inputs), num_items_in_batch)
        if is_stand_in:
            share = weighted_share(share, 0.0, 1.0)
        del inputs
        steps = self.args.torch_empty_cache_steps
        if steps is not None and self.state.global_step % steps == 0:
            clear_device_cache()  # as stock: lowers peak GPU memory at the cost of speed
        if self.args.n_gpu > 1:
            share = share.mean()  # nn.DataParallel returns one loss per device
        # Accelerate applies the fp16 GradScaler here; Trainer set its own accumulation to 1,
        # and DeepSpeed must not divide by its accumulation steps either (the share already does).
        kwargs = {"scale_wrt_gas": False} if self.accelerator.distributed_type == DistributedType.DEEPSPEED else {}
        if self.args.optim in (OptimizerNames.LOMO, OptimizerNames.ADALOMO):
            # LOMO updates inside backward (fused_backward) and is told this update's learning rate there.
            kwargs["learning_rate"] = self._get_learning_rate()
        # The window's items are summed over processes and DDP averages the gradients over them:
        # the factor undoes the average, so the update is the full batch's.
        self.accelerator.backward(share * self.accelerator.num_processes, **kwargs)
        return share.detach()

    def _update(self, model: nn.Module, window_loss: _LossTracker) -> tuple[float | None, float]:
        """Clip, step the optimizer and the scheduler once, on the whole window's gradient.

        Makes the update's one host sync: ``window_loss``'s sums, still on the
        device, are read together with the gradient norm (and replaced by floats).
        Returns the pre-clip gradient norm and the learning rate this update used.
        A non-finite loss or gradient skips the step (and the scheduler) and is counted;
        ``max_nonfinite_updates`` of them in a row stop the run.
        """
        if self.state.global_step < getattr(self.args, "freeze_encoder_updates", 0):
            # Head warm-up: the encoder's gradients are dropped, so the optimizer leaves it untouched
            # (no step, no weight decay) and clipping sees the head's gradient alone.
            for parameter in encoder_parameters(model):
                parameter.grad = None
        grad_norm = self._clip_grad_norm(model) if self.args.max_grad_norm > 0 else self._get_grad_norm(model)
        # One read for all three: each read of a GPU tensor waits for every kernel queued before it.
        window_loss.loss_sum, window_loss.mass, grad_norm = read_from_device(
            window_loss.loss_sum, window_loss.mass, grad_norm
        )
        learning_rate = self._get_learning_rate()
        finite = math.isfinite(window_loss.mean()) and (grad_norm is None or math.isfinite(grad_norm))

        # With fp16 the GradScaler must see overflowing steps to lower its scale, so it decides.
        if finite or self.accelerator.scaler is not None:
            self.control = self.callback_handler.on_pre_optimizer_step(self.args, self.state, self.control)
            self.optimizer.step()
            self.control = self.callback_handler.on_optimizer_step(self.args, self.state, self.control)
            skipped = self.accelerator.optimizer_step_was_skipped
        else:
            skipped = True
        if skipped:
            self.skipped_updates += 1
            self.nonfinite_in_a_row += 1
        else:
            self.nonfinite_in_a_row = 0
            # Metric-stepped schedulers wait for the next evaluation (Trainer's _evaluate steps them).
            if not isinstance(self.lr_scheduler, METRIC_STEPPED_SCHEDULERS):
                self.lr_scheduler.step()
        model.zero_grad(set_to_none=True)
        limit = getattr(self.args, "max_nonfinite_updates", 5)
        if limit and self.nonfinite_in_a_row >= limit:
            raise self._diverged_error(limit)
        return grad_norm, learning_rate

    def _diverged_error(self, limit: int) -> FinetuneError:
        from .checkpointing import latest_complete_checkpoint

        last_good = latest_complete_checkpoint(self.args.output_dir)
        kept = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was saved yet"
        return FinetuneError(
            f"{limit} updates in a row had a non-finite loss or gradient (the last is update "
            f"{self.state.global_step + 1}); {kept}; lower learning_rate, check the data for broken rows, "
            "or raise max_nonfinite_updates"
        )

    # -------------------------------------------------------------- bookkeeping

    def _epoch_batches(self, train_dataloader: Any, epoch: int) -> Any:
        """The dataloader with its sampler set to ``epoch`` (so shuffling differs per epoch but is reproducible)."""
        if hasattr(train_dataloader, "set_epoch"):
            train_dataloader.set_epoch(epoch)
        inner_sampler = getattr(getattr(train_dataloader, "batch_sampler", None), "batch_sampler", None)
        if hasattr(inner_sampler, "set_epoch"):
            inner_sampler.set_epoch(epoch)
        return train_dataloader

    @staticmethod
    def _count_samples(inputs: dict[str, Any]) -> int:
        """Samples in a micro-batch: the rows of its labels (or of its first tensor)."""
        reference = inputs.get("labels")
        if reference is None:
            reference = next(value for value in inputs.values() if isinstance(value, torch.Tensor))
        return int(reference.shape[0])

    def _loss_items(self, inputs: dict[str, Any]) -> float | torch.Tensor:
        """What this micro-batch's loss averages over (``loss_items``): reviews, label tokens, or summed class weights.

        Counted on the labels' device: a GPU count stays a tensor there (read
        with the update's other sums), since reading it would be a host sync
        per micro-batch.
        """
        labels = inputs.get("labels")
        weighted = self.class_weights is not None and labels is not None
        class_weights = self._class_weights_on(labels.device) if weighted else None
        shifts_labels = getattr(self, "_loss_shifts_labels", False)
        ordinal_outputs = self.model.config.num_labels if self.task == ORDINAL else None
        return loss_items(inputs, shifts_labels, class_weights, self.multi_label, ordinal_outputs)

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device) -> float | torch.Tensor | None:
        """The items of the batches in ``batch_samples`` on this process (``loss_items``), or None without labels.

        Trainer calls this for each evaluation batch and passes the count to
        ``compute_loss``, whose share of it is then the batch's mean. The
        training loop counts its windows itself (``_accumulate_pieces``).
        """
        if not batch_samples or not isinstance(batch_samples[0], dict) or "labels" not in batch_samples[0]:
            return None
        return sum(self._loss_items(batch) for batch in batch_samples)

    def _class_weights_on(self, device: torch.device) -> torch.Tensor:
        """The class weights on ``device``, copied there once.

        A copy from host memory blocks until the GPU has run everything queued
        before it: made per micro-batch, it would be a host sync per micro-batch.
        """
        if self._class_weights_on_device is None or self._class_weights_on_device.device != torch.device(device):
            self._class_weights_on_device = self.class_weights.to(device)
        return self._class_weights_on_device

    def _sum_over_processes(self, value: float | torch.Tensor) -> float | torch.Tensor:
        """``value`` summed over all processes (a no-op on one), as a tensor on the device on several."""
        if self.accelerator.num_processes == 1:
            return value
        total = torch.as_tensor(value, dtype=torch.float64).to(self.args.device)
        return self.accelerator.reduce(total, reduction="sum")

    def _max_over_processes(self, value: int) -> int:
        """The largest ``value`` of all processes (a no-op on one)."""
        if self.accelerator.num_processes == 1:
            return value
        largest = self.accelerator.reduce(torch.tensor(value, device=self.args.device), reduction="max")
        return int(largest.item())

    def _log_save_evaluate(self, model: nn.Module, run: _Run, epoch: _Epoch) -> None:
        """Call ``_maybe_log_save_evaluate`` (after an update or at an epoch's end) with stock's arguments."""
        updates_since_log = self.state.global_step - self._globalstep_last_logged
        tr_loss = self._loss_since_log.as_stock_tr_loss(updates_since_log)
        self._maybe_log_save_evaluate(
            tr_loss,
            epoch.grad_norm,
            model,
            run.trial,
            epoch.index,
            run.ignore_keys_for_eval,
            run.start_time,
            learning_rate=epoch.learning_rate,
        )

    def _maybe_log_save_evaluate(
        self,
        tr_loss: torch.Tensor,
        grad_norm: torch.Tensor | float | None,
        model: nn.Module,
        trial: Any,
        epoch: float,
        ignore_keys_for_eval: list[str] | None,
        start_time: float,
        learning_rate: float | None = None,
    ) -> None:
        """Log, evaluate and save when the callbacks ask for it: Trainer's flow and signature, our loss.

        Called after every update and at each epoch's end, as stock, so a
        subclass that overrides it (to add to the logs, say) and calls
        ``super()`` works unchanged. ``tr_loss`` is this process's loss since
        the last log in stock's terms (the per-sample mean times the updates);
        the logged ``loss`` is the per-sample mean over all processes.
        """
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            loss_sum, mass, _ = self._loss_since_log.reduced(self.accelerator)
            logs: dict[str, float] = {"loss": loss_sum / mass if mass else float("nan")}
            if grad_norm is not None:
                logs["grad_norm"] = float(grad_norm)
            logs["learning_rate"] = learning_rate if learning_rate is not None else self._get_learning_rate()
            if self.skipped_updates:
                logs["skipped_updates"] = self.skipped_updates
            self._loss_since_log = _LossTracker()
            self._globalstep_last_logged = self.state.global_step
            self.store_flos()
            self.log(logs, start_time)

        if self.control.should_evaluate:
            with self._timed("evaluation"):
                metrics = self._evaluate(trial, ignore_keys_for_eval)
            is_new_best = self._determine_best_metric(metrics=metrics, trial=trial)
            if self.args.save_strategy == SaveStrategy.BEST:
                self.control.should_save = is_new_best

        if self.control.should_save:
            with self._timed("checkpoint_saves"):
                self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    @contextlib.contextmanager
    def _timed(self, part: str) -> Iterator[None]:
        """Add the block's wall-clock seconds to ``seconds_in[part]``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds_in[part] += time.perf_counter() - started

    def _finalize_training(self, trial: Any, num_train_samples: Any, start_time: float) -> TrainOutput:
        """Final metrics, best-model reload, ``on_train_end``, NEFTune's hook removed.

        Named as Trainer's: its memory tracker finds the stage ("train") from
        this method's name. ``num_train_samples`` is unused, since the loop
        counts the samples it trained.
        """
        # A checkpoint still being written in the background is finished (or its failure raised)
        # before the best one is loaded and the run ends: only then is every checkpoint complete.
        with self._timed("checkpoint_saves"):
            self.finish_checkpoint_write()
        loss_sum, mass, samples = self._run_loss.reduced(self.accelerator)
        # 0.0 when no update was made (a finished run resumed from its last checkpoint), as stock reports it.
        train_loss = loss_sum / mass if mass else 0.0
        metrics = speed_metrics(
            "train", start_time, num_samples=samples, num_steps=self.state.global_step - self._initial_global_step
        )
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        metrics["skipped_updates"] = self.skipped_updates
        self._memory_tracker.stop_and_update_metrics(metrics)
        self.log(metrics)

        if self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        self._finish_current_push()
        if self.neftune_noise_alpha is not None:
            # As Trainer: the noise is for training only, so the embeddings' hook goes once it ends.
            deactivate_neftune(self.model, self.neftune_hook_handle, self.accelerator)
        self.is_in_train = False
        return TrainOutput(self.state.global_step, train_loss, metrics)


def read_from_device(*values: torch.Tensor | float | None) -> list[float | None]:
    """``values`` as floats, the tensors among them read from their device in one host sync."""
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    read = iter([])
    if tensors:
        device = tensors[0].device
        read = iter(torch.stack([tensor.detach().to(device, torch.float64) for tensor in tensors]).tolist())
    return [
        next(read) if isinstance(value, torch.Tensor) else None if value is None else float(value) for value in values
    ]


def _started(batches: Any) -> Iterator[Any]:
    """``batches`` as an iterator that has already been started (and fetched its first item)."""
    iterator = iter(batches)
    first = next(iterator, _NOTHING)
    return iterator if first is _NOTHING else itertools.chain([first], iterator)


_NOTHING = object()


class _LossTracker:
    """A running sum of per-sample losses, the mass they are averaged over, and the sample count.

    The mass is the number of samples, or with class weights their summed
    weights; either way the mean does not depend on n. A window's tracker holds
    its loss sum (and with class weights its mass) as tensors on the device
    until ``_update`` reads them; every other tracker holds floats.
    """

    def __init__(
        self, loss_sum: float | torch.Tensor = 0.0, mass: float | torch.Tensor = 0.0, samples: int = 0
    ) -> None:
        self.loss_sum = loss_sum
        self.mass = mass
        self.samples = samples

    def add(self, other: _LossTracker) -> None:
        """Add another tracker's totals."""
        self.loss_sum += other.loss_sum
        self.mass += other.mass
        self.samples += other.samples

    def mean(self) -> float:
        """Per-sample (weighted) mean so far (0.0 before any sample)."""
        return self.loss_sum / self.mass if self.mass else 0.0

    def shown_mean(self) -> float | None:
        """The mean for people to read: None before any sample, never a 0 that was not measured."""
        return self.loss_sum / self.mass if self.mass else None

    def as_stock_tr_loss(self, updates: int) -> torch.Tensor:
        """What stock Trainer's ``tr_loss`` would hold: a loss per update, summed over ``updates``."""
        return torch.tensor(self.mean() * updates, dtype=torch.float64)

    def reduced(self, accelerator: Any) -> tuple[float, float, int]:
        """``(loss_sum, mass, samples)`` summed over all processes."""
        if accelerator.num_processes == 1:
            return self.loss_sum, self.mass, self.samples
        totals = torch.tensor(
            [self.loss_sum, self.mass, float(self.samples)], device=accelerator.device, dtype=torch.float64
        )
        totals = accelerator.reduce(totals, reduction="sum")
        return float(totals[0]), float(totals[1]), int(totals[2])


@dataclass
class _Run:
    """What the loop keeps for the whole run: when it started, its epochs, and what Trainer's hooks are passed."""

    start_time: float
    num_epochs: int
    micro_batches_per_epoch: int | None  # None: the length is unknown (an IterableDataset)
    trial: Any
    ignore_keys_for_eval: list[str] | None
    # The denominator of state.epoch's fraction (set by _start_run).
    epoch_micro_batches: int = 0

    @property
    def length_known(self) -> bool:
        """Whether an epoch's micro-batches can be counted ahead (not for an IterableDataset)."""
        return self.micro_batches_per_epoch is not None


@dataclass
class _Epoch:
    """One epoch in the loop: its batches, how far it has gone, its loss and bar, and how it ended."""

    index: int
    batches: Iterable[Any]
    micro_step: int  # micro-batches consumed this epoch (a resumed epoch starts past the skipped ones)
    micro_batches_left: int | None  # at its start; None when the length is unknown
    bar: EpochProgressBar
    updates_before: int  # global_step at its start, to tell an IterableDataset that ran dry
    loss: _LossTracker = field(default_factory=_LossTracker)
    stopped_in_window: bool = False
    # As stock: the epoch's end logs the grad norm and learning rate of the epoch's last update.
    grad_norm: float | None = None
    learning_rate: float | None = None
