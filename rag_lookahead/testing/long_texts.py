"""Watching long texts go into the trie (or a call's own index) slice by slice, for tests that
check a running call steps between the slices rather than waiting for all of them at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from rag_lookahead.drafting.suffix import SuffixDrafter
from rag_lookahead.drafting.trie import TokenTrie

__all__ = ["InsertWatch", "Patcher"]

Watched = Literal["trie", "index"]


class Patcher(Protocol):
    """What sets an attribute for a test's duration (pytest's ``monkeypatch``)."""

    def setattr(self, target: Any, name: str, value: Any) -> None: ...


class InsertWatch:
    """For each part of at least ``shortest`` tokens that ``engine`` inserted, the running
    calls' tokens at that moment (`held`): different counts mean they stepped in between."""

    def __init__(self, engine: Any, shortest: int) -> None:
        self.held: list[int] = []
        self._engine = engine
        self._shortest = shortest

    def note(self, tokens: Sequence[int]) -> None:
        if len(tokens) >= self._shortest:  # a long text's part: not a call's own few tokens
            self.held.append(sum(len(call.ids) for call in self._engine.scheduler._rows.calls))

    def start(self, patcher: Patcher, watched: Watched) -> None:
        """Note every part inserted from now on into ``watched``: the trie or a call's index."""
        insert, index = TokenTrie.insert, SuffixDrafter._append

        def noted_insert(trie: TokenTrie, tokens: Sequence[int], *args: Any, **kwargs: Any) -> None:
            self.note(tokens)
            insert(trie, tokens, *args, **kwargs)

        def noted_index(drafter: SuffixDrafter, tokens: list[int]) -> None:
            self.note(tokens)
            index(drafter, tokens)

        if watched == "trie":
            patcher.setattr(TokenTrie, "insert", noted_insert)
        else:
            patcher.setattr(SuffixDrafter, "_append", noted_index)
