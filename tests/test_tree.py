import pytest
import torch

from rag_lookahead.decoding.tree import DraftTree


def two_branch_tree() -> DraftTree:
    # root 10 -> 11 -> 12, and root 10 -> 13 -> 14 -> 15 ; pre-order
    return DraftTree((10, 11, 12, 13, 14, 15), (-1, 0, 1, 0, 3, 4), "trie")


def test_exact_ancestor_mask() -> None:
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 0, 0, 1, 0, 0],
            [1, 0, 0, 1, 1, 0],
            [1, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(two_branch_tree().ancestor_mask(), expected)


def test_exact_inputs_over_a_cache() -> None:
    tree = two_branch_tree()
    inputs = tree.inputs(past_length=3, device=torch.device("cpu"), dtype=torch.float32)
    assert inputs.input_ids.tolist() == [[10, 11, 12, 13, 14, 15]]
    assert inputs.position_ids.tolist() == [[3, 4, 5, 4, 5, 6]]
    mask = inputs.attention_mask
    assert mask.shape == (1, 1, 6, 9) and mask.dtype == torch.float32
    visible = mask[0, 0] == 0
    assert visible[:, :3].all()  # every node sees the whole cache
    assert torch.equal(visible[:, 3:], tree.ancestor_mask())
    assert (mask[0, 0][~visible] == torch.finfo(torch.float32).min).all()


def test_positions_equal_row_sums_minus_one() -> None:
    tree = two_branch_tree()
    assert list(tree.depths) == (tree.ancestor_mask().sum(-1) - 1).tolist()


def test_children_paths_and_from_draft() -> None:
    tree = DraftTree.from_draft(10, [11, 12, 13], [-1, 0, -1], "trie")
    assert tree.tokens == (10, 11, 12, 13) and tree.parents == (-1, 0, 1, 0)
    assert tree.child(0, 11) == 1 and tree.child(0, 13) == 3 and tree.child(0, 12) is None
    assert tree.path(2) == [0, 1, 2]
    assert DraftTree.from_draft(10, [], [], "trie").source == "none"
    assert len(DraftTree.root_only(5)) == 1


@pytest.mark.parametrize(
    "tokens, parents",
    [((), ()), ((1, 2), (-1, 5)), ((1, 2), (0, -1)), ((1, 2, 2), (-1, 0, 0)), ((1, 2), (-1,))],
)
def test_malformed_trees_are_rejected(tokens: tuple, parents: tuple) -> None:
    with pytest.raises(ValueError):
        DraftTree(tokens, parents)


def test_subtree_keeps_order_parents_and_estimates() -> None:
    tree = DraftTree((10, 11, 12, 13, 14, 15), (-1, 0, 1, 0, 3, 4), "trie", (1, 0.9, 0.5, 0.4, 0.3, 0.2))
    sub = tree.subtree([1, 3, 4])
    assert sub.tokens == (10, 11, 13, 14) and sub.parents == (-1, 0, 0, 2)
    assert sub.estimates == (1, 0.9, 0.4, 0.3) and sub.source == "trie"
    assert tree.subtree([]).source == "none" and len(tree.subtree([])) == 1
    with pytest.raises(ValueError, match="parent"):
        tree.subtree([2])


def test_side_rows_see_the_root_and_their_staircase_only() -> None:
    from rag_lookahead.decoding.tree import SideRows

    tree = DraftTree((10, 11), (-1, 0))
    side = SideRows((20, 21, 22), (1, 2, 2), ((0,), (0, 1), (0, 2)))
    inputs = tree.inputs(past_length=2, device=torch.device("cpu"), dtype=torch.float32, side=side)
    assert inputs.input_ids.tolist() == [[10, 11, 20, 21, 22]]
    assert inputs.position_ids.tolist() == [[2, 3, 3, 4, 4]]
    visible = (inputs.attention_mask[0, 0] == 0).int().tolist()
    assert visible == [
        # cache  root 11  20 21 22
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 0, 1, 1, 0],
        [1, 1, 1, 0, 1, 0, 1],
    ]


def test_merge_shares_prefixes_and_keeps_per_node_sources() -> None:
    trie = DraftTree((10, 11, 12), (-1, 0, 1), "trie", (1.0, 0.9, 0.8))
    pool = DraftTree((10, 11, 13, 14), (-1, 0, 1, 0), "jacobi", (1.0, 0.5, 0.5, 0.5))
    merged = trie.merge(pool)
    assert merged.tokens == (10, 11, 12, 13, 14) and merged.parents == (-1, 0, 1, 1, 0)
    assert merged.sources[1:] == ("trie", "trie", "jacobi", "jacobi")
    assert merged.estimates == (1.0, 0.9, 0.8, 0.5, 0.5)
    assert merged.source == "jacobi+trie" and trie.source == "trie"
    with pytest.raises(ValueError, match="root"):
        trie.merge(DraftTree.root_only(3))
