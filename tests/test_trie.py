"""Tests for rag_lookahead.drafting.trie.TokenTrie."""

from __future__ import annotations

import gc
import gzip
import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead.drafting import trie_nodes
from rag_lookahead.drafting.trie import OUTPUT_OWNER, Node, TokenTrie
from rag_lookahead.drafting.trie_nodes import RankedChildren, collector_paused, draft_candidates

Snapshot = dict[tuple[int, ...], dict[str, int]]

OWNERS = ["a", "b", "c", OUTPUT_OWNER]
tokens_st = st.lists(st.integers(0, 5), max_size=30)
inserts_st = st.lists(st.tuples(st.sampled_from(OWNERS), tokens_st), max_size=6)
FAST = settings(max_examples=60, deadline=None)


def snapshot(trie: TokenTrie) -> Snapshot:
    """Every node as path -> counts."""
    out: Snapshot = {}
    stack: list[tuple[tuple[int, ...], Node]] = [((t,), n) for t, n in trie.root.children.items()]
    while stack:
        path, node = stack.pop()
        out[path] = dict(node.counts)
        stack.extend(((*path, t), child) for t, child in node.children.items())
    return out


def check_invariants(trie: TokenTrie) -> None:
    snap = snapshot(trie)
    assert len(snap) == len(trie)
    for path, counts in snap.items():
        assert counts and all(c >= 1 for c in counts.values())
        if len(path) > 1:
            parent = snap[path[:-1]]
            assert all(c <= parent.get(owner, 0) for owner, c in counts.items()), path
        assert len(path) <= trie.ngram_length
    owners = {owner for counts in snap.values() for owner in counts}
    assert trie.owners() == owners
    for owner in owners:
        assert trie.count_owned(owner) == sum(owner in c for c in snap.values())


def build(inserts: list[tuple[str, list[int]]], **kwargs: int) -> TokenTrie:
    trie = TokenTrie(**kwargs)
    for owner, toks in inserts:
        trie.insert(toks, owner)
    return trie


def visible_subtree(
    trie: TokenTrie, anchor: tuple[int, ...], owner: str | None
) -> list[tuple[tuple[int, ...], Node]]:
    """All visible nodes under ``anchor`` (which must exist) within branch_length, with paths."""
    node = trie.root
    for tok in anchor:
        node = node.children[tok]
    out: list[tuple[tuple[int, ...], Node]] = []
    stack = [(anchor, node)]
    while stack:
        path, node = stack.pop()
        if len(path) - len(anchor) == trie.branch_length:
            continue
        for tok, child in node.children.items():
            if owner in child.counts or OUTPUT_OWNER in child.counts:
                out.append(((*path, tok), child))
                stack.append(((*path, tok), child))
    return out


def visible_walk(trie: TokenTrie, path: tuple[int, ...], owner: str | None) -> Node | None:
    """The node at ``path`` if every step is visible to ``owner``."""
    node = trie.root
    for tok in path:
        child = node.children.get(tok)
        if child is None or not (owner in child.counts or OUTPUT_OWNER in child.counts):
            return None
        node = child
    return node


