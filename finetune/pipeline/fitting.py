"""The fit stage of a run: train, calibrate, save the final model; a stop by signal says how to resume."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.output_files import write_output_text
from ..data.columns import column_values
from ..errors import TrainingInterrupted
from .flags import HOW_TO_RUN_FLAGS, without_flags

if TYPE_CHECKING:
    from ..training.interrupt import StopOnSignal
    from ..training.run_clock import RunClock
    from .reading import RunInputs
    from .request import RunRequest


def fit(
    trainer: Any, stopper: StopOnSignal, request: RunRequest, resume: str | None, inputs: RunInputs, clock: RunClock
) -> dict[str, Any]:
    """Train (from ``resume``), calibrate if asked, save the final model; returns the train metrics, also saved.

    A stop by SIGTERM or SIGINT raises :class:`TrainingInterrupted`, whose message says how to resume.
    """
    args = trainer.args
    # The signal handlers stay through the final save: a SIGTERM there lets the save finish.
    with stopper.held():
        started = time.perf_counter()
        result = trainer.train(resume_from_checkpoint=resume)
        train_seconds = time.perf_counter() - started
        clock.lap("train_steps")
        for part, seconds in getattr(trainer, "seconds_in", {}).items():
            clock.move(seconds, "train_steps", part)
        if stopper.stopped_training:
            raise TrainingInterrupted(_resume_advice(trainer, stopper, request), stopper.exit_status)
        calibration = None
        if args.calibrate_temperature:
            calibration = _calibrate(trainer, inputs)
            clock.lap("evaluation")  # scoring the validation split for the temperature
        _save_final_model(trainer, calibration)
        clock.lap("final_save")
    if stopper.received is not None:
        # Stopped after the last update (during the final save, say): the model is saved, and a checkpoint
        # of that update lets the resumed run go straight to the test split and the report.
        _checkpoint_last_update(trainer)
        done = "after the last update; the final model is saved whole"
        raise TrainingInterrupted(_resume_advice(trainer, stopper, request, done), stopper.exit_status)
    trainer.save_state()
    metrics: dict[str, Any] = {**result.metrics, "train_wall_seconds": train_seconds}
    if calibration is not None:
        metrics["calibration_temperature"] = calibration["temperature"]
    trainer.save_metrics("train", metrics)
    clock.lap("final_save")
    return metrics


def _save_final_model(trainer: Any, calibration: dict[str, Any] | None) -> None:
    """A standard model folder (config with id2label, safetensors, tokenizer), written whole or not at all."""
    from ..training.runs import record_model_fingerprint

    trainer.save_final_model()
    output_dir = trainer.args.output_dir
    if calibration is not None and trainer.is_world_process_zero():
        write_output_text(Path(output_dir, "calibration.json"), json.dumps(calibration, indent=2) + "\n")
    if trainer.is_world_process_zero():
        # What evaluate and predict compare the folder's model with, to say when it is no longer this one.
        record_model_fingerprint(output_dir)


def _calibrate(trainer: Any, inputs: RunInputs) -> dict[str, Any]:
    """Fit a temperature on the validation split and fold it into the trained model, before it is saved."""
    from scipy.special import softmax

    from ..evaluation.calibration import calibrate_in_place
    from ..evaluation.inference import predict_probabilities

    if inputs.encoding.sliding_window:
        # Validation read whole, in windows, as the test split and predict will read reviews.
        texts = column_values(inputs.data.splits["validation"], "text")
        probabilities = predict_probabilities(
            trainer.model, inputs.tokenizer, texts, trainer.args.per_device_eval_batch_size, inputs.encoding
        )
        labels = column_values(inputs.data.splits["validation"], "labels")
    else:
        prediction = trainer.predict(inputs.encoded["validation"], metric_key_prefix="calibration")
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


def _resume_advice(trainer: Any, stopper: StopOnSignal, request: RunRequest, note: str = "") -> str:
    """Where the run stopped, where its checkpoint is, and the command that goes on from it."""
    from ..training.runs import checkpoints

    saved = checkpoints(Path(trainer.args.output_dir))
    where = saved[-1] if saved else trainer.args.output_dir
    flags = without_flags(request.overrides, HOW_TO_RUN_FLAGS)
    command = " ".join([*request.command_head, *flags])
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
