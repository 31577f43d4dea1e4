"""The HTTP app: ``POST /predict``, ``POST /explain``, ``GET /health``, ``GET /info``, the page at ``/`` and ``/docs``.

Every error is a JSON object ``{"error": "..."}`` with a 4xx status that
names the problem and the fix; the server goes on answering. Bodies are
read and checked here rather than by FastAPI's own parsing, so that a
body that is not UTF-8, not JSON, nested too deep or too large gets a
message saying so instead of a generic "error parsing the body". HEAD is
answered wherever GET is; a client that leaves mid-body is one log line.
What happens before a request reaches the app (timeouts, the connection
cap, bytes that are not HTTP) is :mod:`.connections`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import sys
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..data.bad_text import describe_bad_text, first_bad_character, repair_text
from ..errors import FinetuneError
from .batching import Batcher
from .connections import CLOSED_BECAUSE, ConnectionLimits
from .model import ServedModel, load_served_model
from .watch import LiveModel

STATIC_DIR = Path(__file__).parent / "static"
TOKEN_ENV = "FINETUNE_SERVE_TOKEN"
# Routes that need the bearer token when one is set. The page, /health and the OpenAPI
# schema hold no model output, so a browser can load the page and a load balancer can probe.
PROTECTED = ("/predict", "/explain", "/info")
# How much of a body over the limit is read and dropped before the 413 (see BodySizeLimit._refuse).
DRAIN_BYTES = 64 * 2**20
EXAMPLE_BODY = '{"reviews": ["Great value, it works as described."]}'
logger = logging.getLogger("finetune.serve")


@dataclass(frozen=True)
class ServeLimits:
    """What one request may hold; larger requests get 413 with the limit and the flag that raises it."""

    max_body_bytes: int = 1_000_000
    max_reviews: int = 256
    max_review_chars: int = 20_000


@dataclass(frozen=True)
class BatchSettings:
    """How concurrent requests are scored together (:mod:`.batching`)."""

    max_batch_size: int = 64
    max_wait_ms: float = 5.0


# ------------------------------------------------------------------ the request and response bodies


class ReviewsRequest(BaseModel):
    """Reviews to label."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reviews: list[str] = Field(description="the reviews, one string each", examples=[["Great value, works well."]])


class ExplainRequest(ReviewsRequest):
    """Reviews to label and explain."""

    top_k: int = Field(5, ge=1, le=100, description="how many of each review's words top_words lists")


class Prediction(BaseModel):
    """One review's label and every class's probability."""

    label: str
    probabilities: dict[str, float]


class TagPrediction(BaseModel):
    """One review's tags (a multi_label run): those whose probability reaches their threshold, and every tag's."""

    labels: list[str]
    scores: dict[str, float]


class RatingPrediction(BaseModel):
    """One review's stars (a regression or ordinal run), decoded as ``finetune predict`` decodes them."""

    rating: float = Field(
        description="a regression's rating clipped to the levels' range (4 decimals); ordinal: the level"
    )
    label: str = Field(description="the level's name: ordinal's level, or the level nearest a regression's rating")
    prob_above: dict[str, float] | None = Field(
        None, description="ordinal only: P(rating > level) for each level but the top one"
    )


class PredictResponse(BaseModel):
    """One prediction per review, in the order sent: a label, a multi_label run's tags, or a ratings run's stars."""

    results: list[Prediction | TagPrediction | RatingPrediction]


class WordScore(BaseModel):
    """A word of the review (``text[start:end]``) and how much it pushed towards the label (negative: away)."""

    word: str
    start: int
    end: int
    score: float


class Explanation(Prediction):
    """A prediction with the words behind it; ``text`` is the review as the model read it (cleaned)."""

    text: str
    words: list[WordScore]
    top_words: list[WordScore]


class TagExplanation(TagPrediction):
    """A multi_label review's tags with, for each tag given, the words behind it (scored toward its logit)."""

    text: str
    words: dict[str, list[WordScore]]
    top_words: dict[str, list[WordScore]]


class ExplainResponse(BaseModel):
    """One explanation per review, in the order sent: of its label, or of each of a multi_label run's tags."""

    results: list[Explanation | TagExplanation]


