"""``finetune serve`` answers with weights it holds in memory, whatever happens to the model's files (issue 73).

transformers maps a safetensors file into memory; a server answering from that
map died of SIGBUS ("Bus error", no log line) on its next request once the file
was cut short under it. Each server here runs on 127.0.0.1 on its own copy of
the tiny served run, whose model file is cut short, replaced, deleted and made
unreadable between requests.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")

from serving import ServerProcess, request

REVIEW = {"reviews": ["Great value, it works as described."]}
# The watch looks every 2 s (finetune/serve/watch.py); a busy 2-core machine may take longer to notice.
NOTICE_S = 30


def _wait_for_log(server: ServerProcess, offset: int, says: str) -> list[str]:
    """The log lines written since ``offset`` once one of them holds ``says`` (fails after ``NOTICE_S``)."""
    deadline = time.monotonic() + NOTICE_S
    while time.monotonic() < deadline:
        lines = server.log.read_bytes()[offset:].decode("utf-8", errors="replace").splitlines()
        if any(says in line for line in lines):
            return lines
        assert server.process.poll() is None, server.log.read_text()
        time.sleep(0.3)
    raise AssertionError(f"no log line saying {says!r} in {NOTICE_S} s: {server.log.read_text()}")


def test_the_served_model_maps_no_file(served_run, tmp_path):
    """No page of the weights file is mapped once the model is loaded: a file cut short cannot reach it."""
    from finetune.serve.model import load_served_model

    maps = Path("/proc/self/maps")
    if not maps.is_file():
        pytest.skip("needs Linux's /proc/self/maps")
    folder = tmp_path / "run"
    shutil.copytree(served_run, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    served = load_served_model(folder)
    assert str(folder / "model.safetensors") not in maps.read_text()
    assert served.predict(["fine"])[0]["label"] in served.class_names


@pytest.mark.parametrize("reload_on_change", [False, True], ids=["watching", "reloading"])
def test_the_server_answers_whatever_happens_to_its_model_file(served_run, tmp_path, reload_on_change):
    folder = tmp_path / "run"
    shutil.copytree(served_run, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    flags = ("--threads", "1") + (("--reload_on_change",) if reload_on_change else ())
    server = ServerProcess(folder, tmp_path / "serve.log", *flags)
    weights = folder / "model.safetensors"
    saved = weights.read_bytes()
    status, first = request(server.port, "POST", "/predict", REVIEW)
    assert status == 200, first
    says = "cannot reload" if reload_on_change else "still answering with the model loaded"
    # Root reads a file whatever its mode: there the unreadable file is only one cut short.
    unreadable = "unreadable" if os.geteuid() != 0 else "cut short"
    harms = {
        "cut short": lambda: os.truncate(weights, 1000),
        "rewritten": lambda: weights.write_bytes(os.urandom(len(saved))),
        "removed": weights.unlink,
        unreadable: lambda: (weights.write_bytes(saved[:2000]), weights.chmod(0)),
    }
    try:
        for seen, harm in harms.items():
            offset = server.log.stat().st_size
            harm()
            lines = _wait_for_log(server, offset, says)
            assert request(server.port, "POST", "/predict", REVIEW) == (200, first), seen
            assert len(lines) == 1 and "Traceback" not in server.log.read_text(), lines
            if not reload_on_change:
                assert f"{weights.name} {seen}" in lines[0], lines
        assert request(server.port, "GET", "/health") == (200, {"status": "ok"})
        # The folder itself gone: the watch says so in one line, the model in memory answers.
        offset = server.log.stat().st_size
        shutil.rmtree(folder)
        _wait_for_log(server, offset, "is gone" if not reload_on_change else "cannot reload")
        assert request(server.port, "POST", "/predict", REVIEW) == (200, first)
        assert "Traceback" not in server.log.read_text()
    finally:
        assert server.stop() == 0, server.log.read_text()


@pytest.mark.parametrize("chunk_bytes", [1_000_001, 2**40], ids=["one-past-the-limit", "a-terabyte"])
def test_a_chunk_larger_than_max_body_bytes_gets_a_413_at_once(token_server, chunk_bytes):
    """Once the server waited for the chunk until the body timeout (30 s) and answered 408 (issue 73)."""
    import json
    import socket

    from serving import AUTH

    offset = token_server.log.stat().st_size
    head = (
        "POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: {AUTH['Authorization']}\r\nTransfer-Encoding: chunked\r\n\r\n{chunk_bytes:x}\r\n"
    )
    with socket.create_connection(("127.0.0.1", token_server.port), timeout=10) as client:
        started = time.monotonic()
        client.sendall(head.encode() + b'{"reviews": ["a"')
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        waited = time.monotonic() - started
    head_part, _, body = answer.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 413"), answer
    assert json.loads(body) == {
        "error": f"the body has a chunk of {chunk_bytes:,} bytes, more than the limit of 1,000,000; send fewer "
        "reviews per request, or start the server with a larger --max_body_bytes"
    }
    assert waited < 10  # the body timeout is 30 s
    lines = _wait_for_log(token_server, offset, "chunk of")
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert request(token_server.port, "GET", "/health") == (200, {"status": "ok"})
