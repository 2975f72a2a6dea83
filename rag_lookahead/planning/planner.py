"""How much to draft: expected accepted tokens per second, against the measured cost curve.

Each draft node carries the drafter's estimate that the model picks its token once it picked
the parent's. Acceptance statistics (`rag_lookahead.planning.acceptance`) calibrate those
estimates per draft source; a node's chance to be accepted is the product of calibrated
estimates along its path. Taking nodes in decreasing order of that chance always yields a
connected tree, and the step keeps the prefix of that order that maximises (1 + expected
accepted tokens) / forward cost — possibly nothing, except on a periodic exploring plan, which
verifies at least the most likely node.
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_lookahead.config import LookaheadConfig, check_variant
from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft
from rag_lookahead.planning.acceptance import AcceptanceModel, load_acceptance, save_acceptance
from rag_lookahead.planning.costs import BatchCosts, CostCurve, CostModel

__all__ = [
    "AcceptanceModel",
    "PrefillPlan",
    "RankedDraft",
    "StepPlanner",
    "fused_prefill",
    "lone_prefill",
    "plan_batch",
    "plan_draft",
    "plan_packed",
    "rank_draft",
    "separate_prefill",
]

# The Jacobi window rides along only where it adds at most this much to a forward's cost.
_WINDOW_OVERHEAD = 1.05


@dataclass(frozen=True)
class RankedDraft:
    """A draft's nodes by decreasing chance of acceptance: any prefix of ``order`` (with the
    root) is a connected tree; ``fixed`` drafts are verified whole (modes other than auto), an
    ``explore`` draft at least up to its most likely node."""

    tree: DraftTree
    order: tuple[int, ...]  # node indices, most likely first
    chances: tuple[float, ...]  # the chance of each node of ``order``
    fixed: bool = False
    explore: bool = False

    @property
    def least(self) -> int:
        """The fewest tokens (root included) this draft's plan verifies."""
        if self.fixed:
            return len(self.tree)
        return min(len(self.tree), 2 if self.explore else 1)

    def gain(self, size: int) -> float:
        """Expected tokens from verifying the best ``size`` nodes (the root's own one included)."""
        return 1.0 + sum(self.chances[: max(size, 1) - 1])

    def take(self, size: int) -> DraftTree:
        """The best ``size`` nodes, root included."""
        return self.tree.subtree(self.order[: max(size, 1) - 1])

    def cut(self, size: int) -> RankedDraft:
        """This draft of its best ``size`` nodes alone (root included), ranked as it was: what
        a forward at most ``size`` tokens wide can verify of it (a static step's widest
        bucket). A fixed draft is verified whole as cut."""
        if len(self.tree) <= size:
            return self
        kept = self.order[: max(size, 1) - 1]
        index = {old: new for new, old in enumerate(sorted(kept), start=1)}  # as `subtree` numbers
        order = tuple(index[node] for node in kept)
        return RankedDraft(self.take(size), order, self.chances[: len(kept)], self.fixed, self.explore)


def rank_draft(tree: DraftTree, acceptance: AcceptanceModel, fixed: bool = False) -> RankedDraft:
    """Rank ``tree``'s nodes by their calibrated chance: the product of calibrated estimates
    along the path."""
    if len(tree) == 1 or fixed:
        return RankedDraft(tree, tuple(range(1, len(tree))), (1.0,) * (len(tree) - 1), fixed)
    chance = [1.0] * len(tree)
    for node in range(1, len(tree)):  # parents come first
        parent = tree.parents[node]
        p = acceptance.probability(tree.sources[node], parent == 0, tree.estimates[node])
        chance[node] = chance[parent] * p
    order = sorted(range(1, len(tree)), key=lambda n: (-chance[n], n))
    return RankedDraft(tree, tuple(order), tuple(chance[n] for n in order), explore=acceptance.explore())


