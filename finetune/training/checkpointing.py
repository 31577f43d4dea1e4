"""Checkpoints that survive a crash, and loading that refuses pickled weights.

A checkpoint is written into a hidden ``.checkpoint-N.partial`` folder,
flushed to disk, marked complete, and only then renamed to ``checkpoint-N``:
a rename is atomic, so a kill at any moment leaves either the whole new
checkpoint or none of it, and the previous one untouched. Resuming with
``auto`` takes the newest checkpoint that carries the marker.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints, sort_checkpoints
from transformers.utils import logging

from ..errors import FinetuneError, first_line
from .background_saves import (
    BackgroundWriter,
    CheckpointSnapshot,
    cpu_copy,
    reads_checkpoint_on_save,
    rng_states,
    wait_for_write_into,
)
from .model_files import (
    PICKLED_WEIGHTS,
    SAFE_WEIGHTS,
    require_readable_safetensors,
    require_safe_weights,
)

logger = logging.get_logger("transformers.trainer")

COMPLETE_MARKER = "finetune_checkpoint_complete.json"
# The settings a resumed run must share with the checkpoint's to continue it exactly (kept in the marker).
EXACT_RESUME_SETTINGS = ("gradient_accumulation_steps", "per_device_train_batch_size", "world_size")
# Where the final model is written before its files are moved into output_dir.
FINAL_STAGING = ".final-model.partial"


def is_complete_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder`` is a checkpoint this project finished writing."""
    return (Path(folder) / COMPLETE_MARKER).is_file()


def latest_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (incomplete ones are skipped).

    A checkpoint this process is writing into ``output_dir`` in the background is waited for first.
    """
    wait_for_write_into(output_dir)
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    complete = [path for path in sort_checkpoints(str(folder), use_mtime=False) if is_complete_checkpoint(path)]
    return Path(complete[-1]) if complete else None


def check_resume(checkpoint: str | Path, args: Any, changed_data: Sequence[str] = ()) -> list[str]:
    """Refuse a checkpoint that cannot be resumed, or not exactly; returns what changes when inexact is allowed.

    Exact means the resumed run equals the uninterrupted one: the checkpoint must
    hold the optimizer, scheduler and every process's random state, and this run
    must use the micro-batch, ``gradient_accumulation_steps``, number of
    processes and data files it was saved with (``changed_data`` names the files
    whose bytes changed since). ``args.allow_inexact_resume`` turns those
    refusals into the returned warnings; a missing or damaged checkpoint is always refused.
    """
    folder = Path(checkpoint)
    if not folder.is_dir():
        raise FinetuneError(f"checkpoint not found: {checkpoint}; pass a checkpoint-* folder of the run, or auto")
    state = _readable_checkpoint_state(folder, args)
    saved = {**_saved_settings(folder, state, getattr(args, "n_gpu", 0)), **_read_marker(folder)}
    current = {name: getattr(args, name) for name in EXACT_RESUME_SETTINGS}
    changes = [
        f"{name} {saved[name]} -> {current[name]}"
        for name in EXACT_RESUME_SETTINGS
        if saved.get(name) is not None and saved[name] != current[name]
    ]
    missing = [
        what
        for what, present in (
            ("optimizer state (optimizer.pt)", (folder / "optimizer.pt").is_file()),
            ("scheduler state (scheduler.pt)", (folder / "scheduler.pt").is_file()),
            ("random state (rng_state*.pth)", any(folder.glob("rng_state*.pth"))),
        )
        if not present
    ]
    problems = [*(f"it has no {what}" for what in missing), *(f"this run changes {change}" for change in changes)]
    if changed_data:
        problems.append(f"the data files changed since the run began ({', '.join(changed_data)})")
    if problems and not getattr(args, "allow_inexact_resume", False):
        fix = _exact_resume_fix(missing, changes, bool(changed_data))
        raise FinetuneError(
            f"resuming {folder} cannot equal an uninterrupted run: {'; '.join(problems)}; "
            f"{fix}, or pass --allow_inexact_resume to go on anyway"
        )
    consequences = _what_changes(missing, changes, bool(changed_data))
    return [f"resuming {folder} inexactly: {'; '.join(problems)}{consequences}"] if problems else []


def _readable_checkpoint_state(folder: Path, args: Any) -> dict[str, Any]:
    """The checkpoint's ``trainer_state.json``, once its weights and saved states are found whole."""
    earlier = "resume from an earlier checkpoint, or drop --resume_from_checkpoint"
    require_safe_weights(folder, getattr(args, "allow_pickle_checkpoints", False))
    if not any((folder / name).is_file() for name in (*SAFE_WEIGHTS, *PICKLED_WEIGHTS)):
        raise FinetuneError(f"{folder} holds no model weights, so it is no checkpoint to resume; {earlier}")
    require_readable_safetensors(folder)
    state = _read_json(folder / "trainer_state.json", earlier)
    for path in folder.glob("*.pt*"):
        # torch.save writes a zip archive; one cut short has no central directory at its end.
        if path.suffix in (".pt", ".pth") and not zipfile.is_zipfile(path):
            raise FinetuneError(f"{path} is damaged or cut short; {earlier}")
    return state


