"""``finetune serve`` started in the background on 127.0.0.1, and a small HTTP client for it.

Used by the server tests and by ``tools/serve_load.py``: each needs a server on a
free port, to know when it answers, and to stop it the way a process manager
would (SIGTERM, then its exit status).
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

# The line finetune serve prints once it listens; with --port 0 it names the port the system chose.
_ADDRESS = re.compile(r"serving .* at http://127\.0\.0\.1:(\d+)")
PROJECT = Path(__file__).resolve().parent.parent.parent


class ServerProcess:
    """``finetune serve MODEL --port 0 ...`` in the background; its stderr goes to ``log``.

    Returns once ``GET /health`` answers 200 (``self.port`` is then set); raises
    ``RuntimeError`` with the log if the server exits or does not answer within
    ``start_timeout_s`` (loading torch, transformers and the model takes seconds,
    many more on a busy machine).
    """

    def __init__(
        self,
        model_dir: Path | str,
        log: Path,
        *flags: str,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 180,
    ) -> None:
        self.log = log
        environment = {**os.environ, "PYTHONPATH": str(PROJECT), **(env or {})}
        # A file, not a pipe: nobody reads a pipe while the server runs, and a full pipe would stall it.
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "finetune", "serve", str(model_dir), "--port", "0", *flags],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=environment,
            )
        self.port = self._wait_for_port(start_timeout_s)

    def _wait_for_port(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = _ADDRESS.search(self.log.read_text(encoding="utf-8", errors="replace"))
            if found and self._answers(int(found.group(1))):
                return int(found.group(1))
            if self.process.poll() is not None:
                raise RuntimeError(f"finetune serve exited {self.process.returncode}: {self.log.read_text()}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"finetune serve did not start in {timeout_s:g} s: {self.log.read_text()}")

    def _answers(self, port: int) -> bool:
        try:
            return request(port, "GET", "/health")[0] == 200
        except OSError:
            return False

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, then the exit status (killed after ``timeout_s``)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
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
    """One request on a fresh connection to 127.0.0.1: the status and the decoded JSON answer (or the text).

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
