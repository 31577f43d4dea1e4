"""The first stage of a run: its arguments, folder and checkpoint checked, before anything is written."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FinetuneError

if TYPE_CHECKING:
    from ..config.recipes import Recipe


def checked_arguments(recipe: str | None, overrides: list[str] | None, distilling: bool) -> Recipe:
    """The recipe with its flags, refused where the run could not go on or would lose a run.

    Nothing of an earlier run is deleted here: that waits until training has started.
    """
    from ..config.recipes import load_recipe
    from ..training.runs import check_base_model_kept, check_output_dir, holds_run

    run = load_recipe(recipe, overrides)
    args = run.training
    if not distilling:
        check_not_distilling(run, overrides)
    check_integrations(args.report_to, args.use_liger_kernel)
    _check_ratings_training(run)
    check_output_dir(args.output_dir, args.overwrite_output_dir, resuming=args.resume_from_checkpoint is not None)
    if args.overwrite_output_dir and args.resume_from_checkpoint is None and holds_run(Path(args.output_dir)):
        check_base_model_kept(args.output_dir, run.model.model_name_or_path)
    return run


def _check_ratings_training(run: Recipe) -> None:
    """A ratings run's training fields: no class weights (no classes to weigh), a score that is one of its own."""
    from ..config.tasks import ORDERED_TASKS

    task, args = run.data.task, run.training
    if args.regression_loss != "mse" and task != "regression":
        given = f"task is {task}" if task else "no task is set"
        raise FinetuneError(
            f"regression_loss: {args.regression_loss} is for task: regression, and {given}; "
            "set task: regression, or drop regression_loss"
        )
    if task not in ORDERED_TASKS:
        return
    if args.class_weighting != "none":
        raise FinetuneError(
            f"class_weighting weighs classes of a softmax, and this is a {task} run (ordered ratings); "
            "set class_weighting: none"
        )


def held_output_dir(args: Any) -> contextlib.AbstractContextManager[Any]:
    """The output folder held for this run by the main process: a second run is refused at once."""
    from ..training.runs import output_dir_lock

    # One run per folder: a second one is refused rather than colliding with this one's saves.
    return output_dir_lock(args.output_dir) if args.process_index == 0 else contextlib.nullcontext()


def checked_start(run: Recipe) -> str | None:
    """The checkpoint to resume (or None), with the model and the checkpoint checked, in every process."""
    from ..config.tasks import head_size
    from ..training.model_check import check_model_folder
    from ..training.modeling import check_base_model, check_classifier_head, load_tokenizer

    resume = checked_resume_point(run.training, run.data)
    warn_half_precision_without_cpu_kernels(run.training)
    check_base_model(run.model, run.data.max_length, run.training.activation_checkpointing)
    if resume is not None:
        # Trainer loads a checkpoint's weights leniently: a missing head or layer would go on at random.
        check_model_folder(resume, tokenizer=load_tokenizer(run.model, run.data.truncation_side))
    if run.data.class_names:  # given by the recipe (or its label_bins): checked before any data is read
        check_classifier_head(run.model, head_size(run.data.task, len(run.data.class_names)))
    # Every process has checked the folder and the checkpoint before the main one changes anything.
    run.training.distributed_state.wait_for_everyone()
    return resume


