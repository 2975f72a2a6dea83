"""rag-lookahead: faster LLM answers in RAG pipelines, token for token the same.

Drafts come from a token trie of the retrieved documents, the prompt and the model's past
answers; the model verifies a whole draft tree in one forward pass and keeps what it agrees with.
"""

from rag_lookahead.config import GenerationParams, LookaheadConfig
from rag_lookahead.costs import CostCurve
from rag_lookahead.drafting import Drafter, JacobiDrafter, TokenTrie, TrieDrafter
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.models import DEFAULT_MODEL, load_model
from rag_lookahead.prompts import rag_messages
from rag_lookahead.scope import DocumentScope
from rag_lookahead.stats import DecodeStats
from rag_lookahead.stream import Chunk, Completion, TextStream
from rag_lookahead.tree import DraftTree

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "Chunk",
    "Completion",
    "CostCurve",
    "DecodeStats",
    "DocumentScope",
    "DraftTree",
    "Drafter",
    "GenerationParams",
    "JacobiDrafter",
    "LookaheadConfig",
    "LookaheadEngine",
    "TextStream",
    "TokenTrie",
    "TrieDrafter",
    "load_model",
    "rag_messages",
]
