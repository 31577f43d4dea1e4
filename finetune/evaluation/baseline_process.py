"""The TF-IDF baseline fitted in a process of its own while the model trains.

Fitted inline, the baseline held the run up before the model was loaded: 5.3 s
of a 33.7 s run on a GPU, 75 s of a 466 s run on 45,000 long reviews on 2 CPU
cores. Here it is started as soon as the data is read and waited for after
training, so the run pays only for what is left of it then.

The process is spawned, not forked: a forked copy of a process holding
torch's thread pools (or a CUDA context) can hang. It ignores SIGINT, so a
Ctrl-C at the terminal, which reaches every process of the foreground group,
stops the run through the parent alone (save, say how to resume); and it
ends with the parent however the parent ends: :meth:`BaselineProcess.stop`
on every way out of the run, and on Linux the kernel's parent-death signal
when the parent is killed outright (SIGKILL), which no handler sees.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

from .baseline import BaselineResult, fit_and_predict, score_predictions

# How long a terminated process has to end before it is killed.
_GRACE_SECONDS = 5


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a container or ``taskset`` narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def runs_beside_training(device_type: str) -> bool:
    """Whether the baseline is fitted in another process while the model trains (else inline, before it).

    On an accelerator (``device_type`` not ``"cpu"``) always: the CPU cores
    mostly wait on the device while it trains. On a CPU-only machine only
    where cores are left over beyond torch's threads: on 2 cores torch's 2
    threads already use both, and a baseline beside them would take a core
    from every training step for as long as it fits, saving nothing.
    Tests monkeypatch this to force either way.
    """
    if device_type != "cpu":
        return True
    import torch

    return available_cores() > torch.get_num_threads()


class BaselineProcessFailed(Exception):
    """The baseline's process ended without a result, or failed with an error other than "cannot be fit"."""


class BaselineProcess:
    """:func:`~finetune.evaluation.baseline.run_baseline`, fitted in a spawned process: started at once, collected once.

    The process fits and predicts, importing scikit-learn alone; this one
    scores the predictions with the model's own metrics (``evaluate``, which
    brings in transformers: seconds of imports and hundreds of MiB the
    process beside training does not take).

    Use it as a context manager (or call :meth:`stop`): the process is ended
    and reaped on leaving, whatever happened in between.
    """

    def __init__(
        self,
        train_texts: Sequence[str],
        train_labels: Sequence[int],
        to_score: dict[str, tuple[Sequence[str], Sequence[int]]],
        label_names: list[str],
        seed: int = 42,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        # Daemonic: should every other way fail, multiprocessing ends it when this interpreter exits.
        self._process = context.Process(
            target=_fit_in_child, args=(child_end, os.getpid()), name="finetune-baseline", daemon=True
        )
        with _sigint_ignored_by_children():
            self._process.start()
        child_end.close()  # the child's end lives in the child now: a child that dies reads as EOF here
        self._references = {split: list(labels) for split, (_, labels) in to_score.items()}
        self._label_names = list(label_names)
        payload = (
            list(train_texts),
            list(train_labels),
            {split: list(texts) for split, (texts, _) in to_score.items()},
            len(label_names),
            seed,
        )
        # Sent from a thread: pickling and writing tens of megabytes of reviews waits for the child to read
        # them, which it does only once it has started Python and imported scikit-learn.
        self._sender = threading.Thread(target=self._send, args=(payload,), name="finetune-baseline-send", daemon=True)
        self._sender.start()

    @property
    def pid(self) -> int | None:
        """The process id of the fitting process."""
        return self._process.pid

    def _send(self, payload: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError, ValueError):  # the child was ended (or the pipe closed) first
            self._connection.send(payload)

    def result(self) -> BaselineResult:
        """Wait for the fit and return its result.

        Raises ``ValueError`` where scikit-learn cannot fit these reviews (as
        :func:`run_baseline` inline does), :class:`BaselineProcessFailed` where
        the process failed otherwise or ended without a result.
        """
        try:
            kind, value = self._connection.recv()
        except (EOFError, ConnectionResetError):  # the child ended without a word: killed, or out of memory
            self._process.join()
            raise BaselineProcessFailed(
                f"its process ended without a result (exit code {self._process.exitcode})"
            ) from None
        self._process.join()
        if kind == "cannot_fit":
            raise ValueError(value)
        if kind == "failed":
            raise BaselineProcessFailed(f"it failed in its process ({value})")
        return score_predictions(value, self._references, self._label_names)

    def stop(self) -> None:
        """End the process if it still runs and reap it; safe to call again."""
        if self._process.pid is not None and self._process.exitcode is None:
            self._process.terminate()
            self._process.join(_GRACE_SECONDS)
            if self._process.exitcode is None:
                self._process.kill()
                self._process.join()
        self._sender.join(_GRACE_SECONDS)  # its send fails as soon as the child's end is gone
        self._connection.close()

    def __enter__(self) -> BaselineProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Iterator[None]:
    """Processes started inside ignore SIGINT from their first instruction; this one loses no Ctrl-C meanwhile.

    An ignored signal stays ignored across exec, and Python leaves an ignored
    SIGINT ignored, so the child never turns a Ctrl-C into KeyboardInterrupt,
    even while it imports. This process blocks SIGINT while its own handler is
    set aside: on Linux a blocked signal is kept pending even when ignored, and is
    delivered to the handler put back. Only the main thread may set handlers;
    elsewhere the child ignores SIGINT from its first line of Python on.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _end_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this process when its parent dies (PR_SET_PDEATHSIG); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the request: no signal will come
        os._exit(1)


def _fit_in_child(connection: Connection, parent_pid: int) -> None:
    """The child's whole life: ignore Ctrl-C, receive the reviews, fit and predict, send the predictions back."""
    # Already ignored when started from the main thread (see _sigint_ignored_by_children); not from another.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent(parent_pid)
    try:
        train_texts, train_labels, to_predict, num_labels, seed = connection.recv()
    except EOFError:  # the parent stopped before sending
        return
    try:
        result = fit_and_predict(train_texts, train_labels, to_predict, num_labels, seed=seed)
    except ValueError as error:
        # scikit-learn's "no terms remain" on a handful of reviews: the parent says so, as inline.
        message: tuple[str, Any] = ("cannot_fit", str(error))
    except Exception as error:  # any other failure is reported, and the run goes on without the baseline
        message = ("failed", f"{type(error).__name__}: {error}")
    else:
        message = ("result", result)
    with contextlib.suppress(OSError):  # the parent went first
        connection.send(message)