def _exact_resume_fix(missing: list[str], changes: list[str], changed_data: bool) -> str:
    """How to resume exactly, given what the checkpoint lacks and what this run changes."""
    fixes = []
    if missing or changes:
        fixes.append(
            "resume with the settings it was saved with"
            if changes and not missing
            else "resume from a checkpoint saved without save_only_model"
            if missing and not changes
            else "resume from a full checkpoint with the settings it was saved with"
        )
    if changed_data:
        fixes.append("resume with the data it was trained on, train afresh with --overwrite_output_dir")
    return "; ".join(fixes)


def _what_changes(missing: list[str], changes: list[str], changed_data: bool) -> str:
    consequences = []
    if any("optimizer" in what or "scheduler" in what for what in missing):
        consequences.append("the optimizer and the learning-rate schedule start afresh")
    if any("random" in what for what in missing):
        consequences.append("dropout and shuffling draw other numbers")
    if changes:
        consequences.append(
            "the rest of the epoch is counted in other windows, so some reviews may be seen twice or skipped"
        )
    if changed_data:
        consequences.append("the rest of the run reads the new data")
    return f" ({'; '.join(consequences)})"


def _saved_settings(folder: Path, state: dict[str, Any], n_gpu: int) -> dict[str, Any]:
    """What an older checkpoint (no settings in its marker) still tells: batch size and number of processes."""
    settings: dict[str, Any] = {}
    if isinstance(state.get("train_batch_size"), int):
        # Trainer records the micro-batch times the GPUs of one process (DataParallel).
        settings["per_device_train_batch_size"] = state["train_batch_size"] // max(1, n_gpu)
    ranks = list(folder.glob("rng_state_*.pth"))
    if ranks:
        settings["world_size"] = len(ranks)
    elif (folder / "rng_state.pth").is_file():
        settings["world_size"] = 1
    return settings


