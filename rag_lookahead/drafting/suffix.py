"""Drafts from the call's own text, as deep as the match is long (SuffixDecoding, arXiv 2411.04975).

Every earlier occurrence of the context's last token in the call's prompt, documents and output
so far is a candidate; its *match length* is how many tokens before it agree with the context.
A candidate's continuation is drafted up to a depth that grows with its match length, and
candidates vote for their continuations with a weight that also grows with it, so a long copy
drafts a deep chain while a one-token coincidence drafts a few tokens with little weight. The draft keeps the
branches with the most weight, best first.

Each node's source names the longest match behind it in coarse buckets ("sfx1" ... "sfx16"),
so the planner learns how deep each kind of match is accepted on the model at hand.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.trie_nodes import as_tokens, check_int

__all__ = ["SuffixDrafter", "SuffixRule", "match_bucket"]

_SEPARATOR = -1  # between texts: never a token id, so no match or continuation crosses it
_BUCKETS = (16, 8, 4, 3, 2, 1)  # lower bounds of the match-length buckets, longest first


def match_bucket(length: int) -> int:
    """The bucket a match of ``length`` tokens falls in (the largest bound at most it)."""
    return next(bound for bound in _BUCKETS if length >= bound)


_SOURCES = [f"sfx{match_bucket(n)}" for n in range(1, _BUCKETS[0] + 1)]  # by length, cached


def _source(length: int) -> str:
    return _SOURCES[min(length, _BUCKETS[0]) - 1]


@dataclass(frozen=True)
class SuffixRule:
    """How a match's length sets its branch: depth ``depth_factor * length + depth_offset``
    (at most ``max_depth``), weight ``length ** weight_power``; matches longer than
    ``max_match`` count as ``max_match``; only the ``max_candidates`` longest matches vote,
    and a node needs ``min_share`` of all the votes to be drafted. Only the latest
    ``max_scan`` occurrences of the last token are looked at, which bounds a step's work on
    repetitive text."""

    max_match: int = 32
    max_depth: int = 16
    depth_factor: float = 4.0
    depth_offset: int = 0
    weight_power: float = 2.0
    max_candidates: int = 32
    min_share: float = 0.05
    max_scan: int = 512

    def __post_init__(self) -> None:
        for name in ("max_match", "max_depth", "max_candidates", "max_scan"):
            check_int(name, getattr(self, name), 1)
        check_int("depth_offset", self.depth_offset, 0)
        for name in ("depth_factor", "weight_power"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
        if not 0 <= self.min_share <= 1:
            raise ValueError(f"min_share must be in [0, 1], got {self.min_share!r}")

    def depth(self, length: int) -> int:
        return min(self.max_depth, int(self.depth_factor * length) + self.depth_offset)

    def weight(self, length: int) -> float:
        return float(length) ** self.weight_power


class _Node:
    __slots__ = ("children", "longest", "order", "parent", "reach", "token", "weight")

    def __init__(self, token: int, parent: _Node | None, order: int, longest: int) -> None:
        self.token = token
        self.parent = parent
        self.order = order
        self.longest = longest  # the longest match among the candidates drafting this node
        self.children: dict[int, _Node] = {}
        self.weight = 0.0  # votes of the candidates drafting this node
        self.reach = 0.0  # votes of those that draft below it too


class SuffixDrafter:
    """Drafts from the call's own token ids (prompt, documents, then what it emitted).

    Sees token ids only; holds nothing shared, so `close` just lets go of its text.
    """

    def __init__(
        self, sequences: Sequence[Sequence[int]], min_match: int = 1, rule: SuffixRule | None = None
    ) -> None:
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be a positive integer, got {min_match!r}")
        self.rule = rule if rule is not None else SuffixRule()
        self.min_match = min_match
        self._text: list[int] = []
        self._where: dict[int, list[int]] = {}  # token -> its positions in _text
        for seq in sequences:
            self._append(as_tokens(seq))
            self._text.append(_SEPARATOR)

    def _append(self, tokens: Sequence[int]) -> None:
        text, where = self._text, self._where
        for token in tokens:
            positions = where.get(token)
            if positions is None:
                where[token] = [len(text)]
            else:
                positions.append(len(text))
            text.append(token)

    def matches(self, context: Sequence[int]) -> list[tuple[int, int]]:
        """(match length, position) of the longest-matching earlier occurrences of the context's
        last token, longest first (ties: latest first), at most ``rule.max_candidates``."""
        if not context:
            return []
        tail = as_tokens(context[-self.rule.max_match :])
        text, last = self._text, len(self._text) - 1
        found: list[tuple[int, int]] = []
        for pos in self._where.get(tail[-1], [])[-self.rule.max_scan :]:
            if pos == last or text[pos + 1] == _SEPARATOR:
                continue  # nothing follows it
            length = 1
            while length < len(tail) and pos >= length and text[pos - length] == tail[-1 - length]:
                length += 1
            if length >= self.min_match:
                found.append((length, pos))
        return heapq.nlargest(self.rule.max_candidates, found)

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        root = _Node(context[-1], None, 0, 0)
        if budget > 0:
            self._vote(root, self.matches(context))
        return StepDraft(self._select(root, budget))

    def _vote(self, root: _Node, found: list[tuple[int, int]]) -> None:
        # Longest matches vote first, so a node's first voter carries its longest match.
        rule, text, order = self.rule, self._text, 1
        for length, pos in found:
            weight, node = rule.weight(length), root
            root.weight += weight
            for token in text[pos + 1 : pos + 1 + rule.depth(length)]:
                if token == _SEPARATOR:
                    break
                node.reach += weight
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node(token, node, order, length)
                    order += 1
                child.weight += weight
                node = child

    def _select(self, root: _Node, budget: int) -> DraftTree:
        # Weights shrink down every path, so best-first by weight keeps the draft connected.
        floor = self.rule.min_share * root.weight
        heap = [(-c.weight, c.order, c) for c in root.children.values() if c.weight >= floor]
        heapq.heapify(heap)
        taken: list[_Node] = []
        index = {root: -1}
        while heap and len(taken) < budget:
            node = heapq.heappop(heap)[2]
            index[node] = len(taken)
            taken.append(node)
            for child in node.children.values():
                if child.weight >= floor:
                    heapq.heappush(heap, (-child.weight, child.order, child))
        tokens = [node.token for node in taken]
        parents = [index[node.parent] for node in taken]  # type: ignore[index]
        sources = [_source(node.longest) for node in taken]
        estimates = [node.weight / node.parent.reach for node in taken]  # type: ignore[union-attr]
        return DraftTree.from_draft(root.token, tokens, parents, sources, estimates)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        self._append(as_tokens(tokens))

    def close(self) -> None:
        self._text.clear()
        self._where.clear()
