"""The step's inputs and mask, built for the batch in tensor operations, equal the row-by-row build
they replaced, on random trees, side rows and cache lengths."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_lookahead.decoding.batch import batch_inputs
from rag_lookahead.decoding.masks import ancestors
from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft, TreeInputs


def row_by_row_ancestors(tree: DraftTree) -> torch.Tensor:
    """The ancestor mask as it was built: each node's path walked in Python."""
    mask = torch.zeros(len(tree), len(tree), dtype=torch.bool)
    for i in range(len(tree)):
        mask[i, tree.path(i)] = True
    return mask


def row_by_row_layout(draft: StepDraft) -> tuple[list[int], list[int], torch.Tensor]:
    tree, side = draft.tree, draft.side
    n = len(tree)
    allowed = torch.zeros(len(draft), len(draft), dtype=torch.bool)
    allowed[:n, :n] = row_by_row_ancestors(tree)
    offsets, tokens = list(tree.depths), list(tree.tokens)
    if side is not None:
        allowed[n:, 0] = True
        for row, seen in enumerate(side.visible):
            allowed[n + row, [n + k for k in seen]] = True
        offsets += side.offsets
        tokens += side.tokens
    return tokens, offsets, allowed


def row_by_row_inputs(drafts: Sequence[StepDraft], lengths: Sequence[int], dtype: torch.dtype) -> TreeInputs:
    """The batch's inputs as they were built before: one row at a time."""
    rows, width = len(drafts), max(len(d) for d in drafts)
    mask = torch.full((rows, 1, width, max(lengths) + width), torch.finfo(dtype).min, dtype=dtype)
    ids = torch.zeros(rows, width, dtype=torch.long)
    positions = torch.zeros(rows, width, dtype=torch.long)
    for i, (draft, length) in enumerate(zip(drafts, lengths, strict=True)):
        tokens, offsets, allowed = row_by_row_layout(draft)
        n = len(tokens)
        seen = torch.eye(width, dtype=torch.bool)
        seen[:n, :n] = allowed
        mask[i, 0, :, length : length + width].masked_fill_(seen, 0.0)
        mask[i, 0, :n, :length] = 0.0
        ids[i, :n] = torch.tensor(tokens)
        ids[i, n:] = tokens[0]
        positions[i, :n] = torch.tensor(offsets) + length
        positions[i, n:] = length
    return TreeInputs(ids, positions, mask)


def random_tree(rng: random.Random, size: int) -> DraftTree:
    # Chains and bushes alike: a parent drawn near the node or anywhere before it.
    parents = [-1] + [
        max(0, i - 1 - rng.randrange(3)) if rng.random() < 0.6 else rng.randrange(i) for i in range(1, size)
    ]
    return DraftTree(tuple(rng.sample(range(1000), size)), tuple(parents))


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
