"""``finetune serve``: answers as ``finetune predict`` does, batches concurrent requests, refuses abuse, stops cleanly.

Servers run on 127.0.0.1 with the tiny 2-layer model of a finished tiny run.
Timings on a shared machine are never asserted: batching is checked by counting
model calls, and ``tools/serve_load.py`` measures the speed on a real run.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="finetune serve needs the serve extra: pip install -e '.[serve]'")

from helpers import WORDS
from serving import AUTH, TOKEN, ServerProcess, request

from finetune.cli import main

REVIEWS = ["Great value, it works as described.", "Stopped working after a week &amp; no refund."]


@pytest.fixture
def run_dir(served_run) -> Path:
    return served_run


@pytest.fixture
def server(token_server) -> ServerProcess:
    return token_server


def _expected(run_dir: Path, reviews: list[str]) -> np.ndarray:
    """What ``finetune predict`` computes for ``reviews``: cleaned as in training, then the model's probabilities."""
    from finetune.data.cleaning import clean_texts
    from finetune.data.encoding import ReviewEncoding
    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.training.runs import find_run_config

    encoding = ReviewEncoding.from_fields(find_run_config(run_dir)["data"])
    return predict_probabilities(*load_inference_model(run_dir), clean_texts(reviews), 32, encoding)


def test_predict_answers_as_finetune_predict_does(server, run_dir):
    status, answer = request(server.port, "POST", "/predict", {"reviews": REVIEWS}, AUTH)
    assert status == 200, answer
    expected = _expected(run_dir, REVIEWS)
    classes = ["negative", "neutral", "positive"]
    for result, row in zip(answer["results"], expected, strict=True):
        assert list(result["probabilities"]) == classes
        assert np.allclose([result["probabilities"][name] for name in classes], row, atol=1e-5)
        assert result["label"] == classes[int(row.argmax())]


def test_info_tells_classes_base_model_and_test_scores(server, run_dir, tiny_model_dir):
    status, info = request(server.port, "GET", "/info", headers=AUTH)
    assert status == 200, info
    metrics = json.loads((run_dir / "report" / "metrics.json").read_text())
    assert info["classes"] == ["negative", "neutral", "positive"]
    assert info["base_model"] == str(tiny_model_dir)
    assert info["backend"] == "pytorch"
    assert info["test"]["accuracy"] == metrics["test"]["accuracy"]
    assert info["test"]["macro_f1"] == metrics["test"]["macro_f1"]
    assert info["limits"] == {"max_body_bytes": 1_000_000, "max_reviews": 256, "max_review_chars": 20_000}
    assert info["threads"] == 1  # --threads 1