class RequestProblem(Exception):
    """A request the server cannot answer: the HTTP status and a one-line message naming the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------ the app


def create_app(
    served: ServedModel,
    limits: ServeLimits | None = None,
    batching: BatchSettings | None = None,
    token: str | None = None,
    on_bad_text: str = "refuse",
    reload_on_change: bool = False,
    connections: ConnectionLimits | None = None,
) -> FastAPI:
    """The ASGI app serving ``served``; with ``token``, the routes in ``PROTECTED`` need ``Authorization: Bearer``.

    A review holding text that is not Unicode (a lone surrogate) gets a 422
    naming its index, or with ``on_bad_text="replace"`` is read with U+FFFD in its place.
    The model's files are watched: a change is said in the log and ``/info``,
    and with ``reload_on_change`` the model is loaded again (:mod:`.watch`).
    ``connections`` are the timeouts and cap the server runs with (:mod:`.connections`), for ``/info``.
    """
    serving = _Serving.start(
        served,
        limits or ServeLimits(),
        batching or BatchSettings(),
        connections or ConnectionLimits(),
        on_bad_text,
        reload_on_change,
        _token_check(token),
    )
    app = FastAPIOffline(
        title="finetune serve",
        description=f"The review classifier in {served.model_dir}: labels, class probabilities, the words behind them.",
        version="1",
        lifespan=serving.lifespan,
        static_url="/static-docs",
    )
    app.add_middleware(BodySizeLimit, max_body_bytes=serving.limits.max_body_bytes)
    app.add_middleware(HeadAsGet)
    _add_error_handlers(app)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    _add_page_and_info_routes(app, serving)
    _add_model_routes(app, serving)
    return app


@dataclass
class _Serving:
    """What the routes share: the live model, the one thread that runs it, its batchers, and the server's settings."""

    live: LiveModel
    executor: ThreadPoolExecutor
    predictions: Batcher
    explanations: Batcher
    limits: ServeLimits
    batching: BatchSettings
    connections: ConnectionLimits
    on_bad_text: str
    check_token: Callable[[Request], None]

    @classmethod
    def start(
        cls,
        served: ServedModel,
        limits: ServeLimits,
        batching: BatchSettings,
        connections: ConnectionLimits,
        on_bad_text: str,
        reload_on_change: bool,
        check_token: Callable[[Request], None],
    ) -> _Serving:
        """The live model, its thread and batchers (started with the app, in :meth:`lifespan`)."""
        # A reload keeps the --threshold the server started with.
        live = LiveModel(served, reload_on_change, functools.partial(load_served_model, threshold=served.threshold))
        # One thread runs the model: torch already spreads one call over the cores, and two calls would fight for them.
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        wait = batching.max_wait_ms / 1000
        # Through live: a model reloaded on change answers the next call.
        predictions = Batcher(lambda texts: live.served.predict(texts), executor, batching.max_batch_size, wait)
        explanations = Batcher(lambda texts: live.served.explain(texts), executor, batching.max_batch_size, wait)
        return cls(live, executor, predictions, explanations, limits, batching, connections, on_bad_text, check_token)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start the batchers and the watch of the model's files; at the end, stop them and the model's thread."""
        self.predictions.start()
        self.explanations.start()
        watch = asyncio.get_running_loop().create_task(self.live.watch(self.executor))
        yield
        # uvicorn runs this after the requests in flight are answered (SIGTERM, Ctrl-C).
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await self.predictions.stop()
        await self.explanations.stop()
        self.executor.shutdown(wait=True)

    def info(self) -> dict[str, Any]:
        """What ``/info`` answers: the model, its files, the server's limits and what it has served."""
        served = self.live.served
        return {
            "model_dir": str(served.model_dir),
            "classes": served.class_names,  # a ratings run's: its levels, lowest first
            "task": served.task,
            "thresholds": (
                dict(zip(served.class_names, (float(value) for value in served.tag_thresholds)))
                if served.tags
                else None
            ),
            "base_model": served.base_model,
            "backend": served.backend,
            "test": served.test_scores,
            "explain": served.why_not_explainable is None,
            "model_files": self.live.info(),
            "limits": asdict(self.limits),
            "connections": asdict(self.connections),
            "on_bad_text": self.on_bad_text,
            "batching": asdict(self.batching),
            "threads": torch.get_num_threads(),
            "served": {
                route: {
                    "model_calls": batcher.model_calls,
                    "reviews": batcher.reviews_scored,
                    "largest_batch": batcher.largest_batch,
                }
                for route, batcher in (("predict", self.predictions), ("explain", self.explanations))
            },
        }


def _token_check(token: str | None) -> Callable[[Request], None]:
    """A check that refuses a request without the server's token (none without one)."""

    def check_token(request: Request) -> None:
        if token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise RequestProblem(401, "this server needs a token; send the header 'Authorization: Bearer TOKEN'")
        # compare_digest: the time taken does not tell how much of a guess was right.
        if not secrets.compare_digest(given.strip().encode(), token.encode()):
            raise RequestProblem(401, "wrong token; send the token the server was started with (--token)")

    return check_token


def _add_page_and_info_routes(app: FastAPI, serving: _Serving) -> None:
    """``/`` (the page), ``/health`` and ``/info``."""

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    @app.get("/health", summary="Whether the server answers")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info", summary="The model: classes, base model, test scores, limits")
    async def info(request: Request) -> dict[str, Any]:
        serving.check_token(request)
        return serving.info()


