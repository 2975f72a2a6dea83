"""The forward cost curves a ``mode="auto"`` engine plans with, timed on the engine's own runner
(or read back from the disk cache, `rag_lookahead.planning.costs.cached_curve`): one row's
forwards by their new tokens, and batches of 2, 4, 8, ... rows by their width. What the engine
makes of them (calibration by the steps, the check of a curve read back) is its pricing's
(`rag_lookahead.engine.pricing`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_lookahead.planning.costs import (
    BatchCosts,
    CostCurve,
    cached_curve,
    curve_key,
    forget_curve,
    measure_curve,
    most_forwards,
    sparse_sizes,
)
from rag_lookahead.planning.load import watch_load
from rag_lookahead.progress import progress_bar
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.tuning.timers import batch_timer, chain_timer, context_for

__all__ = ["TimedCurve", "backend_key", "batch_curves", "step_curve"]

# The context a one-row curve's forwards are timed after.
_STEP_CONTEXT = 256
# The context each row of a measured batch holds (a RAG prompt is longer; this keeps it quick).
_BATCH_CONTEXT = 256


@dataclass(frozen=True)
class TimedCurve:
    """One row's forward cost curve, and how it came: measured in this call (``fresh``) or read
    back from the disk, after ``context`` cached tokens; ``forget`` removes it from the disk
    (for the next process to measure its own)."""

    curve: CostCurve
    fresh: bool
    context: int
    forget: Callable[[], bool] = field(compare=False, repr=False)


def backend_key(runner: ModelRunner, max_tokens: int) -> dict[str, Any]:
    """What a curve of ``runner``'s forwards up to ``max_tokens`` depends on (`curve_key`): its
    model, device, and its backend's linear kernels, attention and forward."""
    backend = runner.backend
    return curve_key(
        runner.model, runner.device, max_tokens, backend.linear_name, backend.attention, backend.forward
    )


def step_curve(
    runner: ModelRunner, max_tokens: int, directory: Path, *, remeasure: bool, progress: bool
) -> TimedCurve:
    """Forward seconds of ``runner`` by size up to ``max_tokens``: cached under ``directory``
    (unless ``remeasure``), else measured now (with a progress bar if ``progress``)."""
    context = context_for(runner, _STEP_CONTEXT)
    key = backend_key(runner, max_tokens)
    measured = []

    def measure() -> CostCurve:
        measured.append(True)

        def timer() -> Callable[[int], float]:
            return functools.partial(chain_timer(runner, context), runner)

        return _watched(progress, "measuring forward costs (once)", timer, max_tokens)

    curve = cached_curve(directory, key, measure, remeasure=remeasure, waiting=_waiting(progress))
    return TimedCurve(curve, bool(measured), context, functools.partial(forget_curve, directory, key, curve))


def batch_curves(
    runner: ModelRunner, max_rows: int, max_width: int, directory: Path, *, remeasure: bool, progress: bool
) -> BatchCosts | None:
    """Batched forward seconds of ``runner`` by width for 2, 4, 8, ... rows up to ``max_rows``
    (cached under ``directory`` unless ``remeasure``, else measured now); ``None`` when no
    batch has two rows."""
    curves = []
    rows = 2
    while rows <= max_rows:
        key = {
            **backend_key(runner, max_width),
            "rows": rows,
            "context": _BATCH_CONTEXT,
            "packed": runner.packs(),
        }
        measure = functools.partial(_measure_batch, runner, rows, max_width, progress)
        curve = cached_curve(directory, key, measure, remeasure=remeasure, waiting=_waiting(progress))
        curves.append((rows, curve))
        rows *= 2
    return BatchCosts(tuple(curves)) if curves else None


def _measure_batch(runner: ModelRunner, rows: int, max_width: int, progress: bool) -> CostCurve:
    what = f"measuring costs of {rows}-row batches (once)"
    return _watched(progress, what, functools.partial(batch_timer, runner, rows, _BATCH_CONTEXT), max_width)


def _watched(
    progress: bool, what: str, timer: Callable[[], Callable[[int], float]], max_tokens: int
) -> CostCurve:
    """The curve of the forward ``timer`` makes (its prompts prefilled under the bar) up to
    ``max_tokens``, timed at a few sizes (`sparse_sizes`: the steps' own timings calibrate the
    sizes between, `StepCalibration`), with a progress bar saying ``what``: marked ``loaded``
    if other work shared the cores meanwhile (by the system's load, or by sizes whose times
    never settled), so that the disk keeps it briefly."""
    sizes = sparse_sizes(max_tokens)
    total = most_forwards(len(sizes))
    with watch_load() as seen, progress_bar(progress, what, total=total, unit="forward") as bar:
        curve = measure_curve(timer(), max_tokens, bar=bar, sizes=sizes)
    return dataclasses.replace(curve, loaded=True) if seen[0].busy else curve


def _waiting(progress: bool) -> str | None:
    """What to say while another process measures the same costs (where progress is shown)."""
    return "waiting for another process measuring the same forward costs ..." if progress else None