def _read_marker(folder: Path) -> dict[str, Any]:
    marker = folder / COMPLETE_MARKER
    if not marker.is_file():
        return {}
    try:
        saved = json.loads(marker.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return {}
    return {name: saved[name] for name in EXACT_RESUME_SETTINGS if name in saved}


def _read_json(path: Path, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise FinetuneError(f"{path.parent} has no {path.name}, so it cannot be resumed; {fix}")
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:
        raise FinetuneError(f"{path} is damaged ({first_line(error)}); {fix}")
    if not isinstance(loaded, dict):
        raise FinetuneError(f"{path} is damaged (not a JSON object); {fix}")
    return loaded


def require_finite_weights(model: Any, what: str, run_dir: str | Path, step: int) -> None:
    """Raise, naming the last good checkpoint, when ``model``'s weights hold NaN or inf; they are never saved."""
    if all(bool(parameter.isfinite().all()) for parameter in model.parameters()):
        return
    last_good = latest_complete_checkpoint(run_dir)
    kept = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was saved before"
    raise FinetuneError(
        f"the weights hold NaN or inf at update {step}, so {what} is not saved; {kept}; lower learning_rate"
    )


def _save_error(final: Path, run_dir: Path, error: BaseException) -> FinetuneError:
    """The one line a failed checkpoint save stops the run with, naming the checkpoint that is kept."""
    previous = latest_complete_checkpoint(run_dir)
    kept = f"the previous checkpoint {previous} is kept" if previous else "no earlier checkpoint exists"
    return FinetuneError(
        f"cannot save {final} ({_save_failure(error)}); {kept}; free disk space or choose another output_dir"
    )


def _save_failure(error: BaseException) -> str:
    """Why a save failed, in a few words: the OS's reason where it can be found, else the library's first line."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error)
    # safetensors: "Error while serializing: I/O error: File too large (os error 27)".
    match = re.search(r"os error (\d+)", text)
    if match:
        return os.strerror(int(match.group(1)))
    # torch.save's zip writer reports a short write by positions ("unexpected pos 704 vs 598").
    if "PytorchStreamWriter" in text or "unexpected pos" in text:
        return "a file was cut short: the disk is full or a file-size limit was reached"
    return first_line(error)


class CrashSafeCheckpoints:
    """A ``Trainer`` mixin: atomic checkpoints with a completion marker, and safe weight loading.

    With ``background_checkpoint_saves`` a checkpoint is copied into CPU memory
    while training waits and written by a background thread (``background_saves.py``).
    """

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """Trainer's ``train()``, which returns (or raises) only once no checkpoint is being written."""
        try:
            return super().train(*args, **kwargs)
        except BaseException:
            # The exception that stopped training is the one to report; the write is finished first, so
            # its checkpoint is whole (a write that failed too has removed its partial folder: say so).
            try:
                self.finish_checkpoint_write()
            except Exception as error:
                logger.warning(f"{error}")
            raise

    def finish_checkpoint_write(self) -> None:
        """Wait for the checkpoint being written in the background, if any; raise its error if it failed.

        Called before the next save, at the end of training and before anything
        reads the run's checkpoints, so that they see only complete ones.
        """
        writer: BackgroundWriter | None = getattr(self, "_checkpoint_writer", None)
        if writer is None:
            return
        try:
            writer.wait()
        except FinetuneError:
            self.state.best_model_checkpoint = self._best_before_write  # that checkpoint does not exist
            raise

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Trainer's checkpoint, written to a staging folder and renamed into place when complete.

        Where ``_saves_in_background`` allows, training waits only for a copy in CPU
        memory, and a background thread writes, renames and rotates.
        """
        # The previous background write first: the best checkpoint's folder, the newest complete one
        # and rotation must be those of finished writes, and only one copy is held in memory at a time.
        self.finish_checkpoint_write()
        run_dir = Path(self._get_output_dir(trial=trial))
        final = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        # Skipped updates keep bad numbers out of the weights; if some got in anyway, keep them off disk.
        require_finite_weights(model, str(final), run_dir, self.state.global_step)
        staging = run_dir / f".{final.name}.partial"
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        # Trainer's bookkeeping of the best checkpoint, before the state is written, so that a
        # checkpoint that is the new best names itself in its own trainer_state.json, as stock's does.
        best_before = self.state.best_model_checkpoint
        if self.state.best_global_step:
            best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}"
            if best == final or best.is_dir():
                self.state.best_model_checkpoint = str(best)
        snapshot = self._checkpoint_snapshot() if self._saves_in_background() else None
        if snapshot is not None:
            self._best_before_write = best_before
            self._checkpoint_writer = getattr(self, "_checkpoint_writer", None) or BackgroundWriter()
            self._checkpoint_writer.start(
                functools.partial(self._write_in_background, snapshot, run_dir, staging, final),
                name=f"finetune-save-{final.name}",
                folder=run_dir,
            )
            return
        try:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)  # left by a kill during an earlier save
                staging.mkdir(parents=True)
            self.accelerator.wait_for_everyone()  # every process writes its RNG state into staging
            self._write_checkpoint_files(staging)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                self._publish(staging, final, self.state.global_step)
        except Exception as error:
            # A full disk or a file-size limit surfaces as an OSError from Python, but as SafetensorError
            # or RuntimeError from safetensors and torch.save: every one leaves a partial folder to remove.
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
            self.state.best_model_checkpoint = best_before  # this checkpoint does not exist
            raise _save_error(final, run_dir, error) from error

        if self.args.push_to_hub:
            self._push_from_checkpoint(str(final))  # as stock: every save with hub_strategy every_save / checkpoint
        if self.args.should_save:
            self._rotate_complete_checkpoints(run_dir, self.state.best_model_checkpoint)

    def _saves_in_background(self) -> bool:
        """Whether this save may be written by a background thread: asked for, and as exact and safe as in place.

        Only inside ``train()`` and on one process: several would have to meet at
        a barrier around the save, from a thread. Not with DeepSpeed or FSDP,
        which save through collectives, nor with ``push_to_hub`` or a callback
        that reads the folder in ``on_save``: both expect it in place.
        """
        return (
            bool(getattr(self.args, "background_checkpoint_saves", False))
            and self.is_in_train
            and self.args.world_size == 1
            and self.args.should_save
            and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)
            and not self.args.push_to_hub
            and not any(reads_checkpoint_on_save(callback) for callback in self.callback_handler.callbacks)
        )

    def _checkpoint_snapshot(self) -> CheckpointSnapshot | None:
        """Everything the checkpoint holds, as ``_write_checkpoint_files`` would write it now, copied to CPU memory.

        None on a device whose random state only Trainer's own save knows (the save is then synchronous).
        """
        from transformers.training_args import ParallelMode

        save_all = not self.args.save_only_model
        rng = rng_states(self.args.parallel_mode == ParallelMode.DISTRIBUTED) if save_all else None
        if save_all and rng is None:
            return None
        scaler = getattr(self.accelerator, "scaler", None)
        self._record_callback_states()
        return CheckpointSnapshot(
            global_step=self.state.global_step,
            model_state=cpu_copy(self.model.state_dict()),
            optimizer_state=cpu_copy(self.optimizer.state_dict()) if save_all else None,
            scheduler_state=cpu_copy(self.lr_scheduler.state_dict()) if save_all else None,
            scaler_state=cpu_copy(scaler.state_dict()) if save_all and scaler is not None else None,
            rng_state=rng,
            trainer_state=copy.deepcopy(self.state),
        )

    def _write_in_background(self, snapshot: CheckpointSnapshot, run_dir: Path, staging: Path, final: Path) -> None:
        """The background thread's part of a save: write, flush, mark, rename, then rotate."""
        try:
            shutil.rmtree(staging, ignore_errors=True)  # left by a kill during an earlier save
            staging.mkdir(parents=True)
            self._write_snapshot(snapshot, staging)
            self._publish(staging, final, snapshot.global_step)
        except Exception as error:
            shutil.rmtree(staging, ignore_errors=True)
            raise _save_error(final, run_dir, error) from error
        self._rotate_complete_checkpoints(run_dir, snapshot.trainer_state.best_model_checkpoint)

    def _write_snapshot(self, snapshot: CheckpointSnapshot, staging: Path) -> None:
        """The files ``_write_checkpoint_files`` writes, from ``snapshot`` instead of the live objects."""
        from transformers.trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME

        # Trainer's own model saving (weights, config, tokenizer, training_args.bin), given the copied weights.
        self._save(str(staging), state_dict=snapshot.model_state)
        if snapshot.optimizer_state is not None:
            torch.save(snapshot.optimizer_state, staging / OPTIMIZER_NAME)
            torch.save(snapshot.scheduler_state, staging / SCHEDULER_NAME)
        if snapshot.scaler_state is not None:
            torch.save(snapshot.scaler_state, staging / SCALER_NAME)
        if snapshot.rng_state is not None:
            torch.save(snapshot.rng_state, staging / "rng_state.pth")
        snapshot.trainer_state.save_to_json(str(staging / TRAINER_STATE_NAME))

    def _write_checkpoint_files(self, staging: Path) -> None:
        """What Trainer saves in a checkpoint: model, optimizer, scheduler, scaler, RNG states, state."""
        self.save_model(str(staging), _internal_call=True)
        if not self.args.save_only_model:
            self._save_optimizer_and_scheduler(str(staging))
            self._save_scaler(str(staging))
            self._save_rng_state(str(staging))
        if self.args.should_save:
            self._record_callback_states()
            self.state.save_to_json(str(staging / "trainer_state.json"))

    def _record_callback_states(self) -> None:
        """Put the stateful callbacks' states into ``state``, as Trainer does before writing it."""
        from transformers.trainer_callback import ExportableState

        for callback in [*self.callback_handler.callbacks, self.control]:
            if isinstance(callback, ExportableState):
                name = callback.__class__.__name__
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(callback.state())
                else:
                    self.state.stateful_callbacks[name] = callback.state()

    def _publish(self, staging: Path, final: Path, global_step: int) -> None:
        # Flush every file, then mark, then rename: the marker is never on disk before the data.
        for path in staging.rglob("*"):
            if path.is_file():
                _fsync(path)
        marker = staging / COMPLETE_MARKER
        # The settings an exact resume must share (check_resume compares them).
        settings = {name: getattr(self.args, name) for name in EXACT_RESUME_SETTINGS}
        marker.write_text(json.dumps({"global_step": global_step, **settings}) + "\n", encoding="utf-8")
        _fsync(marker)
        if final.exists():  # the same step saved again (e.g. after a resume): replace it whole
            replaced = final.with_name(f".{final.name}.replaced")
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(final, replaced)
            os.replace(staging, final)
            shutil.rmtree(replaced, ignore_errors=True)
        else:
            os.replace(staging, final)
        _fsync(final.parent)

    def _rotate_complete_checkpoints(self, run_dir: Path, best_model_checkpoint: str | None) -> None:
        # Incomplete checkpoints never count toward save_total_limit, and Trainer's rotation
        # keeps the best one; with a limit of 1 it keeps the best and the newest.
        rotate_checkpoints(
            output_dir=str(run_dir),
            save_total_limit=self.args.save_total_limit,
            best_model_checkpoint=best_model_checkpoint,
            use_mtime=False,
        )

    def save_final_model(self) -> None:
        """``save_model()`` into ``output_dir``, except never with non-finite weights nor half-written.

        The files are written into a staging folder and moved into place only
        once all of them are: a failed save (disk full, a file-size limit)
        removes the staging folder, leaves what was in ``output_dir`` as it
        was, and stops with one line naming the checkpoint that is kept.
        """
        run_dir = Path(self.args.output_dir)
        require_finite_weights(self.model, f"the final model in {run_dir}", run_dir, self.state.global_step)
        staging = run_dir / FINAL_STAGING
        try:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
            self.save_model(str(staging), _internal_call=True)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                for path in staging.rglob("*"):
                    if path.is_file():
                        _fsync(path)
                for path in sorted(staging.iterdir()):
                    target = run_dir / path.name
                    if target.is_dir() and not path.is_dir():
                        shutil.rmtree(target)
                    os.replace(path, target)
                staging.rmdir()
                _fsync(run_dir)
        except Exception as error:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
            last = latest_complete_checkpoint(run_dir)
            kept = (
                f"the last checkpoint {last} is kept; free disk space, then resume it with "
                "--resume_from_checkpoint auto to save the model"
                if last
                else "no checkpoint was saved; free disk space or choose another output_dir and train again"
            )
            raise FinetuneError(f"cannot save the final model in {run_dir} ({_save_failure(error)}); {kept}") from error
        if self.args.push_to_hub:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Trainer's loading, after refusing a checkpoint whose weights are only pickle files."""
        require_safe_weights(resume_from_checkpoint, getattr(self.args, "allow_pickle_checkpoints", False))
        with _damaged_checkpoint(resume_from_checkpoint):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Trainer's loading, with a damaged file reported in one line."""
        with _damaged_checkpoint(checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Trainer's loading, with a damaged file reported in one line."""
        with _damaged_checkpoint(checkpoint):
            super()._load_rng_state(checkpoint)


class _damaged_checkpoint:
    """Turn an exception while reading a checkpoint (a file cut short, overwritten) into one line with the fix."""

    def __init__(self, checkpoint: str | None) -> None:
        self.checkpoint = checkpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if error is None or isinstance(error, FinetuneError) or not isinstance(error, Exception):
            return False
        raise FinetuneError(
            f"cannot read checkpoint {self.checkpoint} ({first_line(error)}); it is damaged: "
            "resume from an earlier checkpoint, or drop --resume_from_checkpoint"
        ) from error


def _fsync(path: Path) -> None:
    # Directories are fsynced too, so the rename itself survives a power cut.
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
