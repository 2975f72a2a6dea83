"""The configs the flags describe, made before anything loads (a bad combination is refused at once)."""

from __future__ import annotations

import argparse
from typing import Any

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.loading import LoadKeywords, LoadOptions
from rag_lookahead.rag.chunking import ChunkingConfig
from rag_lookahead.rag.retrieval import RetrievalConfig, check_mode

__all__ = ["chunking_config", "load_options", "lookahead_config", "retrieval_config"]

# The model flags besides --model, named as the options (`serve` takes only some of them).
_LOADING_FLAGS = tuple(name for name in LoadKeywords.__annotations__ if name != "progress")


def load_options(args: argparse.Namespace, progress: bool = True) -> LoadOptions:
    """The model flags' loading options, with ``progress`` bars (drawn on a terminal only)."""
    flags: dict[str, Any] = {name: getattr(args, name, None) for name in _LOADING_FLAGS}
    return LoadOptions.of(None, args.model, **flags, progress=progress)


def lookahead_config(args: argparse.Namespace) -> LookaheadConfig:
    """The lookahead flags' settings."""
    return LookaheadConfig(
        mode="off" if getattr(args, "no_lookahead", False) else args.mode,
        decoding_length=args.decoding_length,
        branch_length=args.branch_length,
        draft_policy=args.draft_policy,
        cpu_linear=args.cpu_linear,
        step=args.step,
        max_model_len=args.max_model_len,
    )


def chunking_config(args: argparse.Namespace) -> ChunkingConfig:
    """The indexing flags' chunking settings."""
    return ChunkingConfig(args.chunk_size, args.chunk_overlap, args.chunk_unit)


def retrieval_config(args: argparse.Namespace) -> RetrievalConfig:
    """The retrieval flags' settings (`bench --retrieval gold` retrieves nothing, except from the
    bundled corpus, which it searches the default way)."""
    named = {"faiss": "dense", "gold": RetrievalConfig().mode}.get(args.retrieval, args.retrieval)
    return RetrievalConfig(top_k=args.top_k, min_score=args.min_score, mode=check_mode(named))
