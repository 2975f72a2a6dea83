"""How to reach a serving engine: `ServerConfig`, frozen and validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["KINDS", "ServerConfig", "ServerKind"]

ServerKind = Literal["vllm", "sglang", "openai", "rag-lookahead"]
KINDS: tuple[ServerKind, ...] = ("vllm", "sglang", "openai", "rag-lookahead")

_MAX_RETRIES = 100  # only there to refuse absurd values


@dataclass(frozen=True)
class ServerConfig:
    """An OpenAI-compatible server and how to talk to it.

    Attributes:
        base_url: The server's OpenAI API root as the ``openai`` client takes it, e.g.
            ``http://localhost:8000/v1``. SGLang's corpus endpoints and vLLM's ``/metrics``
            live beside it (the same URL without its trailing ``/v1``); rag-lookahead's
            corpora below it (``/v1/corpora``).
        model: The served model's name (``--served-model-name``, else the path it was started with).
        kind: ``"vllm"``, ``"sglang"``, ``"rag-lookahead"`` (``rag-lookahead serve --backend
            local``) or ``"openai"`` (any other compatible server): what the server does with
            documents and which of its extra sampling fields it takes.
        api_key: Sent as a bearer token; ``None`` sends a placeholder (servers started without
            a key ignore it). Never read from the environment.
        timeout: Seconds to wait for a connection and between two streamed chunks.
        deadline: Seconds one call may take in all, from sending the request to the answer's
            last chunk, or ``None`` for no bound beyond ``timeout``. ``timeout`` alone never
            ends a server that keeps sending keep-alive comments (or anything) without
            finishing; past the deadline the call ends with `ServerTimeout`. Each of the
            request's retries waits at most this long for the answer to start.
        max_retries: Retries of a request answered 408, 409, 429 or 5xx, or not answered at
            all, with the ``openai`` client's backoff (it honours ``Retry-After``).
        append_documents_to_prompt: On vLLM and plain servers a call's ``documents=`` must
            already be in its prompt, since drafts come only from the prompt there; ``True``
            appends the missing ones to the prompt instead. This changes the prompt, and so
            the answer.
        context_window: The served model's context window in tokens, if known (the pipeline
            fits its sources within it).
    """

    base_url: str
    model: str
    kind: ServerKind = "openai"
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 600.0
    deadline: float | None = None
    max_retries: int = 2
    append_documents_to_prompt: bool = False
    context_window: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not _is_http_url(self.base_url):
            raise ValueError(f"base_url must be an http(s):// URL with a host, got {self.base_url!r}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be the served model's name, got {self.model!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key must be a non-empty string or None")
        _check_seconds("timeout", self.timeout)
        if self.deadline is not None:
            _check_seconds("deadline", self.deadline)
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= _MAX_RETRIES:
            raise ValueError(f"max_retries must be an integer from 0 to {_MAX_RETRIES}, got {retries!r}")
        if not isinstance(self.append_documents_to_prompt, bool):
            raise ValueError("append_documents_to_prompt must be True or False")
        window = self.context_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"context_window must be a positive integer or None, got {window!r}")

    @property
    def root_url(self) -> str:
        """The server's root: ``base_url`` without a trailing ``/v1``."""
        return self.base_url.removesuffix("/v1")


def _check_seconds(name: str, seconds: object) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise ValueError(f"{name} must be a number of seconds, got {seconds!r}")
    if seconds <= 0:
        raise ValueError(f"{name} must be > 0, got {seconds}")


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)
