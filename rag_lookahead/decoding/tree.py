"""The draft tree: what one decoding step asks the model to verify.

Node 0 is the root: the last emitted token, not yet in the KV cache. Every other node is a draft
token whose parent comes before it. The tree is flattened once per step into the model inputs
(`TreeInputs`): token ids, position ids (cache length + depth) and an additive 4-D attention mask
in which each node sees the whole cache, its ancestors and itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rag_lookahead.decoding.masks import ancestors, step_mask

__all__ = [
    "MAX_SOURCE_LENGTH",
    "PREDICTION_LABEL",
    "DraftTree",
    "PackedInputs",
    "SideRows",
    "StepDraft",
    "TreeInputs",
    "packed_inputs",
    "step_inputs",
]

# The source label of nodes drafted from a call's prediction (OpenAI's Predicted Outputs): the
# planner trusts them from the start, the stats count them.
PREDICTION_LABEL = "pred"
# The longest source label the acceptance table keeps (and a saved table may hold).
MAX_SOURCE_LENGTH = 64


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
    """Model inputs for one step's forward: a draft per row, each over its own cache."""

    input_ids: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, 1, T, max(lengths) + T], 0 = visible, dtype min = hidden


@dataclass(frozen=True)
class PackedInputs:
    """Model inputs for one step's forward with every row's draft side by side, unpadded.

    Row ``i``'s ``sizes[i]`` tokens are ``input_ids[0, offsets[i] : offsets[i] + sizes[i]]``;
    they attend over its own cache and draft alone, ``masks[i]`` ``[1, 1, sizes[i],
    lengths[i] + sizes[i]]`` (``None``: a single token, which sees all of them), and in a
    sliding-window layer under ``sliding[i]``.
    """

    input_ids: torch.Tensor  # [1, N], N = sum(sizes)
    position_ids: torch.Tensor  # [1, N]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    masks: tuple[torch.Tensor | None, ...]
    sliding: tuple[torch.Tensor | None, ...]

    @property
    def rows(self) -> torch.Tensor:
        """Each token's row ``[N]``."""
        sizes = torch.tensor(self.sizes, device=self.input_ids.device)
        return torch.repeat_interleave(torch.arange(len(self.sizes), device=sizes.device), sizes)


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
        tokens, parents = self.tokens, self.parents
        depths = [0]
        children: list[dict[int, int]] = [{}]
        for i in range(1, len(tokens)):
            parent, token = parents[i], tokens[i]
            if not 0 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must come first")
            siblings = children[parent]
            if token in siblings:
                raise ValueError(f"node {parent} has two children with token {token}")
            siblings[token] = i
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
            (-1, *[p + 1 for p in parents]),
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
        if len(other) == 1:
            return self  # nothing to add (a drafter left no room or no match): frozen, so shared
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
        return ancestors(torch.tensor([self.parents]), max(self.depths))[0]

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

    def inputs(self, past_length: int, device: torch.device, dtype: torch.dtype) -> TreeInputs:
        """The model inputs of this forward over a ``past_length`` cache, all of it visible."""
        return step_inputs([self], [past_length], device, dtype)


def step_inputs(
    drafts: Sequence[StepDraft], lengths: Sequence[int], device: torch.device, dtype: torch.dtype
) -> TreeInputs:
    """Inputs ``[B, T]`` and mask ``[B, 1, T, max(lengths) + T]`` for one draft per row.

    Row ``i``'s draft sits at columns ``lengths[i]`` to ``lengths[i] + T``; it sees its own
    first ``lengths[i]`` columns and, within the draft, its ancestors and itself (side rows:
    the root and their own pattern). A padded slot sees only itself, so that every query has a
    finite softmax (its output is never used). The drafts are flattened into parent arrays in
    one pass and the mask is built for all rows at once (`rag_lookahead.decoding.masks`).
    """
    rows, width = len(drafts), max(len(d) for d in drafts)
    flat = _FlatDrafts(width)
    for draft in drafts:
        flat.add(draft)
    depth = max(max(d.tree.depths) for d in drafts)
    selfless = None
    if flat.selfless:
        selfless = torch.zeros(rows * width, dtype=torch.bool, device=device)
        selfless[flat.selfless] = True
        selfless = selfless.view(rows, width)
    parents = torch.tensor(flat.parents, device=device).view(rows, width)
    seen = ancestors(parents, depth, selfless)  # [B, T, T]
    if flat.extra:
        seen[tuple(torch.tensor(flat.extra, device=device).T)] = True
    sizes = torch.tensor([len(d) for d in drafts], device=device)
    positions = torch.tensor(flat.offsets, device=device).view(rows, width)
    positions += torch.tensor(lengths, device=device)[:, None]
    return TreeInputs(
        input_ids=torch.tensor(flat.ids, device=device).view(rows, width),
        position_ids=positions,
        attention_mask=step_mask(seen, sizes, lengths, dtype),
    )