# ---- construction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_query_length": 0},
        {"branch_length": -1},
        {"max_nodes": 10},
        {"branch_length": 2.0},
        {"max_nodes": True},
    ],
)
def test_constructor_validates(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TokenTrie(**kwargs)  # type: ignore[arg-type]


# ---- insertion ----------------------------------------------------------------------------


def test_insert_counts_hand_example() -> None:
    trie = build([("q", [1, 2, 3, 1, 2, 4])], max_query_length=1, branch_length=2)
    expected = {
        (1,): 2, (1, 2): 2, (1, 2, 3): 1, (1, 2, 4): 1,
        (2,): 2, (2, 3): 1, (2, 3, 1): 1, (2, 4): 1,
        (3,): 1, (3, 1): 1, (3, 1, 2): 1,
        (4,): 1,
    }  # fmt: skip
    assert snapshot(trie) == {path: {"q": c} for path, c in expected.items()}
    assert len(trie) == 12 and trie.count_owned("q") == 12
    assert trie.counts_at([1, 2]) == {"q": 2} and trie.counts_at([9]) == {}


@FAST
@given(inserts_st)
def test_counts_monotone_and_owner_sets_consistent(inserts: list[tuple[str, list[int]]]) -> None:
    check_invariants(build(inserts, max_query_length=1, branch_length=3))


@FAST
@given(tokens_st, st.lists(st.integers(1, 7), max_size=10), inserts_st)
def test_stream_equals_insert(
    toks: list[int], chunks: list[int], others: list[tuple[str, list[int]]]
) -> None:
    streamed = build(others, max_query_length=1, branch_length=3)
    stream = streamed.insert_cursor()
    rest = list(toks)
    for size in [*chunks, len(rest)]:
        stream.extend(rest[:size])
        rest = rest[size:]
    inserted = build([*others, (OUTPUT_OWNER, toks)], max_query_length=1, branch_length=3)
    assert snapshot(streamed) == snapshot(inserted)
    check_invariants(streamed)


@FAST
@given(tokens_st, st.lists(st.integers(1, 7), max_size=10), inserts_st)
def test_an_insert_in_parts_equals_one_insert(
    toks: list[int], parts: list[int], others: list[tuple[str, list[int]]]
) -> None:
    """A long text inserted a part at a time (each part with the n-grams' ends past it, as the
    model's thread takes it in between steps) counts what one insert of it counts."""
    parted = build(others, max_query_length=1, branch_length=3)
    width, start = parted.ngram_length, 0
    for size in [*parts, len(toks)]:
        parted.insert(toks[start : start + size + width - 1], "a", starts=size)
        start = min(start + size, len(toks))
    whole = build([*others, ("a", toks)], max_query_length=1, branch_length=3)
    assert snapshot(parted) == snapshot(whole)
    check_invariants(parted)
    with pytest.raises(ValueError, match="starts"):
        parted.insert(toks, "a", starts=-1)


def test_stream_tokens_visible_immediately() -> None:
    trie = TokenTrie(max_query_length=2, branch_length=4)
    stream = trie.insert_cursor()
    stream.extend([7, 8])
    assert trie.draft([7], None, 5)[0] == [8]
    stream.extend([9])
    assert trie.draft([7, 8], None, 5)[:3] == ([9], [-1], 2)


# ---- elimination --------------------------------------------------------------------------


@FAST
@given(inserts_st, st.sampled_from(OWNERS))
def test_eliminate_matches_trie_without_owner(inserts: list[tuple[str, list[int]]], victim: str) -> None:
    trie = build(inserts, max_query_length=1, branch_length=3)
    before = len(trie)
    removed = trie.eliminate(victim)
    without = build([(o, t) for o, t in inserts if o != victim], max_query_length=1, branch_length=3)
    assert snapshot(trie) == snapshot(without)
    assert removed == before - len(trie)
    assert victim not in trie.owners() and trie.count_owned(victim) == 0
    check_invariants(trie)


def test_bad_tokens_and_owners_rejected() -> None:
    trie = TokenTrie()
    with pytest.raises(TypeError):
        trie.insert([1.0, 2.0], "a")  # type: ignore[list-item]
    for owner in ("", None):
        with pytest.raises(ValueError):
            trie.insert([1], owner)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        trie.draft([1], "a", -1)


def test_inserting_leaves_the_garbage_collector_as_it_was() -> None:
    # Bulk inserts pause the collector (speed); its state afterwards must be the caller's.
    trie = TokenTrie()
    assert gc.isenabled()
    trie.insert(list(range(50)), "a")
    assert gc.isenabled()
    gc.disable()
    try:
        trie.insert(list(range(50)), "b")
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("failed midway")
    assert gc.isenabled()
    assert trie.counts_at([0, 1]) == {"a": 1, "b": 1}


def test_eliminate_unknown_owner_is_noop() -> None:
    trie = build([("a", [1, 2, 3])])
    assert trie.eliminate("zzz") == 0 and len(trie) == 6


def test_stream_after_eliminating_its_owner_stays_consistent() -> None:
    trie = build([("a", [1, 2, 3, 4])], max_query_length=1, branch_length=3)
    stream = trie.insert_cursor()
    stream.extend([1, 2])
    trie.eliminate(OUTPUT_OWNER)
    stream.extend([3, 4, 5])
    check_invariants(trie)
    assert trie.counts_at([3, 4, 5]) == {OUTPUT_OWNER: 1}


# ---- drafting -----------------------------------------------------------------------------


def test_draft_visibility_excludes_other_queries() -> None:
    trie = build([("A", [1, 2, 3]), ("B", [1, 2, 9]), ("B", [5, 6])])
    tokens, _, match, *_ = trie.draft([1, 2], "A", 10)
    assert tokens == [3] and match == 2
    assert trie.draft([5], "A", 10)[:3] == ([], [], 0)
    assert trie.draft([1, 2], None, 10)[:3] == ([], [], 0)
    assert trie.draft([1, 2], "C", 10)[:3] == ([], [], 0)


def test_draft_longest_suffix_with_fallback() -> None:
    trie = build([("A", [5, 1, 2, 3]), ("A", [7, 2, 8]), ("A", [4, 1])], max_query_length=2, branch_length=3)
    assert trie.draft([9, 1, 2], "A", 1)[:3] == ([3], [-1], 2)
    tokens, _, match, *_ = trie.draft([6, 2], "A", 5)  # (6, 2) is unknown -> fall back to (2,)
    assert match == 1 and sorted(tokens) == [3, 8]
    assert trie.draft([6, 2], "A", 5, min_match=2)[:3] == ([], [], 0)
    assert trie.draft([9, 1, 2], "A", 1, min_match=3)[:3] == ([], [], 0)  # longer than max_query_length
    # (4, 1) exists but has no continuation: fall back to (1,), which does.
    assert trie.draft([4, 1], "A", 1)[:3] == ([2], [-1], 1)
    assert trie.draft([], "A", 3)[:3] == ([], [], 0)
    assert trie.draft([1, 2], "A", 0)[:3] == ([], [], 0)


def test_draft_respects_lengths() -> None:
    trie = build([("A", list(range(100)))], max_query_length=2, branch_length=3)
    assert trie.draft([0], "A", 10)[:3] == ([1, 2, 3], [-1, 0, 1], 1)
    assert trie.draft([0, 1], "A", 10)[:3] == ([2, 3, 4], [-1, 0, 1], 2)
    assert trie.draft([0, 1], "A", 2)[:3] == ([2, 3], [-1, 0], 2)


def test_draft_preorder_best_first() -> None:
    inserts = [("A", [1, 2, 3]), ("A", [1, 2, 3]), ("A", [1, 2, 4]), ("A", [1, 5])]
    trie = build(inserts, max_query_length=1, branch_length=3)
    assert trie.draft([1], "A", 10)[:3] == ([2, 3, 4, 5], [-1, 0, 0, -1], 1)
    assert trie.draft([1], "A", 2)[:3] == ([2, 3], [-1, 0], 1)
    assert trie.draft([1], "A", 3)[:3] == ([2, 3, 4], [-1, 0, 0], 1)


def test_draft_ranks_query_counts_before_output_counts() -> None:
    trie = build([("A", [1, 2])] + [(OUTPUT_OWNER, [1, 3])] * 5, max_query_length=1, branch_length=2)
    assert trie.draft([1], "A", 1)[:3] == ([2], [-1], 1)
    assert trie.draft([1], "A", 2)[:3] == ([2, 3], [-1, -1], 1)
    assert trie.draft([1], None, 2)[:3] == ([3], [-1], 1)


@FAST
@given(
    inserts_st,
    st.lists(st.integers(0, 5), max_size=4),
    st.sampled_from(["a", "b", None]),
    st.integers(1, 12),
)
def test_draft_is_top_k_in_preorder(
    inserts: list[tuple[str, list[int]]], context: list[int], owner: str | None, length: int
) -> None:
    trie = build(inserts, max_query_length=2, branch_length=3)
    tokens, parents, match, *_ = trie.draft(context, owner, length)
    assert len(tokens) == len(parents) <= length
    assert (match == 0) == (not tokens)
    if not tokens:
        return
    anchor = tuple(context[len(context) - match :])
    paths: list[tuple[int, ...]] = []
    for i, (tok, parent) in enumerate(zip(tokens, parents, strict=True)):
        assert -1 <= parent < i
        paths.append((anchor if parent == -1 else paths[parent]) + (tok,))
    for j, path in enumerate(paths):  # pre-order: each subtree is the contiguous block after its root
        below = [i for i, other in enumerate(paths) if len(other) > len(path) and other[: len(path)] == path]
        assert below == list(range(j + 1, j + 1 + len(below)))

    def key(node: Node) -> tuple[int, int, int]:
        return (-node.counts.get(owner or "", 0), -node.counts.get(OUTPUT_OWNER, 0), node.order)

    ranked = sorted(visible_subtree(trie, anchor, owner), key=lambda item: key(item[1]))
    assert set(paths) == {path for path, _ in ranked[:length]}
    nodes = dict(ranked)
    for i in range(len(tokens)):  # siblings listed best first
        sibs = [key(nodes[paths[j]]) for j in range(len(tokens)) if parents[j] == parents[i]]
        assert sibs == sorted(sibs)
    for longer in range(match + 1, min(len(context), trie.max_query_length) + 1):  # longest usable match
        suffix = tuple(context[len(context) - longer :])
        assert visible_walk(trie, suffix, owner) is None or not visible_subtree(trie, suffix, owner)


# ---- pruning ------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OWNERS), st.lists(st.integers(0, 40), min_size=100, max_size=600)),
        min_size=1,
        max_size=5,
    )
)
def test_node_cap_never_exceeded(inserts: list[tuple[str, list[int]]]) -> None:
    trie = TokenTrie(max_query_length=2, branch_length=6, max_nodes=1000)
    streams = {owner: trie.insert_cursor(owner) for owner in OWNERS}
    for owner, toks in inserts:
        trie.insert(toks, owner)
        assert len(trie) <= 1000
        for chunk in range(0, 300, 7):  # streams must survive their open nodes being pruned
            streams[owner].extend(toks[chunk : chunk + 7])
            assert len(trie) <= 1000
        check_invariants(trie)
    for owner in list(trie.owners()):
        trie.eliminate(owner)
        check_invariants(trie)
    assert len(trie) == 0 and trie.owners() == set()


