"""The same calls on a serving engine: vLLM, SGLang, ``rag-lookahead serve``, or any
OpenAI-compatible server.

``ServerEngine(base_url=..., model=..., kind="vllm" | "sglang" | "rag-lookahead" | "openai")`` has the local
engine's `stream`, `complete` and `scope`, returns the same `TextStream` and `DecodeStats`, and
plugs into `RagPipeline` and the LangChain and LlamaIndex adapters through ``engine=``.
`server_command` prints the command that starts such a server with speculative settings for RAG.

Its names are imported when first used (`rag_lookahead.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_lookahead.lazy import lazy_attributes

if TYPE_CHECKING:
    from rag_lookahead.server.call import ServerError, ServerTimeout
    from rag_lookahead.server.config import KINDS, ServerConfig, ServerKind
    from rag_lookahead.server.corpus import CorpusError, CorpusWarning
    from rag_lookahead.server.engine import ServerEngine
    from rag_lookahead.server.launch import BACKENDS, server_command
    from rag_lookahead.server.metrics import SpeculationCounters
    from rag_lookahead.server.scope import ServerScope

__all__ = [
    "BACKENDS",
    "KINDS",
    "CorpusError",
    "CorpusWarning",
    "ServerConfig",
    "ServerEngine",
    "ServerError",
    "ServerKind",
    "ServerScope",
    "ServerTimeout",
    "SpeculationCounters",
    "server_command",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "ServerError": "rag_lookahead.server.call",
        "ServerTimeout": "rag_lookahead.server.call",
        "KINDS": "rag_lookahead.server.config",
        "ServerConfig": "rag_lookahead.server.config",
        "ServerKind": "rag_lookahead.server.config",
        "CorpusError": "rag_lookahead.server.corpus",
        "CorpusWarning": "rag_lookahead.server.corpus",
        "ServerEngine": "rag_lookahead.server.engine",
        "BACKENDS": "rag_lookahead.server.launch",
        "server_command": "rag_lookahead.server.launch",
        "SpeculationCounters": "rag_lookahead.server.metrics",
        "ServerScope": "rag_lookahead.server.scope",
    },
)
