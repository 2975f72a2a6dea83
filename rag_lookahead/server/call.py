"""One streamed request: its chunks as the engine's `StreamChunk`s, its stats, and its end.

The end — the stream read to its last chunk, closed, dropped, or failed — closes the HTTP
response (so the server stops generating) and removes the corpus loaded for the call, once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from rag_lookahead.streaming.stats import FinishReason, StepRecorder
from rag_lookahead.streaming.stream import StreamChunk

__all__ = ["ServerCall", "ServerError", "finish_reason"]


class ServerError(RuntimeError):
    """The server's stream broke the OpenAI API's contract (no finish, an unknown reason)."""


def finish_reason(choice: Any) -> FinishReason | None:
    """The engine's reason for a streamed choice's ``finish_reason``.

    ``"stop"`` covers both the model's EOS and a stop string; vLLM names the string that
    matched in ``stop_reason`` and SGLang in ``matched_stop`` (a token id there is an EOS).
    """
    reason = getattr(choice, "finish_reason", None)
    if reason is None:
        return None
    if reason == "length":
        return "length"
    if reason == "abort":
        return "abandoned"
    if reason == "stop":
        matched = getattr(choice, "stop_reason", None)
        if matched is None:
            matched = getattr(choice, "matched_stop", None)
        return "stop_string" if isinstance(matched, str) else "eos"
    raise ServerError(f"the server finished with reason {reason!r}, which this engine does not produce")


class ServerCall:
    """The state of one request while its chunks are read."""

    def __init__(self, recorder: StepRecorder, on_end: Callable[[], None]) -> None:
        self.recorder = recorder
        self.response: Any = None
        self._on_end = on_end
        self._ended = False
        self._lock = threading.Lock()
        self._chunks = 0

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self) -> None:
        """Close the HTTP stream and release the call's corpus (idempotent, any thread)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.recorder.finish("abandoned")  # the first reason stands: a finished call keeps its own
        try:
            if self.response is not None:
                self.response.close()
        finally:
            self._on_end()

    def steps(self) -> Generator[StreamChunk, None, None]:
        """The response's text as chunks; raises what the server sent or `ServerError`."""
        try:
            for chunk in self.response:
                text = self._read(chunk)
                if text:
                    yield StreamChunk([], text)
            if self.recorder.finish_reason is None:
                raise ServerError("the server ended the stream before the answer finished")
        except Exception:
            if self._ended:
                return  # closed from elsewhere while a chunk was being read
            raise
        finally:
            self.end()

    def _read(self, chunk: Any) -> str:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self._count(usage)
        text = ""
        for choice in getattr(chunk, "choices", None) or ():
            delta = getattr(choice, "delta", None)
            piece = getattr(delta, "content", None) if delta is not None else getattr(choice, "text", None)
            text += piece or ""
            reason = finish_reason(choice)
            if reason is not None:
                self.recorder.finish(reason)
        if text:
            recorder = self.recorder
            if not self._chunks:
                recorder.prefill_seconds = time.perf_counter() - recorder.started
            self._chunks += 1
            recorder.new_tokens = max(recorder.new_tokens, self._chunks)  # until usage says
        return text

    def _count(self, usage: Any) -> None:
        recorder = self.recorder
        recorder.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        recorder.new_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        if cached:
            recorder.cached_prompt_tokens = int(cached)