def _add_model_routes(app: FastAPI, serving: _Serving) -> None:
    """``/predict`` and ``/explain``: reviews in, labels (and the words behind them) out, batched."""

    @app.post(
        "/predict",
        summary="Label reviews",
        response_model=PredictResponse,
        # A regression's stars have no prob_above: left out rather than sent as null.
        response_model_exclude_none=True,
        openapi_extra=_request_body(ReviewsRequest),
    )
    async def predict(request: Request) -> dict[str, Any]:
        serving.check_token(request)
        body = await _read_body(request, ReviewsRequest, serving.limits, serving.on_bad_text)
        texts = _model_inputs(serving.live.served, body.reviews)
        return {"results": await serving.predictions.submit(texts)}

    @app.post(
        "/explain",
        summary="Label reviews and score each word's push towards the label",
        response_model=ExplainResponse,
        openapi_extra=_request_body(ExplainRequest),
    )
    async def explain(request: Request) -> dict[str, Any]:
        serving.check_token(request)
        body = await _read_body(request, ExplainRequest, serving.limits, serving.on_bad_text)
        if serving.live.served.why_not_explainable:
            raise RequestProblem(501, serving.live.served.why_not_explainable)
        texts = _model_inputs(serving.live.served, body.reviews)
        explained = await serving.explanations.submit(texts)
        return {"results": [_explanation(text, explanation, body.top_k) for text, explanation in zip(texts, explained)]}


def _explanation(text: str, explanation: Any, top_k: int) -> dict[str, Any]:
    """One review's explanation as ``/explain`` answers it: its label's words, or each of its tags'."""
    from ..evaluation.explain import TagExplanation as TagWords

    if isinstance(explanation, TagWords):
        return {
            "text": text,
            "labels": explanation.labels,
            "scores": {tag: round(p, 6) for tag, p in explanation.scores.items()},  # as /predict rounds them
            "words": {tag: [_word(word) for word in words] for tag, words in explanation.words.items()},
            "top_words": {tag: [_word(word) for word in words] for tag, words in explanation.top_words(top_k).items()},
        }
    return {
        "text": text,
        "label": explanation.label,
        "probabilities": explanation.probabilities,
        "words": [_word(word) for word in explanation.words],
        "top_words": [_word(word) for word in explanation.top_words(top_k)],
    }


def _word(word: Any) -> dict[str, Any]:
    return {"word": word.word, "start": word.start, "end": word.end, "score": float(word.score)}


def _request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI description of a JSON body that the route reads itself (see the module docstring)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def _read_body(request: Request, model: type[BaseModel], limits: ServeLimits, on_bad_text: str = "refuse") -> Any:
    """The JSON body checked against ``model`` and ``limits``; a :class:`RequestProblem` says what is wrong.

    A review holding a lone surrogate is refused (422), or repaired with ``on_bad_text="replace"``.
    """
    data = _parse_json(await request.body())
    try:
        body = model.model_validate(data)
    except ValidationError as error:
        raise RequestProblem(422, f"{_first_problem(error)}; send {EXAMPLE_BODY}")
    if not body.reviews:
        raise RequestProblem(422, f"reviews is an empty list; send at least one review, e.g. {EXAMPLE_BODY}")
    if len(body.reviews) > limits.max_reviews:
        raise RequestProblem(
            413,
            f"{len(body.reviews):,} reviews in one request, more than the limit of {limits.max_reviews:,}; send them "
            "in several requests, or start the server with a larger --max_reviews",
        )
    for index, review in enumerate(body.reviews):
        if len(review) > limits.max_review_chars:
            raise RequestProblem(
                413,
                f"reviews[{index}] has {len(review):,} characters, more than the limit of "
                f"{limits.max_review_chars:,}; shorten it, or start the server with a larger --max_review_chars",
            )
    if on_bad_text == "replace":
        body.reviews = [repair_text(review) for review in body.reviews]
    for index, review in enumerate(body.reviews):
        # JSON may escape half of a surrogate pair; the tokenizer cannot encode it (once a 500).
        if first_bad_character(review) is not None:
            raise RequestProblem(
                422,
                f"reviews[{index}] {describe_bad_text(review)}; send UTF-8 text (a \\ud800-\\udbff escape must be "
                "followed by a \\udc00-\\udfff one, as in an emoji)",
            )
    return body


