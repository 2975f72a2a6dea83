"""The draft tree: what one decoding step asks the model to verify.

Node 0 is the root: the last emitted token, not yet in the KV cache. Every other node is a draft
token whose parent comes before it. The tree is flattened once per step into the model inputs
(`TreeInputs`): token ids, position ids (cache length + depth) and an additive 4-D attention mask
in which each node sees the whole cache, its ancestors and itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["DraftTree", "SideRows", "StepDraft", "TreeInputs"]


@dataclass(frozen=True)
class SideRows:
    """Rows that ride along in a step's forward without being verified (the Jacobi window).

    Each side row sees the cache, the tree's root and the side rows listed in ``visible``
    (itself included); no tree node sees a side row, so they cannot change what is accepted.
    """

    tokens: tuple[int, ...]
    offsets: tuple[int, ...]  # position after the root's
    visible: tuple[tuple[int, ...], ...]

    def __len__(self) -> int:
        return len(self.tokens)


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
        sources: Where each node came from (``"trie"``, ``"jacobi"``); a single string labels
            every node. `source` summarises them for the per-step stats.
        estimates: The drafter's guess, per node, that the model picks this node's token given
            that it picked its parent's; ``estimates[0]`` (the root) is 1. Empty means unknown (1).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    sources: tuple[str, ...] | str = "none"
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
        if isinstance(self.sources, str):
            object.__setattr__(self, "sources", (self.sources,) * len(self.tokens))
        elif len(self.sources) != len(self.tokens):
            raise ValueError("a draft tree needs one source per node")
        if not self.estimates:
            object.__setattr__(self, "estimates", (1.0,) * len(self.tokens))
        elif len(self.estimates) != len(self.tokens):
            raise ValueError("a draft tree needs one estimate per node")
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "_children", tuple(children))

    @property
    def source(self) -> str:
        """``"none"`` for a lone root, else the draft sources joined by ``+``."""
        return "+".join(sorted(set(self.sources[1:]))) or "none"

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
        source: str | Sequence[str],
        estimates: Sequence[float] = (),
    ) -> DraftTree:
        """Attach a drafter's nodes (parent ``-1`` meaning the root) below ``root``.

        ``source`` names every node's source, or each node's in turn.
        """
        sources = [source] * len(tokens) if isinstance(source, str) else list(source)
        return cls(
            (root, *tokens),
            (-1, *(p + 1 for p in parents)),
            ("root", *sources),
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
            tuple(self.sources[i] for i in kept),
            tuple(self.estimates[i] for i in kept),
        )

    def merge(self, other: DraftTree, at: int = 0) -> DraftTree:
        """This tree plus ``other``'s branches below node ``at`` (the root by default), whose
        token is ``other``'s root token; shared nodes keep this tree's data."""
        if other.tokens[0] != self.tokens[at]:
            raise ValueError("a merged tree's root must carry the token of the node it joins at")
        tokens, parents = list(self.tokens), list(self.parents)
        sources, estimates = list(self.sources), list(self.estimates)
        children = [dict(c) for c in self._children]
        where = [at] * len(other)  # other's node -> index in the merged tree
        for node in range(1, len(other)):
            parent, token = where[other.parents[node]], other.tokens[node]
            if token not in children[parent]:
                children[parent][token] = len(tokens)
                children.append({})
                tokens.append(token)
                parents.append(parent)
                sources.append(other.sources[node])
                estimates.append(other.estimates[node])
            where[node] = children[parent][token]
        return DraftTree(tuple(tokens), tuple(parents), tuple(sources), tuple(estimates))

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` carrying ``token``, if the draft has one."""
        return self._children[node].get(token)

    def children(self, node: int) -> list[int]:
        """``node``'s children, in the order they were added."""
        return list(self._children[node].values())

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
        if self.parents == tuple(range(-1, n - 1)):  # a chain (a prompt's chunk): causal
            return torch.ones(n, n, dtype=torch.bool).tril()
        rows: list[int] = []
        cols: list[int] = []
        for i in range(n):
            path = self.path(i)
            rows += [i] * len(path)
            cols += path
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[rows, cols] = True
        return mask

    def inputs(
        self,
        past_length: int,
        device: torch.device,
        dtype: torch.dtype,
        side: SideRows | None = None,
    ) -> TreeInputs:
        """Flatten the tree (then any side rows) into model inputs over a ``past_length`` cache."""
        return StepDraft(self, side).inputs(past_length, device, dtype)


@dataclass(frozen=True)
class StepDraft:
    """What one step forwards: the tree to verify and, optionally, rows riding along with it.

    Drafters propose one, the planner prunes it (fewer nodes, or no side rows), the runner
    forwards it, and the model's predictions at the side rows go back to the drafter.
    """

    tree: DraftTree
    side: SideRows | None = None

    def __len__(self) -> int:
        """Rows in the forward: the tree's nodes, then the side rows."""
        return len(self.tree) + (len(self.side) if self.side is not None else 0)

    def layout(self) -> tuple[list[int], list[int], torch.Tensor]:
        """Token ids, position offsets after the root's, and ``[n, n]`` bool: which of this
        draft's rows each row sees (its ancestors and itself; side rows their own pattern)."""
        tree, side = self.tree, self.side
        n = len(tree)
        allowed = torch.zeros(len(self), len(self), dtype=torch.bool)
        allowed[:n, :n] = tree.ancestor_mask()
        offsets, tokens = list(tree.depths), list(tree.tokens)
        if side is not None:
            allowed[n:, 0] = True  # the root
            for row, seen in enumerate(side.visible):
                allowed[n + row, [n + k for k in seen]] = True
            offsets += side.offsets
            tokens += side.tokens
        return tokens, offsets, allowed

    def inputs(self, past_length: int, device: torch.device, dtype: torch.dtype) -> TreeInputs:
        """The model inputs of this forward over a ``past_length`` cache, all of it visible."""
        tokens, offsets, allowed = self.layout()
        width = len(tokens)
        mask = torch.zeros(1, 1, width, past_length + width, dtype=dtype)
        mask[0, 0, :, past_length:].masked_fill_(~allowed, torch.finfo(dtype).min)
        positions = torch.tensor([offsets], dtype=torch.long) + past_length
        return TreeInputs(
            input_ids=torch.tensor([tokens], dtype=torch.long, device=device),
            position_ids=positions.to(device),
            attention_mask=mask.to(device),
        )
