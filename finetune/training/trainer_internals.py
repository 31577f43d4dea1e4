"""Every private member of ``transformers.Trainer`` that ReviewTrainer and its mixins rely on, in one list.

``Trainer``'s underscore methods and attributes may change in any release,
which is why ``pyproject.toml`` pins transformers to one minor version.
``tests/test_trainer_internals.py`` checks each entry here against the
installed transformers (the method exists with these parameters, the attribute
is still set by ``Trainer``), so an upgrade that moves one fails in one
readable test instead of mid-training. The upgrade procedure is in
``docs/development.md`` ("Upgrading transformers").

A member used by a new line of code belongs here too.
"""

from __future__ import annotations

import inspect
import re
from typing import Literal, NamedTuple

Use = Literal["called", "overridden", "attribute"]


class TrainerMember(NamedTuple):
    """One private member of ``transformers.Trainer`` and how this package uses it."""

    name: str
    # "called": we call Trainer's own and define none; "overridden": we define ours (which may call
    # Trainer's through super()) and Trainer calls it, so the parameters must match what it passes;
    # "attribute": state Trainer sets or reads, checked by name in its source.
    use: Use
    # The parameter names after ``self``, in order (empty for an attribute).
    parameters: tuple[str, ...]
    where: str


TRAINER_MEMBERS: tuple[TrainerMember, ...] = (
    # Overridden: Trainer's train() and its helpers call these on ReviewTrainer.
    TrainerMember(
        "_inner_training_loop",
        "overridden",
        ("batch_size", "args", "resume_from_checkpoint", "trial", "ignore_keys_for_eval"),
        "training/trainer.py: the accumulation loop replaces Trainer's",
    ),
    TrainerMember("_get_train_sampler", "overridden", ("train_dataset",), "training/trainer.py: length grouping"),
    TrainerMember(
        "_get_eval_sampler", "overridden", ("eval_dataset",), "training/trainer.py: evaluation sorted by length"
    ),
    TrainerMember(
        "_prepare_input", "overridden", ("data",), "training/trainer.py: host tensors copied to a GPU without a sync"
    ),
    TrainerMember(
        "_maybe_log_save_evaluate",
        "overridden",
        ("tr_loss", "grad_norm", "model", "trial", "epoch", "ignore_keys_for_eval", "start_time", "learning_rate"),
        "training/trainer.py: logs the exact window loss",
    ),
    TrainerMember(
        "_finalize_training", "overridden", ("trial", "num_train_samples", "start_time"), "training/trainer.py"
    ),
    TrainerMember(
        "_save_checkpoint",
        "overridden",
        ("model", "trial"),
        "training/checkpointing.py: atomic saves; pipeline/fitting.py calls it for a run stopped after its last update",
    ),
    TrainerMember(
        "_load_from_checkpoint", "overridden", ("resume_from_checkpoint", "model"), "training/checkpointing.py"
    ),
    TrainerMember("_load_optimizer_and_scheduler", "overridden", ("checkpoint",), "training/checkpointing.py"),
    TrainerMember("_load_rng_state", "overridden", ("checkpoint",), "training/checkpointing.py; trainer.py calls it"),
    TrainerMember("_set_signature_columns_if_needed", "overridden", (), "training/distillation.py: teacher column"),
    TrainerMember(
        "_get_num_items_in_batch",
        "overridden",
        ("batch_samples", "device"),
        "training/trainer.py: an evaluation batch's items, counted as the training loop counts them",
    ),
    TrainerMember(
        "_loss_shifts_labels",
        "attribute",
        (),
        "training/trainer.py: whether the model's loss predicts the next token, so its items are labels[..., 1:]",
    ),
    TrainerMember(
        "_get_learning_rate",
        "overridden",
        (),
        "training/trainer.py: the recipe's learning_rate as scheduled, not the head's; it calls Trainer's",
    ),
    # Called: Trainer's own helpers, used as they are.
    TrainerMember(
        "_init_training_state",
        "called",
        ("max_steps", "num_update_steps_per_epoch", "num_train_epochs", "resume_from_checkpoint", "trial"),
        "training/trainer.py: state, resume position",
    ),
    TrainerMember(
        "_prepare_for_training",
        "called",
        ("max_steps", "train_dataloader", "resume_from_checkpoint"),
        "training/trainer.py: optimizer, scheduler, Accelerate",
    ),
    TrainerMember("_update_auto_batch_size", "called", ("batch_size",), "training/trainer.py"),
    TrainerMember("_evaluate", "called", ("trial", "ignore_keys_for_eval", "skip_scheduler"), "training/trainer.py"),
    TrainerMember("_determine_best_metric", "called", ("metrics", "trial"), "training/trainer.py"),
    TrainerMember("_clip_grad_norm", "called", ("model",), "training/trainer.py"),
    TrainerMember("_get_grad_norm", "called", ("model", "grad_norm"), "training/trainer.py"),
    TrainerMember("_prepare_inputs", "called", ("inputs",), "training/trainer.py"),
    TrainerMember("_track_num_input_tokens", "called", ("inputs",), "training/trainer.py"),
    TrainerMember("_load_best_model", "called", (), "training/trainer.py"),
    TrainerMember("_finish_current_push", "called", (), "training/trainer.py"),
    TrainerMember("_get_output_dir", "called", ("trial",), "training/checkpointing.py"),
    TrainerMember("_push_from_checkpoint", "called", ("checkpoint_folder",), "training/checkpointing.py"),
    TrainerMember("_save_optimizer_and_scheduler", "called", ("output_dir",), "training/checkpointing.py"),
    TrainerMember("_save_rng_state", "called", ("output_dir",), "training/checkpointing.py"),
    TrainerMember("_save_scaler", "called", ("output_dir",), "training/checkpointing.py"),
    TrainerMember("_save", "called", ("output_dir", "state_dict"), "training/checkpointing.py: background saves"),
    # Attributes: set by Trainer and read by us, or set by us and read by Trainer's methods.
    TrainerMember("_train_batch_size", "attribute", (), "training/trainer.py: the banner's micro-batch"),
    TrainerMember("_memory_tracker", "attribute", (), "training/trainer.py: _finalize_training's metrics"),
    TrainerMember("_initial_global_step", "attribute", (), "training/trainer.py: set at the loop's start"),
    TrainerMember("_initial_num_input_tokens_seen", "attribute", (), "training/trainer.py: set at the loop's start"),
    TrainerMember("_globalstep_last_logged", "attribute", (), "training/trainer.py: logging interval"),
    TrainerMember("_signature_columns", "attribute", (), "training/distillation.py: adds the teacher column"),
)


def parameter_names(function: object) -> tuple[str, ...]:
    """The parameter names of a method after ``self``."""
    return tuple(inspect.signature(function).parameters)[1:]


def trainer_member_problems(trainer_class: type, members: tuple[TrainerMember, ...] = TRAINER_MEMBERS) -> list[str]:
    """One line per member ``trainer_class`` no longer has as listed; [] when every one is as expected."""
    import transformers.trainer

    # Attributes are set inside methods (e.g. _inner_training_loop), so only the source can say they still are.
    source = inspect.getsource(transformers.trainer)
    problems = []
    for member in members:
        if member.use == "attribute":
            if not re.search(rf"self\.{member.name}\b", source):
                problems.append(f"Trainer no longer uses self.{member.name} (used in {member.where})")
            continue
        function = getattr(trainer_class, member.name, None)
        if not callable(function):
            problems.append(f"Trainer.{member.name} is gone ({member.use} in {member.where})")
        elif parameter_names(function) != member.parameters:
            problems.append(
                f"Trainer.{member.name} now takes {parameter_names(function)}, "
                f"expected {member.parameters} ({member.use} in {member.where})"
            )
    return problems
