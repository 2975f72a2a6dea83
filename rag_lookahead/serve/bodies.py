"""Request bodies: JSON read up to the server's limit, whatever the client claims, within the
server's time (`BodyDeadline`), and no deeper than `MAX_JSON_DEPTH`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_lookahead.protocol import RequestError
from rag_lookahead.serve.errors import CLIENT_CLOSED, ApiError

__all__ = ["MAX_JSON_DEPTH", "BodyDeadline", "json_body", "known_fields"]

#: The deepest nesting of arrays and objects a request body may have. No request needs more;
#: far deeper would exhaust the parser's stack, or a schema compiler's later.
MAX_JSON_DEPTH = 64
_log = logging.getLogger(__name__)


async def json_body(request: Request, limit: int) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (413 past it, 400 if it is not
    JSON or nests deeper than `MAX_JSON_DEPTH`)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:  # a body sent without (or lying about) its length
                raise _too_large(limit)
    except ClientDisconnect:
        # Nobody reads the answer: it is logged here alone, quietly (no traceback).
        _log.debug("a client left before its request body ended: %s %s", request.method, request.url.path)
        raise ApiError(CLIENT_CLOSED, "the client left before its request body ended") from None
    value = _parsed(body)
    if _too_deep(value, MAX_JSON_DEPTH):
        raise _not_json(f"it nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")
    return value


def _parsed(body: bytearray) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _not_json(str(err)) from None
    except RecursionError:  # the parser's stack: checked before anything else reads the value
        raise _not_json(f"it nests arrays and objects deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as err:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
        raise _not_json(f"a number in it is too long ({err})") from None


def _too_deep(value: Any, most: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``most`` levels (iterative: any depth)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > most:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _not_json(why: str) -> ApiError:
    return ApiError(400, f"the request body is not valid JSON: {why}", code="invalid_json")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")


class BodyDeadline:
    """ASGI middleware: a request's body must arrive in full within ``timeout_s`` of its
    headers and, once its first ``grace_s`` are over, keep up ``min_rate`` bytes a second
    (``0``: no minimum), else the request is HTTP 408 and its connection closed. The deadline
    alone would let a client dripping a byte at a time hold its connection for all of
    ``timeout_s``, and enough such clients every connection the server takes. Plain ASGI (not
    Starlette's ``BaseHTTPMiddleware``, which would hide a client's disconnect from the app)."""

    def __init__(self, app: ASGIApp, timeout_s: float, min_rate: int = 0, grace_s: float = 0.0) -> None:
        self._app = app
        self._timeout_s = timeout_s
        self._min_rate = min_rate
        self._grace_s = grace_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = anyio.current_time()
        received = 0
        whole = False  # the whole body is in: later messages are the client's disconnect

        async def timed() -> Message:
            nonlocal received, whole
            if whole:
                return await receive()
            allowed = self._allowed(received)
            with anyio.move_on_after(started + allowed - anyio.current_time()) as waited:
                message = await receive()
            if waited.cancelled_caught:
                raise self._late(allowed)
            received += len(message.get("body", b""))
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self._app(scope, timed, send)

    def _allowed(self, received: int) -> float:
        """Seconds from the headers by which the body must be whole, or past ``received`` bytes."""
        if not self._min_rate:
            return self._timeout_s
        return min(self._timeout_s, self._grace_s + received / self._min_rate)

    def _late(self, allowed: float) -> ApiError:
        if allowed < self._timeout_s:
            why = (
                f"came slower than {self._min_rate} bytes a second "
                f"(after its first {self._grace_s:g} seconds)"
            )
        else:
            why = f"did not arrive within {self._timeout_s:g} seconds"
        # What may still come is not read: the connection closes after the answer.
        return ApiError(408, f"the request body {why}", code="body_timeout", headers={"Connection": "close"})


def known_fields(body: object, keys: frozenset[str], check_model: Callable[[str], None]) -> dict[str, Any]:
    """The request's keys with a value, once each is known and its model is the one served."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the request body is a JSON object, got {type(body).__name__}")
    given = {key: value for key, value in body.items() if value is not None}
    unknown = sorted(set(given) - keys)
    if unknown:
        raise RequestError(
            f"unknown parameter {unknown[0]!r}; known: {', '.join(sorted(keys))}",
            str(unknown[0]),
            "unknown_parameter",
        )
    model = given.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise RequestError(f"model is the served model's name, got {model!r}", "model")
        check_model(model)
    return given
