"""The server tests' shared ``finetune serve`` process on 127.0.0.1 (see finetune/serve/background.py).

Loaded as a pytest plugin (``tests/conftest.py``), so the API tests and the page test share one
server (``token_server``) on one tiny run (``served_run``): a server start costs seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.serve.background import ServerProcess, request

__all__ = ["AUTH", "TOKEN", "ServerProcess", "request", "served_run", "token_server"]

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
