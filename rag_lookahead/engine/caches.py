"""The caches of the calls outside the batch, and the forwards run in them.

A joining prompt prefilled apart, between two steps of the batch, grows its call's own cache
from the longest kept beginning of its prompt (`KeptPrompts`) until it becomes the call's row;
a call that cannot share the batch (on a model that cannot verify trees) decodes plainly in the
model's own cache. The scheduler holds them here, beside its calls, not on them.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rag_lookahead.engine.executor import Executor
from rag_lookahead.engine.kept import KeptPrompts
from rag_lookahead.engine.prefill import PromptChunk
from rag_lookahead.engine.pricing import Pricing
from rag_lookahead.engine.request import Call

__all__ = ["CallCaches"]


class CallCaches:
    """Each call's own cache while it prefills apart or decodes alone (a row's is the batch's)."""

    def __init__(self, executor: Executor, pricing: Pricing, kept: KeptPrompts) -> None:
        self.executor, self.pricing, self.kept = executor, pricing, kept
        self._caches: dict[Call, Any] = {}

    def __contains__(self, call: Call) -> bool:
        return call in self._caches

    def __getitem__(self, call: Call) -> Any:
        return self._caches[call]

    def put(self, call: Call, cache: Any) -> None:
        """``call`` goes on in ``cache`` (its row's copy, say)."""
        self._caches[call] = cache

    def take(self, call: Call) -> Any:
        """``call``'s cache, no longer held here (it moves into the batch, or the call ended)."""
        return self._caches.pop(call, None)

    def cached_prefix(self, call: Call) -> int:
        """How much of ``call``'s prompt is cached already (its cache from there, looked up
        once, for a call that may share the batch)."""
        if call not in self._caches and call.batchable:
            self._caches[call], call.prefilled = self.kept.lookup(call.prompt_ids)
            call.recorder.cached_prompt_tokens = call.prefilled
        return call.prefilled

    def prefill(self, chunk: PromptChunk) -> tuple[torch.Tensor, float]:
        """``chunk`` of a call's prompt forwarded in its own cache: the logits at its last
        token ``[1, V]``, and the seconds."""
        call = chunk.call
        tokens = call.prompt_ids[chunk.start : chunk.end]
        logits, self._caches[call], seconds = self.executor.prompt_apart(tokens, self._caches.get(call))
        self.pricing.observe_prompt(chunk.tokens, seconds)
        call.prefilled = chunk.end
        return logits, seconds

    def plain_step(self, call: Call) -> tuple[torch.Tensor, float]:
        """One plain step of ``call`` after its last token, in its own cache: the logits
        ``[1, V]``, and the seconds."""
        started = time.perf_counter()
        logits, self._caches[call] = self.executor.plain_step(call.ids[-1], self._caches.get(call))
        return logits, time.perf_counter() - started
