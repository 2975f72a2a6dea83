"""The prompts kept for later calls to start from, as of the model's last change.

A joining call's prompt starts from the longest beginning it shares with a kept prompt
(`PrefixCache`). After the model changed (seen as each call starts: `ModelTuning.refresh`,
before it is queued) the kept entries are stale: they go, and only the calls admitted from then
on keep theirs (a running call's were partly computed before the change: a change while calls
run is the caller's race, but it outlives them in no kept prompt).
"""

from __future__ import annotations

from typing import Any

from rag_lookahead.engine.request import Call
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.prefix import PrefixCache

__all__ = ["KeptPrompts"]


class KeptPrompts:
    """The kept prompts of one scheduler (none when ``max_bytes`` is 0)."""

    def __init__(self, max_bytes: int, generation: int) -> None:
        self._prefixes = PrefixCache(max_bytes) if max_bytes else None
        self.generation = generation  # the model's changes seen when the kept ones were computed

    def refresh(self, generation: int) -> None:
        """The model's changes seen now: after one, the kept prompts are forgotten."""
        if generation == self.generation:
            return
        self.generation = generation
        if self._prefixes is not None:
            self._prefixes = PrefixCache(self._prefixes.max_bytes)

    def lookup(self, prompt_ids: list[int]) -> tuple[Any, int]:
        """A cache holding the longest kept beginning of ``prompt_ids`` (a new one if none),
        and its tokens."""
        if self._prefixes is None:
            return new_tree_cache(), 0
        return self._prefixes.lookup(prompt_ids)

    def keep(self, call: Call, cache: Any) -> None:
        """``call``'s prompt kept, as computed in ``cache``, if it was admitted after the
        model's last change (and shares the batch's caches)."""
        if self._prefixes is not None and call.batchable and call.generation == self.generation:
            self._prefixes.store(call.prompt_ids, cache)
