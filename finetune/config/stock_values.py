"""Stock ``TrainingArguments`` values that Trainer, torch or an integration would refuse only as a traceback.

Each was found by passing a bad value on the command line: the run read and
tokenised its data (some wrote ``finetune_run.json``) and then stopped on a
traceback from deep inside Trainer, the DataLoader, the scheduler or
``torch.compile``. Checked here, with the arguments, they stop the run in one
line that names the fix, before anything is read or written.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import FinetuneError

# What the scheduler functions take from Trainer itself, not from lr_scheduler_kwargs.
SCHEDULER_OWN_PARAMETERS = ("optimizer", "num_warmup_steps", "num_training_steps")


def check_stock_values(args: Any) -> None:
    """Refuse values of stock ``TrainingArguments`` fields that would fail only once training runs."""
    _check_loader(args)
    if args.eval_accumulation_steps is not None and args.eval_accumulation_steps < 1:
        raise FinetuneError(
            f"eval_accumulation_steps must be >= 1 (got {args.eval_accumulation_steps}); try 16 to move "
            "predictions to the CPU every 16 batches, or leave it out"
        )
    if args.neftune_noise_alpha is not None and not args.neftune_noise_alpha > 0:
        raise FinetuneError(
            f"neftune_noise_alpha must be > 0 (got {args.neftune_noise_alpha}); try 5, or leave it out for no noise"
        )
    if args.label_names is not None and list(args.label_names) != ["labels"]:
        # Trainer would look for the labels under these keys, find none and compute no metrics.
        raise FinetuneError(
            f"label_names must be left out (got {list(args.label_names)}): batches here carry their labels as "
            "'labels'; to choose the data's label column, set label_column"
        )
    for name, usual in (("adam_beta1", 0.9), ("adam_beta2", 0.999)):
        value = getattr(args, name)
        if not 0.0 <= value < 1.0:  # torch's Adam refuses it when the optimizer is made, as training starts
            raise FinetuneError(f"{name} must be in [0, 1) (got {value}); try --{name} {usual}")
    _check_optim_args(args.optim_args)
    _check_scheduler_kwargs(args.lr_scheduler_type, args.lr_scheduler_kwargs)
    _check_schedule_runs(args)
    _check_checkpointing_kwargs(args)
    _check_report_to(args.report_to)


def _check_loader(args: Any) -> None:
    if args.dataloader_num_workers < 0:
        raise FinetuneError(
            f"dataloader_num_workers must be >= 0 (got {args.dataloader_num_workers}); pass 0 to collate in the "
            "training process, or e.g. --dataloader_num_workers 2 for two loader processes"
        )
    if args.dataloader_prefetch_factor is not None and args.dataloader_prefetch_factor < 1:
        raise FinetuneError(
            f"dataloader_prefetch_factor must be >= 1 (got {args.dataloader_prefetch_factor}): the batches each "
            "loader worker collates ahead; try 2, or leave it out"
        )
    if args.dataloader_persistent_workers and args.dataloader_num_workers == 0:
        raise FinetuneError(
            "dataloader_persistent_workers keeps loader worker processes between epochs, and there are none; "
            "pass --dataloader_num_workers 2 with it, or drop it"
        )


def _check_optim_args(optim_args: str | None) -> None:
    """``optim_args`` is "key=value" pairs joined by commas (Trainer splits each on its one "=")."""
    if not optim_args:
        return
    for pair in optim_args.replace(" ", "").split(","):
        if pair.count("=") != 1 or not pair.split("=")[0]:
            raise FinetuneError(
                f"optim_args takes key=value pairs joined by commas (got {optim_args!r}); "
                "e.g. --optim_args 'key1=value1,key2=value2', or leave it out"
            )


def _check_scheduler_kwargs(scheduler_type: Any, kwargs: dict[str, Any] | None) -> None:
    """Each key of ``lr_scheduler_kwargs`` must be a parameter of the scheduler it is passed to."""
    if not kwargs:
        return
    from transformers.trainer_utils import SchedulerType

    accepted, passes_on = _scheduler_options(scheduler_type)
    if passes_on:
        return  # to another scheduler (reduce_lr_on_plateau to torch's): the dry run below hears what it says
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
        raise FinetuneError(
            f"lr_scheduler_kwargs: lr_scheduler_type {SchedulerType(scheduler_type).value} has no "
            f"{', '.join(unknown)}; {takes}, or pick another lr_scheduler_type"
        )


def _scheduler_options(scheduler_type: Any) -> tuple[list[str], bool]:
    """The parameters a scheduler function takes from ``lr_scheduler_kwargs`` (not those Trainer passes), and
    whether it also passes any other keyword on (``**kwargs``)."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    function = TYPE_TO_SCHEDULER_FUNCTION.get(SchedulerType(scheduler_type))
    if function is None:
        return [], True
    parameters = inspect.signature(function).parameters.values()
    passes_on = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)
    named = [parameter.name for parameter in parameters if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    return [name for name in named if name not in SCHEDULER_OWN_PARAMETERS], passes_on


def _check_schedule_runs(args: Any) -> None:
    """Make the schedule on a stand-in optimizer and step it to its end, as Trainer will.

    A missing option (``cosine_with_min_lr`` without ``min_lr``), a value the
    scheduler refuses (``lr_end`` above the learning rate) or one that breaks
    only at the last step (``power`` below 0) fails here, not when training
    starts or, worse, as it ends.
    """
    import warnings

    import torch
    from transformers import get_scheduler
    from transformers.optimization import GreedyLR

    # Ten steps reach the schedule's start, its warmup's end and its end, where the failures above happen; no
    # optimizer step between them (a scheduler reads only the learning rate), which cost 0.1 ms each.
    steps = 10
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scheduler = get_scheduler(
                args.lr_scheduler_type,
                optimizer,
                num_warmup_steps=args.get_warmup_steps(steps),
                num_training_steps=steps,
                scheduler_specific_kwargs=args.lr_scheduler_kwargs,
            )
            if not isinstance(scheduler, (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR)):  # metric-stepped
                for _ in range(steps):
                    scheduler.step()
    except (TypeError, ValueError, ArithmeticError) as error:
        options = ", ".join(_scheduler_options(args.lr_scheduler_type)[0]) or "none"
        kwargs = args.lr_scheduler_kwargs or {}
        raise FinetuneError(
            f"lr_scheduler_type {args.lr_scheduler_type.value} with lr_scheduler_kwargs {kwargs} cannot run "
            f"({str(error).splitlines()[0]}); its options: {options}, as --lr_scheduler_kwargs "
            """'{"name": value}'"""
        ) from None


def _check_checkpointing_kwargs(args: Any) -> None:
    """``activation_checkpointing_kwargs``: transformers' own two keys and what torch's checkpoint takes."""
    if not args.activation_checkpointing or not args.activation_checkpointing_kwargs:
        return
    import torch.utils.checkpoint

    parameters = inspect.signature(torch.utils.checkpoint.checkpoint).parameters.values()
    # preserve_rng_state is read from checkpoint's **kwargs; every_n_layers and offload are transformers'.
    accepted = [parameter.name for parameter in parameters if parameter.kind is inspect.Parameter.KEYWORD_ONLY]
    accepted += ["preserve_rng_state", "every_n_layers", "offload"]
    unknown = [key for key in args.activation_checkpointing_kwargs if key not in accepted]
    if unknown:
        raise FinetuneError(
            f"activation_checkpointing_kwargs has no {', '.join(unknown)}; it takes {', '.join(accepted)}"
        )


def _check_report_to(report_to: list[str]) -> None:
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    unknown = [name for name in report_to if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        raise FinetuneError(
            f"report_to: unknown integration {', '.join(unknown)}; choose from none, all, "
            f"{', '.join(sorted(INTEGRATION_TO_CALLBACK))}"
        )


def check_compile_mode(args: Any) -> None:
    """An Inductor ``torch_compile_mode`` must be one Inductor knows (torch.compile checks it at the first forward).

    Called before ``TrainingArguments.__post_init__``, which turns a mode into
    ``torch_compile`` with Inductor as its backend when none is named.
    """
    if args.torch_compile_mode is None or args.torch_compile_backend not in (None, "inductor"):
        return
    import torch._inductor

    modes = list(torch._inductor.list_mode_options())
    if args.torch_compile_mode not in modes:
        raise FinetuneError(
            f"torch_compile_mode must be one of {', '.join(modes)} (got {args.torch_compile_mode!r}); "
            "try reduce-overhead, or leave it out"
        )
