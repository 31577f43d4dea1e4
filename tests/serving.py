"""A ``finetune serve`` process on 127.0.0.1 for the server tests, and a small HTTP client for it.

Loaded as a pytest plugin (``tests/conftest.py``), so the API tests and the page test share one
server (``token_server``) on one tiny run (``served_run``): a server start costs seconds.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).parent.parent
# Loading torch, transformers and the model takes seconds, many more on a busy machine.
START_TIMEOUT_S = 180
_ADDRESS = re.compile(r"serving .* at http://127\.0\.0\.1:(\d+)")
TOKEN = "test-secret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="session")
def served_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 2-update tiny run with a test split, so its report has test scores for /info."""
    from bad_input.common import run_recipe

    from finetune.cli import main

    folder = tmp_path_factory.mktemp("served-run")
    assert main(["train", str(run_recipe(folder, tiny_model_dir, test_split_percentage=20))]) == 0
    return folder / "run"


@pytest.fixture(scope="session")
def token_server(served_run, tmp_path_factory):
    """``finetune serve`` on ``served_run`` with one torch thread, needing ``TOKEN`` (given by the environment)."""
    pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    process = ServerProcess(served_run, log, "--threads", "1", env={"FINETUNE_SERVE_TOKEN": TOKEN})
    yield process
    assert process.stop() == 0, log.read_text()


class ServerProcess:
    """``finetune serve MODEL --port 0 ...`` started in the background; its stderr goes to ``log``."""

    def __init__(self, model_dir: Path, log: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        environment = {**os.environ, "PYTHONPATH": str(PROJECT), **(env or {})}
        # A file, not a pipe: nobody reads a pipe while the test runs, and a full pipe would stall the server.
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "finetune", "serve", str(model_dir), "--port", "0", *flags],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=environment,
            )
        self.port = self._wait_for_port()

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = _ADDRESS.search(self.log.read_text(encoding="utf-8", errors="replace"))
            if found and self._answers(int(found.group(1))):
                return int(found.group(1))
            if self.process.poll() is not None:
                raise AssertionError(f"finetune serve exited {self.process.returncode}: {self.log.read_text()}")
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"finetune serve did not start in {START_TIMEOUT_S} s: {self.log.read_text()}")

    def _answers(self, port: int) -> bool:
        try:
            return request(port, "GET", "/health")[0] == 200
        except OSError:
            return False

    def stop(self) -> int:
        """SIGTERM, then the exit status (killed after 60 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> tuple[int, Any]:
    """One request on a fresh connection: the status and the decoded JSON answer (or the text, if not JSON).

    ``body`` is sent as is when bytes, else as JSON.
    """
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", errors="replace")