def _streamed_sizes(trie: TokenTrie, owner: str, tokens: list[int]) -> list[int]:
    """The trie's size after each token a cursor adds, invariants checked along the way."""
    cursor, sizes = trie.insert_cursor(owner), []
    for token in tokens:
        cursor.extend([token])
        sizes.append(len(trie))
        assert len(trie) <= trie.max_nodes
    return sizes


def test_a_prune_advances_with_the_tries_growth_a_slice_at_a_time() -> None:
    """A stream that grows a trie past 7/8 of its cap is pruned a slice per token, never all
    at once: no token's step removes more than a few hundred nodes (a whole prune would take
    thousands), and the trie ends below the cap with its invariants whole."""
    rng = random.Random(5)
    trie = TokenTrie(max_query_length=2, branch_length=6, max_nodes=20_000)
    sizes = _streamed_sizes(trie, OUTPUT_OWNER, [rng.randrange(3000) for _ in range(6000)])
    drops = [before - after for before, after in itertools.pairwise(sizes)]
    assert max(drops) > 0  # it pruned
    assert max(drops) < 1_000
    check_invariants(trie)
    assert trie.prune(target=len(trie)) == 0  # a prune called by name: now, and nothing to do


def test_owners_eliminated_while_a_prune_is_under_way_leave_the_trie_whole() -> None:
    rng = random.Random(6)
    trie = TokenTrie(max_query_length=2, branch_length=6, max_nodes=20_000)
    trie.insert([rng.randrange(3000) for _ in range(2000)], "a")
    _streamed_sizes(trie, "b", [rng.randrange(3000) for _ in range(2200)])  # past 7/8: pruning
    trie.eliminate("a")
    check_invariants(trie)
    _streamed_sizes(trie, "b", [rng.randrange(3000) for _ in range(2000)])
    check_invariants(trie)
    assert trie.owners() == {"b"}


