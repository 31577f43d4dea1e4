"""The served model and a watch over its files: a model retrained or calibrated under the server is said, or reloaded.

The server loads its model once. When the files it was loaded from change
(``finetune train --overwrite_output_dir`` into the served folder, ``evaluate
--calibrate``), it would go on answering with the old model without a word;
:class:`LiveModel` looks at their sizes and times every ``WATCH_INTERVAL_S``
seconds and says so in the log (once per change) and in ``/info``. With
``reload_on_change`` it loads the folder again once the files have stopped
changing for one interval, on the model's own thread so no request sees half a
swap; a folder that does not load (training has only begun) is said in one
line and the old model kept until the files change again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from ..training.runs import model_files
from .model import ServedModel, load_served_model

logger = logging.getLogger("finetune.serve")
# How often the model's files are looked at: a stat of each, some microseconds.
WATCH_INTERVAL_S = 2.0
# A file's size and modification time (ns): what tells that it was written since.
FileState = dict[str, tuple[int, int]]


def model_file_state(folder: Path) -> FileState:
    """The size and modification time of each file ``folder``'s model is loaded from.

    A folder that cannot be listed (gone, or made unreadable) has no files: its files are said to be removed.
    """
    state = {}
    try:
        paths = model_files(folder)
    except OSError:
        return state
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue  # removed between the listing and the stat: it is not there
        state[path.name] = (stat.st_size, stat.st_mtime_ns)
    return state


def changed_files(before: FileState, after: FileState) -> list[str]:
    """The names of the files added, removed or rewritten between two states."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def describe_changes(folder: Path, before: FileState, after: FileState) -> list[str]:
    """What happened to each changed file, as the log says it: ``model.safetensors cut short``, ``... removed``."""
    if not folder.is_dir():
        return ["the folder is gone"]
    if not os.access(folder, os.R_OK | os.X_OK):
        return ["the folder is unreadable"]
    described = []
    for name in changed_files(before, after):
        if name not in after:
            described.append(f"{name} removed")
        elif name not in before:
            described.append(f"{name} added")
        elif not os.access(folder / name, os.R_OK):
            described.append(f"{name} unreadable")
        elif after[name][0] < before[name][0]:
            described.append(f"{name} cut short")
        else:
            described.append(f"{name} rewritten")
    return described


class LiveModel:
    """The model the server answers with, and whether its files changed on disk since it was loaded."""

    def __init__(
        self,
        served: ServedModel,
        reload_on_change: bool = False,
        load: Callable[[Path], ServedModel] = load_served_model,
    ) -> None:
        self.served = served
        self.reload_on_change = reload_on_change
        self.load = load
        self.loaded_state = model_file_state(served.model_dir)
        self.loaded_at = time.time()
        self.changed: list[str] = []  # since the model was loaded, as of the last look
        self.reloads = 0
        self.reload_error: str | None = None
        self._said: list[str] = []  # the changes last said in the log, so that each is said once
        self._settling: FileState | None = None  # the state seen one look ago, while files are still being written
        self._failed: FileState | None = None  # the state a reload failed on: tried again only once it changes

    async def watch(self, executor: Executor) -> None:
        """Look at the files every ``WATCH_INTERVAL_S`` until cancelled (the server's lifespan runs it)."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                await self.check(executor)
            except Exception:  # a look that fails must not end the watch, nor the server
                logger.exception("error looking at %s's files", self.served.model_dir)

    async def check(self, executor: Executor) -> None:
        """Compare the files with those loaded: say a change once; with ``reload_on_change``, load it once settled."""
        folder = self.served.model_dir
        state = model_file_state(folder)
        self.changed = changed_files(self.loaded_state, state)
        if not self.changed:
            self._settling = None
            return
        if not self.reload_on_change:
            seen = describe_changes(folder, self.loaded_state, state)
            # Said once per kind of change, not per look: a file being written changes size at every look.
            if seen != self._said:
                self._said = seen
                logger.warning(
                    "warning: %s changed on disk (%s) since the model was loaded at %s; still answering with the "
                    "model loaded then, held in memory: restart the server, or start it with --reload_on_change",
                    folder,
                    ", ".join(seen),
                    _clock(self.loaded_at),
                )
            return
        if state != self._settling:
            self._settling = state  # still being written, perhaps: wait one more look
            return
        if state == self._failed:
            return
        try:
            # On the model's one thread: no request is scored while the model is swapped.
            reloaded = await asyncio.get_running_loop().run_in_executor(executor, self.load, folder)
        except Exception as error:  # a FinetuneError says what is wrong with the folder; anything else is said too
            self._failed = state
            self.reload_error = " ".join(str(error).split()) or type(error).__name__
            logger.warning(
                "warning: cannot reload %s (%s): %s; still answering with the model loaded at %s, held in memory",
                folder,
                ", ".join(describe_changes(folder, self.loaded_state, state)),
                self.reload_error,
                _clock(self.loaded_at),
            )
            return
        logger.warning("reloaded %s: %s changed on disk", folder, ", ".join(self.changed))
        # The state seen before loading: a file written during the load is a change still to come.
        self.served, self.loaded_state, self.loaded_at = reloaded, state, time.time()
        self.changed, self.reloads, self.reload_error, self._settling = [], self.reloads + 1, None, None

    def info(self) -> dict[str, Any]:
        """What ``/info`` says of the model's files."""
        return {
            "loaded_at": _clock(self.loaded_at),
            "changed_on_disk": self.changed,
            "reload_on_change": self.reload_on_change,
            "reloads": self.reloads,
            "reload_error": self.reload_error,
        }


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
