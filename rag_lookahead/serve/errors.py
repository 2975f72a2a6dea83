"""Errors in OpenAI's shape: ``{"error": {"message", "type", "code", "param"}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from rag_lookahead.protocol import RequestError

__all__ = ["CLIENT_CLOSED", "ApiError", "error_body", "install_handlers"]

# nginx's status for a request its client closed before the answer: logged, never received.
CLIENT_CLOSED = 499

# OpenAI's error types by status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    # A route this server does not offer (corpora on a replicated server): the client's to change.
    501: "invalid_request_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An answer other than 200, raised anywhere in a route."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The error object of an answer (or of a stream's error event)."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "code": code,
            "param": param,
        }
    }


def install_handlers(app: FastAPI) -> None:
    """Every error the app answers, in OpenAI's shape: its own, bad requests, unknown routes."""

    async def api_error(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, ApiError)
        body = error_body(err.status, err.message, err.code, err.param)
        return JSONResponse(body, status_code=err.status, headers=err.headers)

    async def request_error(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestError)
        return JSONResponse(error_body(400, err.message, err.code, err.param), status_code=400)

    async def http_error(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, HTTPException)
        code = "not_found" if err.status_code == 404 else None
        body = error_body(err.status_code, str(err.detail), code)
        return JSONResponse(body, status_code=err.status_code, headers=err.headers)

    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        # A bug still answers in the shape clients parse; the traceback goes to the server's log.
        message = f"internal error: {type(err).__name__}: {err}"
        return JSONResponse(error_body(500, message, "internal_error"), status_code=500)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestError, request_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
