"""What a forward pass costs: measured once per (model, device, dtype, threads), cached on disk.

On a CPU a forward over 8 new tokens costs about twice one over a single token; on a GPU the
curve is nearly flat for dozens of tokens. The draft budget is chosen against this curve.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.decoding.attention import attention_used
from rag_lookahead.files import atomic_write, exclusive

__all__ = [
    "BatchCosts",
    "Calibration",
    "CostCurve",
    "CostModel",
    "CurveCheck",
    "cached_curve",
    "curve_key",
    "measure_curve",
    "model_digest",
    "settled",
]

FORMAT = "rag-lookahead-costs"
VERSION = 3  # 1: sparse sizes, forced non-decreasing; 2: medians of three, kept however spread
MAX_AGE_SECONDS = 30 * 24 * 3600


@dataclass(frozen=True)
class CostCurve:
    """Forward seconds for ``sizes[i]`` new tokens over a cache, interpolated in between."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds) or self.sizes[0] != 1:
            raise ValueError("a cost curve needs matching sizes and seconds, starting at size 1")
        if list(self.sizes) != sorted(set(self.sizes)) or min(self.seconds) <= 0:
            raise ValueError("cost curve sizes must increase and seconds be positive")

    def __call__(self, tokens: int) -> float:
        """Seconds for a forward over ``tokens`` new tokens (linear beyond the last point)."""
        sizes, secs = self.sizes, self.seconds
        if tokens <= sizes[0]:
            return secs[0]
        for i in range(1, len(sizes)):
            if tokens <= sizes[i]:
                frac = (tokens - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
                return secs[i - 1] + frac * (secs[i] - secs[i - 1])
        slope = (secs[-1] - secs[0]) / max(sizes[-1] - 1, 1)
        return secs[-1] + slope * (tokens - sizes[-1])

    @classmethod
    def flat(cls) -> CostCurve:
        """Every size costs the same: drafting is free (an idle GPU, roughly)."""
        return cls((1,), (1.0,))


@dataclass(frozen=True)
class BatchCosts:
    """Forward seconds of a batch by its width (tokens per row), one curve per number of rows.

    Measured for a few row counts; in between, the two nearest are interpolated. A batched
    forward is not priced by its total tokens: several rows each attend to their own cache,
    and kernels take other paths than for one row (on a CPU a second token per row can cost
    as much as the first).
    """

    curves: tuple[tuple[int, CostCurve], ...]  # (rows, seconds by width), rows increasing

    def __post_init__(self) -> None:
        rows = [n for n, _ in self.curves]
        if not rows or rows != sorted(set(rows)) or rows[0] < 2:
            raise ValueError("batch costs need increasing row counts of at least 2")

    def __call__(self, rows: int, width: int) -> float:
        """Seconds of a forward over ``rows`` rows of ``width`` tokens each."""
        below = [(n, c) for n, c in self.curves if n <= rows] or [self.curves[0]]
        above = [(n, c) for n, c in self.curves if n >= rows] or [self.curves[-1]]
        (low, low_curve), (high, high_curve) = below[-1], above[0]
        if high == low:
            return low_curve(width) * max(rows, 1) / low if rows > high else low_curve(width)
        frac = (rows - low) / (high - low)
        return low_curve(width) + frac * (high_curve(width) - low_curve(width))


@dataclass
class CostModel:
    """The forward costs of one model on its device, kept in one place: the `ModelRunner`
    holds it (measuring writes it), every planner of the model and the scheduler read it, so
    an engine variant made before a measurement plans with it too."""

    curve: CostCurve | None = None  # one row, by new tokens
    batch: BatchCosts | None = None  # several rows, by width
    # Watches a curve read from the disk cache against the forwards really timed (None: a
    # curve measured in this process or given, trusted as it is).
    check: CurveCheck | None = None
    _claim: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def claim_remeasure(self) -> bool:
        """Whether the forwards run so far say the cached curve is wrong, so that it should be
        measured again; true for one caller only (the check ends with it)."""
        with self._claim:
            if self.check is None or not self.check.stale():
                return False
            self.check = None
            return True

    def observe(self, tokens: int, seconds: float) -> None:
        """One forward over ``tokens`` new tokens took ``seconds`` (for `CurveCheck`)."""
        if self.check is not None and self.curve is not None:
            self.check.record(self.curve(tokens), seconds)

    def batched(self) -> Callable[[int, int], float] | None:
        """Seconds of a batched forward by rows and width: as measured, else one row's curve
        over all the batch's tokens (a `Calibration` corrects it), else nothing to plan with."""
        if self.batch is not None:
            return self.batch
        curve = self.curve
        if curve is None:
            return None
        return lambda rows, width: curve(rows * width)


class Calibration:
    """How much batched forwards really cost over what `BatchCosts` says, learned step by step.

    The batch costs were measured at a short context and a few tokens per row (or are missing,
    and a row's curve stands in); real rows hold RAG prompts, and the curve is extrapolated past
    its widths. The ratio observed / predicted is kept per row count and per width class (1,
    2-3, 4-7, 8-15, ... tokens per row: the error grows with the width, so one ratio for every
    width would price wide steps too low and narrow ones too high), smoothed, and multiplies
    the prediction. A cell not seen yet takes the ratio of the nearest seen class, from the
    nearest row count among those: a prompt's chunk widens a step into a class that drafts
    rarely reach, and once one such step was timed, steps as wide over other rows are priced
    from it rather than from narrow ones.
    """

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self._ratios: dict[tuple[int, int], float] = {}

    def factor(self, rows: int, width: int) -> float:
        wanted = width.bit_length()
        ratio = self._ratios.get((rows, wanted))
        if ratio is not None:
            return ratio
        seen = [(abs(c - wanted), -c, abs(n - rows), -n, r) for (n, c), r in self._ratios.items()]
        return min(seen)[-1] if seen else 1.0  # (ties: the wider class, then more rows)

    @staticmethod
    def class_ends(size: int, least: int = 1) -> list[int]:
        """The largest size of every class from ``least``'s up to below ``size``'s, then
        ``size``: within a class one ratio applies, so a price that grows with the size grows
        within it, and its highest over these sizes is the least price for ``size`` that no
        smaller size (from ``least``) exceeds, whatever ratio each class learned."""
        ends = ((1 << k) - 1 for k in range(least.bit_length(), size.bit_length()))
        return [*(end for end in ends if end >= least), size]

    def record(self, rows: int, width: int, predicted: float, observed: float) -> None:
        key, ratio = (rows, width.bit_length()), observed / predicted
        old = self._ratios.get(key)
        self._ratios[key] = ratio if old is None else old + self.weight * (ratio - old)


class CurveCheck:
    """Whether a cached cost curve is too slow for the forwards really run now.

    A curve measured while other work shared the cores is too slow, and often too steep, for
    the quiet machine that reads it back later. Real forwards hold longer contexts than the
    measured ones, so they should cost at least what the curve says: when, over ``samples``
    forwards, even the slower half ran in under ``ratio`` of the curve's time, the curve was
    measured under a load that has gone. Forwards slower than the curve prove nothing (a load
    now, or a long context), so they never call for a measurement: that would measure a load.
    """

    def __init__(self, samples: int = 16, ratio: float = 0.6) -> None:
        if samples < 1 or not 0 < ratio < 1:
            raise ValueError("a curve check needs samples >= 1 and a ratio in (0, 1)")
        self.samples = samples
        self.ratio = ratio
        self._ratios: list[float] = []

    def record(self, predicted: float, observed: float) -> None:
        if len(self._ratios) < self.samples and predicted > 0:
            self._ratios.append(observed / predicted)

    def stale(self) -> bool:
        ratios = sorted(self._ratios)
        return len(ratios) >= self.samples and ratios[len(ratios) // 2] < self.ratio


def measure_curve(
    forward: Callable[[int], float],
    max_tokens: int,
    repeats: int = 3,
    *,
    tolerance: float = 0.1,
    max_rounds: int = 6,
    bar: Any = None,
) -> CostCurve:
    """Time ``forward(k)`` (seconds of one forward over k new tokens) for every k up to ``max_tokens``.

    Every size is measured, and kept as measured even where it is cheaper than a smaller one: on
    a CPU the matrix kernels favour some shapes, and the planner should use those. Rounds run
    over all sizes in turn, and each size keeps the least of its times: other work on the
    machine only ever adds time, so the least is the nearest to the forward's own cost. A size
    whose two least times still differ by more than ``tolerance`` was never timed unhindered
    twice: it is timed again, round after round, up to ``max_rounds`` rounds in all. ``bar``, a
    `tqdm` bar, counts the forwards.
    """
    if repeats < 2 or max_rounds < repeats:
        raise ValueError("measure_curve needs at least 2 repeats and max_rounds >= repeats")
    sizes = range(1, max_tokens + 1)
    if bar is not None:
        bar.total = (repeats + 1) * max_tokens
    for k in sizes:
        forward(k)  # warm-up: allocator and kernel selection for this shape
        _tick(bar)
    runs: list[list[float]] = [[] for _ in sizes]
    timed: Sequence[int] = sizes
    for round_ in range(max_rounds):
        if round_ >= repeats:
            timed = [k for k in sizes if not settled(runs[k - 1], tolerance)]
            if not timed:
                break
            if bar is not None:
                bar.total += len(timed)
        for k in timed:
            runs[k - 1].append(forward(k))
            _tick(bar)
    return CostCurve(tuple(sizes), tuple(min(r) for r in runs))


def settled(times: Sequence[float], tolerance: float) -> bool:
    """Whether the two least of ``times`` agree within ``tolerance`` (relative): the least was
    seen twice, so it is the forward's own cost, not a lucky or a hindered one."""
    if len(times) < 2:
        return False
    first, second = sorted(times)[:2]
    return second <= first * (1 + tolerance)


def _tick(bar: Any) -> None:
    if bar is not None:
        bar.update(1)


def model_digest(model: Any) -> str:
    """A short digest of the model's configuration: what tells one model from another."""
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else ""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def curve_key(model: Any, device: torch.device, max_tokens: int, linear: str) -> dict[str, Any]:
    """What the curve depends on (``linear``: the kernel of its linear layers, `linear_used`);
    a cached curve with another key is stale."""
    import transformers

    return {
        "model": model_digest(model),
        "device": str(device),
        "dtype": str(model.dtype),
        "attention": str(attention_used(model, device)),
        "linear": linear,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "max_tokens": max_tokens,
    }


def cached_curve(
    directory: Path,
    key: dict[str, Any],
    measure: Callable[[], CostCurve],
    *,
    remeasure: bool = False,
    waiting: str | None = None,
) -> CostCurve:
    """The curve stored for ``key`` under ``directory``, measured and stored if missing, stale
    or ``remeasure`` is set; while another process measures it, this one waits for its curve
    (saying ``waiting`` on standard error, if given)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = directory / f"costs-v{VERSION}-{digest}.json"  # another version's file is left alone
    asked = time.time()
    curve = None if remeasure else _read(path, key)
    if curve is not None:
        return curve
    # One process measures, another waiting meanwhile reads its curve: two measuring at once
    # would slow each other's forwards and both keep a curve that is too steep.
    with exclusive(path, waiting):
        # Measured by another process while this one waited (after it asked, if it remeasures).
        curve = _read(path, key, since=asked if remeasure else None)
        if curve is None:
            curve = measure()
            _write(path, key, curve)
    return curve


def _read(path: Path, key: dict[str, Any], since: float | None = None) -> CostCurve | None:
    """The curve at ``path`` if it is for ``key``, fresh, and measured at ``since`` or later."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        measured_at = float(data["measured_at"])
        fresh = time.time() - measured_at < MAX_AGE_SECONDS and (since is None or measured_at >= since)
        if (
            data.get("format") != FORMAT
            or data.get("version") != VERSION
            or data.get("key") != key
            or not fresh
        ):
            return None
        return CostCurve(tuple(int(s) for s in data["sizes"]), tuple(float(s) for s in data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or unreadable: measure again


def _write(path: Path, key: dict[str, Any], curve: CostCurve) -> None:
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "key": key,
        "measured_at": time.time(),
        "sizes": list(curve.sizes),
        "seconds": list(curve.seconds),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(payload, indent=1))
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
