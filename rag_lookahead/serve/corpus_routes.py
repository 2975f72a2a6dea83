"""The corpus routes: ``POST /v1/corpora``, ``GET`` and ``DELETE /v1/corpora/{id}``, and
``POST /v1/corpora/{id}/documents``; a chat or completion request's ``corpus`` names one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rag_lookahead.protocol import RequestError
from rag_lookahead.protocol.requests import checked_text
from rag_lookahead.serve.bodies import json_body
from rag_lookahead.serve.corpora import Corpora

__all__ = ["corpus_routes"]

_CREATE_KEYS = frozenset({"documents", "ttl_seconds"})
_EXTEND_KEYS = frozenset({"documents"})


def corpus_routes(corpora: Corpora, max_body_bytes: int) -> APIRouter:
    """The routes over ``corpora`` (the app adds its API-key check to each)."""
    router = APIRouter()

    @router.post("/v1/corpora")
    async def create(request: Request) -> JSONResponse:
        body = _checked(await json_body(request, max_body_bytes), _CREATE_KEYS)
        documents = _documents(body.get("documents", []))
        ttl = _ttl(body.get("ttl_seconds"), corpora.ttl_s)
        return JSONResponse(await anyio.to_thread.run_sync(corpora.create, documents, ttl))

    @router.post("/v1/corpora/{corpus_id}/documents")
    async def extend(corpus_id: str, request: Request) -> JSONResponse:
        body = _checked(await json_body(request, max_body_bytes), _EXTEND_KEYS)
        if "documents" not in body:
            raise RequestError("documents are required", "documents", "missing_parameter")
        documents = _documents(body["documents"])
        return JSONResponse(await anyio.to_thread.run_sync(corpora.extend, corpus_id, documents))

    @router.get("/v1/corpora/{corpus_id}")
    async def describe(corpus_id: str) -> JSONResponse:
        return JSONResponse(await anyio.to_thread.run_sync(corpora.describe, corpus_id))

    @router.delete("/v1/corpora/{corpus_id}")
    async def delete(corpus_id: str) -> JSONResponse:
        return JSONResponse(await anyio.to_thread.run_sync(corpora.delete, corpus_id))

    return router


def _checked(body: Any, known: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise RequestError(f"the request body is a JSON object, got {type(body).__name__}")
    unknown = sorted(str(key) for key in body if key not in known)
    if unknown:
        raise RequestError(
            f"unknown parameter {unknown[0]!r}; known: {', '.join(sorted(known))}",
            unknown[0],
            "unknown_parameter",
        )
    return {key: value for key, value in body.items() if value is not None}


def _documents(value: object) -> list[str]:
    if not isinstance(value, list):
        raise RequestError(f"documents are a list of strings, got {type(value).__name__}", "documents")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise RequestError(f"documents[{i}] is a string, got {type(text).__name__}", f"documents[{i}]")
        checked_text(text, f"documents[{i}]")
    return value


def _ttl(value: object, most: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"ttl_seconds is a number of seconds, got {value!r}", "ttl_seconds")
    if not 0 < value <= most:
        raise RequestError(
            f"ttl_seconds must be above 0 and at most this server's {most:g}, got {value}", "ttl_seconds"
        )
    return float(value)