def test_page_schema_and_health_need_no_token(server):
    status, page = request(server.port, "GET", "/")
    assert status == 200 and '<script src="/static/app.js">' in page
    assert request(server.port, "GET", "/static/app.js")[0] == 200
    status, schema = request(server.port, "GET", "/openapi.json")
    assert status == 200 and {"/predict", "/explain", "/info", "/health"} <= set(schema["paths"])
    assert (
        "reviews"
        in schema["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )
    status, docs = request(server.port, "GET", "/docs")
    # Swagger UI from the package, not a CDN: the page works offline.
    assert status == 200 and "/static-docs/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()
    assert request(server.port, "GET", "/static-docs/swagger-ui-bundle.js")[0] == 200
    assert request(server.port, "GET", "/health") == (200, {"status": "ok"})


ABUSE = {
    "bad JSON": (("POST", "/predict", b'{"reviews": ["fine",'), AUTH, 400, "the body is not JSON"),
    "wrong type of reviews": (("POST", "/predict", {"reviews": "fine"}), AUTH, 422, "reviews: input should be"),
    "wrong type of a review": (("POST", "/predict", {"reviews": ["fine", 7]}), AUTH, 422, "reviews[1]: input"),
    "unknown field": (("POST", "/predict", {"reviews": ["fine"], "lang": "en"}), AUTH, 422, "unknown field 'lang'"),
    "not an object": (("POST", "/predict", ["fine"]), AUTH, 422, "the body is not a JSON object (got list)"),
    "empty list": (("POST", "/predict", {"reviews": []}), AUTH, 422, "reviews is an empty list"),
    "empty review": (("POST", "/predict", {"reviews": ["fine", " <br> "]}), AUTH, 422, "reviews[1] is empty"),
    "empty body": (("POST", "/predict", b""), AUTH, 400, "the body is empty"),
    "10 MB body": (
        ("POST", "/predict", json.dumps({"reviews": ["x" * 1000] * 10_000}).encode()),
        AUTH,
        413,
        "more than the limit of 1,000,000; send fewer reviews",
    ),
    "100,000-character review": (
        ("POST", "/predict", {"reviews": ["y" * 100_000]}),
        AUTH,
        413,
        "reviews[0] has 100,000 characters, more than the limit of 20,000",
    ),
    "too many reviews": (("POST", "/predict", {"reviews": ["ok"] * 257}), AUTH, 413, "257 reviews in one request"),
    "non-UTF-8 bytes": (("POST", "/predict", b'{"reviews": ["caf\xe9"]}'), AUTH, 400, "not UTF-8 (byte 0xe9"),
    "JSON nested too deep": (("POST", "/predict", b"[" * 200_000), AUTH, 400, "nested too deep"),
    # Python refuses to read an integer of more than 4,300 digits (once a 500 and a traceback in the log).
    "number of 5,001 digits": (
        ("POST", "/predict", b'{"reviews": ["a"], "top_k": 1' + b"0" * 5000 + b"}"),
        AUTH,
        400,
        "the body holds a number too long to read (more than 4,300 digits)",
    ),
    "unknown route": (("GET", "/predictions", None), AUTH, 404, "no route GET /predictions; the routes are"),
    "wrong method": (("GET", "/predict", None), AUTH, 405, "GET is not allowed on /predict"),
    "missing token": (("POST", "/predict", {"reviews": ["fine"]}), {}, 401, "this server needs a token"),
    "wrong token": (("POST", "/predict", {"reviews": ["fine"]}), {"Authorization": "Bearer guess"}, 401, "wrong token"),
    "token of another scheme": (("GET", "/info", None), {"Authorization": TOKEN}, 401, "Authorization: Bearer"),
}


@pytest.mark.parametrize("case", list(ABUSE))
def test_abuse_gets_a_4xx_json_error_naming_the_problem_and_the_server_goes_on(server, case):
    (method, path, body), headers, status, says = ABUSE[case]
    answered, answer = request(server.port, method, path, body, headers)
    assert answered == status, answer
    assert isinstance(answer, dict) and list(answer) == ["error"], answer
    assert says in answer["error"]
    # The next request is answered as if nothing happened.
    status, answer = request(server.port, "POST", "/predict", {"reviews": ["fine"]}, AUTH)
    assert status == 200 and len(answer["results"]) == 1


class _Client:
    """One keep-alive connection sending one review per request."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.answers: dict[int, dict] = {}

    def send(self, index: int, review: str) -> None:
        self.connection.request("POST", "/predict", json.dumps({"reviews": [review]}), {**AUTH})
        response = self.connection.getresponse()
        body = json.loads(response.read())
        assert response.status == 200, body
        self.answers[index] = body["results"][0]


def _served_so_far(port: int) -> tuple[int, int]:
    """How many model calls ``/predict`` has made, and how many reviews they scored (from ``/info``)."""
    _, info = request(port, "GET", "/info", headers=AUTH)
    served = info["served"]["predict"]
    return served["model_calls"], served["reviews"]


def test_8_concurrent_clients_are_batched_into_fewer_model_calls_than_requests(server):
    rng = random.Random(0)
    reviews = [" ".join(rng.choices(WORDS, k=rng.randint(3, 25))) for _ in range(160)]
    clients = 8

    # The same reviews one request at a time: one model call each.
    calls_before, reviews_before = _served_so_far(server.port)
    one_at_a_time = _Client(server.port)
    for index, review in enumerate(reviews):
        one_at_a_time.send(index, review)
    calls_alone, reviews_alone = _served_so_far(server.port)
    assert (calls_alone - calls_before, reviews_alone - reviews_before) == (len(reviews), len(reviews))

    # Then from 8 clients at once, each its own share, one request in flight per client.
    concurrent = [_Client(server.port) for _ in range(clients)]
    threads = [
        threading.Thread(target=lambda c=client, k=k: [c.send(i, reviews[i]) for i in range(k, len(reviews), clients)])
        for k, client in enumerate(concurrent)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls_batched, reviews_batched = _served_so_far(server.port)

    answers = {index: answer for client in concurrent for index, answer in client.answers.items()}
    assert sorted(answers) == list(range(len(reviews)))
    for index, answer in answers.items():
        # Batched with other reviews (padded to a longer one), a review gets the same answer.
        alone = one_at_a_time.answers[index]
        assert answer["label"] == alone["label"]
        assert max(abs(answer["probabilities"][c] - p) for c, p in alone["probabilities"].items()) < 1e-4
    # Every review scored once; a call holds at most the 8 requests in flight, and on average more than 2.
    calls = calls_batched - calls_alone
    assert reviews_batched - reviews_alone == len(reviews)
    assert len(reviews) / clients <= calls < len(reviews) / 2, calls


def test_sigterm_finishes_the_request_in_flight_and_exits_0(run_dir, tmp_path):
    # A batching wait of 3 s keeps the one request in flight while SIGTERM arrives.
    limits = ["--max_reviews", "3", "--max_review_chars", "50", "--max_body_bytes", "2000"]
    server = ServerProcess(run_dir, tmp_path / "serve.log", "--max_wait_ms", "3000", *limits)
    # The same server shows the limits are the flags' (one server start fewer).
    status, answer = request(server.port, "POST", "/predict", {"reviews": ["ok"] * 4})
    assert status == 413 and "4 reviews in one request, more than the limit of 3" in answer["error"]
    status, answer = request(server.port, "POST", "/predict", {"reviews": ["z" * 51]})
    assert status == 413 and "51 characters, more than the limit of 50" in answer["error"]
    status, answer = request(server.port, "POST", "/predict", {"reviews": ["ok", "fine", "a" * 2000]})
    assert status == 413 and "more than the limit of 2,000" in answer["error"]
    answers = []
    sender = threading.Thread(
        target=lambda: answers.append(request(server.port, "POST", "/predict", {"reviews": REVIEWS}))
    )
    sender.start()
    time.sleep(1.0)
    assert server.stop() == 0, server.log.read_text()
    sender.join(timeout=60)
    assert answers and answers[0][0] == 200 and len(answers[0][1]["results"]) == 2, answers
    assert server.log.read_text().rstrip().endswith("stopped")
    with pytest.raises(OSError):  # and nothing listens any more
        request(server.port, "GET", "/health", timeout=5)


def test_explain_gives_word_spans_into_the_review_read(server):
    reviews = ["Stopped working after a week, no refund.", "Great&nbsp;value, it works as described."]
    status, answer = request(server.port, "POST", "/explain", {"reviews": reviews, "top_k": 2}, AUTH)
    assert status == 200, answer
    status, predicted = request(server.port, "POST", "/predict", {"reviews": reviews}, AUTH)
    for result, prediction in zip(answer["results"], predicted["results"], strict=True):
        assert result["label"] == prediction["label"]
        assert result["words"] and len(result["top_words"]) <= 2
        for word in result["words"]:
            assert result["text"][word["start"] : word["end"]] == word["word"]
    # The text is the review as the model read it: the entity decoded, as in training.
    assert answer["results"][1]["text"].startswith("Great\xa0value")


def test_an_int8_export_is_served_the_same_way(tiny_model_dir, tmp_path):
    from fastapi.testclient import TestClient

    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.serve.app import create_app
    from finetune.serve.model import load_served_model

    pytest.importorskip("openvino", reason="the int8 export needs the export extra")
    exported = tmp_path / "tiny-int8"
    assert main(["export", str(tiny_model_dir), "--int8", "--weights_only", "--output", str(exported)]) == 0
    with TestClient(create_app(load_served_model(exported))) as client:
        answer = client.post("/predict", json={"reviews": REVIEWS})
        info = client.get("/info").json()
        explain = client.post("/explain", json={"reviews": REVIEWS})
    assert answer.status_code == 200
    expected = predict_probabilities(*load_inference_model(exported), REVIEWS, 32)
    got = [list(result["probabilities"].values()) for result in answer.json()["results"]]
    assert np.allclose(got, expected, atol=1e-5)
    assert info["backend"] == "openvino int8" and info["explain"] is False and info["test"] is None
    assert explain.status_code == 501 and "--fp32_fallback" in explain.json()["error"]


def test_serve_refuses_a_folder_without_a_model_and_a_taken_port(tmp_path, run_dir, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The folder is checked first: the message names the mistake, not the port.
        assert main(["serve", str(tmp_path), "--port", str(port)]) == 2
        assert "holds no model (no config.json)" in capsys.readouterr().err
        assert main(["serve", str(run_dir), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["serve", str(run_dir), "--token", " "]) == 2
    assert "the token is empty" in capsys.readouterr().err


def test_connections_to_the_listening_socket_send_without_nagle_delay():
    """Accepted connections get TCP_NODELAY from asyncio, which sets it only on sockets made as IPPROTO_TCP.

    Without it, an answer written as headers then body waits for the client's delayed ACK:
    about 40 ms for every request sent one at a time.
    """
    import asyncio
    import socket

    from finetune.commands.serve import _listen

    async def nodelay_of_an_accepted_connection() -> int:
        listener = _listen("127.0.0.1", 0)
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        class Record(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                connection = transport.get_extra_info("socket")
                accepted.set_result(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await asyncio.get_running_loop().create_server(Record, sock=listener)
        with socket.create_connection(listener.getsockname()[:2]):
            value = await asyncio.wait_for(accepted, 10)
        server.close()
        return value

    assert asyncio.run(nodelay_of_an_accepted_connection()) != 0


def test_the_page_ships_in_the_wheel():
    import fnmatch

    from helpers import PROJECT

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")

    patterns = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["finetune"]
    package = PROJECT / "finetune"
    assets = [path.relative_to(package).as_posix() for path in (package / "serve" / "static").iterdir()]
    assert {"index.html", "app.js", "style.css"} <= {Path(asset).name for asset in assets}
    assert all(any(fnmatch.fnmatch(asset, pattern) for pattern in patterns) for asset in assets), patterns


def test_the_batcher_shares_calls_within_the_size_limit_and_keeps_each_request_whole():
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from finetune.serve.batching import Batcher

    calls: list[list[str]] = []

    def score(reviews: list[str]) -> list[str]:
        calls.append(list(reviews))
        time.sleep(0.05)  # the model is busy: requests queue meanwhile
        if "boom" in reviews:
            raise RuntimeError("model failed")
        return [review.upper() for review in reviews]

    async def scenario() -> list:
        batcher = Batcher(score, ThreadPoolExecutor(max_workers=1), max_batch_size=4, max_wait_s=0.01)
        batcher.start()
        requests = [["a"], ["b", "c"], ["d", "e"], ["f"], ["g"]]
        answers = await asyncio.gather(*(batcher.submit(reviews) for reviews in requests))
        failed = await asyncio.gather(batcher.submit(["x"]), batcher.submit(["boom"]), return_exceptions=True)
        await batcher.stop()
        return [answers, failed, batcher.model_calls, batcher.largest_batch]

    answers, failed, model_calls, largest = asyncio.run(scenario())
    assert answers == [["A"], ["B", "C"], ["D", "E"], ["F"], ["G"]]
    # Calls of at most 4 reviews; ["d", "e"] would make 5, so it waits for the next call rather than be split.
    assert calls == [["a", "b", "c"], ["d", "e", "f", "g"], ["x", "boom"]]
    assert model_calls == 3 and largest == 4
    # A failed call fails every request in it, and only those.
    assert [str(error) for error in failed] == ["model failed", "model failed"]
