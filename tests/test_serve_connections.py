"""``finetune serve`` under slow, malformed and dropped connections, and a model retrained under it (issue 48).

Every test talks to 127.0.0.1 only, through raw sockets where HTTP clients
would hide what the server does, and each waits a bounded time. A server with
one-second timeouts and a cap of 4 connections checks that a stalled
connection is closed within its timeout; the shared server (``token_server``,
default settings) checks what every server does: errors in JSON, HEAD where
GET is, one log line for a client that leaves.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")

from serving import AUTH, TOKEN, ServerProcess, request

TIMEOUT_S = 1
MAX_CONNECTIONS = 4
# Time for a busy 2-core machine to notice a timer, on top of the timeout itself.
SLACK_S = 4


@pytest.fixture(scope="module")
def guarded_run(served_run, tmp_path_factory) -> Path:
    """A copy of the served run, whose files the reload test changes."""
    folder = tmp_path_factory.mktemp("guarded") / "run"
    shutil.copytree(served_run, folder)
    return folder


@pytest.fixture(scope="module")
def guarded(guarded_run, tmp_path_factory):
    """``finetune serve`` with one-second timeouts, at most 4 connections, reloading a model changed on disk."""
    log = tmp_path_factory.mktemp("guarded-serve") / "serve.log"
    seconds = str(TIMEOUT_S)
    process = ServerProcess(
        guarded_run,
        log,
        *("--threads", "1", "--header_timeout", seconds, "--body_timeout", seconds),
        *("--keep_alive_timeout", seconds, "--max_connections", str(MAX_CONNECTIONS), "--reload_on_change"),
        env={"FINETUNE_SERVE_TOKEN": TOKEN},
    )
    yield process
    assert process.stop() == 0, log.read_text()


def connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S + SLACK_S + 5)
    return client


def read_until_closed(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a socket timeout fails the test)."""
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


