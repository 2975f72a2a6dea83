"""How much to draft: expected accepted tokens per second, against the measured cost curve.

Each draft node carries the drafter's estimate that the model picks its token once it picked
the parent's. Running acceptance statistics calibrate those estimates per draft source; a node's
chance to be accepted is the product of calibrated estimates along its path. Taking nodes in
decreasing order of that chance always yields a connected tree, and the step keeps the prefix
of that order that maximises (1 + expected accepted tokens) / forward cost — possibly nothing.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.costs import BatchCosts, CostCurve
from rag_lookahead.decoding.tree import DraftTree, StepDraft

__all__ = ["AcceptanceModel", "RankedDraft", "StepPlanner", "plan_batch", "plan_draft", "rank_draft"]

# The Jacobi window rides along only where it adds at most this much to a forward's cost.
_WINDOW_OVERHEAD = 1.05

_BUCKETS = 10


class AcceptanceModel:
    """Calibrates drafter estimates from what the model actually accepted.

    Statistics are kept per (source, first level or deeper, estimate decile), starting from a
    prior (``prior_scale`` times the estimate, worth ``prior_weight`` observations) and halved
    once a bucket has seen ``horizon`` nodes, so they follow a changing workload. A bucket
    judged not worth drafting would never be tried again, so every ``explore_every``-th plan
    trusts the raw estimates instead.
    """

    def __init__(
        self,
        prior_weight: float = 4.0,
        prior_scale: float = 0.7,
        horizon: float = 400.0,
        explore_every: int = 32,
    ) -> None:
        self.prior_weight = prior_weight
        self.prior_scale = prior_scale
        self.horizon = horizon
        self.explore_every = explore_every
        self._plans = 0
        self._seen: defaultdict[tuple[str, bool, int], list[float]] = defaultdict(lambda: [0.0, 0.0])

    @staticmethod
    def _key(source: str, first_level: bool, estimate: float) -> tuple[str, bool, int]:
        return source, first_level, min(int(estimate * _BUCKETS), _BUCKETS - 1)

    def probability(self, source: str, first_level: bool, estimate: float) -> float:
        """Calibrated chance that a node is accepted given that its parent was."""
        accepted, tried = self._seen[self._key(source, first_level, estimate)]
        prior = self.prior_scale * estimate
        return (accepted + self.prior_weight * prior) / (tried + self.prior_weight)

    def explore(self) -> bool:
        """Whether this plan should trust the drafter's raw estimates (a periodic exploration)."""
        self._plans += 1
        return self._plans % self.explore_every == 0

    def update(self, tree: DraftTree, accepted_nodes: Sequence[int]) -> None:
        """Record the outcome of verifying ``tree``: every node whose parent was accepted was tried."""
        on_path = set(accepted_nodes)
        for node in range(1, len(tree)):
            if tree.parents[node] in on_path:
                key = self._key(tree.sources[node], tree.parents[node] == 0, tree.estimates[node])
                seen = self._seen[key]
                seen[0] += node in on_path
                seen[1] += 1
                if seen[1] >= self.horizon:
                    seen[0] /= 2
                    seen[1] /= 2


@dataclass(frozen=True)
class RankedDraft:
    """A draft's nodes by decreasing chance of acceptance: any prefix of ``order`` (with the
    root) is a connected tree, and ``fixed`` drafts are verified whole (modes other than auto)."""

    tree: DraftTree
    order: tuple[int, ...]  # node indices, most likely first
    chances: tuple[float, ...]  # the chance of each node of ``order``
    fixed: bool = False

    def gain(self, size: int) -> float:
        """Expected tokens from verifying the best ``size`` nodes (the root's own one included)."""
        return 1.0 + sum(self.chances[: max(size, 1) - 1])

    def take(self, size: int) -> DraftTree:
        """The best ``size`` nodes, root included."""
        return self.tree.subtree(self.order[: max(size, 1) - 1])