def test_prune_removes_output_only_nodes_first_and_decays() -> None:
    trie = TokenTrie(max_query_length=1, branch_length=2)
    trie.insert([1, 2, 3], "q")
    trie.insert([1, 2, 3, 4] * 3, OUTPUT_OWNER)
    before = snapshot(trie)
    query_nodes = trie.count_owned("q")
    removed = trie.prune(target=query_nodes)
    assert removed == len(before) - query_nodes == len(before) - len(trie)
    after = snapshot(trie)
    assert all("q" in counts for counts in after.values())
    for path, counts in after.items():
        old = before[path]
        assert counts.get("q") == old["q"]
        decayed = (old[OUTPUT_OWNER] + 1) // 2 if OUTPUT_OWNER in old else None
        assert counts.get(OUTPUT_OWNER) == decayed
    check_invariants(trie)
    assert trie.prune(target=len(trie)) == 0


def test_prune_removes_least_frequent_deepest_first() -> None:
    inserts = [(OUTPUT_OWNER, [1, 2, 3])] * 2 + [(OUTPUT_OWNER, [4, 5])]
    trie = build(inserts, max_query_length=1, branch_length=2)
    assert trie.prune(target=len(trie) - 1) == 1
    # (4,), (5,) and (4, 5) have the lowest count; the deepest goes first.
    assert trie.counts_at([4, 5]) == {} and trie.counts_at([4]) == {OUTPUT_OWNER: 1}
    assert trie.counts_at([1, 2, 3]) == {OUTPUT_OWNER: 1}  # decayed from 2