def packed_inputs(
    drafts: Sequence[StepDraft],
    lengths: Sequence[int],
    device: torch.device,
    dtype: torch.dtype,
    layer_masks: Callable[[TreeInputs, Sequence[int]], torch.Tensor | dict[str, torch.Tensor]] | None = None,
) -> PackedInputs:
    """`step_inputs` without the padding: the rows' drafts one after another in one sequence,
    each with its own mask over its own cache (the padded mask's row, cut to its real slots
    and columns: row ``i``'s draft sits at columns ``lengths[i]`` on in both). ``layer_masks``:
    the model's masks from the padded inputs (a sliding window cut out, for its sliding
    layers: `rag_lookahead.runtime.layer_masks.LayerMasks`)."""
    padded = step_inputs(drafts, lengths, device, dtype)
    argument = padded.attention_mask if layer_masks is None else layer_masks(padded, lengths)
    if isinstance(argument, dict):
        full, sliding = argument["full_attention"], argument["sliding_attention"]
    else:
        full = sliding = argument
    sizes = [len(d) for d in drafts]
    width = padded.input_ids.shape[1]
    real = torch.tensor([i * width + k for i, n in enumerate(sizes) for k in range(n)], device=device)
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)

    def rows(mask: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # A lone root sees its whole cache and itself, unless a window hides some of it.
        alone = mask is padded.attention_mask
        return tuple(
            None if n == 1 and alone else mask[i : i + 1, :, :n, : length + n]
            for i, (n, length) in enumerate(zip(sizes, lengths, strict=True))
        )

    masks = rows(full)
    return PackedInputs(
        input_ids=padded.input_ids.view(-1)[real][None],
        position_ids=padded.position_ids.view(-1)[real][None],
        offsets=tuple(offsets),
        sizes=tuple(sizes),
        masks=masks,
        sliding=masks if sliding is full else rows(sliding),
    )


class _FlatDrafts:
    """Drafts flattened into lists of ``width`` slots per row, padded after each draft."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.ids: list[int] = []
        self.parents: list[int] = []  # -1: none (a root, a side row, a padded slot)
        self.offsets: list[int] = []  # positions after the root's
        self.selfless: list[int] = []  # flat slots that see only what they list (side rows)
        self.extra: list[tuple[int, int, int]] = []  # (row, slot, seen slot) besides ancestors
        self.rows = 0

    def add(self, draft: StepDraft) -> None:
        tree, side = draft.tree, draft.side
        self.ids += tree.tokens
        self.parents += tree.parents
        self.offsets += tree.depths
        if side is not None:
            row, n = self.rows, len(tree)
            self.ids += side.tokens
            self.parents += [-1] * len(side)
            self.offsets += side.offsets
            self.selfless += range(row * self.width + n, row * self.width + n + len(side))
            for k, visible in enumerate(side.visible):  # the root, and what each lists
                self.extra += [(row, n + k, 0), *((row, n + k, n + j) for j in visible)]
        pad = self.width - len(draft)
        self.ids += [tree.tokens[0]] * pad
        self.parents += [-1] * pad
        self.offsets += [0] * pad
        self.rows += 1
