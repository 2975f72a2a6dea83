"""A step's attention mask from flat parent arrays, built for the whole batch in tensor operations.

Each row of a step is a draft (a tree, possibly with side rows) after its own cache. Its slots
are described by a parent array (``-1``: no parent), whether each slot sees itself, and a few
extra (row, slot, seen slot) triples for patterns that are not trees (the flat ids and parent
array per row that SGLang's lookahead drafter hands over too); the ancestor relation is then
closed by pointer doubling (``log2(depth)`` gathers), so that no Python loop runs per node or
per row. Slots past a row's draft are padding: they see only themselves, so that every query
has a finite softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ancestors", "step_mask"]


def ancestors(parents: torch.Tensor, depth: int, selfless: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, W, W]`` bool: ``out[b, i, j]`` iff slot ``j`` is slot ``i`` or one of its ancestors.

    ``parents`` ``[B, W]``: each slot's parent (``-1`` for none), always an earlier slot;
    ``depth``: at least the longest chain of parents; ``selfless`` ``[B, W]`` bool: slots that
    do not see themselves (and have no parent).
    """
    rows, width = parents.shape
    slots = torch.arange(width, device=parents.device).expand(rows, width)  # [B, W]
    jump = torch.where(parents < 0, slots, parents)  # the root (and a parentless slot) stays put
    reach = torch.eye(width, dtype=torch.bool, device=parents.device).repeat(rows, 1, 1)  # [B, W, W]
    if selfless is not None:
        reach &= ~selfless[:, :, None]
    parent = torch.zeros_like(reach).scatter_(2, jump[:, :, None], parents[:, :, None] >= 0)
    reach |= parent
    # After k rounds a slot reaches every ancestor within 2**k steps.
    for _ in range(max(depth - 1, 0).bit_length()):
        reach |= reach.gather(1, jump[:, :, None].expand(rows, width, width))
        jump = jump.gather(1, jump)
    return reach


def step_mask(
    seen: torch.Tensor, sizes: torch.Tensor, lengths: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """The additive mask ``[B, 1, W, max(lengths) + W]`` of a step whose row ``b`` holds
    ``sizes[b]`` slots after ``lengths[b]`` cached columns, its slots seeing one another as
    ``seen`` ``[B, W, W]`` says. Row ``b``'s slots sit at columns ``lengths[b]`` on; its real
    slots see its whole cache, its padding slots only themselves."""
    rows, width, _ = seen.shape
    device, hidden = seen.device, torch.finfo(dtype).min
    starts = torch.tensor(lengths, device=device)  # [B]
    columns = torch.arange(max(lengths) + width, device=device)  # [C]
    shown, hidden_value = (
        torch.zeros((), dtype=dtype, device=device),
        torch.tensor(hidden, dtype=dtype, device=device),
    )
    # Each row's cache as one line of columns, and a line hiding everything for padding slots:
    # the mask's rows are copies of these lines (one large copy, not one fill per row or slot).
    lines = torch.where(columns < starts[:, None], shown, hidden_value)  # [B, C]
    lines = torch.cat([lines, hidden_value.expand(1, columns.numel())])  # [B + 1, C]
    slots = torch.arange(width, device=device)
    line = torch.where(slots < sizes[:, None], torch.arange(rows, device=device)[:, None], rows)  # [B, W]
    mask = lines.index_select(0, line.view(-1)).view(rows, width, -1)  # [B, W, C]
    # Then its own row's slots, from the start on: W columns per row, written at once.
    where = (starts[:, None] + slots)[:, None, :].expand(rows, width, width)  # [B, W, W]
    block = torch.zeros(rows, width, width, dtype=dtype, device=device).masked_fill_(~seen, hidden)
    mask.scatter_(2, where, block)
    return mask[:, None]