def rank_draft(tree: DraftTree, acceptance: AcceptanceModel, fixed: bool = False) -> RankedDraft:
    """Rank ``tree``'s nodes by their calibrated chance: the product of calibrated estimates
    along the path (the drafter's raw estimates on an exploring plan)."""
    if len(tree) == 1 or fixed:
        return RankedDraft(tree, tuple(range(1, len(tree))), (1.0,) * (len(tree) - 1), fixed)
    explore = acceptance.explore()
    chance = [1.0] * len(tree)
    for node in range(1, len(tree)):  # parents come first
        parent = tree.parents[node]
        p = tree.estimates[node]
        if not explore:
            p = acceptance.probability(tree.sources[node], parent == 0, p)
        chance[node] = chance[parent] * p
    order = sorted(range(1, len(tree)), key=lambda n: (-chance[n], n))
    return RankedDraft(tree, tuple(order), tuple(chance[n] for n in order))


def plan_draft(tree: DraftTree, acceptance: AcceptanceModel, cost: CostCurve) -> DraftTree:
    """The part of ``tree`` worth verifying: the best rate of expected tokens per second."""
    if len(tree) == 1:
        return tree
    return plan_batch([rank_draft(tree, acceptance)], cost)[0]


def plan_batch(
    drafts: Sequence[RankedDraft], cost: Callable[[int], float] | None, max_tokens: int | None = None
) -> list[DraftTree]:
    """One tree per row for a forward in which every row is padded to the widest.

    The forward over these rows costs ``cost(width)``: the plan picks the width with the best
    rate of expected tokens (all rows together) per second, each auto row verifying its best
    nodes up to that width; a fixed row is verified whole (and sets the least width). No row is
    wider than ``max_tokens / rows`` (at least its root).
    """
    rows = len(drafts)
    cap = max(max_tokens // rows, 1) if max_tokens is not None else None
    least = max((len(d.tree) for d in drafts if d.fixed), default=1)
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
    # Every width tried is at least each fixed row's size (under the cap): fixed rows stay whole.
    return [d.take(min(len(d.tree), best_width)) for d in drafts]


class StepPlanner:
    """What each step verifies: all of the draft, or in ``mode="auto"`` the part that pays.

    ``mode="auto"`` needs the forward cost curve (`cost_curve`), set once it is measured.
    Thread-safe: calls of one engine plan and learn concurrently.
    """

    def __init__(
        self,
        config: LookaheadConfig,
        cost_curve: CostCurve | None = None,
        batch_costs: BatchCosts | None = None,
    ) -> None:
        self.config = config
        self.acceptance = AcceptanceModel()
        self.cost_curve = cost_curve
        self.batch_costs = batch_costs
        self._lock = threading.Lock()

    def rank(self, draft: StepDraft) -> RankedDraft:
        """``draft``'s nodes by calibrated chance, for a batch plan (`plan_batch`)."""
        with self._lock:
            return rank_draft(draft.tree, self.acceptance, fixed=self.config.mode != "auto")

    def plan(self, draft: StepDraft, room: int) -> StepDraft:
        """The part of ``draft`` to forward this step; ``room`` positions are left in the context."""
        tree = draft.tree
        with self._lock:
            if self.config.mode == "auto" and len(tree) > 1:
                tree = plan_draft(tree, self.acceptance, self._curve())
            side = draft.side
            # A side row past the context window, or a window that does not pay, stays out.
            if side is not None and (
                max(side.offsets) >= room or not self._window_pays(len(tree), len(side))
            ):
                side = None
        return StepDraft(tree, side)

    def _window_pays(self, tree_size: int, rows: int) -> bool:
        """Whether side rows ride along with a tree of ``tree_size`` tokens."""
        if self.config.mode != "auto":
            return True
        cost = self._curve()
        # Only where it is nearly free (a GPU, not a CPU): its n-grams rarely repay more.
        return cost(tree_size + rows) <= _WINDOW_OVERHEAD * cost(tree_size)

    def _curve(self) -> CostCurve:
        if self.cost_curve is None:
            raise RuntimeError("mode='auto' plans against a cost curve: call engine.measure_costs() first")
        return self.cost_curve

    def learn(self, tree: DraftTree, accepted_nodes: Sequence[int]) -> None:
        """Record what the model accepted of a verified tree."""
        if len(tree) > 1:
            with self._lock:
                self.acceptance.update(tree, accepted_nodes)
