"""Prefix trie of token ids with per-owner n-gram counts, the source of lookahead drafts.

Every window of ``max_query_length + branch_length`` tokens that an owner inserts becomes a path
from the root, so a node's count for an owner is how often that n-gram occurs in the owner's text.
Owners are query ids (prompt and retrieved documents) plus ``OUTPUT_OWNER`` for generated text.
"""

from __future__ import annotations

import heapq
import operator
import os
from itertools import chain
from typing import Iterator, NamedTuple, Sequence
from weakref import WeakSet

__all__ = ["OUTPUT_OWNER", "Node", "TokenTrie", "TrieDraft", "TrieStream"]

OUTPUT_OWNER = "__output__"

_MIN_NODES = 1000
_PRUNE_FRACTION = 0.75
NO_OWNER = ""  # draft(owner=None) looks this up; insert() rejects it as an owner

class TrieDraft(NamedTuple):
    """A draft read from the trie, in pre-order with best siblings first."""

    tokens: list[int]
    parents: list[int]  # index of each token's parent in this draft; -1 = the matched node
    match_length: int  # how many context tokens matched (0: no draft)
    estimates: list[float]  # visible count of each node over its parent's: P(token | path)
    owned: list[bool]  # whether the query owner counts the node (else only outputs do)


_EMPTY = TrieDraft([], [], 0, [], [])

# (-query count, -output count, creation order, node): heap order = best first, ties deterministic.
_Entry = tuple[int, int, int, "Node"]


class Node:
    """One n-gram: ``counts`` maps owner -> occurrences. A pruned node has ``parent = None``."""

    __slots__ = ("token", "parent", "children", "counts", "depth", "order")

    def __init__(self, token: int | None, parent: Node | None, depth: int, order: int) -> None:
        self.token = token
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.counts: dict[str, int] = {}
        self.depth = depth
        self.order = order  # creation order, the final tie-break of draft ranking


class TrieStream:
    """Feeds tokens to a trie as they are generated; each token is visible immediately."""

    def __init__(self, trie: TokenTrie, owner: str) -> None:
        self._trie = trie
        self._owner = owner
        self._open: list[Node] = []  # deepest node of every window still growing
        trie._streams.add(self)  # so eliminate/decay can restart its windows

    @property
    def owner(self) -> str:
        return self._owner

    def extend(self, tokens: Sequence[int]) -> None:
        """Count ``tokens`` as the continuation of everything extended so far."""
        for token in _as_tokens(tokens):
            self._step(token)

    def _step(self, token: int) -> None:
        trie = self._trie
        width = trie.window
        grown: list[Node] = []
        for node in self._open:
            if node.parent is not None:  # pruned windows are simply dropped
                child = trie._bump(node, token, self._owner)
                if child.depth < width:
                    grown.append(child)
        grown.append(trie._bump(trie.root, token, self._owner))
        self._open = grown
        if len(trie) > trie.max_nodes:
            trie.prune()


