"""The greedy choice over a vocabulary: torch's argmax, found faster on a CPU."""

from __future__ import annotations

import torch

__all__ = ["first_argmax"]

# Columns per block: large enough that the blocks' maxima are few.
_BLOCK = 1024


def first_argmax(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(-1)`` (the first index of each row's maximum, a NaN counting as one),
    found faster on a CPU: torch's CPU argmax over a vocabulary runs several times slower than
    a max, so the row's blocks of ``_BLOCK`` columns are reduced with ``amax`` and only the
    first block holding the maximum is searched."""
    vocab = scores.shape[-1]
    if scores.device.type != "cpu" or vocab < 2 * _BLOCK:
        return scores.argmax(dim=-1)
    whole = vocab - vocab % _BLOCK
    best = scores[..., :whole].unflatten(-1, (-1, _BLOCK)).amax(-1)  # [..., blocks]
    if whole < vocab:
        best = torch.cat([best, scores[..., whole:].amax(-1, keepdim=True)], dim=-1)
    start = best.argmax(dim=-1) * _BLOCK  # [...]: the first block holding the maximum
    # A short last block repeats its last column, after the real one: the first stays first.
    columns = (start[..., None] + torch.arange(_BLOCK, device=scores.device)).clamp(max=vocab - 1)
    return start + scores.gather(-1, columns).argmax(dim=-1)
