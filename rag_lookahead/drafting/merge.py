"""Drafters combined: one tree per step from all of a call's drafters, built by mode."""

from __future__ import annotations

import threading
import uuid
from typing import Sequence

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.drafting.base import Drafter, WindowedDrafter
from rag_lookahead.drafting.jacobi import JacobiDrafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter
from rag_lookahead.tree import DraftTree

__all__ = ["MergedDrafter", "build_drafter"]


def build_drafter(
    config: LookaheadConfig,
    trie: TokenTrie,
    lock: threading.RLock,
    sequences: Sequence[Sequence[int]],
    scope: tuple[str, Sequence[Sequence[int]]] | None = None,
) -> MergedDrafter:
    """The drafters ``config.mode`` asks for, for one call whose prompt is ``sequences[0]``.

    ``scope`` is a `DocumentScope`'s owner and documents: the call's branches then join the
    scope's, which outlive the call.
    """
    drafters: list[Drafter] = []
    if config.mode in ("auto", "trie"):
        owner = scope[0] if scope else f"call-{uuid.uuid4().hex}"
        drafters.append(
            TrieDrafter(
                trie, owner, sequences, lock, config.min_query_length, eliminate_on_close=scope is None
            )
        )
    if config.mode in ("auto", "jacobi"):
        pooled = [*sequences, *scope[1]] if scope else sequences
        drafters.append(
            JacobiDrafter(pooled, config.window_size, config.ngram_size, config.guess_set_size)
        )
    return MergedDrafter(drafters)


class MergedDrafter:
    """Several drafters as one: their trees merged under the budget, the first one's first."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        tree = self.drafters[0].propose(context, budget)
        for drafter in self.drafters[1:]:
            room = budget - (len(tree) - 1)
            if room <= 0:
                break
            tree = tree.merge(drafter.propose(context, room))
        return tree

    def observe(self, tokens: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.observe(tokens)

    def close(self) -> None:
        for drafter in self.drafters:
            drafter.close()

    def windowed(self) -> WindowedDrafter | None:
        return next((d for d in self.drafters if isinstance(d, WindowedDrafter)), None)
