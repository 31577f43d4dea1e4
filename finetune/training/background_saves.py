"""Checkpoints written in a background thread: the snapshot training waits for, and the one writer.

A save copies what the checkpoint holds into CPU memory (``cpu_copy``) while
training waits, then a :class:`BackgroundWriter` thread writes, flushes, marks
and renames it while training goes on. One write at a time: the next save,
the end of training and anything that reads the run's folder wait for it
first, and a write that failed raises its error there.
"""

from __future__ import annotations

import copy
import random
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback


@dataclass
class CheckpointSnapshot:
    """What one checkpoint holds, copied at the update it was saved after; None for what is not saved."""

    global_step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None
    scheduler_state: dict[str, Any] | None
    scaler_state: dict[str, Any] | None
    rng_state: dict[str, Any] | None
    trainer_state: Any  # a copy of Trainer's TrainerState, best_model_checkpoint included


def cpu_copy(value: Any, copies: dict[tuple, torch.Tensor] | None = None) -> Any:
    """``value`` with every tensor in it copied to CPU memory, containers rebuilt, anything else deep-copied.

    Tensors that share memory (tied weights) stay shared in the copy: saving
    finds tied weights by their storage, and ``torch.save`` keeps them as one.
    """
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        key = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), value.shape, value.stride())
        if key not in copies:
            copies[key] = value.detach().to("cpu", copy=True)
        return copies[key]
    if type(value) in (dict, OrderedDict):
        copied = type(value)((name, cpu_copy(item, copies)) for name, item in value.items())
        if hasattr(value, "_metadata"):  # a module's state_dict() carries its layers' versions
            copied._metadata = copy.deepcopy(value._metadata)
        return copied
    if type(value) in (list, tuple):
        return type(value)(cpu_copy(item, copies) for item in value)
    return copy.deepcopy(value)


def rng_states(parallel_mode_is_distributed: bool) -> dict[str, Any] | None:
    """The random states ``Trainer._save_rng_state`` saves for one process, or None on a device it saves others for.

    Trainer also saves XLA, NPU, HPU, MLU and MUSA states; where one of those
    is present the save stays synchronous, with Trainer's own method.
    """
    from transformers.utils import (
        is_torch_hpu_available,
        is_torch_mlu_available,
        is_torch_musa_available,
        is_torch_npu_available,
        is_torch_xla_available,
    )

    others = (
        is_torch_xla_available,
        is_torch_npu_available,
        is_torch_hpu_available,
        is_torch_mlu_available,
        is_torch_musa_available,
    )
    if any(available() for available in others):
        return None
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        # As Trainer: every GPU's state on several processes, the current one's otherwise.
        cuda = torch.cuda.random
        states["cuda"] = cuda.get_rng_state_all() if parallel_mode_is_distributed else cuda.get_rng_state()
    return states


def reads_checkpoint_on_save(callback: Any) -> bool:
    """Whether ``callback`` may read the checkpoint folder in ``on_save`` (it overrides it, and does not say no).

    Reporting integrations (wandb, MLflow, Neptune, ClearML, ...) upload the
    folder there; with one of them a save is written before ``on_save``, as
    without background saves. A callback whose ``on_save`` never reads the
    folder says so with ``reads_checkpoint_on_save = False``.
    """
    declared = getattr(callback, "reads_checkpoint_on_save", None)
    if declared is not None:
        return bool(declared)
    on_save = getattr(type(callback), "on_save", TrainerCallback.on_save)
    return on_save is not TrainerCallback.on_save


# The write in flight into each run folder: anything in this process that looks for the newest
# complete checkpoint (latest_complete_checkpoint) waits for it first, as the trainer does.
_writes_in_flight: dict[Path, BackgroundWriter] = {}


def wait_for_write_into(folder: str | Path) -> None:
    """Block until a background write into ``folder`` has ended; a failure is left for its trainer to raise."""
    writer = _writes_in_flight.get(Path(folder).resolve())
    if writer is not None:
        writer.join()


class BackgroundWriter:
    """At most one write in flight, in its own thread; its exception is raised by the next :meth:`wait`.

    The thread is not a daemon: a process that ends while a write is in flight
    (an exception, ``sys.exit``) finishes the write first, so the checkpoint
    is whole; only a kill cuts it short, and then the folder was never renamed.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._folder: Path | None = None
        self._error: BaseException | None = None
        # Set once someone waits for the write in flight (tests hold a write back until then).
        self.waited = threading.Event()

    def start(self, write: Callable[[], None], name: str, folder: str | Path) -> None:
        """Run ``write``, which writes into ``folder``, in a new thread; the previous write was waited for."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint write is still in flight; wait() for it before starting another")
        self.waited = threading.Event()
        self._folder = Path(folder).resolve()
        self._thread = threading.Thread(target=self._run, args=(write,), name=name, daemon=False)
        _writes_in_flight[self._folder] = self
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as error:  # handed to the training thread, which raises it at its next wait
            self._error = error

    def join(self) -> None:
        """Block until the write in flight has ended, leaving its exception for :meth:`wait`.

        A no-op in the writer's own thread (its error message names the newest complete checkpoint too).
        """
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self.waited.set()
            thread.join()

    def wait(self) -> None:
        """Block until the write in flight has ended; raise its exception, if it raised one."""
        self.join()
        if self._thread is not None:
            self._thread = None
            if _writes_in_flight.get(self._folder) is self:
                del _writes_in_flight[self._folder]
        error, self._error = self._error, None
        if error is not None:
            raise error
