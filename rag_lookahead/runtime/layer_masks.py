"""Tree masks for models whose layers attend over different spans.

A sliding-window layer sees, from a query at position ``p``, only keys at positions
``> p - window``; full-attention layers see everything. transformers builds such masks itself
for causal inputs, but a tree's mask is built here: for a model with sliding layers the window
is cut out of it, node by node at each node's own position, and a model that mixes both kinds
of layer takes one mask per layer type (``{"full_attention": ..., "sliding_attention": ...}``,
as its forward accepts). The engine's caches keep every position of every layer, so rolling a
sliding layer back is as exact as rolling back a full one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rag_lookahead.decoding.tree import TreeInputs

__all__ = ["LayerMasks", "cut_window"]

_FULL, _SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class LayerMasks:
    """Which masks a model's layers take. ``window``: its sliding layers' window (``None``: all
    layers attend fully); ``by_type``: it mixes full and sliding layers; ``unsupported``: layer
    types whose span a mask here cannot express (such a model does not verify trees)."""

    window: int | None
    by_type: bool
    unsupported: tuple[str, ...] = ()

    @classmethod
    def of(cls, config: Any) -> LayerMasks:
        types = set(getattr(config, "layer_types", None) or ())
        window = getattr(config, "sliding_window", None) or None
        if getattr(config, "use_sliding_window", True) is False:
            window = None
        if types:  # per-layer types declared: a window applies only where a layer slides
            unsupported = tuple(sorted(types - {_FULL, _SLIDING}))
            if _SLIDING not in types:
                return cls(None, False, unsupported)
            if window is None:
                return cls(None, False, (*unsupported, "sliding_attention without a window"))
            return cls(int(window), _FULL in types, unsupported)
        return cls(None if window is None else int(window), False)

    def __call__(self, inputs: TreeInputs, lengths: Sequence[int]) -> torch.Tensor | dict[str, torch.Tensor]:
        """The mask argument for ``inputs``, whose rows follow caches of ``lengths`` tokens."""
        if self.window is None:
            return inputs.attention_mask
        windowed = cut_window(inputs.attention_mask, inputs.position_ids, lengths, self.window)
        if not self.by_type:
            return windowed
        return {_FULL: inputs.attention_mask, _SLIDING: windowed}


def cut_window(
    mask: torch.Tensor, positions: torch.Tensor, lengths: Sequence[int], window: int
) -> torch.Tensor:
    """``mask`` ``[B, 1, T, C]`` with every key at ``window`` or more positions before its query
    hidden. Row ``i``'s first ``lengths[i]`` columns hold positions ``0..lengths[i]-1`` (the
    cache) and the next ``T`` its queries' own positions (``positions`` ``[B, T]``)."""
    width = positions.shape[1]
    columns = torch.arange(mask.shape[-1], device=positions.device)  # [C]
    slot = columns - torch.tensor(lengths, device=positions.device)[:, None]  # [B, C]
    in_step = (slot >= 0) & (slot < width)
    keys = torch.where(in_step, positions.gather(1, slot.clamp(0, width - 1)), columns)  # [B, C]
    far = positions[:, :, None] - keys[:, None, :] >= window  # [B, T, C]
    return mask.masked_fill(far[:, None], torch.finfo(mask.dtype).min)
