"""Reading a draft tree out of the trie: best-first after the longest matching suffix."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

from rag_lookahead.drafting.trie_nodes import (
    NO_OWNER,
    OUTPUT_OWNER,
    Node,
    as_tokens,
    check_int,
    draft_candidates,
    visible,
)

__all__ = ["TrieDraft", "read_draft"]


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


def read_draft(
    root: Node,
    context: Sequence[int],
    owner: str | None,
    budget: int,
    min_match: int,
    max_query_length: int,
    branch_length: int,
) -> TrieDraft:
    """Best-first draft tree of at most ``budget`` tokens below ``root``'s longest match of a
    suffix of ``context`` (``min_match`` to ``max_query_length`` tokens), ``branch_length`` deep.

    Only ``owner``'s and output counts are visible. The tree comes in pre-order with best
    siblings first; ``parents[i] == -1`` hangs off the matched node.
    """
    check_int("budget", budget, 0)
    check_int("min_match", min_match, 1)
    if budget == 0 or len(context) == 0:
        return _EMPTY
    tail = as_tokens(context[-max_query_length:])
    owner = owner or NO_OWNER
    for length in range(len(tail), min_match - 1, -1):
        anchor = _walk(root, tail[len(tail) - length :], owner)
        if anchor is None:
            continue
        heap: list[_Entry] = []
        _push_children(heap, anchor, owner, budget)
        if heap:
            return _select(anchor, heap, owner, budget, length, anchor.depth + branch_length)
    return _EMPTY


def _walk(root: Node, path: list[int], owner: str) -> Node | None:
    node = root
    for token in path:
        child = node.children.get(token)
        if child is None:
            return None
        if not (child.counts.get(owner) or child.counts.get(OUTPUT_OWNER)):
            return None  # another query's n-gram
        node = child
    return node


def _select(
    anchor: Node, heap: list[_Entry], owner: str, budget: int, match_length: int, limit: int
) -> TrieDraft:
    # Counts are monotone, so popping best-first yields the top-``budget`` connected subtree,
    # and each parent's children are popped (hence listed) best first; ``limit`` is the depth
    # no draft node may exceed.
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
        estimates.append(visible(node, owner) / visible(node.parent, owner))  # type: ignore[arg-type]
        owned.append(owner in node.counts)
        stack.extend((child, index) for child in reversed(kids[node]))
    return TrieDraft(tokens, parents, match_length, estimates, owned)


def _push_children(heap: list[_Entry], node: Node, owner: str, room: int) -> None:
    entries: list[_Entry] = []
    for child in draft_candidates(node, room):
        counts = child.counts
        query = counts.get(owner, 0)
        output = counts.get(OUTPUT_OWNER, 0)
        if query or output:
            entries.append((-query, -output, child.order, child))
    if len(entries) > room:
        # A child ranked below ``room`` of its own siblings can never be selected.
        entries.sort()  # what heapq.nsmallest gives, without its overhead on short lists
        del entries[room:]
    for entry in entries:
        heapq.heappush(heap, entry)