def _parse_json(raw: bytes) -> Any:
    """The body read as UTF-8 JSON; a :class:`RequestProblem` (400) says why it cannot be."""
    if not raw.strip():
        raise RequestProblem(400, f"the body is empty; send JSON such as {EXAMPLE_BODY}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestProblem(
            400,
            f"the body is not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start}); send JSON in UTF-8",
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestProblem(
            400, f"the body is not JSON ({error.msg} at line {error.lineno} column {error.colno}); send {EXAMPLE_BODY}"
        )
    except RecursionError:
        raise RequestProblem(400, f"the body is JSON nested too deep to read; send {EXAMPLE_BODY}")
    except ValueError:
        # Python refuses to turn so many digits into an int (CVE-2020-10735); no field here takes such a number.
        raise RequestProblem(
            400,
            f"the body holds a number too long to read (more than {sys.get_int_max_str_digits():,} digits); "
            f"send numbers of ordinary size, as in {EXAMPLE_BODY}",
        )


def _first_problem(error: ValidationError) -> str:
    """Pydantic's first complaint as ``where: what (got TYPE)``, where in the body's own notation (``reviews[2]``)."""
    first = error.errors()[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]).lstrip(".")
    if first["type"] == "extra_forbidden":
        return f"unknown field '{where}'"
    if not where:  # the body itself is a list, a string or a number
        return f"the body is not a JSON object (got {type(first['input']).__name__})"
    got = "" if first["type"] == "missing" else f" (got {type(first['input']).__name__})"
    return f"{where or 'the body'}: {first['msg'][0].lower()}{first['msg'][1:]}{got}"


def _model_inputs(served: ServedModel, reviews: list[str]) -> list[str]:
    """The reviews cleaned as in training; one left empty is refused, as training drops empty reviews."""
    texts = served.model_inputs(reviews)
    empty = [index for index, text in enumerate(texts) if not text]
    if empty:
        shown = ", ".join(f"reviews[{index}]" for index in empty[:5]) + (", ..." if len(empty) > 5 else "")
        raise RequestProblem(422, f"{shown} {'is' if len(empty) == 1 else 'are'} empty (after cleaning); send text")
    return texts


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": "..."}``, never FastAPI's ``{"detail": ...}`` nor an HTML page."""
    routes = "GET /, GET /health, GET /info, POST /predict, POST /explain, GET /docs"

    @app.exception_handler(RequestProblem)
    async def problem(request: Request, error: RequestProblem) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse({"error": str(error)}, status_code=error.status, headers=headers)

    @app.exception_handler(FinetuneError)
    async def refused(request: Request, error: FinetuneError) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            message = f"no route {request.method} {request.url.path}; the routes are {routes}"
        elif error.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; the routes are {routes}"
        else:
            message = str(error.detail)
        return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, error: ClientDisconnect) -> JSONResponse:
        # One line, not the two tracebacks the handler below and uvicorn would log: a client may always leave.
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        closed_because = request.scope.get(CLOSED_BECAUSE)
        if closed_because:
            logger.warning("closed the connection of client %s: %s", client, closed_because)
        else:
            logger.warning(
                "client %s left before sending the whole body of %s %s", client, request.method, request.url.path
            )
        # Not sent: uvicorn drops what is written to a connection that is gone.
        return JSONResponse({"error": "the client left before sending the whole body"}, status_code=400)

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception) -> JSONResponse:
        logger.exception("error answering %s %s", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(error).__name__}: {error})"}, status_code=500)


class BodySizeLimit:
    """ASGI middleware: a body over ``max_body_bytes`` gets 413 and is never held in memory whole.

    A declared ``Content-Length`` over the limit is refused before the app sees the
    request; a chunked body is counted as it arrives and refused when it passes the limit.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, receive, send, f"{int(declared):,} bytes")
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise _BodyTooLarge
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send, f"more than {self.max_body_bytes:,} bytes")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        # The rest of the body is read and dropped first (up to DRAIN_BYTES), as nginx's "lingering close"
        # does: a connection closed with data unread is reset by the kernel, and the client may lose this
        # answer with it. A client that asked "Expect: 100-continue" has sent nothing yet and waits for it.
        if dict(scope["headers"]).get(b"expect", b"").lower() != b"100-continue":
            drained = 0
            while drained < DRAIN_BYTES:
                message = await receive()
                drained += len(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body"):
                    break
        response = JSONResponse(
            {
                "error": f"the body has {size}, more than the limit of {self.max_body_bytes:,}; "
                "send fewer reviews per request, or start the server with a larger --max_body_bytes"
            },
            status_code=413,
            headers={"Connection": "close"},
        )
        await response({"type": "http"}, _no_body, send)


class _BodyTooLarge(Exception):
    pass


class HeadAsGet:
    """ASGI middleware: ``HEAD`` answered wherever ``GET`` is, with GET's headers and no body.

    FastAPI's routes take only the methods they name, so ``HEAD /health`` was a
    405; a load balancer or a link checker asks with HEAD.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}
