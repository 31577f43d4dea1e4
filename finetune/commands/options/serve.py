"""``finetune serve MODEL``: the model over HTTP (/predict, /explain, a page at /)."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import Command, argument, as_keywords, option
from .shared import on_bad_text_option
from .values import port_number, positive_int, positive_seconds


@dataclass(frozen=True)
class ServeOptions:
    """The options of ``finetune serve``."""

    model: str = argument(help="a run folder, a checkpoint or an int8 export folder")
    host: str = option("127.0.0.1", help="the address to listen on (default: 127.0.0.1: this machine only)")
    port: int = option(8000, type=port_number, help="the port (default: 8000; 0: any free port)")
    token: str | None = option(
        help="require 'Authorization: Bearer TOKEN' (default: $FINETUNE_SERVE_TOKEN; none if unset)"
    )
    max_body_bytes: int = option(1_000_000, type=positive_int, help="largest request body (default: 1000000)")
    max_reviews: int = option(256, type=positive_int, help="most reviews a request (default: 256)")
    max_review_chars: int = option(20_000, type=positive_int, help="longest review in characters (default: 20000)")
    max_batch_size: int = option(
        64, type=positive_int, help="most reviews of concurrent requests scored in one model call (default: 64)"
    )
    max_wait_ms: float = option(5.0, help="how long a request waits for others to share its model call (default: 5)")
    threads: int | None = option(
        type=positive_int, help="torch threads for the model (default: one per core; 1 on a busy machine)"
    )
    access_log: bool = option(False, help="log every request on stderr")
    on_bad_text: str = on_bad_text_option("a review", "answered 422 naming its index")
    header_timeout: float = option(
        10.0,
        type=positive_seconds,
        help="seconds a connection has to send a request's headers; then 408 and closed (default: 10)",
    )
    body_timeout: float = option(
        30.0,
        type=positive_seconds,
        help="seconds a request has to send its body once its headers are in; then 408 and closed (default: 30)",
    )
    keep_alive_timeout: float = option(
        5.0, type=positive_seconds, help="seconds an idle connection is kept open after an answer (default: 5)"
    )
    max_connections: int = option(
        256, type=positive_int, help="most connections open at once; one more gets 503 and is closed (default: 256)"
    )
    threshold: float | None = option(
        help="a multi_label run's tags: give a tag where its probability reaches this, for every tag "
        "(default: each tag's own, tuned on validation, from tag_thresholds.json)"
    )
    reload_on_change: bool = option(
        False, help="load the model again when its files change on disk (default: keep serving it, and warn)"
    )


def run(options: ServeOptions, extra: list[str]) -> None:
    """Serve the model until SIGTERM or Ctrl-C."""
    from ..serve import serve

    serve(options.model, **as_keywords(options, leave_out=("model",)))


COMMAND = Command(
    "serve",
    help="serve a model over HTTP (/predict, /explain, a page at /); needs: pip install 'finetune[serve]'",
    options=ServeOptions,
    run=run,
)
