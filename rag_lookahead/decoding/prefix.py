"""Prompt prefixes kept in the KV cache, so that a prompt starting alike skips their prefill.

Calls share a chat template and a system prompt, documents placed first, or a whole repeated
question. After a prompt is prefilled its cache entries are kept (a copy, under a byte cap,
least recently used out first); a later prompt starts from a copy of the longest prefix it
shares with a kept one and prefills only the rest. A column's keys and values depend only on
the tokens up to it, so they are the ones the prompt's own prefill computes — exactly the
situation of a prompt prefilled in chunks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rag_lookahead.decoding.kv_cache import new_tree_cache

__all__ = ["PrefixCache"]

_States = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H, n, D]


class PrefixCache:
    """Prefilled prompts' cache entries, keyed by their tokens, within ``max_bytes``.

    Used by one thread at a time (the scheduler's driver).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], _States] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @torch.inference_mode()
    def lookup(self, prompt: Sequence[int]) -> tuple[DynamicCache, int]:
        """A fresh tree cache holding the longest kept prefix of ``prompt``, and its length.

        The prompt's last token is never taken from here: its forward gives the first logits.
        """
        cache = new_tree_cache()
        best, reused = None, 0
        for tokens in self._entries:
            shared = min(_common_length(tokens, prompt), len(prompt) - 1)
            if shared > reused:
                best, reused = tokens, shared
        if best is None:
            return cache, 0
        self._entries.move_to_end(best)
        for index, (keys, values) in enumerate(self._entries[best]):
            cache.update(keys[:, :, :reused], values[:, :, :reused], index)  # copied in
        return cache, reused

    @torch.inference_mode()
    def store(self, prompt: Sequence[int], cache: DynamicCache) -> None:
        """Keep a copy of ``cache``'s first ``len(prompt)`` columns, the prompt's entries."""
        tokens = tuple(prompt)
        layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
        if not tokens or len(layers) != len(cache.layers):
            return
        size = sum(2 * _states(layer)[0][:, :, : len(tokens)].nbytes for layer in layers)
        if size > self.max_bytes:
            return
        for kept in list(self._entries):
            if tokens[: len(kept)] == kept:  # the new entry covers it
                self._drop(kept)
            elif kept[: len(tokens)] == tokens:  # it covers the new one
                self._entries.move_to_end(kept)
                return
        while self._entries and self.bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[tokens] = [
            (keys[:, :, : len(tokens)].clone(), values[:, :, : len(tokens)].clone())
            for keys, values in map(_states, layers)
        ]
        self.bytes += size

    def _drop(self, tokens: tuple[int, ...]) -> None:
        states = self._entries.pop(tokens)
        self.bytes -= sum(keys.nbytes + values.nbytes for keys, values in states)


def _states(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
