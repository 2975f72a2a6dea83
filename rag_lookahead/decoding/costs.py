"""What a forward pass costs: measured once per (model, device, dtype, threads), cached on disk.

On a CPU a forward over 8 new tokens costs about twice one over a single token; on a GPU the
curve is nearly flat for dozens of tokens. The draft budget is chosen against this curve.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.decoding.attention import attention_used

__all__ = [
    "BatchCosts",
    "Calibration",
    "CostCurve",
    "CostModel",
    "cached_curve",
    "curve_key",
    "measure_curve",
    "model_digest",
]

FORMAT = "rag-lookahead-costs"
VERSION = 2  # 1: sparse sizes, forced non-decreasing
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

    The batch costs were measured at a short context (or are missing, and a row's curve stands
    in); real rows hold RAG prompts, and kernels take other paths once a row has more than one
    token. The ratio observed / predicted is kept per row count and per width class (one token
    per row, or more), smoothed, and multiplies the prediction.
    """

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self._ratios: dict[tuple[int, bool], float] = {}

    def factor(self, rows: int, width: int) -> float:
        return self._ratios.get((rows, width > 1), 1.0)

    def record(self, rows: int, width: int, predicted: float, observed: float) -> None:
        key, ratio = (rows, width > 1), observed / predicted
        old = self._ratios.get(key)
        self._ratios[key] = ratio if old is None else old + self.weight * (ratio - old)


def measure_curve(forward: Callable[[int], float], max_tokens: int, repeats: int = 3) -> CostCurve:
    """Time ``forward(k)`` (seconds of one forward over k new tokens) for every k up to ``max_tokens``.

    Every size is measured, and kept as measured even where it is cheaper than a smaller one: on
    a CPU the matrix kernels favour some shapes, and the planner should use those. Rounds run
    over all sizes in turn, so a passing load slows every size alike, and each size keeps its
    median.
    """
    sizes = range(1, max_tokens + 1)
    for k in sizes:
        forward(k)  # warm-up: allocator and kernel selection for this shape
    runs: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats):
        for k in sizes:
            runs[k - 1].append(forward(k))
    seconds = tuple(sorted(r)[repeats // 2] for r in runs)
    return CostCurve(tuple(sizes), seconds)


def model_digest(model: Any) -> str:
    """A short digest of the model's configuration: what tells one model from another."""
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else ""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def curve_key(model: Any, device: torch.device, max_tokens: int) -> dict[str, Any]:
    """What the curve depends on; a cached curve with another key is stale."""
    import transformers

    return {
        "model": model_digest(model),
        "device": str(device),
        "dtype": str(model.dtype),
        "attention": str(attention_used(model, device)),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "max_tokens": max_tokens,
    }


def cached_curve(directory: Path, key: dict[str, Any], measure: Callable[[], CostCurve]) -> CostCurve:
    """The curve stored for ``key`` under ``directory``, measured and stored if missing or stale."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = directory / f"costs-{digest}.json"
    curve = _read(path, key)
    if curve is None:
        curve = measure()
        _write(path, key, curve)
    return curve


def _read(path: Path, key: dict[str, Any]) -> CostCurve | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fresh = time.time() - float(data["measured_at"]) < MAX_AGE_SECONDS
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
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
