"""Tests for rag_lookahead.drafting.suffix: drafts whose depth and weight follow the match length."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting.compose import DrafterBuild, build_drafter
from rag_lookahead.drafting.suffix import SuffixDrafter, SuffixRule, match_bucket
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter

FAST = settings(max_examples=80, deadline=None)


def paths(tree: DraftTree) -> list[list[int]]:
    """Every root-to-node path's tokens, the root's own excluded."""
    out = []
    for node in range(1, len(tree)):
        path = []
        while node > 0:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        out.append(path[::-1])
    return out


def chain(tree: DraftTree) -> list[int]:
    """The tokens of a draft that is one chain."""
    assert list(tree.parents) == list(range(-1, len(tree) - 1))
    return list(tree.tokens[1:])


def test_long_match_drafts_a_deep_chain() -> None:
    text = list(range(100, 140))
    drafter = SuffixDrafter([text], rule=SuffixRule(depth_factor=1.0, depth_offset=1, max_depth=16))
    tree = drafter.propose([7, *text[:8]], budget=30).tree
    assert chain(tree) == text[8:17]  # match of 8 tokens: 1 * 8 + 1 deep
    assert set(tree.sources[1:]) == {"sfx8"}
    assert all(e == 1.0 for e in tree.estimates)


def test_depth_grows_with_match_length() -> None:
    text = list(range(100, 140))
    drafter = SuffixDrafter([text], rule=SuffixRule(depth_factor=2.0, depth_offset=0, max_depth=40))
    depths = [len(drafter.propose([7, *text[:n]], budget=40).tree) - 1 for n in (1, 2, 3, 5)]
    assert depths == [2, 4, 6, 10]


def test_longer_match_outweighs_more_frequent_short_ones() -> None:
    # "1 2 3 -> 4" once, "9 3 -> 5" three times: the context "1 2 3" matches the first for 3 tokens.
    texts = [[1, 2, 3, 4], [9, 3, 5], [9, 3, 5], [9, 3, 5]]
    tree = SuffixDrafter(texts).propose([1, 2, 3], budget=1).tree
    assert tree.tokens[1:] == (4,)
    both = SuffixDrafter(texts).propose([1, 2, 3], budget=2).tree
    assert set(both.tokens[1:]) == {4, 5}
    assert both.tokens[1] == 4  # best first
    assert both.estimates[1] > both.estimates[2]  # 3**2 against 3 * 1**2 votes


def test_frequency_breaks_equal_matches() -> None:
    texts = [[1, 2, 8], [1, 2, 9], [1, 2, 9]]
    tree = SuffixDrafter(texts).propose([1, 2], budget=2).tree
    assert tree.tokens[1:] == (9, 8)
    assert tree.estimates[1:] == pytest.approx((2 / 3, 1 / 3))


def test_no_match_or_branch_crosses_a_text_boundary() -> None:
    drafter = SuffixDrafter([[1, 2, 3], [4, 5, 6]])
    assert len(drafter.propose([3], budget=5).tree) == 1  # 3 ends a text: nothing follows it
    assert drafter.matches([3, 4]) == [(1, 4)]  # "3 | 4" is not a 2-token match
    assert chain(drafter.propose([2], budget=5).tree) == [3]


def test_output_is_drafted_from_as_it_is_observed() -> None:
    drafter = SuffixDrafter([[1, 2, 3]])
    drafter.observe([7, 8, 9, 7])
    assert chain(drafter.propose([1, 2, 3, 7, 8, 9, 7], budget=2).tree) == [8, 9]
    drafter.close()
    assert len(drafter.propose([1, 2], budget=2).tree) == 1


def test_min_match_and_min_share() -> None:
    assert len(SuffixDrafter([[5, 1, 2]], min_match=2).propose([9, 1], budget=4).tree) == 1
    assert chain(SuffixDrafter([[5, 1, 2]], min_match=2).propose([5, 1], budget=4).tree) == [2]
    # 1 vote of 4**2 = 16 against one of 1: under a 10% share the short match's branch goes.
    texts = [[1, 2, 3, 4, 5], [4, 6]]
    rule = SuffixRule(min_share=0.1)
    assert set(SuffixDrafter(texts, rule=rule).propose([1, 2, 3, 4], budget=8).tree.tokens[1:]) == {5}


def test_a_long_run_of_one_token_is_scanned_only_at_its_end() -> None:
    run = [3] * 5000
    drafter = SuffixDrafter([run], rule=SuffixRule(max_scan=16, max_candidates=4))
    found = drafter.matches([3] * 40)
    assert [pos for _, pos in found] == [4998, 4997, 4996, 4995]  # the run's last token has no follower
    assert chain(drafter.propose([3] * 40, budget=16).tree) == [3] * 4  # up to the run's end


def test_empty_context_and_budget() -> None:
    drafter = SuffixDrafter([[1, 2, 3]])
    assert len(drafter.propose([1], budget=0).tree) == 1
    assert drafter.matches([]) == []
    with pytest.raises(IndexError):
        drafter.propose([], budget=4)  # a draft hangs off the context's last token


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_match": 0},
        {"max_depth": 0},
        {"max_candidates": True},
        {"depth_offset": -1},
        {"depth_factor": -1.0},
        {"weight_power": float("nan")},
        {"depth_factor": float("inf")},
        {"depth_factor": "4"},
        {"min_share": 1.5},
        {"max_scan": 0},
    ],
)
def test_rule_validates(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SuffixRule(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("min_match", [0, True, 1.5])
def test_min_match_validates(min_match: object) -> None:
    with pytest.raises(ValueError):
        SuffixDrafter([[1]], min_match=min_match)  # type: ignore[arg-type]


def test_buckets() -> None:
    assert [match_bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 99)] == [1, 2, 3, 4, 4, 8, 8, 16, 16]


texts_st = st.lists(st.lists(st.integers(0, 4), max_size=25), min_size=1, max_size=4)


@FAST
@given(texts_st, st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(0, 20))
def test_every_branch_continues_an_occurrence_of_the_context(
    texts: list[list[int]], context: list[int], budget: int
) -> None:
    drafter = SuffixDrafter(texts)
    tree = drafter.propose(context, budget).tree
    assert len(tree) - 1 <= budget
    assert tree.tokens[0] == context[-1]
    for path in paths(tree):
        wanted = [context[-1], *path]
        assert any(text[i : i + len(wanted)] == wanted for text in texts for i in range(len(text))), (
            path,
            texts,
        )
    assert all(0 < e <= 1 for e in tree.estimates)


@FAST
@given(texts_st, st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(1, 20))
def test_draft_is_connected_best_first(texts: list[list[int]], context: list[int], budget: int) -> None:
    tree = SuffixDrafter(texts).propose(context, budget).tree
    # Any prefix of the nodes is a tree (parents first), which DraftTree itself checks.
    for size in range(1, len(tree)):
        tree.subtree(range(1, size))


def test_config_policy_composes_the_suffix_drafter_first() -> None:
    with pytest.raises(ValueError, match="draft_policy"):
        LookaheadConfig(draft_policy="magic")  # type: ignore[arg-type]
    trie = TokenTrie()
    drafter = build_drafter(LookaheadConfig(mode="trie", draft_policy="suffix"), trie, [[1, 2, 3, 4]])
    assert [type(d) for d in drafter.drafters] == [SuffixDrafter, TrieDrafter]
    tree = drafter.propose([1, 2], budget=4).tree
    assert chain(tree)[:2] == [3, 4] and tree.sources[1].startswith("sfx")
    drafter.close()
    assert len(trie) == 0


class Shared:
    """A `DocumentScope`'s documents, as `build_drafter` sees them."""

    owner = "scope-1"
    sequences = ([40, 41, 42, 43],)


