"""The draft tree: what one decoding step asks the model to verify.

Node 0 is the root: the last emitted token, not yet in the KV cache. Every other node is a draft
token whose parent comes before it. The tree is flattened once per step into the model inputs
(`TreeInputs`): token ids, position ids (cache length + depth) and an additive 4-D attention mask
in which each node sees the whole cache, its ancestors and itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = ["DraftTree", "TreeInputs"]


@dataclass(frozen=True)
class TreeInputs:
    """Model inputs for one tree forward over a cache of ``past_length`` tokens."""

    input_ids: torch.Tensor  # [1, n]
    position_ids: torch.Tensor  # [1, n]
    attention_mask: torch.Tensor  # [1, 1, n, past_length + n], 0 = visible, dtype min = hidden


@dataclass(frozen=True)
class DraftTree:
    """A rooted token tree in topological order (each parent before its children).

    Attributes:
        tokens: Token id per node; ``tokens[0]`` is the root.
        parents: Parent index per node; ``parents[0] == -1``.
        source: Where the draft came from (``"trie"``, ``"none"``), for the per-step stats.
        estimates: The drafter's guess, per node, that the model picks this node's token given
            that it picked its parent's; ``estimates[0]`` (the root) is 1. Empty means unknown (1).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    source: str = "none"
    estimates: tuple[float, ...] = ()
    depths: tuple[int, ...] = field(init=False)
    _children: tuple[dict[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.parents) or self.parents[0] != -1:
            raise ValueError("a draft tree needs a root (parent -1) and one parent per token")
        depths = [0]
        children: list[dict[int, int]] = [{}]
        for i in range(1, len(self.tokens)):
            parent = self.parents[i]
            if not 0 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must come first")
            if self.tokens[i] in children[parent]:
                raise ValueError(f"node {parent} has two children with token {self.tokens[i]}")
            children[parent][self.tokens[i]] = i
            children.append({})
            depths.append(depths[parent] + 1)
        if not self.estimates:
            object.__setattr__(self, "estimates", (1.0,) * len(self.tokens))
        elif len(self.estimates) != len(self.tokens):
            raise ValueError("a draft tree needs one estimate per node")
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "_children", tuple(children))

    @classmethod
    def root_only(cls, token: int) -> DraftTree:
        """The degenerate tree of plain decoding: just the last token."""
        return cls((token,), (-1,))

    @classmethod
    def from_draft(
        cls,
        root: int,
        tokens: Sequence[int],
        parents: Sequence[int],
        source: str,
        estimates: Sequence[float] = (),
    ) -> DraftTree:
        """Attach a drafter's nodes (parent ``-1`` meaning the root) below ``root``."""
        return cls(
            (root, *tokens),
            (-1, *(p + 1 for p in parents)),
            source if tokens else "none",
            (1.0, *estimates) if estimates else (),
        )

    def subtree(self, keep: Sequence[int]) -> DraftTree:
        """The tree restricted to the ``keep`` nodes (the root and every kept node's parent too)."""
        kept = sorted(set(keep) | {0})
        index = {old: new for new, old in enumerate(kept)}
        if any(self.parents[i] not in index for i in kept[1:]):
            raise ValueError("a subtree must keep the parent of every kept node")
        return DraftTree(
            tuple(self.tokens[i] for i in kept),
            tuple(-1 if i == 0 else index[self.parents[i]] for i in kept),
            self.source if len(kept) > 1 else "none",
            tuple(self.estimates[i] for i in kept),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` carrying ``token``, if the draft has one."""
        return self._children[node].get(token)

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        nodes = []
        while node != -1:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """``[n, n]`` bool: ``mask[i, j]`` iff node j is node i or one of its ancestors."""
        n = len(self)
        rows: list[int] = []
        cols: list[int] = []
        for i in range(n):
            path = self.path(i)
            rows += [i] * len(path)
            cols += path
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[rows, cols] = True
        return mask

    def inputs(self, past_length: int, device: torch.device, dtype: torch.dtype) -> TreeInputs:
        """Flatten the tree into model inputs over a cache holding ``past_length`` tokens."""
        n = len(self)
        hidden = torch.finfo(dtype).min
        mask = torch.zeros(1, 1, n, past_length + n, dtype=dtype)  # the cache is fully visible
        mask[0, 0, :, past_length:].masked_fill_(~self.ancestor_mask(), hidden)
        positions = torch.tensor([self.depths], dtype=torch.long) + past_length
        return TreeInputs(
            input_ids=torch.tensor([self.tokens], dtype=torch.long, device=device),
            position_ids=positions.to(device),
            attention_mask=mask.to(device),
        )
