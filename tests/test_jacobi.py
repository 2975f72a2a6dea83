"""The Jacobi window and n-gram pool (pure bookkeeping; losslessness is in test_lossless)."""

import pytest
import torch

from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting.jacobi import JacobiDrafter, JacobiWindow, NGramPool, WindowLayout


def test_pool_keeps_at_most_g_newest_per_key() -> None:
    pool = NGramPool(ngram_size=3, guess_set_size=2)
    for ngram in ([1, 2, 3], [1, 4, 5], [1, 6, 7], [9, 9, 9]):
        pool.add(ngram)
    assert pool.candidates(1) == [(6, 7), (4, 5)]
    pool.add([1, 4, 5])  # a repeat becomes the newest
    assert pool.candidates(1) == [(4, 5), (6, 7)]
    assert pool.candidates(2) == [] and len(pool) == 3
    with pytest.raises(ValueError):
        pool.add([1, 2])


def test_pool_collects_every_ngram_of_a_sequence() -> None:
    pool = NGramPool(ngram_size=2, guess_set_size=5)
    pool.add_sequence([5, 6, 5, 7])
    assert pool.candidates(5) == [(7,), (6,)] and pool.candidates(6) == [(5,)]


def test_window_layout_is_the_staircase() -> None:
    layout = WindowLayout(window_size=3, levels=3)  # N = 4
    # rows: level 0 cols 0-2, level 1 cols 0-2, level 2 cols 0-2
    assert layout.offsets == (1, 2, 3, 2, 3, 4, 3, 4, 5)
    assert layout.visible[0] == (0,)
    assert layout.visible[2] == (0, 1, 2)  # level 0 is a causal chain
    assert layout.visible[4] == (0, 1, 4)  # level 1, col 1: level 0 up to col 1, itself
    assert layout.visible[8] == (0, 1, 2, 5, 8)  # level 2, col 2: its column above, level 0 to col 2
    # Each row sees exactly the rows at offsets 1..its own offset - one per position.
    for row, seen in enumerate(layout.visible):
        assert sorted(layout.offsets[k] for k in seen) == list(range(1, layout.offsets[row] + 1))


def test_window_rows_in_a_forward_mask() -> None:
    layout = WindowLayout(window_size=2, levels=2)
    drafter = JacobiDrafter([[1, 2, 3, 4, 5]], window_size=2, ngram_size=3, guess_set_size=2)
    side = drafter.propose([1, 2, 3, 4, 5], budget=4).side
    assert side is not None and side.offsets == layout.offsets == (1, 2, 2, 3)
    inputs = DraftTree.root_only(7).inputs(4, torch.device("cpu"), torch.float32, side)
    assert inputs.position_ids.tolist() == [[4, 5, 6, 6, 7]]
    visible = (inputs.attention_mask[0, 0, :, 4:] == 0).int().tolist()
    assert visible == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 0, 1]]


def test_window_advance_collects_column_ngrams_and_shifts_levels() -> None:
    window = JacobiWindow(window_size=2, ngram_size=3, seed_tokens=[10, 11, 12, 13])
    assert window.tokens == [10, 11, 12, 13]  # level 0: 10 11 ; level 1: 12 13
    ngrams = window.advance([90, 91, 92, 93])  # predictions per row
    assert ngrams == [(10, 12, 92), (11, 13, 93)]
    assert window.tokens == [12, 13, 92, 93]
    single = JacobiWindow(window_size=2, ngram_size=2, seed_tokens=[1])
    assert single.advance([5, 6]) == [(1, 5), (1, 6)] and single.tokens == [5, 6]


def test_drafter_proposes_pool_candidates_for_the_last_token_within_budget() -> None:
    drafter = JacobiDrafter([[4, 5, 6, 4, 7, 8]], window_size=2, ngram_size=3, guess_set_size=4)
    tree = drafter.propose([1, 4], budget=10).tree
    assert tree.tokens[0] == 4 and sorted(tree.tokens[1:]) == [5, 6, 7, 8]
    assert tree.source == "jacobi"
    assert sorted(tree.estimates[1:]) == [0.5, 0.5, 1.0, 1.0]  # two first tokens, then certain
    assert len(drafter.propose([1, 4], budget=2).tree) == 3  # one whole candidate only
    drafter.observe([9, 4, 2])  # output n-grams continue from the prompt's last tokens
    assert drafter.pool.candidates(9) == [(4, 2)]
    assert drafter.pool.candidates(8)[0] == (9, 4)


def test_the_models_predictions_at_the_side_rows_advance_the_window() -> None:
    drafter = JacobiDrafter([[1, 2, 3, 4, 5]], window_size=2, ngram_size=3, guess_set_size=2)
    before = list(drafter.window.tokens)
    drafter.observe([6])  # the planner left the side rows out: the window stays
    assert drafter.window.tokens == before
    drafter.observe([7], side_predictions=[90, 91, 92, 93])
    assert drafter.window.tokens == [*before[2:], 92, 93]
    assert (before[0], before[2], 92) in [(before[0], *c) for c in drafter.pool.candidates(before[0])]