def test_default_prune_target_and_validation() -> None:
    trie = build([("a", list(range(1000)))], max_query_length=1, branch_length=1, max_nodes=1000)
    assert len(trie) <= 1000
    trie.prune()
    assert len(trie) <= 750
    with pytest.raises(ValueError):
        trie.prune(-1)


# ---- persistence --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trie.json", "trie.json.gz"])
def test_save_load_round_trip(tmp_path: Path, name: str) -> None:
    trie = build([("a", [1, 2, 3, 1, 2, 4] * 3), ("b", [2, 2, 5]), (OUTPUT_OWNER, [1, 2, 9, 1, 2, 9])])
    path = tmp_path / name
    trie.save(path)
    loaded = TokenTrie.load(path)
    assert snapshot(loaded) == snapshot(trie)
    assert (loaded.max_query_length, loaded.branch_length, loaded.max_nodes) == (2, 12, 200_000)
    for owner in ("a", "b", OUTPUT_OWNER):
        assert loaded.count_owned(owner) == trie.count_owned(owner)
        assert loaded.draft([1, 2], owner, 8) == trie.draft([1, 2], owner, 8)
    assert loaded.eliminate("a") == trie.eliminate("a")
    check_invariants(loaded)
    if name.endswith(".gz"):
        with gzip.open(path) as file:
            assert file.read(1) == b"{"


def good_payload(tmp_path: Path) -> dict[str, object]:
    build([("a", [1, 2, 3])]).save(tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(version=2),
        lambda p: p.pop("version"),
        lambda p: p.update(format="other"),
        lambda p: p.update(max_nodes=5),
        lambda p: p.update(nodes={}),
        lambda p: p["nodes"].append([4, 7, {"a": 1}]),  # parent index not before the node
        lambda p: p["nodes"].append([1, -1, {"a": 1}]),  # duplicate child
        lambda p: p["nodes"].append([9, 0, {"a": 5}]),  # count above parent's
        lambda p: p["nodes"].append([9, 0, {}]),
        lambda p: p["nodes"].append(["x", 0, {"a": 1}]),
    ],
)
def test_load_rejects_bad_payload(tmp_path: Path, mutate: object) -> None:
    payload = good_payload(tmp_path)
    mutate(payload)  # type: ignore[operator]
    (tmp_path / "bad.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError):
        TokenTrie.load(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "name, data", [("x.json", b"not json{"), ("x.json.gz", b"plain"), ("x.json", b"[1]")]
)
def test_load_rejects_garbage(tmp_path: Path, name: str, data: bytes) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError):
        TokenTrie.load(tmp_path / name)


