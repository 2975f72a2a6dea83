"""Drafters: propose what may follow, from token ids only."""

from rag_lookahead.drafting.base import Drafter
from rag_lookahead.drafting.trie import OUTPUT_OWNER, TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter

__all__ = ["OUTPUT_OWNER", "Drafter", "TokenTrie", "TrieDrafter"]
