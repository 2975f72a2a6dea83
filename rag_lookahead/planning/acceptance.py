"""What the model accepts of each kind of draft: calibrated estimates, learned, kept on disk.

A drafter gives each node an estimate that the model picks its token once it picked the
parent's. What the model really accepts differs by source (a document branch after a one-token
match, an output branch after three ...), so the estimates are calibrated from outcomes. The
statistics of one model carry across calls, and across processes through a small versioned JSON
file (`save_acceptance`, `load_acceptance`), so that a fresh engine does not start from a guess.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_lookahead.decoding.tree import MAX_SOURCE_LENGTH, PREDICTION_LABEL, DraftTree
from rag_lookahead.files import keep_cache, read_json_object

__all__ = ["AcceptanceModel", "load_acceptance", "save_acceptance"]

FORMAT = "rag-lookahead-acceptance"
VERSION = 1
_BUCKETS = 10
_MAX_BUCKETS = 10_000  # far beyond any real table: a hostile file cannot make it huge
# The most sources a table learns (each keeps up to a bucket per level and decile, and a scale
# per level), so that what it saves always loads again: a caller's drafter may name a new source
# at every step, and past this its new sources lean on the priors alone.
_MAX_SOURCES = _MAX_BUCKETS // (2 * (_BUCKETS + 1))


class AcceptanceModel:
    """Calibrates drafter estimates from what the model actually accepted.

    A node's chance, given that its parent was accepted, is kept per bucket: source, first level
    or deeper, and estimate decile. A bucket with little evidence leans on its source's *scale*
    (accepted over estimated, pooled over all its deciles), and a scale with little evidence on
    ``prior_scale``; each prior is worth ``prior_weight`` observations. Evidence from any decile
    of a source thus moves all of them, and a fresh engine learns quickly what a source's drafts
    are worth. Counts halve once a bucket (or scale) has seen ``horizon`` nodes, so they follow a
    changing workload. A bucket judged not worth drafting would never be tried again, so every
    ``explore_every``-th plan verifies at least its most likely node (`explore`).

    A call's prediction is text its caller expects the answer to copy: its sources
    (``PREDICTION_LABEL``) start from ``prediction_scale`` instead, so that its drafts are
    verified deep from its first steps, where documents' would be trusted only once learned;
    what the model accepts of them corrects it as fast as any other source's.
    """

    def __init__(
        self,
        prior_weight: float = 4.0,
        prior_scale: float = 0.5,
        horizon: float = 400.0,
        explore_every: int = 32,
        prediction_scale: float = 0.9,
    ) -> None:
        self.prior_weight = prior_weight
        self.prior_scale = prior_scale
        self.prediction_scale = prediction_scale
        self.horizon = horizon
        self.explore_every = explore_every
        self.observations = 0  # nodes recorded so far
        self._plans = 0
        self._seen: defaultdict[tuple[str, bool, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._scales: defaultdict[tuple[str, bool], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self._sources: set[str] = set()

    @staticmethod
    def _key(source: str, first_level: bool, estimate: float) -> tuple[str, bool, int]:
        return source, first_level, min(int(estimate * _BUCKETS), _BUCKETS - 1)

    def scale(self, source: str, first_level: bool) -> float:
        """Accepted over estimated for ``source``'s nodes at this level, with the prior."""
        accepted, estimated, _ = self._scales.get((source, first_level), (0.0, 0.0, 0.0))
        prior = self.prediction_scale if source.startswith(PREDICTION_LABEL) else self.prior_scale
        return (accepted + self.prior_weight * prior) / (estimated + self.prior_weight)

    def probability(self, source: str, first_level: bool, estimate: float) -> float:
        """Calibrated chance that a node is accepted given that its parent was."""
        accepted, tried = self._seen.get(self._key(source, first_level, estimate), (0.0, 0.0))
        prior = min(1.0, self.scale(source, first_level) * estimate)
        return (accepted + self.prior_weight * prior) / (tried + self.prior_weight)

    def explore(self) -> bool:
        """Whether this plan should verify at least one node (a periodic exploration)."""
        self._plans += 1
        return self._plans % self.explore_every == 0

    def update(self, tree: DraftTree, accepted_nodes: Sequence[int]) -> None:
        """Record the outcome of verifying ``tree``: every node whose parent was accepted was tried."""
        on_path = set(accepted_nodes)
        for node in range(1, len(tree)):
            parent = tree.parents[node]
            if parent not in on_path:
                continue
            source, estimate, hit = tree.sources[node], tree.estimates[node], node in on_path
            if not self._learns(source):
                continue
            _add(self._seen[self._key(source, parent == 0, estimate)], (hit, 1.0), self.horizon)
            _add(self._scales[(source, parent == 0)], (hit, estimate, 1.0), self.horizon)
            self.observations += 1

    def _learns(self, source: str) -> bool:
        """Whether ``source``'s outcomes are counted: a source already known, or a new one
        while fewer than ``_MAX_SOURCES`` are."""
        if source in self._sources:
            return True
        if len(self._sources) >= _MAX_SOURCES:
            return False
        self._sources.add(source)
        return True

    # ------------------------------------------------------------------ state

    def state(self) -> dict[str, Any]:
        """The learned counts as plain JSON values (see `load_state`)."""
        return {
            "buckets": [[s, f, d, a, t] for (s, f, d), (a, t) in sorted(self._seen.items())],
            "scales": [[s, f, a, e, t] for (s, f), (a, e, t) in sorted(self._scales.items())],
        }

    def load_state(self, state: Any) -> None:
        """Take the counts of `state` (validated: a bad table raises ``ValueError``)."""
        if not isinstance(state, dict) or set(state) != {"buckets", "scales"}:
            raise ValueError("an acceptance table needs exactly 'buckets' and 'scales'")
        buckets, scales = state["buckets"], state["scales"]
        if not isinstance(buckets, list) or not isinstance(scales, list):
            raise ValueError("'buckets' and 'scales' must be lists")
        if len(buckets) + len(scales) > _MAX_BUCKETS:
            raise ValueError(f"an acceptance table holds at most {_MAX_BUCKETS} entries")
        seen: dict[tuple[str, bool, int], list[float]] = {}
        for row in buckets:
            source, first, decile, *counts = _row(row, 5)
            if not (isinstance(decile, int) and not isinstance(decile, bool) and 0 <= decile < _BUCKETS):
                raise ValueError(f"a bucket's decile must be an integer from 0 to {_BUCKETS - 1}")
            seen[(source, first, decile)] = _counts(counts)
        pooled: dict[tuple[str, bool], list[float]] = {}
        for row in scales:
            source, first, *counts = _row(row, 5)
            pooled[(source, first)] = _counts(counts)
        sources = {source for source, _ in pooled} | {source for source, _, _ in seen}
        if len(sources) > _MAX_SOURCES:
            raise ValueError(f"an acceptance table holds at most {_MAX_SOURCES} sources")
        self._seen.clear()
        self._seen.update(seen)
        self._scales.clear()
        self._scales.update(pooled)
        self._sources = sources