def json_error(answer: bytes) -> tuple[int, dict]:
    """The status and JSON body of a raw HTTP/1.1 answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


def log_lines_since(server: ServerProcess, offset: int) -> list[str]:
    return server.log.read_bytes()[offset:].decode("utf-8", errors="replace").splitlines()


STALLS = {
    "nothing sent": b"",
    "partial headers": b"GET /health HTTP/1.1\r\nHo",
    "partial body": (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: 100\r\n\r\n{"
    ),
    "idle after an answer": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("stall", list(STALLS))
def test_a_stalled_connection_is_closed_within_its_timeout(guarded, stall):
    with connect(guarded.port) as client:
        started = time.monotonic()
        client.sendall(STALLS[stall])
        answer = read_until_closed(client)
        waited = time.monotonic() - started
    assert TIMEOUT_S * 0.8 <= waited <= TIMEOUT_S + SLACK_S, waited
    if stall == "partial headers":
        assert json_error(answer) == (408, {"error": guarded_message("headers")})
    elif stall == "partial body":
        assert json_error(answer) == (408, {"error": guarded_message("body")})
    elif stall == "idle after an answer":
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b'{"status":"ok"}')
    else:
        assert answer == b""


def guarded_message(part: str) -> str:
    flag = "--header_timeout" if part == "headers" else "--body_timeout"
    return (
        f"the request's {part} did not arrive within {TIMEOUT_S:g} s, so the connection is closed; "
        f"send the whole request at once, or start the server with a larger {flag}"
    )


def test_connections_past_the_cap_are_refused_at_once_in_json(guarded):
    idle = [connect(guarded.port) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # the server has taken them all
        with connect(guarded.port) as extra:
            started = time.monotonic()
            answer = read_until_closed(extra)
            assert time.monotonic() - started < TIMEOUT_S / 2
        status, body = json_error(answer)
        assert status == 503 and body == {
            "error": f"the server has {MAX_CONNECTIONS} connections open, its limit; retry in a moment, or "
            "start the server with a larger --max_connections"
        }
    finally:
        for client in idle:
            client.close()
    time.sleep(0.2)
    assert request(guarded.port, "GET", "/health") == (200, {"status": "ok"})


@pytest.mark.parametrize(
    "garbage",
    [b"GARBAGE\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", b"GET /" + b"x" * 70_000],
    ids=["not HTTP", "a space in a header name", "headers past h11's limit"],
)
def test_a_request_that_is_not_http_gets_a_json_400(token_server, garbage):
    with connect(token_server.port) as client:
        client.sendall(garbage)
        status, body = json_error(read_until_closed(client))
    assert status == 400
    assert body == {
        "error": "the request is not valid HTTP/1.1 (uvicorn's h11 cannot parse it); send a well-formed request"
    }


@pytest.mark.parametrize("path", ["/", "/health", "/info", "/docs", "/openapi.json", "/static/app.js"])
def test_head_is_answered_where_get_is(token_server, path):
    status, _ = request(token_server.port, "GET", path, headers=AUTH)
    assert status == 200
    connection_headers = {"Authorization": AUTH["Authorization"]}
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", token_server.port, timeout=60)
    try:
        connection.request("GET", path, headers=connection_headers)
        got = connection.getresponse()
        body = got.read()
        connection.request("HEAD", path, headers=connection_headers)
        head = connection.getresponse()
        assert head.read() == b""
    finally:
        connection.close()
    assert head.status == 200
    assert head.getheader("content-type") == got.getheader("content-type")
    assert int(head.getheader("content-length")) == len(body)


def test_a_client_that_leaves_mid_body_is_one_log_line(token_server):
    offset = token_server.log.stat().st_size
    with connect(token_server.port) as client:
        client.sendall(STALLS["partial body"])
        time.sleep(0.5)  # the server reads the headers and waits for the body
    deadline = time.monotonic() + 10
    while not log_lines_since(token_server, offset) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # anything else it would log
    lines = log_lines_since(token_server, offset)
    assert len(lines) == 1, lines
    assert lines[0].startswith("client 127.0.0.1:")
    assert "left before sending the whole body of POST /predict" in lines[0]
    assert request(token_server.port, "POST", "/predict", {"reviews": ["fine"]}, AUTH)[0] == 200


def test_a_model_changed_on_disk_is_reported_and_reloaded(guarded, guarded_run):
    review = {"reviews": ["review 3 was fine and then awful"]}
    status, info = request(guarded.port, "GET", "/info", headers=AUTH)
    assert status == 200 and info["model_files"]["changed_on_disk"] == [] and info["model_files"]["reloads"] == 0
    before = request(guarded.port, "POST", "/predict", review, AUTH)[1]["results"][0]["probabilities"]
    offset = guarded.log.stat().st_size
    # Retrained under it: the weights of the first checkpoint replace the final ones.
    shutil.copyfile(guarded_run / "checkpoint-1" / "model.safetensors", guarded_run / "model.safetensors")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = request(guarded.port, "GET", "/info", headers=AUTH)[1]
        if info["model_files"]["reloads"]:
            break
        time.sleep(0.3)
    assert info["model_files"]["reloads"] == 1 and info["model_files"]["changed_on_disk"] == [], info
    after = request(guarded.port, "POST", "/predict", review, AUTH)[1]["results"][0]["probabilities"]
    assert after != before
    lines = log_lines_since(guarded, offset)
    assert any(f"reloaded {guarded_run}" in line and "model.safetensors changed" in line for line in lines), lines


def _look(live, executor, times: int = 1) -> None:
    """``times`` looks of the watch at the model's files, as the server's lifespan makes them."""
    import asyncio

    for _ in range(times):
        asyncio.run(live.check(executor))


def test_without_reload_on_change_a_change_is_said_once_and_the_model_kept(tiny_model_dir, tmp_path, caplog):
    from concurrent.futures import ThreadPoolExecutor

    from finetune.serve.model import load_served_model
    from finetune.serve.watch import LiveModel

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    live = LiveModel(load_served_model(folder))
    served = live.served
    with ThreadPoolExecutor(max_workers=1) as executor, caplog.at_level("WARNING", logger="finetune.serve"):
        _look(live, executor)
        assert live.changed == [] and caplog.records == []
        (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())  # rewritten
        _look(live, executor, times=3)
    assert live.served is served and live.info()["changed_on_disk"] == ["model.safetensors"]
    (record,) = caplog.records
    assert record.getMessage().startswith(f"warning: {folder} changed on disk (model.safetensors rewritten) since")
    assert "restart the server, or start it with --reload_on_change" in record.getMessage()


def test_a_reload_that_fails_keeps_the_model_and_says_why_once(tiny_model_dir, tmp_path, caplog):
    from concurrent.futures import ThreadPoolExecutor

    from finetune.serve.model import load_served_model
    from finetune.serve.watch import LiveModel

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    live = LiveModel(load_served_model(folder), reload_on_change=True)
    served = live.served
    (folder / "config.json").write_text("{")  # training has only begun writing it
    with ThreadPoolExecutor(max_workers=1) as executor, caplog.at_level("WARNING", logger="finetune.serve"):
        _look(live, executor, times=4)  # once to see it settle, then a reload, then no retry of the same files
    assert live.served is served and live.reloads == 0 and live.reload_error
    (record,) = caplog.records
    assert record.getMessage().startswith(f"warning: cannot reload {folder} (config.json cut short): ")
