"""Prompt prefixes kept in the KV cache, so that a prompt starting alike skips their prefill.

Calls share a chat template and a system prompt, documents placed first, or a whole repeated
question. After a prompt is prefilled its cache entries are kept in a radix tree over token ids
(as SGLang's RadixAttention keeps them): each node holds the entries of the tokens on its edge,
so prompts that share a beginning share its entries once, and a lookup walks the prompt down
the tree instead of comparing it with every kept prompt. Within a byte cap the least recently
used leaves go first. A later prompt starts from a copy of the longest prefix it shares with
the kept ones and prefills only the rest. A column's keys and values depend only on the tokens
up to it, so they are the ones the prompt's own prefill computes — exactly the situation of a
prompt prefilled in chunks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rag_lookahead.runtime.kv_cache import new_tree_cache

__all__ = ["PrefixCache"]

_States = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H, n, D]


class _Node:
    """An edge of the tree: its tokens and their entries, below ``parent``."""

    __slots__ = ("children", "last_used", "parent", "states", "tokens")

    def __init__(self, tokens: tuple[int, ...], states: _States, parent: _Node | None) -> None:
        self.tokens = tokens
        self.states = states
        self.parent = parent
        self.children: dict[int, _Node] = {}  # by their first token
        self.last_used = 0

    @property
    def bytes(self) -> int:
        return sum(keys.nbytes + values.nbytes for keys, values in self.states)

    def split(self, at: int) -> _Node:
        """Cut this edge after its first ``at`` tokens; returns the new upper node (this one
        keeps the rest, below it). Each part gets its own copy, so that either can be freed."""
        assert self.parent is not None and 0 < at < len(self.tokens)
        upper = _Node(self.tokens[:at], _columns(self.states, 0, at), self.parent)
        upper.last_used = self.last_used
        self.parent.children[self.tokens[0]] = upper
        self.tokens, self.states, self.parent = self.tokens[at:], _columns(self.states, at, None), upper
        upper.children[self.tokens[0]] = self
        return upper


class PrefixCache:
    """Prefilled prompts' cache entries in a radix tree over their tokens, within ``max_bytes``.

    Used by one thread at a time (the scheduler's driver).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._root = _Node((), [], None)
        self._clock = itertools.count(1)  # recency, without reading the time

    def __len__(self) -> int:
        """Kept prompts that no longer kept prompt extends: the tree's leaves."""
        return sum(1 for node in self._nodes() if not node.children)

    @torch.inference_mode()
    def lookup(self, prompt: Sequence[int]) -> tuple[DynamicCache, int]:
        """A fresh tree cache holding the longest kept prefix of ``prompt``, and its length.

        The prompt's last token is never taken from here: its forward gives the first logits.
        """
        cache = new_tree_cache()
        path, reused = self._walk(prompt[: len(prompt) - 1])
        if not reused:
            return cache, 0
        now = next(self._clock)
        pieces: list[_States] = []
        left = reused
        for node in path:
            node.last_used = now
            pieces.append(_columns(node.states, 0, min(left, len(node.tokens)), copy=False))
            left -= len(node.tokens)
        for index, layer in enumerate(zip(*pieces, strict=True)):
            keys = torch.cat([k for k, _ in layer], dim=2) if len(layer) > 1 else layer[0][0]
            values = torch.cat([v for _, v in layer], dim=2) if len(layer) > 1 else layer[0][1]
            cache.update(keys, values, index)  # copied in
        return cache, reused

    @torch.inference_mode()
    def store(self, prompt: Sequence[int], cache: DynamicCache) -> None:
        """Keep a copy of ``cache``'s entries for the tokens of ``prompt`` not kept yet."""
        tokens = tuple(prompt)
        layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
        if not tokens or len(layers) != len(cache.layers):
            return
        path, kept = self._walk(tokens)
        now = next(self._clock)
        for node in path:
            node.last_used = now
        if kept == len(tokens):  # a kept prompt covers it
            return
        states = [_states(layer) for layer in layers]
        size = sum(2 * keys[:, :, kept : len(tokens)].nbytes for keys, _ in states)
        parent = path[-1] if path else self._root
        within = kept - sum(len(node.tokens) for node in path[:-1])
        if path and within < len(parent.tokens):  # it leaves the tree inside an edge
            parent = parent.split(within)
        if not self._make_room(size, keep=parent):
            return
        leaf = _Node(tokens[kept:], _columns(states, kept, len(tokens)), parent)
        leaf.last_used = now
        parent.children[tokens[kept]] = leaf
        self.bytes += size

    def _walk(self, tokens: Sequence[int]) -> tuple[list[_Node], int]:
        """The nodes ``tokens`` passes through (the last one perhaps only partly) and how many
        of its tokens the tree holds."""
        path: list[_Node] = []
        node, matched = self._root, 0
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            segment = tuple(tokens[matched : matched + len(child.tokens)])
            shared = len(segment) if segment == child.tokens else _common_length(child.tokens, segment)
            path.append(child)
            matched += shared
            if shared < len(child.tokens):
                break
            node = child
        return path, matched

    def _make_room(self, size: int, keep: _Node) -> bool:
        """Drop least recently used leaves (never ``keep`` or its ancestors) until ``size``
        more bytes fit; whether they do."""
        kept, pinned = set(), 0
        node: _Node | None = keep
        while node is not None:
            kept.add(id(node))
            pinned += node.bytes
            node = node.parent
        if pinned + size > self.max_bytes:  # no eviction could make room: evict nothing
            return False
        order = itertools.count()  # breaks ties between equally recent leaves
        leaves = [
            (n.last_used, next(order), n) for n in self._nodes() if not n.children and id(n) not in kept
        ]
        heapq.heapify(leaves)
        while self.bytes + size > self.max_bytes and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            self.bytes -= leaf.bytes
            if not parent.children and id(parent) not in kept:
                heapq.heappush(leaves, (parent.last_used, next(order), parent))
        return self.bytes + size <= self.max_bytes

    def _nodes(self) -> list[_Node]:
        """Every node but the root."""
        found, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            found.append(node)
            stack += node.children.values()
        return found


def _columns(states: _States, start: int, end: int | None, copy: bool = True) -> _States:
    """Each layer's columns ``start:end`` (a copy of their own, unless ``copy`` is off)."""
    if copy:
        return [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in states]
    return [(k[:, :, start:end], v[:, :, start:end]) for k, v in states]


def _states(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