def plan_draft(
    tree: DraftTree, acceptance: AcceptanceModel, cost: CostCurve, widest: int | None = None
) -> DraftTree:
    """The part of ``tree`` worth verifying: the best rate of expected tokens per second, in at
    most ``widest`` nodes where given."""
    if len(tree) == 1:
        return tree
    ranked = rank_draft(tree, acceptance)
    return plan_batch([ranked if widest is None else ranked.cut(widest)], cost)[0]


def plan_batch(
    drafts: Sequence[RankedDraft], cost: Callable[[int], float] | None, max_tokens: int | None = None
) -> list[DraftTree]:
    """One tree per row for a forward in which every row is padded to the widest.

    The forward over these rows costs ``cost(width)``: the plan picks the width with the best
    rate of expected tokens (all rows together) per second, each auto row verifying its best
    nodes up to that width; a fixed row is verified whole, an exploring one at least to its
    most likely node (each sets a least width). No row is wider than ``max_tokens / rows`` (at
    least its root).
    """
    rows = len(drafts)
    cap = max(max_tokens // rows, 1) if max_tokens is not None else None
    least = max(d.least for d in drafts)
    widest = max(len(d.tree) for d in drafts)
    if cap is not None:
        least, widest = min(least, cap), min(widest, cap)
    best_width, best_rate = widest, -1.0
    if cost is not None:
        for width in range(least, widest + 1):
            expected = sum(d.gain(min(width, len(d.tree))) for d in drafts)
            rate = expected / cost(width)
            if rate > best_rate:
                best_width, best_rate = width, rate
    # Every width tried is at least each row's least size (under the cap): fixed rows stay whole.
    return [d.take(min(len(d.tree), best_width)) for d in drafts]


def plan_packed(
    drafts: Sequence[RankedDraft], cost: Callable[[int], float], max_tokens: int | None = None
) -> list[DraftTree]:
    """One tree per row for a forward in which the rows' drafts lie side by side, unpadded.

    The forward costs ``cost(tokens)``, all rows' tokens together: each row starts at its
    least size, then nodes are added best chance first whichever row they are in, and the
    plan keeps the count with the best rate of expected tokens (all rows together) per second.
    No more than ``max_tokens`` in all (each row at least its least size).
    """
    sizes = [d.least for d in drafts]
    gain, tokens = sum(d.gain(size) for d, size in zip(drafts, sizes, strict=True)), sum(sizes)
    # Every node past its row's least size, by chance: a row's chances only fall, so its
    # nodes come in order and each added prefix is a connected tree.
    nodes = sorted(
        ((d.chances[k - 1], i) for i, d in enumerate(drafts) for k in range(sizes[i], len(d.tree))),
        key=lambda node: -node[0],
    )
    room = len(nodes) if max_tokens is None else max(min(len(nodes), max_tokens - tokens), 0)
    best, best_rate = 0, gain / cost(tokens)
    for added, (chance, _) in enumerate(nodes[:room], start=1):
        gain += chance
        rate = gain / cost(tokens + added)
        if rate > best_rate:
            best, best_rate = added, rate
    for _, row in nodes[:best]:
        sizes[row] += 1
    return [d.take(size) for d, size in zip(drafts, sizes, strict=True)]


@dataclass(frozen=True)
class PrefillPlan:
    """How much of joining prompts one step prefills: ``tokens`` per prefilling row (the
    step's width when they ride in the batch's forward, else the chunk forwarded apart), and
    ``rate``, prompt tokens per second it costs the batch (``inf``: free)."""

    tokens: int
    rate: float


def separate_prefill(
    remaining: int, alone: Callable[[int], float], max_tokens: int, missed: float = 0.0
) -> PrefillPlan:
    """A chunk of a prompt forwarded apart, between two steps of the running rows (who wait
    for all of it): the most prompt tokens per second, up to ``max_tokens``. A second here is
    the chunk's forward plus ``missed``, what the batch loses by the call not decoding in that
    step yet (a row's share of the step)."""
    best = PrefillPlan(1, 1 / (alone(1) + missed))
    for tokens in range(2, max(min(remaining, max_tokens), 1) + 1):
        rate = tokens / (alone(tokens) + missed)
        if rate >= best.rate:
            best = PrefillPlan(tokens, rate)
    return best


def lone_prefill(remaining: int, alone: Callable[[int], float], least: int, most: int, loss: float) -> int:
    """The chunk of a prompt forwarded while no other call runs. Calls arriving meanwhile join
    between its chunks, but each chunk pays a forward's fixed part again (on a CPU, reading
    every weight): the smallest multiple of ``least`` tokens whose chunks forward the prompt's
    ``remaining`` tokens in at most ``1 / (1 - loss)`` the time of chunks as large as they can
    be (all of it, up to ``most``), priced by ``alone``."""

    def seconds(chunk: int) -> float:
        whole, rest = divmod(remaining, chunk)
        return whole * alone(chunk) + (alone(rest) if rest else 0.0)

    largest = max(min(remaining, most), 1)
    bound = seconds(largest) / (1 - loss)
    for tokens in range(least, largest, least):
        if seconds(tokens) <= bound:
            return tokens
    return largest


def fused_prefill(
    remaining: Sequence[int],
    decode_rows: int,
    width: int,
    cost: Callable[[int, int], float],
    max_tokens: int,
    missed: float = 0.0,
    alone: Callable[[int], float] | None = None,
) -> PrefillPlan:
    """The width of a step in which prompts (``remaining`` tokens each) ride along with
    ``decode_rows`` rows of drafts ``width`` wide, each taking up to that width of its prompt.

    Every row of the forward is padded to the widest, so a wider chunk widens every row: the
    step costs ``cost(rows, width)``. The plan takes the width, up to ``max_tokens`` over all
    rows, that prefills the most prompt tokens per second it adds to the running rows' step
    (the widest of equals), counting ``missed`` as `separate_prefill` does; with no running
    rows, the widest. With ``alone`` (seconds of a forward of so many tokens in one row, a
    curve that grows with them), what a step adds is never priced below what its added tokens
    add there: costs calibrated cell by cell can price the running rows' step above a wider
    one, which would make a join look free.
    """
    rows = decode_rows + len(remaining)
    least = max(width, 1)
    widest = max(min(max(remaining), max_tokens // rows), least)
    if decode_rows == 0:
        return PrefillPlan(widest, float("inf"))
    base = cost(decode_rows, width)
    best = PrefillPlan(least, 0.0)
    for tokens in range(least, widest + 1):
        extra = cost(rows, tokens) - base
        if alone is not None:
            extra = max(extra, alone(rows * tokens) - alone(decode_rows * width), 0.0)
        extra += missed
        progress = sum(min(r, tokens) for r in remaining)
        rate = progress / extra if extra > 0 else float("inf")
        if rate >= best.rate:
            best = PrefillPlan(tokens, rate)
    return best


def _fits(tree: DraftTree, side: SideRows, widest: int | None) -> bool:
    """Whether ``side`` rides along with ``tree`` within ``widest`` tokens (``None``: any)."""
    return widest is None or len(tree) + len(side) <= widest


@dataclass
class _Store:
    path: Path
    key: dict[str, Any]
    saved: int  # observations when last written


class StepPlanner:
    """What each step verifies: all of the draft, or in ``mode="auto"`` the part that pays.

    ``mode="auto"`` needs the forward cost curve (`cost_curve`), set once it is measured, and
    plans against it as the steps' own timings calibrate it (`CostModel.priced`); a curve whose
    shape is in doubt (measured under a load, or contradicted by the forwards) drafts into the
    widths the steps have not timed yet (`CostModel.explored`). Thread-safe:
    calls of one engine plan and learn concurrently. Its variants (`with_config`) learn into
    the same statistics, which persist on disk once `load_acceptance` was called.
    """

    def __init__(self, config: LookaheadConfig, costs: CostModel | None = None) -> None:
        self.config = config
        self.acceptance = AcceptanceModel()
        self.costs = costs if costs is not None else CostModel()  # the runner's, shared
        self._lock = threading.Lock()
        self._store: _Store | None = None  # where the statistics persist, once loaded from there

    @property
    def cost_curve(self) -> CostCurve | None:
        return self.costs.curve

    @cost_curve.setter
    def cost_curve(self, curve: CostCurve | None) -> None:
        self.costs.curve = curve

    @property
    def batch_costs(self) -> BatchCosts | None:
        return self.costs.batch

    def with_config(self, config: LookaheadConfig) -> StepPlanner:
        """A planner for ``config`` that learns into the same statistics and plans with the
        same costs: ``config`` changes only per-call settings (`check_variant`)."""
        other = copy.copy(self)
        other.config = check_variant(self.config, config)
        return other

    def load_acceptance(self, path: Path, key: dict[str, Any]) -> None:
        """Start from the statistics stored at ``path`` for ``key`` (earlier processes' calls),
        and keep them there from now on (`save_acceptance`)."""
        with self._lock:
            try:
                load_acceptance(path, key, self.acceptance)
            except ValueError as err:  # a cache: a bad one costs a head start, never an output
                warnings.warn(f"rag-lookahead: {err}; learning afresh", stacklevel=3)
            self._store = _Store(path, key, self.acceptance.observations)

    def save_acceptance(self, every: int = 1) -> None:
        """Write the statistics back if ``every`` nodes were learned since the last write."""
        with self._lock:
            store = self._store
            if store is None or self.acceptance.observations - store.saved < every:
                return
            save_acceptance(store.path, store.key, self.acceptance)
            store.saved = self.acceptance.observations

    def rank(self, draft: StepDraft) -> RankedDraft:
        """``draft``'s nodes by calibrated chance, for a batch plan (`plan_batch`)."""
        with self._lock:
            return rank_draft(draft.tree, self.acceptance, fixed=self.config.mode != "auto")

    def plan(self, draft: StepDraft, room: int, context: int = 0, widest: int | None = None) -> StepDraft:
        """The part of ``draft`` to forward this step after ``context`` cached tokens (what
        its price depends on); ``room`` positions are left in the context. With ``widest`` (a
        static step's widest bucket), at most that many tokens, side rows included: a wider
        tree is cut to its best nodes (its first ones, outside ``mode="auto"``)."""
        tree, side = draft.tree, draft.side
        if self.config.mode != "auto":
            if widest is not None and len(tree) > widest:
                tree = tree.subtree(range(1, widest))  # (topological order: parents kept)
            side = side if side is None or max(side.offsets) < room else None
            return StepDraft(tree, side if side is None or _fits(tree, side, widest) else None)
        if len(tree) == 1 and side is None:
            return draft
        cost = self._curve(context)
        with self._lock:
            if len(tree) > 1:
                tree = plan_draft(tree, self.acceptance, self._explored(context), widest)
        # A side row past the context window, or a window that does not pay, stays out: it
        # rides along only where it is nearly free (a GPU, not a CPU), as its n-grams rarely
        # repay more.
        if side is not None and (
            max(side.offsets) >= room
            or not _fits(tree, side, widest)
            or cost(len(tree) + len(side)) > _WINDOW_OVERHEAD * cost(len(tree))
        ):
            side = None
        return StepDraft(tree, side)

    def _curve(self, context: int) -> CostCurve:
        cost = self.costs.priced(context)
        if cost is None:
            raise RuntimeError("mode='auto' plans against a cost curve: call engine.measure_costs() first")
        return cost

    def _explored(self, context: int) -> CostCurve:
        cost = self.costs.explored(context)
        assert cost is not None, "explored before the costs were measured"
        return cost

    def learn(self, tree: DraftTree, accepted_nodes: Sequence[int]) -> None:
        """Record what the model accepted of a verified tree."""
        if len(tree) > 1:
            with self._lock:
                self.acceptance.update(tree, accepted_nodes)
