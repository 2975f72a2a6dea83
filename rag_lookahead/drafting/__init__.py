"""Drafters: propose what may follow, from token ids only."""

from rag_lookahead.drafting.base import Drafter, WindowedDrafter
from rag_lookahead.drafting.jacobi import JacobiDrafter, NGramPool
from rag_lookahead.drafting.merge import MergedDrafter, build_drafter
from rag_lookahead.drafting.trie import OUTPUT_OWNER, TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter

__all__ = [
    "OUTPUT_OWNER",
    "Drafter",
    "JacobiDrafter",
    "MergedDrafter",
    "NGramPool",
    "TokenTrie",
    "TrieDrafter",
    "WindowedDrafter",
    "build_drafter",
]
