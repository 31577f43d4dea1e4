"""``finetune train``: load a recipe, train, evaluate on the test split, save, report."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Light next to what every train imports anyway (load_recipe's HfArgumentParser is transformers too).
from transformers import TrainerCallback

from ..config.output_files import write_output_text
from ..errors import FinetuneError, TrainingInterrupted


def train(
    recipe: str | None,
    overrides: list[str] | None = None,
    callbacks: list[Any] | None = None,
    distillation: Any = None,
) -> dict[str, Any]:
    """Run one recipe end to end and return its metrics (also written to ``output_dir``).

    ``overrides`` are flags such as ``["--learning_rate", "3e-5"]``; they win
    over the recipe's values. ``callbacks`` are extra ``TrainerCallback``s.
    ``distillation`` (a :class:`finetune.pipeline.teacher.Distillation`) makes
    the run a student of a teacher run: ``finetune distill``.
    """
    from ..config.recipes import load_recipe
    from ..training.model_check import check_model_folder
    from ..training.modeling import check_base_model, check_classifier_head, load_tokenizer
    from ..training.run_clock import RunClock
    from ..training.runs import check_base_model_kept, check_output_dir, holds_run, output_dir_lock

    clock = RunClock()  # the run's wall-clock breakdown, printed at its end and kept in report/metrics.json

    # Arguments: recipe, then flags. Everything that can be checked is checked before anything is
    # written, and nothing of an earlier run is deleted before training has started.
    run = load_recipe(recipe, overrides)
    args = run.training
    if distillation is None:
        from .teacher import check_not_distilling

        check_not_distilling(run, overrides)
    _check_integrations(args.report_to)
    check_output_dir(args.output_dir, args.overwrite_output_dir, resuming=args.resume_from_checkpoint is not None)
    if args.overwrite_output_dir and args.resume_from_checkpoint is None and holds_run(Path(args.output_dir)):
        check_base_model_kept(args.output_dir, run.model.model_name_or_path)
    main_process = args.process_index == 0
    # One run per folder: a second one is refused at once rather than colliding with this one's saves.
    with output_dir_lock(args.output_dir) if main_process else contextlib.nullcontext():
        resume = _checked_resume_point(args, run.data)
        check_base_model(run.model, run.data.max_length)
        if resume is not None:
            # Trainer loads a checkpoint's weights leniently: a missing head or layer would go on at random.
            check_model_folder(resume, tokenizer=load_tokenizer(run.model, run.data.truncation_side))
        if run.data.class_names:  # given by the recipe (or its label_bins): checked before any data is read
            check_classifier_head(run.model, len(run.data.class_names))
        # Every process has checked the folder and the checkpoint before the main one changes anything.
        args.distributed_state.wait_for_everyone()
        # Work started beside the run (the baseline's process) ends with it, however it ends.
        with contextlib.ExitStack() as beside_the_run:
            return _train_checked(run, recipe, overrides, callbacks, resume, clock, distillation, beside_the_run)


def _train_checked(
    run: Any,
    recipe: str | None,
    overrides: list[str] | None,
    callbacks: list[Any] | None,
    resume: str | None,
    clock: Any,
    distillation: Any = None,
    beside_the_run: contextlib.ExitStack | None = None,
) -> dict[str, Any]:
    """Read the data, train, save, evaluate and report a recipe whose arguments have passed every check.

    ``clock`` (a :class:`finetune.training.run_clock.RunClock`) is lapped at each part's end.
    ``beside_the_run`` ends what the run starts beside itself (the baseline's process) when the run ends;
    without it, the baseline is fitted inline.
    """
    import transformers
    from transformers import DataCollatorWithPadding, set_seed

    from ..data.encoding import ReviewEncoding
    from ..data.splits import load_review_data, tokenize_splits
    from ..evaluation.baseline_process import runs_beside_training
    from ..evaluation.bootstrap import score_intervals
    from ..evaluation.inference import predict_probabilities
    from ..evaluation.metrics import build_compute_metrics, classification_report
    from ..evaluation.model_card import write_model_card
    from ..evaluation.report import UpdateRecorder, add_to_run_metrics, write_run_report
    from ..training.distillation import DistillationTrainer
    from ..training.interrupt import StopOnSignal
    from ..training.modeling import check_classifier_head, load_classifier, load_tokenizer
    from ..training.run_clock import format_breakdown
    from ..training.runs import clear_earlier_run, record_model_fingerprint, save_run_config
    from ..training.trainer import ReviewTrainer

    args = run.training
    main_process = args.process_index == 0
    if not main_process:
        transformers.utils.logging.disable_progress_bar()  # one "Loading weights" bar, not one per process

    # Data: read, clean, map labels (dropping and counting bad rows), tokenize. The main
    # process goes first, so the fetch and datasets caches are filled once.
    clock.lap("startup")
    with args.main_process_first(desc="reading and tokenizing the data"):
        data = load_review_data(run.data, seed=args.seed)
        label_names = data.label_names
        check_classifier_head(run.model, len(label_names))  # the classes are known now, the model not loaded
        clock.lap("read")
        # Baseline: the obvious alternative, fit on the same train split, so every figure this run prints can
        # be read against it. Where cores are free (beside an accelerator, say) it is fitted in a process of
        # its own from here on and collected after training; elsewhere inline, below.
        baseline_job = None
        if args.baseline and main_process and beside_the_run is not None and runs_beside_training(args.device.type):
            baseline_job = beside_the_run.enter_context(_start_baseline(data, args.seed))
            clock.lap("baseline")
        tokenizer = load_tokenizer(run.model, run.data.truncation_side)
        clock.lap("load")
        encoding = ReviewEncoding.from_fields(asdict(run.data))
        encoded, truncated = tokenize_splits(data.splits, tokenizer, encoding)
        clock.lap("tokenize")
    data.report.count_truncated(truncated, encoding)
    if "validation" not in encoded and (args.eval_strategy != "no" or args.load_best_model_at_end):
        raise FinetuneError(
            "the data has no validation split (validation_split_percentage 0); set eval_strategy: no and "
            "load_best_model_at_end: false to keep the final model, or hold some reviews out"
        )
    if distillation is not None:
        # The teacher labels every training review (and the unlabelled ones) once, before training.
        with args.main_process_first(desc="the teacher's soft labels"):
            encoded["train"] = distillation.attach(
                data, encoded["train"], tokenizer, encoding, args.per_device_eval_batch_size
            )
        clock.lap("teacher")
    if args.should_log:
        print("\n".join(data.report.summary_lines() + (distillation.notes if distillation else [])), file=sys.stderr)
    clock.lap("tokenize")

    # The baseline inline, where no process fits it beside the training.
    baseline = None
    if args.baseline and main_process and baseline_job is None:
        baseline = _fit_baseline(data, args.seed)
        clock.lap("baseline")

    # Model: the pretrained encoder with a new head for these classes. Seeded first,
    # so the head's random initialisation (and so the whole run) repeats with the seed.
    set_seed(args.seed)
    model = load_classifier(run.model, label_names)
    clock.lap("load")

    # Train. The recorder keeps every update's learning rate for the report's pictures;
    # the stopper turns Ctrl-C / SIGTERM into "save at the next update and stop".
    update_recorder = UpdateRecorder()
    stopper = StopOnSignal()
    command = ["finetune", "train", *([recipe] if recipe else []), *(overrides or [])]
    if distillation is not None:
        command = ["finetune", "distill", str(distillation.teacher.folder), *command[2:]]

    def start_run() -> None:
        # Only once training has started (every check passed, any checkpoint loaded): a mistake found
        # before leaves an earlier run's checkpoints and its finetune_run.json as they were.
        if not trainer.is_world_process_zero():
            return
        if args.overwrite_output_dir and resume is None:
            clear_earlier_run(args.output_dir)
        if recipe is None and overrides:
            # Trained from flags alone: the recipe that reproduces it, ready to edit.
            from ..config.output_files import write_output_text
            from .own_reviews import recipe_text

            write_output_text(Path(args.output_dir, "recipe.yaml"), recipe_text(list(overrides)))
        save_run_config(
            args.output_dir,
            run,
            command,
            data_report=data.report.to_dict(),
            class_weights=None if trainer.class_weights is None else trainer.class_weights.tolist(),
            class_names=label_names,
            extra=distillation.record(args.distill_alpha, args.distill_temperature) if distillation else None,
        )

    trainer_class, distill_kwargs = ReviewTrainer, {}
    if distillation is not None:
        trainer_class = DistillationTrainer
        distill_kwargs = {"distill_alpha": args.distill_alpha, "distill_temperature": args.distill_temperature}
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=encoded["train"],
        eval_dataset=encoded.get("validation"),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=build_compute_metrics(label_names),
        callbacks=[_OnTrainBegin(start_run), update_recorder, stopper, *_early_stopping(args), *(callbacks or [])],
        **distill_kwargs,
    )
    if trainer.class_weights is not None and args.should_log:
        weights = ", ".join(f"{name} {weight:.3f}" for name, weight in zip(label_names, trainer.class_weights.tolist()))
        print(f"class weights: {weights}", file=sys.stderr)
    if args.calibrate_temperature and "validation" not in encoded:
        raise FinetuneError(
            "calibrate_temperature fits T on the validation split, and this run has none; "
            "set validation_split_percentage (e.g. 10), or drop calibrate_temperature"
        )
    command_head = command[: len(command) - len(overrides or [])]  # finetune train RECIPE (or distill)
    # The signal handlers stay through the final save: a SIGTERM there lets the save finish.
    clock.lap("other")  # building the Trainer
    with stopper.held():
        started = time.perf_counter()
        result = trainer.train(resume_from_checkpoint=resume)
        train_seconds = time.perf_counter() - started
        clock.lap("train_steps")
        for part, seconds in getattr(trainer, "seconds_in", {}).items():
            clock.move(seconds, "train_steps", part)
        if stopper.stopped_training:
            raise TrainingInterrupted(_resume_advice(trainer, stopper, command_head, overrides), stopper.exit_status)

        calibration = None
        if args.calibrate_temperature:
            calibration = _calibrate(trainer, encoded, data, tokenizer, encoding)
            clock.lap("evaluation")  # scoring the validation split for the temperature
        # Save: a standard model folder (config with id2label, safetensors, tokenizer), written whole or not at all.
        trainer.save_final_model()
        if calibration is not None and trainer.is_world_process_zero():
            write_output_text(Path(args.output_dir, "calibration.json"), json.dumps(calibration, indent=2) + "\n")
        if trainer.is_world_process_zero():
            # What evaluate and predict compare the folder's model with, to say when it is no longer this one.
            record_model_fingerprint(args.output_dir)
        clock.lap("final_save")
    if stopper.received is not None:
        # Stopped after the last update (during the final save, say): the model is saved, and a checkpoint
        # of that update lets the resumed run go straight to the test split and the report.
        _checkpoint_last_update(trainer)
        done = "after the last update; the final model is saved whole"
        raise TrainingInterrupted(_resume_advice(trainer, stopper, command_head, overrides, done), stopper.exit_status)
    trainer.save_state()
    metrics: dict[str, Any] = {**result.metrics, "train_wall_seconds": train_seconds}
    if calibration is not None:
        metrics["calibration_temperature"] = calibration["temperature"]
    trainer.save_metrics("train", metrics)
    clock.lap("final_save")

    # Evaluate on the test split with the model that training ended with (the best, if asked).
    report = None
    if "test" in encoded:
        if encoding.sliding_window:
            # Long reviews read in overlapping windows, as evaluate and predict will read them.
            predicted = predict_probabilities(
                trainer.model, tokenizer, data.splits["test"]["text"], args.per_device_eval_batch_size, encoding
            ).argmax(-1)
            references = list(data.splits["test"]["labels"])
        else:
            prediction = trainer.predict(encoded["test"], metric_key_prefix="test")
            predicted, references = prediction.predictions.argmax(-1), prediction.label_ids
        report = classification_report(predicted, references, label_names)
        report["intervals"] = score_intervals(predicted, references, label_names)
        metrics["test"] = report
        trainer.save_metrics("test", {"test_accuracy": report["accuracy"], "test_macro_f1": report["macro_f1"]})
        if trainer.is_world_process_zero():
            report_path = Path(args.output_dir, "test_report.json")
            write_output_text(report_path, json.dumps(report, indent=2) + "\n")
        clock.lap("test_scoring")

    # The baseline's process has fitted beside the training (and the test scoring); the run waits
    # for what is left of it, if anything.
    if baseline_job is not None:
        baseline = _collect_baseline(baseline_job)
        clock.lap("baseline")
    if baseline is not None:
        metrics["baseline"] = baseline.to_dict()

    # Report: pictures and their numbers in report/, then the model card. The card is written
    # last so that it, not a README.md from transformers' saving, is the one the folder keeps.
    if trainer.is_world_process_zero():
        report_dir = write_run_report(
            args.output_dir,
            args,
            trainer.state,
            update_recorder.updates,
            recipe,
            train_metrics={key: value for key, value in metrics.items() if key not in ("test", "baseline")},
            test_report=report,
            baseline=metrics.get("baseline"),
        )
        clock.lap("report")
        card = write_model_card(args.output_dir)
        clock.lap("model_card")
        _print_summary(args.output_dir, metrics, train_seconds)
        print(f"pictures and numbers in {report_dir}, model card {card}", file=sys.stderr)
        clock.lap("report")
    metrics["time_breakdown"] = clock.breakdown()
    if trainer.is_world_process_zero():
        add_to_run_metrics(report_dir, "time_breakdown", metrics["time_breakdown"])
        print(format_breakdown(metrics["time_breakdown"]), file=sys.stderr)
    return metrics


def _calibrate(trainer: Any, encoded: Any, data: Any, tokenizer: Any, encoding: Any) -> dict[str, Any]:
    """Fit a temperature on the validation split and fold it into the trained model, before it is saved."""
    from scipy.special import softmax

    from ..evaluation.calibration import calibrate_in_place
    from ..evaluation.inference import predict_probabilities

    if encoding.sliding_window:
        # Validation read whole, in windows, as the test split and predict will read reviews.
        texts = data.splits["validation"]["text"]
        probabilities = predict_probabilities(
            trainer.model, tokenizer, texts, trainer.args.per_device_eval_batch_size, encoding
        )
        labels = list(data.splits["validation"]["labels"])
    else:
        prediction = trainer.predict(encoded["validation"], metric_key_prefix="calibration")
        probabilities, labels = softmax(prediction.predictions, axis=-1), prediction.label_ids
    fitted_on = f"validation, {len(labels)} reviews"
    record = calibrate_in_place(trainer.model, probabilities, labels, fitted_on)
    if trainer.is_world_process_zero():
        print(
            f"calibrated on {fitted_on}: T = {record['temperature']:.3f}, expected calibration error "
            f"{record['validation_ece_before']:.3f} -> {record['validation_ece_after']:.3f}",
            file=sys.stderr,
        )
    return record


def _checked_resume_point(args: Any, data: Any) -> str | None:
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


class _OnTrainBegin(TrainerCallback):
    """Runs ``action`` when training begins: after every check and after any checkpoint has loaded."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Run the action."""
        self.action()


def _resume_advice(
    trainer: Any, stopper: Any, command_head: list[str], overrides: list[str] | None, note: str = ""
) -> str:
    from ..training.runs import checkpoints

    saved = checkpoints(Path(trainer.args.output_dir))
    where = saved[-1] if saved else trainer.args.output_dir
    flags = without_flags(overrides or [], HOW_TO_RUN_FLAGS)
    command = " ".join([*command_head, *flags])
    return (
        f"stopped by {stopper.received.name} at update {trainer.state.global_step} "
        f"(epoch {trainer.state.epoch or 0:.2f}){f', {note}' if note else ''}; checkpoint saved in {where}; "
        f"resume with: {command} --resume_from_checkpoint auto"
    )


def _checkpoint_last_update(trainer: Any) -> None:
    """Save a checkpoint of the last update unless one is there, so that ``--resume_from_checkpoint auto`` finds it.

    Not with ``load_best_model_at_end``: the weights in memory are then the best checkpoint's, not the
    last update's, and resuming the newest checkpoint (which such a run always has) is exact anyway.
    """
    from ..training.checkpointing import latest_complete_checkpoint
    from ..training.runs import checkpoint_step

    args = trainer.args
    newest = latest_complete_checkpoint(args.output_dir)
    if args.load_best_model_at_end or (newest is not None and checkpoint_step(newest) == trainer.state.global_step):
        return
    trainer._save_checkpoint(trainer.model, trial=None)


# Flags that say how to run, not what is trained (True: the flag takes a value). Advice to resume
# leaves them out and adds its own; a run made with or without them is the same run.
HOW_TO_RUN_FLAGS = {"--overwrite_output_dir": False, "--resume_from_checkpoint": True}


def without_flags(flags: list[str], dropped: dict[str, bool]) -> list[str]:
    """``flags`` minus the ``dropped`` ones (``True``: the flag takes a value, dropped with it)."""
    kept: list[str] = []
    skip_value = False
    for flag in flags:
        name = flag.split("=", 1)[0]
        if skip_value:
            skip_value = False
        elif name in dropped:
            skip_value = dropped[name] and "=" not in flag
        else:
            kept.append(flag)
    return kept


def _check_integrations(report_to: list[str]) -> None:
    # Trainer would find out only after the data is read and the output folder made.
    from transformers.integrations import is_tensorboard_available

    if "tensorboard" in report_to and not is_tensorboard_available():
        raise FinetuneError(
            "report_to tensorboard needs TensorBoard, which is not installed; "
            "pip install tensorboard, or set report_to: none"
        )


def _early_stopping(args: Any) -> list[Any]:
    """Trainer's ``EarlyStoppingCallback`` when the recipe asks for it."""
    if args.early_stopping_patience is None:
        return []
    from transformers import EarlyStoppingCallback

    return [EarlyStoppingCallback(args.early_stopping_patience, args.early_stopping_threshold)]


def _baseline_inputs(data: Any) -> tuple[Any, Any, dict[str, tuple[Any, Any]]]:
    """The train split's texts and labels, and the splits the baseline is scored on (validation, test)."""
    splits = data.splits
    to_score = {
        split: (splits[split]["text"], splits[split]["labels"]) for split in ("validation", "test") if split in splits
    }
    return splits["train"]["text"], splits["train"]["labels"], to_score


def _fit_baseline(data: Any, seed: int) -> Any:
    """Fit the TF-IDF baseline on the train split, score it on validation and test, and say so."""
    from ..evaluation.baseline import run_baseline

    train_texts, train_labels, to_score = _baseline_inputs(data)
    try:
        result = run_baseline(train_texts, train_labels, to_score, data.label_names, seed=seed)
    except ValueError as error:
        _say_baseline_skipped(error)
        return None
    _say_baseline(result)
    return result


def _start_baseline(data: Any, seed: int) -> Any:
    """The baseline's fit started in a process of its own: a ``BaselineProcess``, to collect after training."""
    from ..evaluation.baseline_process import BaselineProcess

    train_texts, train_labels, to_score = _baseline_inputs(data)
    return BaselineProcess(train_texts, train_labels, to_score, data.label_names, seed=seed)


def _collect_baseline(job: Any) -> Any:
    """Wait for the baseline's process; its result, said as an inline fit says it, or None (said too)."""
    from ..evaluation.baseline_process import BaselineProcessFailed

    try:
        result = job.result()
    except ValueError as error:
        _say_baseline_skipped(error)
        return None
    except BaselineProcessFailed as failure:
        print(f"baseline skipped: {failure}", file=sys.stderr)
        return None
    _say_baseline(result)
    return result


def _say_baseline_skipped(error: ValueError) -> None:
    # scikit-learn's vectorizers give up on a handful of reviews ("no terms remain"); the run need not.
    print(f"baseline skipped: it cannot be fit on these reviews ({error})", file=sys.stderr)


def _say_baseline(result: Any) -> None:
    scores = ", ".join(
        f"{split} accuracy {score['accuracy']:.3f}, macro-F1 {score['macro_f1']:.3f}"
        for split, score in result.scores.items()
    )
    note = f"; {result.note}" if result.note else ""
    print(f"baseline (TF-IDF + logistic regression, {result.fit_seconds:.1f}s): {scores}{note}", file=sys.stderr)


def _print_summary(output_dir: str, metrics: dict[str, Any], train_seconds: float) -> None:
    from ..evaluation.baseline import describe_comparison

    line = f"trained in {train_seconds:.0f}s, {metrics['train_samples_per_second']:.1f} samples/s"
    if "test" in metrics:
        test = metrics["test"]
        line += (
            f"; test accuracy {test['accuracy']:.3f}, macro-F1 {test['macro_f1']:.3f} ({test['num_samples']} reviews)"
        )
        baseline_test = (metrics.get("baseline") or {}).get("scores", {}).get("test")
        if baseline_test:
            line += f"; {describe_comparison(test, baseline_test)}"
    print(line, file=sys.stderr)
    print(f"model saved to {output_dir}", file=sys.stderr)
