"""Drafters: propose what may follow, from token ids only."""

from rag_lookahead.drafting.compose import ComposedDrafter, SharedDocuments, build_drafter
from rag_lookahead.drafting.jacobi import JacobiDrafter, NGramPool
from rag_lookahead.drafting.prediction import PredictionDrafter
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.suffix import SuffixDrafter, SuffixRule
from rag_lookahead.drafting.trie import OUTPUT_OWNER, InsertCursor, TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter

__all__ = [
    "OUTPUT_OWNER",
    "ComposedDrafter",
    "Drafter",
    "InsertCursor",
    "JacobiDrafter",
    "NGramPool",
    "PredictionDrafter",
    "SharedDocuments",
    "SuffixDrafter",
    "SuffixRule",
    "TokenTrie",
    "TrieDrafter",
    "build_drafter",
]
