"""rag-lookahead: faster LLM answers in RAG pipelines, token for token the same.

Drafts come from a token trie of the retrieved documents, the prompt and the model's past
answers; the model verifies a whole draft tree in one forward pass and keeps what it agrees with.
"""

import warnings
from typing import Any

from rag_lookahead.config import GenerationParams, LookaheadConfig
from rag_lookahead.decoding.costs import CostCurve
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting import Drafter, JacobiDrafter, TokenTrie, TrieDrafter
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.models import DEFAULT_MODEL, load_model
from rag_lookahead.prompts import rag_messages
from rag_lookahead.scope import DocumentScope
from rag_lookahead.streaming.stats import DecodeStats
from rag_lookahead.streaming.stream import Completion, StreamChunk, TextStream
from rag_lookahead.structured import Grammar

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "Completion",
    "CostCurve",
    "DecodeStats",
    "DocumentScope",
    "DraftTree",
    "Drafter",
    "GenerationParams",
    "Grammar",
    "JacobiDrafter",
    "LookaheadConfig",
    "LookaheadEngine",
    "StepDraft",
    "StreamChunk",
    "TextStream",
    "TokenTrie",
    "TrieDrafter",
    "load_model",
    "rag_messages",
]

_RENAMED = {"Chunk": ("StreamChunk", StreamChunk)}


def __getattr__(name: str) -> Any:
    # Old names keep working, with a warning, for one release.
    if name in _RENAMED:
        new, value = _RENAMED[name]
        warnings.warn(f"rag_lookahead.{name} is now rag_lookahead.{new}", DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'rag_lookahead' has no attribute {name!r}")
