"""One real model per test session: the embedded SmolLM2-135M-Instruct, loaded offline."""

from __future__ import annotations

import threading

from rag_lookahead import LookaheadEngine

_lock = threading.Lock()
_engine: LookaheadEngine | None = None


def shared_engine() -> LookaheadEngine:
    """The session's engine (its first use converts the bundled GGUF once, ~25 s, then cached)."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = LookaheadEngine.from_pretrained()
        return _engine
