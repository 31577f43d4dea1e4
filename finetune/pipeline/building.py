"""The model and trainer stages of a run: the classifier seeded and loaded, and the Trainer that trains it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Light next to what every train imports anyway (load_recipe's HfArgumentParser is transformers too).
from transformers import TrainerCallback

from ..config.tasks import SINGLE_LABEL
from ..errors import FinetuneError

if TYPE_CHECKING:
    from ..config.recipes import Recipe
    from ..data.splits import ReviewData
    from ..evaluation.report import UpdateRecorder
    from ..training.interrupt import StopOnSignal
    from .reading import RunInputs
    from .request import RunRequest


def build_model(run: Recipe, data: ReviewData) -> Any:
    """The pretrained encoder with a new head for the data's classes (tags, levels), seeded so its start repeats."""
    from transformers import set_seed

    from ..training.modeling import load_classifier

    # Seeded first, so the head's random initialisation (and so the whole run) repeats with the seed.
    set_seed(run.training.seed)
    return load_classifier(run.model, data.label_names, data.task, data.scale)


def build_trainer(
    request: RunRequest, run: Recipe, inputs: RunInputs, model: Any, resume: str | None
) -> tuple[Any, UpdateRecorder, StopOnSignal]:
    """The Trainer (a student's, with a teacher), the recorder of every update's learning rate, and the stopper.

    The stopper turns Ctrl-C / SIGTERM into "save at the next update and stop". The run's record is
    written when training begins, not before: a mistake found earlier leaves an earlier run as it was.
    """
    from transformers import DataCollatorWithPadding

    from ..evaluation.report import UpdateRecorder
    from ..training.distillation import DistillationTrainer
    from ..training.interrupt import StopOnSignal
    from ..training.trainer import ReviewTrainer

    args = run.training
    update_recorder, stopper = UpdateRecorder(), StopOnSignal()
    trainer_class, distill_kwargs = ReviewTrainer, {}
    if request.distillation is not None:
        trainer_class = DistillationTrainer
        distill_kwargs = {"distill_alpha": args.distill_alpha, "distill_temperature": args.distill_temperature}
    on_train_begin = _OnTrainBegin(lambda: record_run_start(trainer, request, run, inputs, resume))
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=inputs.encoded["train"],
        eval_dataset=inputs.encoded.get("validation"),
        data_collator=DataCollatorWithPadding(inputs.tokenizer, pad_to_multiple_of=args.pad_to_multiple_of),
        processing_class=inputs.tokenizer,
        compute_metrics=_compute_metrics(inputs.data),
        callbacks=[on_train_begin, update_recorder, stopper, *_early_stopping(args), *request.callbacks],
        **distill_kwargs,
    )
    if trainer.class_weights is not None and args.should_log:
        pairs = zip(inputs.data.label_names, trainer.class_weights.tolist())
        # With tags, each weighs its own positive reviews against its negatives (BCE's pos_weight).
        kind = "tag weights (pos_weight)" if inputs.data.multi_label else "class weights"
        print(f"{kind}: {', '.join(f'{name} {weight:.3f}' for name, weight in pairs)}", file=sys.stderr)
    if inputs.data.task != SINGLE_LABEL and (args.calibrate_temperature or request.distillation is not None):
        what = "has several tags per review" if inputs.data.multi_label else "rates stars"
        raise FinetuneError(
            f"{'calibrate_temperature' if args.calibrate_temperature else 'finetune distill'} is for one label per "
            f"review (a softmax) for now, and this run {what}; drop it for a {inputs.data.task} run"
        )
    if args.calibrate_temperature and "validation" not in inputs.encoded:
        raise FinetuneError(
            "calibrate_temperature fits T on the validation split, and this run has none; "
            "set validation_split_percentage (e.g. 10), or drop calibrate_temperature"
        )
    return trainer, update_recorder, stopper


def record_run_start(trainer: Any, request: RunRequest, run: Recipe, inputs: RunInputs, resume: str | None) -> None:
    """Clear an earlier run (``overwrite_output_dir``) and write this one's record: once training has started.

    Only then (every check passed, any checkpoint loaded): a mistake found before leaves an earlier
    run's checkpoints and its finetune_run.json as they were.
    """
    from ..config.output_files import write_output_text
    from ..data.label_issue_rows import DROPPED_LABEL_ISSUES
    from ..training.runs import clear_earlier_run, save_run_config
    from .own_reviews import recipe_text

    if not trainer.is_world_process_zero():
        return
    args, distillation = run.training, request.distillation
    if args.overwrite_output_dir and resume is None:
        clear_earlier_run(args.output_dir)
    if request.recipe is None and request.overrides:
        # Trained from flags alone: the recipe that reproduces it, ready to edit.
        write_output_text(Path(args.output_dir, "recipe.yaml"), recipe_text(list(request.overrides)))
    save_run_config(
        args.output_dir,
        run,
        request.command,
        data_report=inputs.data.report.to_dict(),
        class_weights=None if trainer.class_weights is None else trainer.class_weights.tolist(),
        class_names=inputs.data.label_names,
        extra=distillation.record(args.distill_alpha, args.distill_temperature) if distillation else None,
    )
    dropped_list = Path(args.output_dir, DROPPED_LABEL_ISSUES)
    if inputs.data.report.label_issues_dropped:
        # The list the run trained without, as it was: the user's file may be edited or deleted later.
        write_output_text(dropped_list, Path(run.data.drop_label_issues).read_text(encoding="utf-8"))
    else:
        dropped_list.unlink(missing_ok=True)  # an earlier run's, which this one did not train without


class _OnTrainBegin(TrainerCallback):
    """Runs ``action`` when training begins: after every check and after any checkpoint has loaded."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Run the action."""
        self.action()


def _compute_metrics(data: ReviewData) -> Callable[[Any], dict[str, float]]:
    """What each evaluation scores: the ordered scores of a ratings run, or the classes' (tags')."""
    from ..data.ratings import star_levels
    from ..evaluation.metrics import build_compute_metrics
    from ..evaluation.ordered import build_rating_metrics, with_star_scores

    if data.scale is not None:
        return build_rating_metrics(data.task, data.scale)
    classes = build_compute_metrics(data.label_names, data.task)
    stars = star_levels(data.label_names) if data.task == SINGLE_LABEL else None
    # Classes that are stars: their ordered scores too, so mae can pick the checkpoint as for ratings.
    return classes if stars is None else with_star_scores(classes, stars)


def _early_stopping(args: Any) -> list[Any]:
    """Trainer's ``EarlyStoppingCallback`` when the recipe asks for it."""
    if args.early_stopping_patience is None:
        return []
    from transformers import EarlyStoppingCallback

    return [EarlyStoppingCallback(args.early_stopping_patience, args.early_stopping_threshold)]
