"""vLLM's utility routes: ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``.

``/tokenize`` takes a ``prompt`` (a text, tokenized as ``/v1/completions`` reads it, with the
tokenizer's special tokens unless ``add_special_tokens: false``) or chat ``messages`` (rendered by
the chat template as ``/v1/chat/completions`` reads them, with ``tools`` if given and the
generation prompt), and answers ``{"count", "max_model_len", "tokens", "token_strs"}``;
``/detokenize`` turns ``tokens`` back into ``{"prompt"}``; ``/version`` names this package's
version, and for a local engine its `Backend` (what its forwards run on). Clients that count
tokens on the server (lm-eval's remote tokenizer among them) use the first two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rag_lookahead import __version__
from rag_lookahead.interface import Engine
from rag_lookahead.protocol import RequestError, plan_chat
from rag_lookahead.protocol.errors import checked_text
from rag_lookahead.runtime.backend import Backend
from rag_lookahead.serve.bodies import json_body, known_fields

__all__ = ["engine_backend", "utility_routes", "version_route"]

_TOKENIZE_KEYS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "tools",
        "add_special_tokens",
        "add_generation_prompt",
        "return_token_strs",
    }
)
_DETOKENIZE_KEYS = frozenset({"model", "tokens"})


def utility_routes(engine: Engine, check_model: Callable[[str], None], max_body_bytes: int) -> APIRouter:
    """``/tokenize`` and ``/detokenize`` over ``engine``'s tokenizer; ``check_model`` refuses a
    request naming another model than the one served."""
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = known_fields(await json_body(request, max_body_bytes), _TOKENIZE_KEYS, check_model)
        return JSONResponse(await anyio.to_thread.run_sync(_tokenized, engine, body))

    @router.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = known_fields(await json_body(request, max_body_bytes), _DETOKENIZE_KEYS, check_model)
        return JSONResponse(await anyio.to_thread.run_sync(_detokenized, engine, body))

    return router


def version_route(engine: Engine) -> APIRouter:
    """``GET /version``: this package's version, and ``engine``'s backend where it has one
    (`engine_backend`), as it is now (no key needed, as ``/health``)."""
    router = APIRouter()

    @router.get("/version")
    async def version() -> JSONResponse:
        backend = engine_backend(engine)
        return JSONResponse({"version": __version__, **({"backend": backend.as_dict()} if backend else {})})

    return router


def engine_backend(engine: Engine) -> Backend | None:
    """What a local engine's forwards run on (`LookaheadEngine.backend`); ``None`` for an engine
    whose model runs elsewhere (a remote server's)."""
    backend = getattr(engine, "backend", None)
    return backend if isinstance(backend, Backend) else None


def _tokenized(engine: Engine, body: Mapping[str, Any]) -> dict[str, Any]:
    tokenizer = _tokenizer(engine)
    if ("prompt" in body) == ("messages" in body):
        raise RequestError("give a prompt (a text) or messages (a chat), one of them", "prompt")
    ids = _prompt_ids(tokenizer, body) if "prompt" in body else _chat_ids(engine, body)
    strings = _flag(body, "return_token_strs", False)
    return {
        "count": len(ids),
        "max_model_len": engine.context_window,
        "tokens": ids,
        "token_strs": [str(s) for s in tokenizer.convert_ids_to_tokens(ids)] if strings else None,
    }


def _prompt_ids(tokenizer: Any, body: Mapping[str, Any]) -> list[int]:
    """A text's ids, as a completion's prompt reads it (special tokens unless told)."""
    for key in ("tools", "add_generation_prompt"):
        if key in body:
            raise RequestError(f"{key} goes with messages, not a prompt", key)
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise RequestError("prompt is a string", "prompt")
    special = _flag(body, "add_special_tokens", True)
    return [int(t) for t in tokenizer(checked_text(prompt, "prompt"), add_special_tokens=special).input_ids]


def _chat_ids(engine: Engine, body: Mapping[str, Any]) -> list[int]:
    """Chat messages' ids, as a chat call reads them: the template writes the special tokens
    and the generation prompt, so neither can be turned off here."""
    if _flag(body, "add_special_tokens", False):
        raise RequestError(
            "the chat template writes the messages' special tokens: with messages, add_special_tokens "
            "is false",
            "add_special_tokens",
            "unsupported_value",
        )
    if not _flag(body, "add_generation_prompt", True):
        raise RequestError(
            "messages are read as a chat call reads them, with the generation prompt: "
            "add_generation_prompt is true",
            "add_generation_prompt",
            "unsupported_value",
        )
    plan = plan_chat({key: body[key] for key in ("messages", "tools") if key in body}, engine)
    try:
        return [int(t) for t in engine.encode(plan.prompt, tools=list(plan.tools.tools) or None)]
    except (TypeError, ValueError) as err:
        raise RequestError(str(err), "messages") from None


def _detokenized(engine: Engine, body: Mapping[str, Any]) -> dict[str, Any]:
    tokenizer = _tokenizer(engine)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise RequestError("tokens is a list of token ids (non-negative integers)", "tokens")
    vocab = getattr(engine, "vocab_size", None)
    bad = next((t for t in tokens if vocab is not None and t >= vocab), None)
    if bad is not None:
        raise RequestError(
            f"tokens holds token id {bad}, outside the model's {vocab}-token vocabulary", "tokens"
        )
    return {"prompt": str(tokenizer.decode(tokens))}


def _tokenizer(engine: Engine) -> Any:
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise RequestError(
            f"this server has no tokenizer for its model ({type(engine).__name__} was given none)",
            code="no_tokenizer",
        )
    return tokenizer


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(f"{key} is true or false, got {value!r}", key)
    return value
