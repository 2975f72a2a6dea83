"""The step's inputs and mask, built for the batch in tensor operations, equal the row-by-row build
they replaced, on random trees, side rows and cache lengths."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead.decoding.masks import ancestors
from rag_lookahead.decoding.tree import SideRows, StepDraft
from rag_lookahead.runtime.batch import batch_inputs
from rag_lookahead.testing import random_tree, row_by_row_ancestors, row_by_row_inputs


def random_side(rng: random.Random) -> SideRows | None:
    count = rng.randint(0, 4)
    if not count:
        return None
    visible = tuple(tuple(sorted(rng.sample(range(count), rng.randint(0, count)))) for _ in range(count))
    return SideRows(
        tuple(rng.randrange(1000) for _ in range(count)),
        tuple(rng.randint(1, 5) for _ in range(count)),
        visible,
    )


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 1 << 30),
    rows=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_the_vectorised_inputs_equal_the_row_by_row_build(seed: int, rows: int, dtype: torch.dtype) -> None:
    rng = random.Random(seed)
    drafts = [StepDraft(random_tree(rng, rng.randint(1, 40)), random_side(rng)) for _ in range(rows)]
    lengths = [rng.randint(0, 60) for _ in drafts]
    got = batch_inputs(drafts, lengths, torch.device("cpu"), dtype)
    expected = row_by_row_inputs(drafts, lengths, dtype)
    assert torch.equal(got.input_ids, expected.input_ids)
    assert torch.equal(got.position_ids, expected.position_ids)
    assert got.attention_mask.dtype == dtype and torch.equal(got.attention_mask, expected.attention_mask)
    if rows == 1:  # a step alone: the same inputs
        alone = drafts[0].inputs(lengths[0], torch.device("cpu"), dtype)
        assert torch.equal(alone.attention_mask, expected.attention_mask)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 1 << 30), size=st.integers(1, 80))
def test_pointer_doubling_finds_every_ancestor(seed: int, size: int) -> None:
    tree = random_tree(random.Random(seed), size)
    assert torch.equal(tree.ancestor_mask(), row_by_row_ancestors(tree))
    # A bound on the depth above the real one changes nothing.
    assert torch.equal(ancestors(torch.tensor([tree.parents]), size)[0], row_by_row_ancestors(tree))
