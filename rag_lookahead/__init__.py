"""rag-lookahead: faster LLM answers in RAG pipelines, token for token the same.

Drafts come from a token trie of the retrieved documents, the prompt and the model's past
answers; the model verifies a whole draft tree in one forward pass and keeps what it agrees with.

The names below are imported when first used (`rag_lookahead.lazy`): importing the package
loads no torch, so that the command line answers ``--help`` at once.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from rag_lookahead.lazy import lazy_attributes

if TYPE_CHECKING:
    from rag_lookahead.config import GenerationParams, LookaheadConfig
    from rag_lookahead.decoding.tree import DraftTree, StepDraft
    from rag_lookahead.drafting import Drafter, JacobiDrafter, TokenTrie, TrieDrafter
    from rag_lookahead.engine import LookaheadEngine
    from rag_lookahead.engine.scope import DocumentScope
    from rag_lookahead.loading import LoadOptions
    from rag_lookahead.models import DEFAULT_MODEL, load_model
    from rag_lookahead.planning.costs import CostCurve
    from rag_lookahead.prompts import rag_messages
    from rag_lookahead.streaming.logprobs import TokenLogprob
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
    "LoadOptions",
    "LookaheadConfig",
    "LookaheadEngine",
    "StepDraft",
    "StreamChunk",
    "TextStream",
    "TokenLogprob",
    "TokenTrie",
    "TrieDrafter",
    "load_model",
    "rag_messages",
]

_exported = lazy_attributes(
    __name__,
    {
        "GenerationParams": "rag_lookahead.config",
        "LookaheadConfig": "rag_lookahead.config",
        "CostCurve": "rag_lookahead.planning.costs",
        "DraftTree": "rag_lookahead.decoding.tree",
        "StepDraft": "rag_lookahead.decoding.tree",
        "Drafter": "rag_lookahead.drafting",
        "JacobiDrafter": "rag_lookahead.drafting",
        "TokenTrie": "rag_lookahead.drafting",
        "TrieDrafter": "rag_lookahead.drafting",
        "LookaheadEngine": "rag_lookahead.engine",
        "LoadOptions": "rag_lookahead.loading",
        "DEFAULT_MODEL": "rag_lookahead.models",
        "load_model": "rag_lookahead.models",
        "rag_messages": "rag_lookahead.prompts",
        "DocumentScope": "rag_lookahead.engine.scope",
        "DecodeStats": "rag_lookahead.streaming.stats",
        "Completion": "rag_lookahead.streaming.stream",
        "StreamChunk": "rag_lookahead.streaming.stream",
        "TextStream": "rag_lookahead.streaming.stream",
        "TokenLogprob": "rag_lookahead.streaming.logprobs",
        "Grammar": "rag_lookahead.structured",
    },
)
_RENAMED = {"Chunk": "StreamChunk"}


def __getattr__(name: str) -> Any:
    # Old names keep working, with a warning, for one release.
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"rag_lookahead.{name} is now rag_lookahead.{new}", DeprecationWarning, stacklevel=2)
        return _exported(new)
    return _exported(name)