def _add(counts: list[float], values: tuple[float, ...], horizon: float) -> None:
    for i, value in enumerate(values):
        counts[i] += value
    if counts[-1] >= horizon:
        counts[:] = [c / 2 for c in counts]


def _row(row: Any, length: int) -> list[Any]:
    if not isinstance(row, list) or len(row) != length:
        raise ValueError(f"each acceptance entry is a list of {length} values")
    source, first = row[0], row[1]
    if not isinstance(source, str) or not 0 < len(source) <= MAX_SOURCE_LENGTH or not isinstance(first, bool):
        raise ValueError("an acceptance entry starts with a source name and a first-level flag")
    return row


def _counts(values: list[Any]) -> list[float]:
    """Counts whose first (accepted) is at most their last (tried)."""
    if any(
        isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
        for v in values
    ):
        raise ValueError("acceptance counts must be finite non-negative numbers")
    if values[0] > values[-1]:
        raise ValueError("an acceptance entry cannot accept more nodes than it tried")
    return [float(v) for v in values]


def save_acceptance(path: Path, key: dict[str, Any], model: AcceptanceModel) -> None:
    """Write ``model``'s counts for ``key`` (atomically; a failure to write is not an error)."""
    payload = {"format": FORMAT, "version": VERSION, "key": key, **model.state()}
    keep_cache(path, json.dumps(payload), "the next process learns acceptance afresh")


def load_acceptance(path: Path, key: dict[str, Any], model: AcceptanceModel) -> bool:
    """Give ``model`` the counts stored for ``key`` at ``path``; whether there were any.

    A missing file, another key or version is no table; a malformed or unreadable one (a
    folder, not JSON, `read_json_object`) raises ``ValueError`` naming it.
    """
    try:
        data = read_json_object(path)
    except ValueError as err:
        raise ValueError(f"not a readable acceptance table: {err}") from None
    if data is None:
        return False
    if data.get("format") != FORMAT:
        raise ValueError(f"{path} is not an acceptance table")
    if data.get("version") != VERSION or data.get("key") != key:
        return False
    model.load_state({k: v for k, v in data.items() if k in ("buckets", "scales")})
    return True
