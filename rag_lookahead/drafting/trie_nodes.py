"""The trie's nodes and owners, shared by the trie and its draft read-out."""

from __future__ import annotations

import gc
import operator
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

__all__ = [
    "NO_OWNER",
    "OUTPUT_OWNER",
    "WIDE_NODE",
    "Node",
    "RankedChildren",
    "as_tokens",
    "check_int",
    "check_owner",
    "collector_paused",
    "draft_candidates",
    "is_int",
    "visible",
]

OUTPUT_OWNER = "__output__"
NO_OWNER = ""  # draft(owner=None) looks this up; insert() rejects it as an owner


# Children beyond which a node keeps them ranked (`RankedChildren`) for drafts to read.
WIDE_NODE = 64


class Node:
    """One n-gram: ``counts`` maps owner -> occurrences. A pruned node has ``parent = None``."""

    __slots__ = ("children", "counts", "depth", "order", "parent", "ranked", "token")

    def __init__(self, token: int | None, parent: Node | None, depth: int, order: int) -> None:
        self.token = token
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.counts: dict[str, int] = {}
        self.depth = depth
        self.order = order  # creation order, the final tie-break of draft ranking
        # Set by the first draft that reads this node once it is wide; the trie tells it of
        # every count a child gains (`RankedChildren.note`) and drops it when counts decay.
        self.ranked: RankedChildren | None = None


class RankedChildren:
    """A wide node's children by output count as last sorted, and the few that may rank
    otherwise since: those whose output count grew and those some query owner counts.

    A draft needs a node's best ``room`` children by (query count, output count, creation
    order). Reading every child makes a draft's cost grow with the trie (a common token's node
    gains children as outputs accumulate); with this, a draft reads ``room`` children plus
    the changed ones. Exact, because a child in neither set has no query count and the output
    count it was sorted by; sorted again once the changed ones are a quarter of the children.
    """

    __slots__ = ("grown", "order", "owned")

    def __init__(self, node: Node) -> None:
        children = node.children.values()
        self.order = sorted(children, key=lambda c: (-c.counts.get(OUTPUT_OWNER, 0), c.order))
        self.grown: set[Node] = set()
        self.owned = {c for c in children if len(c.counts) > (OUTPUT_OWNER in c.counts)}

    def note(self, child: Node, owner: str) -> None:
        """``child`` (perhaps new) gained a count for ``owner``."""
        (self.grown if owner == OUTPUT_OWNER else self.owned).add(child)

    def stale(self, width: int) -> bool:
        return len(self.grown) + len(self.owned) > max(WIDE_NODE, width // 4)

    def candidates(self, node: Node, room: int) -> list[Node]:
        changed = self.grown | self.owned
        out = [child for child in changed if child.parent is node]
        taken = 0
        for child in self.order:
            if taken == room:
                break
            if child.parent is node and child not in changed:  # else pruned, or listed already
                out.append(child)
                taken += 1
        return out


def draft_candidates(node: Node, room: int) -> Iterable[Node]:
    """Children of ``node`` among which its best ``room`` are, for any owner (a superset)."""
    if len(node.children) <= WIDE_NODE:
        return node.children.values()
    ranked = node.ranked
    if ranked is None or ranked.stale(len(node.children)):
        ranked = node.ranked = RankedChildren(node)
    return ranked.candidates(node, room)


def visible(node: Node, owner: str) -> int:
    """The node's count as ``owner`` sees it: its own plus the shared outputs'."""
    counts = node.counts
    return counts.get(owner, 0) + counts.get(OUTPUT_OWNER, 0)


def as_tokens(tokens: Sequence[int]) -> list[int]:
    # operator.index accepts numpy/torch integer scalars but rejects floats.
    return [operator.index(token) for token in tokens]


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):  # type: ignore[operator]
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")


def check_owner(owner: object) -> None:
    if not isinstance(owner, str) or owner == NO_OWNER:
        raise ValueError(f"owner must be a non-empty str, got {owner!r}")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk update of a trie.

    A 1,000-token prompt adds ~15,000 nodes; the collections that allocation triggers traverse
    the whole long-lived trie, which took 5x the insertion itself (60 ms vs 10 ms per prompt).
    Inserting makes no garbage, so nothing waits for collection meanwhile. A collector someone
    else disabled stays disabled.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