class TokenTrie:
    """Token n-gram trie with per-owner counts, a hard node cap and visibility-scoped drafting.

    Not thread-safe: callers sharing one trie serialise all calls (streams included).
    """

    def __init__(
        self, max_query_length: int = 2, branch_length: int = 12, max_nodes: int = 200_000
    ) -> None:
        _check_int("max_query_length", max_query_length, 1)
        _check_int("branch_length", branch_length, 1)
        _check_int("max_nodes", max_nodes, _MIN_NODES)
        self._max_query_length = max_query_length
        self._branch_length = branch_length
        self._max_nodes = max_nodes
        self._root = Node(None, None, 0, 0)
        self._next_order = 1
        self._size = 0
        self._owned: dict[str, set[Node]] = {}
        self._streams: WeakSet[TrieStream] = WeakSet()

    @property
    def max_query_length(self) -> int:
        return self._max_query_length

    @property
    def branch_length(self) -> int:
        return self._branch_length

    @property
    def max_nodes(self) -> int:
        return self._max_nodes

    @property
    def window(self) -> int:
        """Length of the inserted n-grams: max_query_length + branch_length."""
        return self._max_query_length + self._branch_length

    @property
    def root(self) -> Node:
        return self._root

    def __len__(self) -> int:
        return self._size

    def owners(self) -> set[str]:
        """Owners that currently have at least one node."""
        return set(self._owned)

    def count_owned(self, owner: str) -> int:
        """Number of nodes carrying a count for ``owner``."""
        return len(self._owned.get(owner, ()))

    def counts_at(self, path: Sequence[int]) -> dict[str, int]:
        """Copy of the counts of the node reached by ``path`` from the root ({} if absent)."""
        node = self._root
        for token in _as_tokens(path):
            child = node.children.get(token)
            if child is None:
                return {}
            node = child
        return dict(node.counts)

    def insert(self, tokens: Sequence[int], owner: str) -> None:
        """Count every window ``tokens[i : i + window]`` for ``owner``."""
        _check_owner(owner)
        toks = _as_tokens(tokens)
        width = self.window
        for start in range(len(toks)):
            node = self._root
            for token in toks[start : start + width]:
                node = self._bump(node, token, owner)
            if self._size > self._max_nodes:  # per window, so huge inserts stay bounded
                self.prune()

    def open_stream(self, owner: str = OUTPUT_OWNER) -> TrieStream:
        """A stream whose ``extend`` matches ``insert`` of the concatenated tokens."""
        _check_owner(owner)
        return TrieStream(self, owner)

    def _bump(self, node: Node, token: int, owner: str) -> Node:
        child = node.children.get(token)
        if child is None:
            child = Node(token, node, node.depth + 1, self._next_order)
            self._next_order += 1
            node.children[token] = child
            self._size += 1
        counts = child.counts
        if owner in counts:
            counts[owner] += 1
        else:
            counts[owner] = 1
            owned = self._owned.get(owner)
            if owned is None:
                owned = self._owned[owner] = set()
            owned.add(child)
        return child

    def eliminate(self, owner: str) -> int:
        """Drop all of ``owner``'s counts; returns how many nodes were left empty and removed."""
        nodes = self._owned.pop(owner, None)
        self._restart_streams(owner)
        if not nodes:
            return 0
        for node in nodes:
            del node.counts[owner]
        removed = 0
        for node in nodes:
            # An empty node's subtree is empty too (counts are monotone), so it all goes.
            if not node.counts and node.parent is not None:
                removed += self._remove_subtree(node)
        return removed

    def prune(self, target: int | None = None) -> int:
        """Remove least valuable subtrees until ``len(self) <= target`` (default 3/4 of the cap)."""
        if target is None:
            target = int(self._max_nodes * _PRUNE_FRACTION)
        _check_int("target", target, 0)
        if self._size <= target:
            return 0
        removed = 0
        buckets = self._prune_buckets()
        for node in chain.from_iterable(buckets[key] for key in sorted(buckets)):
            if self._size <= target:
                break
            if node.parent is not None:
                removed += self._remove_subtree(node)
        self._decay_output()
        return removed

    def _prune_buckets(self) -> dict[tuple[int, int, int], list[Node]]:
        # Output-only nodes go first (phase 0); ascending count then deeper-first means a node is
        # reached only after its descendants, so the trie stays connected at any stopping point.
        # Bucketing by key instead of sorting (key, node) tuples avoids 200k GC-tracked objects.
        buckets: dict[tuple[int, int, int], list[Node]] = {}
        for node in self._iter_nodes():
            counts = node.counts
            if len(counts) == 1 and OUTPUT_OWNER in counts:
                key = (0, counts[OUTPUT_OWNER], -node.depth)
            else:
                key = (1, sum(counts.values()), -node.depth)
            bucket = buckets.get(key)
            if bucket is None:
                buckets[key] = [node]
            else:
                bucket.append(node)
        return buckets

    def _decay_output(self) -> None:
        # Ceil-halving keeps counts positive and monotone down a path, so only pruning deletes.
        for node in self._owned.get(OUTPUT_OWNER, ()):
            node.counts[OUTPUT_OWNER] = (node.counts[OUTPUT_OWNER] + 1) // 2
        self._restart_streams(OUTPUT_OWNER)

    def _restart_streams(self, owner: str) -> None:
        # The owner's counts on open paths just shrank: growing those windows further could give
        # a child more count than its ancestors, so the streams start fresh windows instead.
        for stream in self._streams:
            if stream.owner == owner:
                stream._open.clear()

    def _remove_subtree(self, top: Node) -> int:
        assert top.parent is not None
        del top.parent.children[top.token]  # type: ignore[arg-type]
        removed = 0
        stack = [top]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for owner in node.counts:
                owned = self._owned.get(owner)
                if owned is not None:
                    owned.discard(node)
                    if not owned:
                        del self._owned[owner]
            node.parent = None  # marks it detached for open streams; also breaks the ref cycle
            removed += 1
        self._size -= removed
        return removed

    def draft(
        self, context: Sequence[int], owner: str | None, decoding_length: int, min_match: int = 1
    ) -> TrieDraft:
        """Best-first draft tree after the longest matching suffix of ``context``.

        Only ``owner``'s and output counts are visible. The tree comes in pre-order with best
        siblings first; ``parents[i] == -1`` hangs off the matched node.
        """
        _check_int("decoding_length", decoding_length, 0)
        _check_int("min_match", min_match, 1)
        if decoding_length == 0 or len(context) == 0:
            return _EMPTY
        tail = _as_tokens(context[-self._max_query_length :])
        owner = owner or NO_OWNER
        for length in range(len(tail), min_match - 1, -1):
            anchor = self._walk(tail[len(tail) - length :], owner)
            if anchor is None:
                continue
            heap: list[_Entry] = []
            _push_children(heap, anchor, owner, decoding_length)
            if heap:
                return self._select(anchor, heap, owner, decoding_length, length)
        return _EMPTY

    def _walk(self, path: list[int], owner: str) -> Node | None:
        node = self._root
        for token in path:
            child = node.children.get(token)
            if child is None:
                return None
            if not (child.counts.get(owner) or child.counts.get(OUTPUT_OWNER)):
                return None  # another query's n-gram
            node = child
        return node

    def _select(
        self, anchor: Node, heap: list[_Entry], owner: str, budget: int, match_length: int
    ) -> TrieDraft:
        # Counts are monotone, so popping best-first yields the top-``budget`` connected subtree,
        # and each parent's children are popped (hence listed) best first.
        limit = anchor.depth + self._branch_length
        kids: dict[Node, list[Node]] = {anchor: []}
        taken = 0
        while heap and taken < budget:
            node = heapq.heappop(heap)[3]
            kids[node.parent].append(node)  # type: ignore[index]
            kids[node] = []
            taken += 1
            if node.depth < limit:
                _push_children(heap, node, owner, budget - taken)
        tokens: list[int] = []
        parents: list[int] = []
        estimates: list[float] = []
        owned: list[bool] = []
        stack = [(child, -1) for child in reversed(kids[anchor])]
        while stack:
            node, parent = stack.pop()
            index = len(tokens)
            tokens.append(node.token)  # type: ignore[arg-type]
            parents.append(parent)
            estimates.append(_visible(node, owner) / _visible(node.parent, owner))  # type: ignore[arg-type]
            owned.append(owner in node.counts)
            stack.extend((child, index) for child in reversed(kids[node]))
        return TrieDraft(tokens, parents, match_length, estimates, owned)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trie as versioned JSON (gzip when ``path`` ends with .gz), atomically."""
        from rag_lookahead.drafting.trie_io import save_trie

        save_trie(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenTrie:
        """Read a trie written by ``save``; raises ValueError on a malformed or foreign file."""
        from rag_lookahead.drafting.trie_io import load_trie

        return load_trie(path)

    def _restore_node(self, parent: Node, token: int, counts: dict[str, int]) -> Node:
        """Attach a node read back from a file (validated by the caller), in creation order."""
        node = Node(token, parent, parent.depth + 1, self._next_order)
        self._next_order += 1
        parent.children[token] = node
        node.counts = dict(counts)
        for owner in counts:
            self._owned.setdefault(owner, set()).add(node)
        self._size += 1
        return node

    def _iter_nodes(self) -> Iterator[Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _visible(node: Node, owner: str) -> int:
    counts = node.counts
    return counts.get(owner, 0) + counts.get(OUTPUT_OWNER, 0)


def _push_children(heap: list[_Entry], node: Node, owner: str, room: int) -> None:
    entries: list[_Entry] = []
    for child in node.children.values():
        counts = child.counts
        query = counts.get(owner, 0)
        output = counts.get(OUTPUT_OWNER, 0)
        if query or output:
            entries.append((-query, -output, child.order, child))
    if len(entries) > room:
        # A child ranked below ``room`` of its own siblings can never be selected.
        entries = heapq.nsmallest(room, entries)
    for entry in entries:
        heapq.heappush(heap, entry)


def _as_tokens(tokens: Sequence[int]) -> list[int]:
    # operator.index accepts numpy/torch integer scalars but rejects floats.
    return [operator.index(token) for token in tokens]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int) -> None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_owner(owner: object) -> None:
    if not isinstance(owner, str) or owner == NO_OWNER:
        raise ValueError(f"owner must be a non-empty str, got {owner!r}")
