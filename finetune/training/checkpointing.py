"""Checkpoints that survive a crash, and loading that refuses pickled weights.

A checkpoint is written into a hidden ``.checkpoint-N.partial`` folder,
flushed to disk, marked complete, and only then renamed to ``checkpoint-N``:
a rename is atomic, so a kill at any moment leaves either the whole new
checkpoint or none of it, and the previous one untouched. Resuming with
``auto`` takes the newest checkpoint that carries the marker.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints, sort_checkpoints

from ..errors import FinetuneError

COMPLETE_MARKER = "finetune_checkpoint_complete.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def is_complete_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder`` is a checkpoint this project finished writing."""
    return (Path(folder) / COMPLETE_MARKER).is_file()


def latest_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (incomplete ones are skipped)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    complete = [path for path in sort_checkpoints(str(folder), use_mtime=False) if is_complete_checkpoint(path)]
    return Path(complete[-1]) if complete else None


def require_safe_weights(folder: str | Path, allow_pickle: bool = False) -> None:
    """Refuse a model folder whose weights are only pickle files (which can run code when loaded)."""
    folder = Path(folder)
    has_safe = any((folder / name).is_file() for name in SAFE_WEIGHTS)
    has_pickle = any((folder / name).is_file() for name in PICKLED_WEIGHTS)
    if has_pickle and not has_safe and not allow_pickle:
        raise FinetuneError(
            f"{folder} has only pickled weights (pytorch_model.bin), which can run code when loaded; "
            "convert them to safetensors, or pass --allow_pickle_checkpoints if you trust where they came from"
        )


class CrashSafeCheckpoints:
    """A ``Trainer`` mixin: atomic checkpoints with a completion marker, and safe weight loading."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Trainer's checkpoint, written to a staging folder and renamed into place when complete."""
        run_dir = Path(self._get_output_dir(trial=trial))
        final = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if not all(bool(parameter.isfinite().all()) for parameter in model.parameters()):
            # Skipped updates keep bad numbers out of the weights; if some got in anyway, keep them off disk.
            raise FinetuneError(
                f"the weights hold NaN or inf at update {self.state.global_step}, so {final} is not saved; "
                f"the last good checkpoint is {latest_complete_checkpoint(run_dir)}; lower learning_rate"
            )
        staging = run_dir / f".{final.name}.partial"
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        try:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)  # left by a kill during an earlier save
                staging.mkdir(parents=True)
            self.accelerator.wait_for_everyone()  # every process writes its RNG state into staging
            self._write_checkpoint_files(staging)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                self._publish(staging, final)
        except OSError as error:
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
            previous = latest_complete_checkpoint(run_dir)
            kept = f"the previous checkpoint {previous} is kept" if previous else "no earlier checkpoint exists"
            raise FinetuneError(
                f"cannot save {final} ({error.strerror or error}); {kept}; free disk space or choose another output_dir"
            ) from error

        # Trainer's bookkeeping of the best checkpoint, now that this one exists.
        if self.state.best_global_step:
            best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}"
            if best.is_dir():
                self.state.best_model_checkpoint = str(best)
        if self.args.should_save:
            self._rotate_complete_checkpoints(run_dir)

    def _write_checkpoint_files(self, staging: Path) -> None:
        """What Trainer saves in a checkpoint: model, optimizer, scheduler, scaler, RNG states, state."""
        self.save_model(str(staging), _internal_call=True)
        if not self.args.save_only_model:
            self._save_optimizer_and_scheduler(str(staging))
            self._save_scaler(str(staging))
            self._save_rng_state(str(staging))
        if self.args.should_save:
            from transformers.trainer_callback import ExportableState

            for callback in [*self.callback_handler.callbacks, self.control]:
                if isinstance(callback, ExportableState):
                    name = callback.__class__.__name__
                    if isinstance(self.state.stateful_callbacks.get(name), list):
                        self.state.stateful_callbacks[name].append(callback.state())
                    else:
                        self.state.stateful_callbacks[name] = callback.state()
            self.state.save_to_json(str(staging / "trainer_state.json"))

    def _publish(self, staging: Path, final: Path) -> None:
        # Flush every file, then mark, then rename: the marker is never on disk before the data.
        for path in staging.rglob("*"):
            if path.is_file():
                _fsync(path)
        marker = staging / COMPLETE_MARKER
        marker.write_text(json.dumps({"global_step": self.state.global_step}) + "\n", encoding="utf-8")
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

    def _rotate_complete_checkpoints(self, run_dir: Path) -> None:
        # Incomplete checkpoints never count toward save_total_limit, and Trainer's rotation
        # keeps the best one; with a limit of 1 it keeps the best and the newest.
        rotate_checkpoints(
            output_dir=str(run_dir),
            save_total_limit=self.args.save_total_limit,
            best_model_checkpoint=self.state.best_model_checkpoint,
            use_mtime=False,
        )

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Trainer's loading, after refusing a checkpoint whose weights are only pickle files."""
        require_safe_weights(resume_from_checkpoint, getattr(self.args, "allow_pickle_checkpoints", False))
        super()._load_from_checkpoint(resume_from_checkpoint, model)


def _fsync(path: Path) -> None:
    # Directories are fsynced too, so the rename itself survives a power cut.
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