def checked_resume_point(args: Any, data: Any) -> str | None:
    """The checkpoint to resume (``auto``: the newest complete one), refused unless resuming it is exact.

    Exact includes ``data``'s files holding the bytes the run recorded. With
    ``allow_inexact_resume`` an inexact resume goes on, after a warning that says what changes.
    """
    from ..training.checkpointing import check_resume, latest_complete_checkpoint
    from ..training.runs import changed_data_files, find_run_config, stopped_before_first_checkpoint

    resume = args.resume_from_checkpoint
    if resume is None:
        return None
    if resume == "auto":
        # The newest checkpoint that was written completely; one cut short by a kill is skipped.
        newest = latest_complete_checkpoint(args.output_dir)
        if newest is None:
            if stopped_before_first_checkpoint(Path(args.output_dir)):
                # Killed before its first save (a Ctrl-C saves one): starting again loses nothing, and
                # --overwrite_output_dir would be the only other way, which in --seeds retrains them all.
                if args.should_log:
                    print(
                        f"{args.output_dir}: the run there stopped before its first checkpoint, so it starts again "
                        "from the beginning",
                        file=sys.stderr,
                    )
                return None
            raise FinetuneError(f"no complete checkpoint to resume in {args.output_dir}; drop --resume_from_checkpoint")
        resume = str(newest)
    changed_data = changed_data_files(find_run_config(Path(resume)) or {}, data)
    for warning in check_resume(resume, args, changed_data):
        if args.should_log:
            print(f"warning: {warning}", file=sys.stderr)
    return resume


# The recipe fields only a student reads: a plain run refuses them, and a check needs a teacher for them.
DISTILL_FIELDS = (
    "unlabeled_file",
    "unlabeled_from",
    "max_unlabeled",
    "unlabeled_sentences",
    "distill_alpha",
    "distill_temperature",
    "distill_trade_reviews",
)


def check_not_distilling(run: Recipe, overrides: list[str] | None) -> None:
    """Refuse distillation settings in a plain ``finetune train``, which would ignore them."""
    from ..config.recipes import flag_names

    given = set(run.values) | flag_names(overrides or [])
    named = [name for name in DISTILL_FIELDS if name in given]
    if named:
        raise FinetuneError(
            f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} for 'finetune distill TEACHER_RUN RECIPE'; "
            "run that, or drop them to train without a teacher"
        )


def warn_half_precision_without_cpu_kernels(args: Any) -> None:
    """Warn where bf16 or fp16 training on a CPU would run without native kernels, many times slower than fp32."""
    import torch

    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else None
    if precision is None or args.device.type != "cpu" or half_precision_has_cpu_kernels(precision):
        return
    if args.should_log:
        # Measured on an AMD EPYC (Zen 1, AVX2): bf16 products at 1.4 to 1.5 GFLOP/s (512), fp32 at 69 (2048).
        print(
            f"warning: this CPU has no native {precision} kernels for oneDNN (on x86 they need AVX-512), "
            f"so {precision} training runs many times slower than fp32 here; "
            f"drop --{precision} (set {precision}: false) to train faster "
            f"(CPU capability: {torch.backends.cpu.get_cpu_capability()})",
            file=sys.stderr,
        )


def half_precision_has_cpu_kernels(precision: str) -> bool:
    """Whether oneDNN multiplies ``precision`` ("bf16" or "fp16") natively on this CPU (else a slow fallback does)."""
    import torch

    check = {"bf16": "_is_mkldnn_bf16_supported", "fp16": "_is_mkldnn_fp16_supported"}[precision]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):  # a torch without the check, or without oneDNN: nothing to say
        return True


def check_integrations(report_to: list[str], use_liger_kernel: bool = False) -> None:
    """Refuse a ``report_to`` or ``use_liger_kernel`` whose package is not installed."""
    # Trainer would find out only after the data is read and the output folder made, as a traceback.
    from transformers.integrations import is_tensorboard_available
    from transformers.utils import is_liger_kernel_available

    if "tensorboard" in report_to and not is_tensorboard_available():
        raise FinetuneError(
            "report_to tensorboard needs TensorBoard, which is not installed; "
            "pip install tensorboard, or set report_to: none"
        )
    if use_liger_kernel and not is_liger_kernel_available():
        raise FinetuneError(
            "use_liger_kernel needs liger-kernel, which is not installed; pip install liger-kernel, or set "
            "use_liger_kernel: false (its kernels are for decoder LLMs such as Llama, not BERT-family encoders)"
        )
