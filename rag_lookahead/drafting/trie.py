"""Prefix trie of token ids with per-owner n-gram counts, the source of lookahead drafts.

Every n-gram of ``max_query_length + branch_length`` tokens that an owner inserts becomes a path
from the root, so a node's count for an owner is how often that n-gram occurs in the owner's text.
Owners are query ids (prompt and retrieved documents) plus ``OUTPUT_OWNER`` for generated text.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from itertools import chain
from weakref import WeakSet

from rag_lookahead.config import MAX_TRIE_NODES
from rag_lookahead.drafting.trie_io import read_trie_file, restore_nodes, write_trie_file
from rag_lookahead.drafting.trie_nodes import (
    NO_OWNER,
    OUTPUT_OWNER,
    Node,
    as_tokens,
    check_int,
    check_owner,
    collector_paused,
)
from rag_lookahead.drafting.trie_read import TrieDraft, read_draft

__all__ = ["NO_OWNER", "OUTPUT_OWNER", "InsertCursor", "Node", "TokenTrie", "TrieDraft"]

_MIN_NODES = 1000
_MAX_LENGTH = 4096  # far deeper than any useful draft; bounds what a hostile file can ask for
_PRUNE_FRACTION = 0.75
# Past this share of the cap a prune starts and advances with the trie's growth, a slice of its
# work per node added (`_PRUNE_WORK_PER_NODE`), so that no one insert pays for a whole prune:
# a prune reads every node, and a stream's step that crossed the cap would wait for it.
_PRUNE_FROM = 0.875
# Nodes a prune under way reads or removes per node added: it reads every node once and removes
# an eighth of the cap, so it ends well before the trie grows from `_PRUNE_FROM` to the cap.
_PRUNE_WORK_PER_NODE = 16
_PRUNE_SLICE = 256  # nodes a prune reads or removes between two looks at its budget


class InsertCursor:
    """Inserts tokens as they are generated, each visible at once: the same counts as one
    `TokenTrie.insert` of everything extended so far."""

    def __init__(self, trie: TokenTrie, owner: str) -> None:
        self._trie = trie
        self._owner = owner
        self._open: list[Node] = []  # deepest node of every n-gram still growing
        trie._cursors.add(self)  # so eliminate/decay can restart its n-grams

    @property
    def owner(self) -> str:
        return self._owner

    def extend(self, tokens: Sequence[int]) -> None:
        """Count ``tokens`` as the continuation of everything extended so far."""
        with self._trie.lock:
            for token in as_tokens(tokens):
                self._step(token)

    def _step(self, token: int) -> None:
        trie = self._trie
        width = trie.ngram_length
        before = len(trie)
        grown: list[Node] = []
        for node in self._open:
            if node.parent is not None:  # pruned n-grams are simply dropped
                child = trie._bump(node, token, self._owner)
                if child.depth < width:
                    grown.append(child)
        grown.append(trie._bump(trie.root, token, self._owner))
        self._open = grown
        trie._grown(len(trie) - before)


class TokenTrie:
    """Token n-gram trie with per-owner counts, a hard node cap and visibility-scoped drafting.

    Thread-safe: every method holds the trie's own `lock` (reentrant), which callers may also
    hold to make several calls one update.
    """

    def __init__(self, max_query_length: int = 2, branch_length: int = 12, max_nodes: int = 200_000) -> None:
        check_int("max_query_length", max_query_length, 1, _MAX_LENGTH)
        check_int("branch_length", branch_length, 1, _MAX_LENGTH)
        check_int("max_nodes", max_nodes, _MIN_NODES, MAX_TRIE_NODES)
        self._max_query_length = max_query_length
        self._branch_length = branch_length
        self._max_nodes = max_nodes
        self._root = Node(None, None, 0, 0)
        self._next_order = 1
        self._size = 0
        self._owned: dict[str, set[Node]] = {}
        self._cursors: WeakSet[InsertCursor] = WeakSet()
        self._lock = threading.RLock()
        self._pruning: Iterator[int] | None = None  # a prune under way (`_prune_slices`)

    @property
    def lock(self) -> threading.RLock:
        """The lock every method holds; hold it to make several calls one atomic update."""
        return self._lock

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
    def ngram_length(self) -> int:
        """Length of the inserted n-grams (the deepest path): max_query_length + branch_length."""
        return self._max_query_length + self._branch_length

    @property
    def root(self) -> Node:
        return self._root

    def __len__(self) -> int:
        return self._size

    def owners(self) -> set[str]:
        """Owners that currently have at least one node."""
        with self._lock:
            return set(self._owned)

    def count_owned(self, owner: str) -> int:
        """Number of nodes carrying a count for ``owner``."""
        with self._lock:
            return len(self._owned.get(owner, ()))

    def counts_at(self, path: Sequence[int]) -> dict[str, int]:
        """Copy of the counts of the node reached by ``path`` from the root ({} if absent)."""
        with self._lock:
            node = self._root
            for token in as_tokens(path):
                child = node.children.get(token)
                if child is None:
                    return {}
                node = child
            return dict(node.counts)

    def insert(self, tokens: Sequence[int], owner: str, *, starts: int | None = None) -> None:
        """Count every n-gram ``tokens[i : i + ngram_length]`` for ``owner``; with ``starts``,
        only those that begin in the first ``starts`` tokens (the rest are their ends): a long
        text goes in a part at a time, ``insert(text[a : b + ngram_length - 1], owner,
        starts=b - a)``, the same counts as one insert of it all."""
        check_owner(owner)
        toks = as_tokens(tokens)
        width = self.ngram_length
        if starts is not None:
            check_int("starts", starts, 0)
        with self._lock, collector_paused():
            for start in range(len(toks) if starts is None else min(starts, len(toks))):
                node, before = self._root, self._size
                for token in toks[start : start + width]:
                    node = self._bump(node, token, owner)
                self._grown(self._size - before)  # per n-gram, so huge inserts stay bounded

    def insert_cursor(self, owner: str = OUTPUT_OWNER) -> InsertCursor:
        """A cursor whose ``extend`` calls count as one ``insert`` of their tokens joined."""
        check_owner(owner)
        with self._lock:
            return InsertCursor(self, owner)

    def _bump(self, node: Node, token: int, owner: str) -> Node:
        child = node.children.get(token)
        if child is None:
            child = Node(token, node, node.depth + 1, self._next_order)
            self._next_order += 1
            node.children[token] = child
            self._size += 1
        if node.ranked is not None:
            node.ranked.note(child, owner)
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
        with self._lock:
            return self._eliminate(owner)

    def _eliminate(self, owner: str) -> int:
        nodes = self._owned.pop(owner, None)
        self._restart_cursors(owner)
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
        """Remove least valuable subtrees until ``len(self) <= target`` (default 3/4 of the cap),
        now (a prune under way as the trie grows is dropped: this one reads every node anew)."""
        if target is None:
            target = int(self._max_nodes * _PRUNE_FRACTION)
        check_int("target", target, 0)
        with self._lock, collector_paused():
            self._pruning = None
            before = self._size
            if before > target:
                for _ in self._prune_slices(target):
                    pass
            return before - self._size

    def _grown(self, added: int) -> None:
        """After ``added`` nodes: past `_PRUNE_FROM` of the cap, a prune starts or advances by
        `_PRUNE_WORK_PER_NODE` per node added; past the cap, it ends now."""
        if self._pruning is None:
            if self._size <= self._max_nodes * _PRUNE_FROM:
                return
            self._pruning = self._prune_slices(int(self._max_nodes * _PRUNE_FRACTION))
        budget = added * _PRUNE_WORK_PER_NODE if self._size <= self._max_nodes else None
        for work in self._pruning:
            if budget is not None:
                budget -= work
                if budget <= 0:
                    return
        self._pruning = None

    def _prune_slices(self, target: int) -> Iterator[int]:
        """A prune to ``target`` nodes, run a slice at a time: yields the nodes it read or
        removed since its last yield. Nodes added meanwhile are left to the next prune; nodes
        removed meanwhile (eliminated) are passed over. It ends with the output counts decayed,
        at once, so that every path's counts stay monotone."""
        buckets: dict[tuple[int, int, int], list[Node]] = {}
        yield from self._bucket_slices(buckets)
        work = removed = 0
        for node in chain.from_iterable(buckets[key] for key in sorted(buckets)):
            if self._size <= target:
                break
            if node.parent is not None:  # (not already gone with an ancestor, or eliminated)
                work += self._remove_subtree(node)
                if work >= _PRUNE_SLICE:
                    removed += work
                    yield work
                    work = 0
        if removed + work:
            self._decay_output()
        yield work

    def _bucket_slices(self, buckets: dict[tuple[int, int, int], list[Node]]) -> Iterator[int]:
        # Output-only nodes go first (phase 0); ascending count then deeper-first means a node is
        # reached only after its descendants, so the trie stays connected at any stopping point.
        # Bucketing by key instead of sorting (key, node) tuples avoids 200k GC-tracked objects.
        # Each node's children are read as it is reached (a list of them: the trie may grow
        # between two slices).
        stack = list(self._root.children.values())
        read = 0
        while stack:
            node = stack.pop()
            if node.parent is None:  # removed since it was listed
                continue
            stack.extend(node.children.values())
            read += 1
            if read == _PRUNE_SLICE:
                yield read
                read = 0
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
        yield read

    def _decay_output(self) -> None:
        # Ceil-halving keeps counts positive and monotone down a path, so only pruning deletes.
        # Ties form, so rankings by output count are dropped: only a node with output counts
        # has children with them.
        for node in self._owned.get(OUTPUT_OWNER, ()):
            node.counts[OUTPUT_OWNER] = (node.counts[OUTPUT_OWNER] + 1) // 2
            node.ranked = None
        self._restart_cursors(OUTPUT_OWNER)

    def _restart_cursors(self, owner: str) -> None:
        # The owner's counts on open paths just shrank: growing those n-grams further could give
        # a child more count than its ancestors, so the cursors start fresh n-grams instead.
        for cursor in self._cursors:
            if cursor.owner == owner:
                cursor._open.clear()

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
            node.parent = None  # marks it detached for open cursors; also breaks the ref cycle
            node.ranked = None  # a ranking holds on to the children it lists
            removed += 1
        self._size -= removed
        return removed

    def draft(self, context: Sequence[int], owner: str | None, budget: int, min_match: int = 1) -> TrieDraft:
        """Best-first draft tree of at most ``budget`` tokens after the longest matching suffix
        of ``context`` (at least ``min_match`` tokens).

        Only ``owner``'s and output counts are visible. The tree comes in pre-order with best
        siblings first; ``parents[i] == -1`` hangs off the matched node.
        """
        with self._lock:
            return read_draft(
                self._root, context, owner, budget, min_match, self._max_query_length, self._branch_length
            )

    def settings(self) -> dict[str, int]:
        """The constructor's arguments."""
        return {
            "max_query_length": self._max_query_length,
            "branch_length": self._branch_length,
            "max_nodes": self._max_nodes,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the trie as versioned JSON (gzip when ``path`` ends with .gz), atomically."""
        with self._lock:
            write_trie_file(path, self.settings(), self._root, self.nodes())

    @classmethod
    def load(cls, path: str | os.PathLike[str], vocab_size: int | None = None) -> TokenTrie:
        """Read a trie written by ``save``; raises ValueError on a malformed or foreign file,
        or one holding token ids outside ``vocab_size`` (when given)."""
        settings, entries = read_trie_file(path)
        try:
            trie = cls(**settings)  # the constructor validates the settings
        except (TypeError, ValueError) as err:
            raise ValueError(f"{os.fspath(path)}: bad trie settings ({err})") from None
        if len(entries) > trie.max_nodes:
            raise ValueError(f"{os.fspath(path)}: more nodes than its max_nodes ({trie.max_nodes})")
        with trie._lock, collector_paused():
            restore_nodes(entries, trie.root, trie.restore_node)
        largest = trie.largest_token()
        if vocab_size is not None and largest >= vocab_size:
            where = os.fspath(path)
            raise ValueError(f"{where}: token id {largest} is outside a {vocab_size}-token vocabulary")
        return trie

    def largest_token(self) -> int:
        """The largest token id in the trie (-1 when empty)."""
        with self._lock:
            return max((node.token for node in self._walk() if node.token is not None), default=-1)

    def nodes(self) -> list[Node]:
        """Every node below the root, in creation order (each parent before its children)."""
        with self._lock:
            return sorted(self._walk(), key=lambda node: node.order)

    def restore_node(self, parent: Node, token: int, counts: dict[str, int]) -> Node:
        """Attach a node read back from a file below ``parent`` (validated by the caller)."""
        with self._lock:
            node = Node(token, parent, parent.depth + 1, self._next_order)
            self._next_order += 1
            parent.children[token] = node
            node.counts = dict(counts)
            if parent.ranked is not None:
                for owner in counts:
                    parent.ranked.note(node, owner)
            for owner in counts:
                self._owned.setdefault(owner, set()).add(node)
            self._size += 1
            return node

    def _walk(self) -> Iterator[Node]:
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
