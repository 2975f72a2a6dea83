"""Request bodies: JSON read up to the server's limit, whatever the client claims."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from rag_lookahead.http.errors import ApiError

__all__ = ["json_body"]


async def json_body(request: Request, limit: int) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (413 past it, 400 if not JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:  # a body sent without (or lying about) its length
            raise _too_large(limit)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