def test_draft_estimates_are_conditional_frequencies() -> None:
    trie = TokenTrie(max_query_length=1, branch_length=4)
    for seq in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        trie.insert(seq, "A")
    draft = trie.draft([1], "A", 10)
    assert draft.tokens == [2, 3, 4] and draft.parents == [-1, 0, 0]
    assert draft.estimates == [1.0, 2 / 3, 1 / 3]
    trie.insert([1, 2, 5], OUTPUT_OWNER)
    assert trie.draft([1], "A", 10).owned == [True, True, True, False]


# ---- wide nodes: drafts read a ranked few of their children -------------------------------


@settings(max_examples=200, deadline=None)
@given(st.randoms(use_true_random=False), st.booleans(), st.integers(1, 12))
def test_ranked_children_draft_exactly_as_reading_every_child(
    rng: random.Random, resort: bool, budget: int
) -> None:
    """Every node counts as wide, so drafts read through `RankedChildren` (sorted again as the
    rule says, or never: kept up to date only by the counts the trie reports to it), between
    inserts, streamed outputs, eliminations and prunes."""
    trie = TokenTrie(max_query_length=2, branch_length=3, max_nodes=1000)
    cursor = trie.insert_cursor()
    with pytest.MonkeyPatch.context() as patch:
        if not resort:
            patch.setattr(RankedChildren, "stale", lambda self, width: False)
        for _ in range(80):
            tokens = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
            op = rng.choice(["insert", "extend", "draft", "draft", "draft", "eliminate", "prune"])
            if op == "insert":
                trie.insert(tokens, rng.choice(OWNERS))
            elif op == "extend":
                cursor.extend(tokens)
            elif op == "eliminate":
                trie.eliminate(rng.choice(OWNERS))
            elif op == "prune" and rng.random() < 0.3:
                trie.prune(len(trie) // 2)
            elif op == "draft":
                owner = rng.choice(["a", "b", None])
                patch.setattr(trie_nodes, "WIDE_NODE", 10**9)
                every_child = trie.draft(tokens[:2], owner, budget)
                patch.setattr(trie_nodes, "WIDE_NODE", 0)
                assert trie.draft(tokens[:2], owner, budget) == every_child
    check_invariants(trie)


def test_a_wide_node_drafts_from_a_few_of_its_children() -> None:
    """A node with thousands of children: a draft reads its budget of them plus the children
    whose counts changed since, not all of them (the count the scan would otherwise grow by)."""
    trie = TokenTrie(max_query_length=1, branch_length=1, max_nodes=10_000)
    for token in range(2000):
        trie.insert([7, 10_000 + token] * (1 + token % 5), OUTPUT_OWNER)
    wide = trie.root.children[7]
    assert len(wide.children) == 2000
    first = trie.draft([7], None, 4)
    assert len(draft_candidates(wide, 4)) == 4
    trie.insert([7, 10_001, 7, 10_002], OUTPUT_OWNER)  # two children gain a count
    trie.insert([7, 10_003], "q")  # a query owner's child
    assert len(draft_candidates(wide, 4)) <= 4 + 3
    assert trie.draft([7], None, 4).tokens[:1] == first.tokens[:1]
    assert trie.draft([7], "q", 4).tokens[0] == 10_003  # the query's own count ranks first


def test_ranked_children_are_sorted_again_after_counts_decay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Halving output counts makes ties, which creation order breaks: a ranking kept from
    before would list the once more frequent child first."""
    monkeypatch.setattr(trie_nodes, "WIDE_NODE", 0)
    trie = TokenTrie(max_query_length=1, branch_length=1)
    for tokens, times in (([5, 1], 3), ([5, 2], 4), ([9], 1)):
        for _ in range(times):
            trie.insert(tokens, OUTPUT_OWNER)
    assert trie.draft([5], None, 1).tokens == [2]
    assert trie.prune(len(trie) - 1) == 1  # removes [9], then halves: [5, 1] and [5, 2] both 2
    assert trie.draft([5], None, 1).tokens == [1]
