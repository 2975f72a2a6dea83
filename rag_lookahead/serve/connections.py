"""Connections under `run_app`'s uvicorn: at most ``max_connections`` open, and no client
holding one by sending its headers slowly.

uvicorn has neither: its ``limit_concurrency`` answers 503 to requests once too many are in
flight, but only after their headers arrived, and keeps every connection open meanwhile; and
a connection that sends a byte now and then is never timed out (its keep-alive timer is
reset by each byte). So its h11 protocol is extended here: a connection past the cap is
answered 503 and closed as it opens, and a request's headers must arrive in full within
``header_timeout_s`` of its first byte (a new connection's: of its opening), else the
connection is closed. A request's body has its own deadline (`BodyDeadline`, in the app).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from rag_lookahead.serve.errors import error_body
from rag_lookahead.serve.settings import ServeSettings

__all__ = ["guarded_protocol"]

_log = logging.getLogger(__name__)


def _refusal() -> bytes:
    """The whole 503 answer of a connection past the cap, in OpenAI's error shape."""
    body = json.dumps(error_body(503, "too many connections: retry later", "too_many_connections")).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_REFUSAL = _refusal()


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a header timeout (set by
    `guarded_protocol`)."""

    max_connections = 1
    header_timeout_s = 1.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._refused = False
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refused = True
            self.connections.discard(self)  # counts no more, though closing takes a loop turn
            _log.debug("a connection past max_connections=%d was refused", self.max_connections)
            self.transport.write(_REFUSAL)
            self.transport.close()
            return
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        between = self._between_requests()
        super().data_received(data)
        if not self._between_requests():
            self._headers_in()  # a request's headers are all in: the app has it now
        elif between:
            self._await_headers()  # the first bytes of the next request (or more of them)

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_in()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _await_headers(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_in(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._between_requests():
            return
        _log.debug("a request's headers took over %gs: its connection was closed", self.header_timeout_s)
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def guarded_protocol(settings: ServeSettings) -> type[H11Protocol]:
    """uvicorn's h11 protocol class (``uvicorn.Config(http=...)``) with ``settings``'
    ``max_connections`` and ``header_timeout_s``."""
    return type(
        "GuardedH11Protocol",
        (_GuardedH11Protocol,),
        {"max_connections": settings.max_connections, "header_timeout_s": settings.header_timeout_s},
    )
