"""The same calls on a serving engine: vLLM, SGLang, ``rag-lookahead serve``, or any
OpenAI-compatible server.

``ServerEngine(base_url=..., model=..., kind="vllm" | "sglang" | "rag-lookahead" | "openai")`` has the local
engine's `stream`, `complete` and `scope`, returns the same `TextStream` and `DecodeStats`, and
plugs into `RagPipeline` and the LangChain and LlamaIndex adapters through ``engine=``.
`server_command` prints the command that starts such a server with speculative settings for RAG.
"""

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