def test_shared_documents_are_drafted_from_too() -> None:
    trie = TokenTrie()
    drafter = build_drafter(LookaheadConfig(mode="trie"), trie, [[1, 2]], Shared())
    tree = drafter.propose([1, 2, 40, 41], budget=4).tree
    assert chain(tree) == [42, 43] and set(tree.sources[1:]) == {"sfx2"}
    drafter.close()


# (case, the drafters' config): each builds the same drafter however its texts are sliced
SLICED_BUILD_CASES: list[tuple[str, LookaheadConfig]] = [
    ("the call's text, then the trie", LookaheadConfig(mode="trie", draft_policy="suffix")),
    ("the trie alone", LookaheadConfig(mode="trie", draft_policy="trie")),
    ("auto: with the Jacobi pool", LookaheadConfig(mode="auto")),
    ("the Jacobi pool alone", LookaheadConfig(mode="jacobi")),
]


@pytest.mark.parametrize(("case", "config"), SLICED_BUILD_CASES, ids=[c[0] for c in SLICED_BUILD_CASES])
@FAST
@given(
    texts=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=40), min_size=1, max_size=4),
    budgets=st.lists(st.integers(1, 60), max_size=30),
    shared=st.booleans(),
    prediction=st.lists(st.integers(0, 9), max_size=10),
)
def test_a_drafter_built_in_slices_is_the_one_built_at_once(
    case: str,
    config: LookaheadConfig,
    texts: list[list[int]],
    budgets: list[int],
    shared: bool,
    prediction: list[int],
) -> None:
    """Taken in a slice at a time (as the model's thread takes a call's long texts in between
    steps), every slice some of it, the texts make the drafter they make at once: its drafts
    are the same, wherever the slices ended."""
    scope = Shared() if shared else None
    whole = build_drafter(config, TokenTrie(), texts, scope, prediction)
    build = DrafterBuild(config, TokenTrie(), texts, scope, prediction)
    for budget in budgets:
        if not build.left:
            break
        left = build.left
        assert build.advance(budget) > 0 and build.left < left
    sliced = build.drafter()
    assert build.left == 0
    for context in [text[:end] for text in texts for end in range(1, len(text) + 1)]:
        a, b = whole.propose(context, 8), sliced.propose(context, 8)
        assert (a.tree.tokens, a.tree.parents, a.tree.sources, a.side) == (
            b.tree.tokens,
            b.tree.parents,
            b.tree.sources,
            b.side,
        )


def test_a_build_let_go_before_its_drafter_leaves_nothing_in_the_trie() -> None:
    """A call that ends while its texts go in (its client left) takes its branches with it; a
    scope's stay, the scope's own."""
    trie = TokenTrie()
    build = DrafterBuild(LookaheadConfig(mode="trie"), trie, [[1, 2, 3, 4, 5, 6, 7, 8]])
    build.advance(1)
    assert trie.owners() == {build.owner}
    build.close()
    build.close()  # idempotent
    assert not trie.owners()
    scoped = DrafterBuild(LookaheadConfig(mode="trie"), trie, [[1, 2, 3]], Shared())
    scoped.advance(1)
    scoped.close()
    assert trie.owners() == {Shared.owner}
