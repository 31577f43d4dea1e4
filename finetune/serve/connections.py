"""The server's HTTP connections: uvicorn's h11 protocol with read timeouts, a cap on connections, errors in JSON.

uvicorn (0.54) times out only a keep-alive connection that is idle after an
answer: a connection that sends nothing, half its headers or half its body
stays open for ever, and enough of them use up the process's file descriptors.
:func:`guarded_protocol` makes uvicorn's h11 protocol class with

- a **header timeout**: a new connection, or one with part of a next request,
  must deliver the request's headers within ``header_timeout`` seconds;
- a **body timeout**: once the headers are in, the body must arrive within
  ``body_timeout`` seconds;
- a **cap on open connections**: past ``max_connections`` a new connection
  gets a 503 and is closed at once (uvicorn's ``limit_concurrency`` counts
  only requests, and answers in plain text);
- **a chunk too large** for the body limit: a chunked body whose chunk's
  declared size takes it past ``max_body_bytes`` gets its 413 at once, not
  after the body timeout;
- **JSON errors** for what the app never sees: the 408 of a timeout, the 503
  of the cap, the 413 of a chunk too large, and the 400 of a request that is
  not HTTP (uvicorn writes plain text). uvicorn does not pass on which part h11 found malformed, so that 400
  says only that the request is not valid HTTP/1.1.

A connection that sent nothing is closed without an answer; a half-sent one
gets a 408 naming the flag that sets the timeout. The body timeout's reason is
left in the request's scope (``CLOSED_BECAUSE``), for the app to log as the
one line it writes when a client leaves mid-body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("finetune.serve")
# The key of the request's scope under which a timeout says why it closed the connection.
CLOSED_BECAUSE = "finetune.closed_because"


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections may be open at once."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 256


def guarded_protocol(limits: ConnectionLimits, max_body_bytes: int | None = None) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with ``limits``' timeouts and cap, and JSON for its own errors.

    Give it to ``uvicorn.Config(http=...)``; the keep-alive timeout is
    uvicorn's own ``timeout_keep_alive``, which ``Config`` takes separately.
    With ``max_body_bytes``, a chunked body that declares a chunk taking it past
    the limit gets its 413 as soon as the chunk's size is read.
    """
    # A subclass per server, so two servers in one process keep their own limits.
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "max_body_bytes": max_body_bytes})


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a read timeout for headers and body and a cap on connections.

    Its ``limits`` and ``max_body_bytes`` are set on the subclass :func:`guarded_protocol` makes.
    """

    limits: ClassVar[ConnectionLimits]
    max_body_bytes: ClassVar[int | None] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_timer_part = ""
        super().connection_made(transport)
        self._body_bytes = 0  # of the request being read, as h11 hands them on
        self._count_body_bytes()
        # This connection is counted already: the cap is on the others.
        if len(self.connections) > self.limits.max_connections:
            logger.warning(
                "refused a connection from %s: %d connections are open (--max_connections)",
                _address(self.client),
                self.limits.max_connections,
            )
            self._answer_and_close(
                503,
                f"the server has {self.limits.max_connections} connections open, its limit; retry in a moment, or "
                "start the server with a larger --max_connections",
                {"retry-after": "1"},
            )
            return
        self._time_reading("headers", self.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._refuse_a_chunk_too_large():
            self._follow_the_request()

    def _count_body_bytes(self) -> None:
        """Count the body bytes h11 hands on, so a chunk's declared size can be added to them."""
        next_event = self.conn.next_event

        def counting_next_event() -> Any:
            event = next_event()
            if isinstance(event, h11.Request):
                self._body_bytes = 0
            elif isinstance(event, h11.Data):
                self._body_bytes += len(event.data)
            return event

        self.conn.next_event = counting_next_event  # type: ignore[method-assign]

    def _refuse_a_chunk_too_large(self) -> bool:
        """A 413 now for a chunk whose declared size takes the body past ``max_body_bytes``.

        The app counts a body as it arrives, so a client declaring a chunk of a terabyte and
        sending a few bytes held the connection until the body timeout, then got a 408.
        """
        # h11 keeps the bytes of the chunk still to come on its chunked reader (h11 0.14-0.16). A body of a
        # declared Content-Length is the app's to refuse (BodySizeLimit), after reading what it can of it.
        reader = getattr(self.conn, "_reader", None)
        if self.max_body_bytes is None or type(reader).__name__ != "ChunkedReader" or self.transport.is_closing():
            return False
        remaining = getattr(reader, "_bytes_in_chunk", 0)
        # Only a chunk still to come: chunks already read past the limit are the app's to refuse, as above.
        if self.conn.their_state is not h11.SEND_BODY or not remaining:
            return False
        if self._body_bytes + remaining <= self.max_body_bytes:
            return False
        self._stop_timing()
        chunk = f"a chunk of {self._body_bytes + remaining:,} bytes"
        if self.cycle is not None:
            # The app waits on the body: it logs the one line, with this reason, when it sees the client gone.
            reason = f"its body declared {chunk}, more than --max_body_bytes {self.max_body_bytes:,}"
            self.cycle.scope[CLOSED_BECAUSE] = reason  # type: ignore[literal-required]
            if self.cycle.response_started:
                self.transport.close()
                return True
        self._answer_and_close(
            413,
            f"the body has {chunk}, more than the limit of {self.max_body_bytes:,}; send fewer reviews per request, "
            "or start the server with a larger --max_body_bytes",
        )
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A next request already in (pipelined) has been read on by uvicorn just now.
        self._follow_the_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timing()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # h11 refused the bytes (a bad request line, header or size); uvicorn gives no more detail than that.
        self._stop_timing()
        self._answer_and_close(
            400, "the request is not valid HTTP/1.1 (uvicorn's h11 cannot parse it); send a well-formed request"
        )

    def _follow_the_request(self) -> None:
        """Time what the client still owes: headers (a request begun), its body, or nothing."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._time_reading("body", self.limits.body_timeout)
        elif state is h11.IDLE and (self.conn.trailing_data[0] or self.cycle is None):
            # Part of a request is in, or none yet on a new connection: its headers are owed.
            self._time_reading("headers", self.limits.header_timeout)
        else:
            # Read whole (the app answers), or idle after an answer: uvicorn's keep-alive timeout applies.
            self._stop_timing()

    def _time_reading(self, part: str, seconds: float) -> None:
        if self._read_timer_part == part:
            return  # the time runs from the start of this part, not from its latest bytes
        self._stop_timing()
        self._read_timer_part = part
        self._read_timer = self.loop.call_later(seconds, self._reading_timed_out, part, seconds)

    def _stop_timing(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer, self._read_timer_part = None, ""

    def _reading_timed_out(self, part: str, seconds: float) -> None:
        self._read_timer, self._read_timer_part = None, ""
        if self.transport.is_closing():
            return
        flag = "--header_timeout" if part == "headers" else "--body_timeout"
        if part == "headers" and not self.conn.trailing_data[0]:
            self.transport.close()  # it sent nothing: nothing to answer
            return
        if part == "body" and self.cycle is not None:
            # The app waits on the body: it logs the one line, with this reason, when it sees the client gone.
            reason = f"its body did not arrive within {seconds:g} s ({flag})"
            self.cycle.scope[CLOSED_BECAUSE] = reason  # type: ignore[literal-required]
            if self.cycle.response_started:
                self.transport.close()
                return
        else:
            logger.warning(
                "closed a connection from %s: its request's headers did not arrive within %g s (%s)",
                _address(self.client),
                seconds,
                flag,
            )
        self._answer_and_close(
            408,
            f"the request's {part} did not arrive within {seconds:g} s, so the connection is closed; "
            f"send the whole request at once, or start the server with a larger {flag}",
        )

    def _answer_and_close(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """Write ``{"error": message}`` with ``status`` straight to the socket, then close it.

        Written past h11, whose state may not allow an answer (no request yet, or half of one).
        """
        body = json.dumps({"error": message}).encode()
        lines = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self.transport.close()


_REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large", 503: "Service Unavailable"}


def _address(client: Any) -> str:
    """``host:port`` of a client, as uvicorn gives it (a tuple, or None for a Unix socket)."""
    return f"{client[0]}:{client[1]}" if client else "a client"
