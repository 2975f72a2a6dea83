"""SuffixDrafter's drafts against a straightforward reference: the whole vote tree built, every
earlier occurrence of the last token matched backwards from scratch (the first implementation,
kept here as the definition of what the drafter drafts)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting.suffix import SuffixDrafter, SuffixRule, match_bucket

SEPARATOR = -1


class _Node:
    __slots__ = ("children", "longest", "order", "parent", "reach", "token", "weight")

    def __init__(self, token: int, parent: _Node | None, order: int, longest: int) -> None:
        self.token = token
        self.parent = parent
        self.order = order
        self.longest = longest
        self.children: dict[int, _Node] = {}
        self.weight = 0.0
        self.reach = 0.0


class ReferenceSuffixDrafter:
    """The reference: text with separators, a scan of every occurrence, a vote tree of nodes."""

    def __init__(self, sequences: Sequence[Sequence[int]], min_match: int, rule: SuffixRule) -> None:
        self.rule, self.min_match = rule, min_match
        self.text: list[int] = []
        for seq in sequences:
            self.text += [*seq, SEPARATOR]

    def observe(self, tokens: Sequence[int]) -> None:
        self.text += tokens

    def matches(self, context: Sequence[int]) -> list[tuple[int, int]]:
        if not context:
            return []
        tail = list(context[-self.rule.max_match :])
        text, last = self.text, len(self.text) - 1
        occurrences = [pos for pos, token in enumerate(text) if token == tail[-1] and token != SEPARATOR]
        found = []
        for pos in occurrences[-self.rule.max_scan :]:
            if pos == last or text[pos + 1] == SEPARATOR:
                continue
            length = 1
            while length < len(tail) and pos >= length and text[pos - length] == tail[-1 - length]:
                length += 1
            if length >= self.min_match:
                found.append((length, pos))
        return heapq.nlargest(self.rule.max_candidates, found)

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        root = _Node(context[-1], None, 0, 0)
        if budget > 0:
            self._vote(root, self.matches(context))
        return self._select(root, budget)

    def _vote(self, root: _Node, found: list[tuple[int, int]]) -> None:
        rule, text, order = self.rule, self.text, 1
        for length, pos in found:
            weight, node = rule.weight(length), root
            root.weight += weight
            for token in text[pos + 1 : pos + 1 + rule.depth(length)]:
                if token == SEPARATOR:
                    break
                node.reach += weight
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node(token, node, order, length)
                    order += 1
                child.weight += weight
                node = child

    def _select(self, root: _Node, budget: int) -> DraftTree:
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
        return DraftTree.from_draft(
            root.token,
            [node.token for node in taken],
            [index[node.parent] for node in taken],  # type: ignore[index]
            [f"sfx{match_bucket(min(node.longest, 16))}" for node in taken],
            [node.weight / node.parent.reach for node in taken],  # type: ignore[union-attr]
        )


def same(tree: DraftTree, reference: DraftTree) -> bool:
    """Token, parent, source and estimate of every node, the estimates to the bit."""
    return (
        tree.tokens == reference.tokens
        and tree.parents == reference.parents
        and tree.sources == reference.sources
        and tree.estimates == reference.estimates
    )


# Few distinct tokens, so that matches are long, many and tied.
token_st = st.integers(0, 5)


@st.composite
def streams(draw: st.DrawFn) -> list[int]:
    """Fresh pieces, repeats of a shared piece and runs of one token, end to end."""
    base = draw(st.lists(token_st, max_size=40))
    piece = st.one_of(
        st.lists(token_st, max_size=6),
        st.just(base[: len(base) // 2]),
        st.just(base[len(base) // 3 :]),
        st.builds(lambda token, n: [token] * n, token_st, st.integers(1, 12)),
    )
    return [token for part in draw(st.lists(piece, max_size=8)) for token in part]


stream_st = streams()
rule_st = st.builds(
    SuffixRule,
    max_match=st.integers(1, 12),
    max_depth=st.integers(1, 20),
    depth_factor=st.sampled_from([0.0, 0.5, 1.0, 4.0]),
    depth_offset=st.integers(0, 3),
    weight_power=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0]),
    max_candidates=st.integers(1, 40),
    min_share=st.sampled_from([0.0, 0.05, 0.2, 1.0]),
    max_scan=st.integers(1, 60),
)
budget_st = st.one_of(st.integers(-1, 2), st.integers(3, 40))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(stream_st, min_size=1, max_size=4),
    # Other contexts may hold any int, the separator too: no text ever matches it.
    st.lists(st.tuples(stream_st, st.lists(st.integers(-1, 5), max_size=5)), min_size=1, max_size=4),
    st.integers(1, 4),
    rule_st,
    budget_st,
)
def test_drafts_equal_the_reference_as_the_text_grows(
    sequences: list[list[int]],
    steps: list[tuple[list[int], list[int]]],
    min_match: int,
    rule: SuffixRule,
    budget: int,
) -> None:
    drafter = SuffixDrafter(sequences, min_match, rule)
    reference = ReferenceSuffixDrafter(sequences, min_match, rule)
    context = list(sequences[0])
    for emitted, other in steps:
        drafter.observe(emitted)
        reference.observe(emitted)
        context += emitted
        # The call's own context, then one that is not the text's end (any context may be asked).
        for asked in (context, [*other, *context[-3:]], other):
            if not asked:
                continue
            assert drafter.matches(asked) == reference.matches(asked)
            assert same(drafter.propose(asked, budget).tree, reference.propose(asked, budget))


@settings(max_examples=100, deadline=None)
@given(st.lists(token_st, min_size=1, max_size=300), st.integers(1, 16), st.integers(0, 20))
def test_long_repetitive_text_with_the_default_rule(text: list[int], max_scan: int, budget: int) -> None:
    rule = SuffixRule(max_scan=max_scan)
    drafter = SuffixDrafter([text[:50]], 1, rule)
    reference = ReferenceSuffixDrafter([text[:50]], 1, rule)
    drafter.observe(text[50:])
    reference.observe(text[50:])
    for end in range(1, len(text) + 1, 7):
        context = text[:end]
        assert same(drafter.propose(context, budget).tree, reference.propose(context, budget))


def test_ties_between_equal_votes_follow_the_reference() -> None:
    # Equal matches with different continuations, then the same continuation from two places.
    texts = [[1, 2, 7, 8], [1, 2, 9, 8], [1, 2, 7, 6], [3, 2, 9, 8]]
    for budget in (1, 2, 3, 5, 16):
        for context in ([1, 2], [3, 2], [2], [5, 2]):
            drafter = SuffixDrafter(texts)
            reference = ReferenceSuffixDrafter(texts, 1, SuffixRule())
            assert same(drafter.propose(context, budget).tree, reference.propose(context, budget))
