"""A child process (pip) that ends with its parent: its own process group, ended on SIGTERM, SIGINT or SIGHUP.

``subprocess.run`` leaves the child in the parent's process group and waits
for it; SIGTERM to the parent ended only the parent, and pip went on writing
into the work folder of a fetch that no longer existed. Here the child runs in
a process group of its own (so a signal meant for the parent is the parent's
to handle), the parent turns SIGTERM and SIGHUP into an exception while it
waits, and on any way out but the child's own end the whole group is ended
before the exception goes on, so the callers' clean-up (removing a work
folder) runs on a folder no one writes into. On Linux the child also asks the
kernel to end it if the parent is killed outright (SIGKILL), which no handler sees.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from ..errors import StoppedBySignal

# What the shell reports for a process ended by each signal (128 + N); SIGINT goes through KeyboardInterrupt.
_STOPPING_SIGNALS = {signal.SIGTERM: 143, signal.SIGHUP: 129}
# How long the group has to end after SIGTERM before it gets SIGKILL.
_GRACE_SECONDS = 5
# Run in the child before the program: end me when my parent ends (prctl PR_SET_PDEATHSIG = 1), then run it.
_ENDS_WITH_PARENT = (
    "import ctypes, os, runpy, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL); "
    # The parent may have died before prctl: then no signal comes, so stop here.
    "os.getppid() == int(sys.argv[1]) or os._exit(1); "
    "sys.argv = sys.argv[2:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def run_python_module(
    module: str, arguments: list[str], stopped: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module arguments`` to its end, its output captured as text, as ``subprocess.run`` would.

    ``env``, when given, is the child's whole environment (``subprocess.Popen``'s).

    A SIGTERM or SIGHUP to this process ends the child's whole process group,
    then raises :class:`StoppedBySignal` with ``"stopped by SIGTERM while
    {stopped}"`` (the caller's clean-up runs as the exception passes); Ctrl-C
    ends it too, then raises ``KeyboardInterrupt`` as Python does.
    """
    if sys.platform.startswith("linux"):
        command = [sys.executable, "-c", _ENDS_WITH_PARENT, str(os.getpid()), module, *arguments]
    else:
        command = [sys.executable, "-m", module, *arguments]
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, which a terminal's Ctrl-C does not reach: forwarded below
    )
    try:
        with _signals_raise(stopped):
            stdout, stderr = child.communicate()
    except BaseException:
        if child.returncode is None:  # once reaped, its group id may already be another's
            _end_group(child)
        raise
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


@contextlib.contextmanager
def _signals_raise(stopped: str) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`StoppedBySignal` (only the main thread can catch signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        raise StoppedBySignal(f"stopped by {name} while {stopped}", _STOPPING_SIGNALS[signal.Signals(signum)])

    previous = {signum: signal.signal(signum, stop) for signum in _STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _end_group(child: subprocess.Popen) -> None:
    """End ``child``'s process group: SIGTERM, then SIGKILL after a grace period; reap the child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
