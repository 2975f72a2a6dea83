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
    from rag_lookahead.remote.call import ServerError, ServerTimeout
    from rag_lookahead.remote.config import KINDS, ServerConfig, ServerKind
    from rag_lookahead.remote.corpus import CorpusError, CorpusWarning
    from rag_lookahead.remote.engine import ServerEngine
    from rag_lookahead.remote.launch import BACKENDS, server_command
    from rag_lookahead.remote.metrics import SpeculationCounters
    from rag_lookahead.remote.scope import ServerScope

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
        "ServerError": "rag_lookahead.remote.call",
        "ServerTimeout": "rag_lookahead.remote.call",
        "KINDS": "rag_lookahead.remote.config",
        "ServerConfig": "rag_lookahead.remote.config",
        "ServerKind": "rag_lookahead.remote.config",
        "CorpusError": "rag_lookahead.remote.corpus",
        "CorpusWarning": "rag_lookahead.remote.corpus",
        "ServerEngine": "rag_lookahead.remote.engine",
        "BACKENDS": "rag_lookahead.remote.launch",
        "server_command": "rag_lookahead.remote.launch",
        "SpeculationCounters": "rag_lookahead.remote.metrics",
        "ServerScope": "rag_lookahead.remote.scope",
    },
)
