"""``finetune serve RUN_OR_EXPORT``: the model behind HTTP, with a page to try it (``pip install 'finetune[serve]'``).

The model loads and is checked once (as ``finetune predict`` checks it),
then uvicorn serves :mod:`finetune.serve.app` on 127.0.0.1 unless ``--host``
says otherwise. SIGTERM or Ctrl-C stops taking new connections, answers
the requests in flight, and exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import FinetuneError

DEFAULT_PORT = 8000
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")

if TYPE_CHECKING:
    from ..serve.connections import ConnectionLimits


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    max_body_bytes: int = 1_000_000,
    max_reviews: int = 256,
    max_review_chars: int = 20_000,
    max_batch_size: int = 64,
    max_wait_ms: float = 5.0,
    access_log: bool = False,
    threads: int | None = None,
    on_bad_text: str = "refuse",
    header_timeout: float = 10.0,
    body_timeout: float = 30.0,
    keep_alive_timeout: float = 5.0,
    max_connections: int = 256,
    reload_on_change: bool = False,
    threshold: float | None = None,
) -> None:
    """Serve the model in ``model_path`` (a run, checkpoint or int8 export folder) until SIGTERM or Ctrl-C.

    ``token`` (default: ``$FINETUNE_SERVE_TOKEN``) makes ``/predict``, ``/explain`` and ``/info``
    answer only requests with ``Authorization: Bearer TOKEN``. ``port`` 0 takes a free port; the
    address is printed on stderr either way. ``threads`` sets torch's threads (default: one per core).
    ``on_bad_text``: a review holding text that is not Unicode gets a 422 (``refuse``) or U+FFFD (``replace``).
    A multi_label run answers ``labels`` (tags at their tuned threshold, or ``threshold``) and ``scores``.

    A connection must send a request's headers within ``header_timeout``
    seconds and its body within ``body_timeout`` more, and is closed after
    ``keep_alive_timeout`` seconds idle; past ``max_connections`` open at
    once, a new one gets a 503 (:mod:`finetune.serve.connections`). When the
    model's files change on disk the log and ``/info`` say so; with
    ``reload_on_change`` the model is loaded again (:mod:`finetune.serve.watch`).
    """
    _require_uvicorn()
    from ..serve.app import TOKEN_ENV, BatchSettings, ServeLimits, create_app
    from ..serve.connections import ConnectionLimits
    from ..serve.model import load_served_model, require_served_folder

    # Every check before the model loads: a mistake costs a second, not a load.
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    connections = ConnectionLimits(header_timeout, body_timeout, keep_alive_timeout, max_connections)
    _check_options(token, max_wait_ms, max_body_bytes, connections, threshold)
    require_served_folder(model_path)
    listener = _listen(host, port)
    _set_threads(threads)
    served = load_served_model(model_path, threshold)
    app = create_app(
        served,
        ServeLimits(max_body_bytes=max_body_bytes, max_reviews=max_reviews, max_review_chars=max_review_chars),
        BatchSettings(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms),
        token=token.strip() if token else None,
        on_bad_text=on_bad_text,
        reload_on_change=reload_on_change,
        connections=connections,
    )
    _say_where(served, listener, host, token)
    _run_server(app, listener, access_log, connections, max_body_bytes)
    print("stopped", file=sys.stderr)


def _require_uvicorn() -> None:
    """Refuse to start without the ``serve`` extra, naming the install command."""
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise FinetuneError(
            "finetune serve needs FastAPI and uvicorn; install them with: pip install 'finetune[serve]'"
        )


def _set_threads(threads: int | None) -> None:
    """Torch's threads for the model's calls (None: torch's default, one per core)."""
    if threads is None:
        return
    import torch

    # On a machine busy with other work, one thread can be several times faster for the few reviews
    # of a request: torch's threads wait on each other at every operation (docs/serve.md).
    torch.set_num_threads(threads)


def _run_server(
    app: Any, listener: socket.socket, access_log: bool, connections: ConnectionLimits, max_body_bytes: int
) -> None:
    """uvicorn serving ``app`` on ``listener`` until SIGTERM or Ctrl-C (which end it with exit status 0)."""
    import uvicorn

    from ..serve.connections import guarded_protocol

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=access_log,
        timeout_graceful_shutdown=60,
        # uvicorn's h11 protocol with read timeouts, the cap and JSON errors (httptools is never used).
        http=guarded_protocol(connections, max_body_bytes),
        timeout_keep_alive=connections.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn types it int; a float works
        ws="none",  # no WebSocket route: an Upgrade request is answered as HTTP, its errors in JSON
    )
    _server_class()(config).run(sockets=[listener])


def _check_options(
    token: str | None,
    max_wait_ms: float,
    max_body_bytes: int,
    connections: ConnectionLimits,
    threshold: float | None = None,
) -> None:
    """Refuse an empty token, a negative wait, limits and timeouts that would stop every request, a bad threshold."""
    from ..evaluation.tag_thresholds import check_threshold
    from ..serve.app import TOKEN_ENV

    check_threshold(threshold)
    if token is not None and not token.strip():
        raise FinetuneError(f"the token is empty; pass --token with a secret, or unset {TOKEN_ENV}")
    if max_wait_ms < 0:
        raise FinetuneError(f"--max_wait_ms must be >= 0 (got {max_wait_ms})")
    if max_body_bytes < 1:
        raise FinetuneError(f"--max_body_bytes must be >= 1 (got {max_body_bytes})")
    for flag, seconds in (
        ("--header_timeout", connections.header_timeout),
        ("--body_timeout", connections.body_timeout),
        ("--keep_alive_timeout", connections.keep_alive_timeout),
    ):
        if not 0 < seconds < float("inf"):
            raise FinetuneError(f"{flag} must be a number of seconds > 0 (got {seconds}); e.g. {flag} 10")
    if connections.max_connections < 1:
        raise FinetuneError(f"--max_connections must be >= 1 (got {connections.max_connections})")


def _say_where(served: Any, listener: socket.socket, host: str, token: str | None) -> None:
    """The address served (port 0's number known now), and a warning when anyone on the network may use it."""
    from ..serve.app import TOKEN_ENV

    bound_host, bound_port = listener.getsockname()[:2]
    url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"
    print(f"serving {served.model_dir} ({served.backend}) at {url}", file=sys.stderr)
    print(f"  page: {url}/   API: {url}/docs   stop: Ctrl-C or SIGTERM", file=sys.stderr)
    if token is None and host not in LOCAL_HOSTS:
        print(
            f"warning: serving on {host} without a token: anyone who reaches this machine can use the model; "
            f"set {TOKEN_ENV} or pass --token",
            file=sys.stderr,
        )


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, so a taken port is a one-line error and port 0's number is known."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as error:
        raise FinetuneError(f"--host {host}: {error.strerror}; pass an address such as 127.0.0.1 or 0.0.0.0")
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that
    # say they are TCP, and with it on, every answer written as headers then body waits ~40 ms for the
    # client's delayed ACK: 44 ms for GET /health instead of 0.3 ms, a request at a time (docs/serve.md).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise FinetuneError(f"cannot listen on {host}:{port} ({error.strerror}); pass another --port, or 0 for any")
    return listener


def _server_class() -> type:
    """uvicorn's ``Server`` with SIGTERM ending in exit status 0 (uvicorn is an optional extra: made on first use)."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, ending with exit status 0 on SIGTERM.

        uvicorn raises a caught SIGTERM again once it has shut down, so the process
        would end "killed by SIGTERM" (143) after a clean stop; a service manager
        stopping it on purpose would log that as a failure.
        """

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop without waiting
            else:
                self.should_exit = True

    return Server
