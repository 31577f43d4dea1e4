"""Load figures of ``finetune serve``: 8 concurrent clients against one request at a time and ``finetune predict``.

    python tools/serve_load.py RUN [--input data/reviews/test.csv] [--requests 222] [--clients 8]

Starts ``finetune serve RUN`` on 127.0.0.1 (a free port), then sends the
file's reviews (read as ``finetune predict`` reads them, cycled to
``--requests`` requests of ``--reviews_per_request`` reviews):

1. one request at a time from one client;
2. from ``--clients`` clients at once, each with its share.

and scores the same reviews in this process as ``finetune predict`` does
(the model loaded once, ``predict_probabilities`` at its default batch of 32,
no file reading or writing), and again in calls of at most clients x
reviews_per_request reviews, the largest call the server can make (what
batching could reach with no HTTP at all). Prints one JSON object: p50/p99
latency and reviews/s of each, and the ratios the issue sets targets for
(batched against one at a time: 3x; batched against predict: 0.8x). Stops the
server with SIGTERM and checks that it exits 0.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder or an int8 export")
    parser.add_argument("--input", default=str(PROJECT / "data" / "reviews" / "test.csv"), help="reviews to send")
    parser.add_argument("--requests", type=int, default=222, help="requests in each of the two runs")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--reviews_per_request", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch threads, for finetune serve and the predict figure alike")
    parser.add_argument("--serve_flags", default="", help="more flags for finetune serve, e.g. '--max_wait_ms 2'")
    options = parser.parse_args()

    import torch

    from finetune.pipeline.review_rows import read_model_inputs
    from finetune.serve.background import ServerProcess

    serve_flags = options.serve_flags.split()
    if options.threads:
        torch.set_num_threads(options.threads)
        serve_flags += ["--threads", str(options.threads)]

    reviews = [text for text in read_model_inputs(Path(options.run), options.input) if text]
    size = options.reviews_per_request
    bodies = [[reviews[(index * size + k) % len(reviews)] for k in range(size)] for index in range(options.requests)]
    figures: dict = {
        "run": options.run,
        "input": options.input,
        "requests": options.requests,
        "reviews_per_request": size,
        "threads": torch.get_num_threads(),
    }

    # finetune predict's scoring of the same reviews, model loaded once; then the same in calls no larger
    # than the server can make (every client's request in one call): the most batching can reach.
    texts = [review for body in bodies for review in body]
    figures["predict"], figures["predict_in_server_sized_calls"] = _predict_rates(
        Path(options.run), texts, [len(texts), options.clients * size]
    )

    with tempfile.TemporaryDirectory() as folder:
        server = ServerProcess(options.run, Path(folder) / "serve.log", *serve_flags, start_timeout_s=300)
        try:
            _send_all(server.port, bodies[:8], clients=1)  # warm-up: first calls are slower
            figures["one_at_a_time"] = _send_all(server.port, bodies, clients=1)
            figures["batched"] = _send_all(server.port, bodies, clients=options.clients)
            figures["batched"]["clients"] = options.clients
        finally:
            figures["server_exit_status"] = server.stop(timeout_s=120)
    batched = figures["batched"]["reviews_per_s"]
    figures["batched_vs_one_at_a_time"] = round(batched / figures["one_at_a_time"]["reviews_per_s"], 2)
    figures["batched_vs_predict"] = round(batched / figures["predict"]["reviews_per_s"], 2)
    ceiling = figures["predict_in_server_sized_calls"]["reviews_per_s"]
    figures["batched_vs_server_sized_calls"] = round(batched / ceiling, 2)
    print(json.dumps(figures, indent=2))


def _predict_rates(run: Path, texts: list[str], call_sizes: list[int]) -> list[dict]:
    """Reviews/s of ``predict_probabilities`` (its batch of 32) on ``texts`` cut into calls of each size."""
    from finetune.data.encoding import ReviewEncoding
    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.training.runs import find_run_config

    model, tokenizer = load_inference_model(run)
    encoding = ReviewEncoding.from_fields((find_run_config(run) or {}).get("data", {}))
    predict_probabilities(model, tokenizer, texts[:32], 32, encoding)  # warm-up
    rates = []
    for call_size in call_sizes:
        started = time.perf_counter()
        for start in range(0, len(texts), call_size):
            predict_probabilities(model, tokenizer, texts[start : start + call_size], 32, encoding)
        seconds = time.perf_counter() - started
        rates.append(
            {
                "reviews": len(texts),
                "call_size": call_size,
                "seconds": round(seconds, 2),
                "reviews_per_s": round(len(texts) / seconds, 1),
            }
        )
    return rates


def _send_all(port: int, bodies: list[list[str]], clients: int) -> dict:
    """Send every body (clients taking turns over the list); latency figures and reviews/s."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(first: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for body in bodies[first::clients]:
            started = time.perf_counter()
            connection.request("POST", "/predict", json.dumps({"reviews": body}), {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"/predict answered {response.status}")
            with lock:
                latencies.append(time.perf_counter() - started)
        connection.close()

    threads = [threading.Thread(target=client, args=(first,)) for first in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    latencies.sort()
    reviews = sum(len(body) for body in bodies)
    return {
        "reviews": reviews,
        "seconds": round(seconds, 2),
        "reviews_per_s": round(reviews / seconds, 1),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
    }


if __name__ == "__main__":
    main()
