"""The cost curves a ``mode="auto"`` engine plans with where its batch's steps run on a
`StaticStep` (`rag_lookahead.runtime.static`): each bucket's forward timed, replayed where it
is captured.

A static step pads every forward to its bucket, so what a step costs is its bucket's time,
whatever the step holds: one row's curve is a step function of the width (every width priced
at the time of the bucket it is padded to), the batches' curves a step function of the rows
too. A larger bucket timed cheaper than a smaller one (a kernel shape, a moment of load) is
priced up to it, as `CostCurve` prices a wider size up: the plan must not pad wider to save
time.

Unlike the eager curves (`rag_lookahead.tuning.cost_timing`), these are not kept on disk: a
bucket's time depends on what this process's step is (captured or not, each bucket in its own
graph, its ``max_len``, which attention reads whole, and its ladders), which no other process
shares, and timing it costs a few forwards per bucket, replays on a GPU, nothing to save.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rag_lookahead.planning.costs import BatchCosts, CostCurve, measure_curve
from rag_lookahead.planning.load import watch_load
from rag_lookahead.progress import progress_bar
from rag_lookahead.runtime.static import Bucket, StaticStep

__all__ = ["BucketCosts", "bucket_costs"]


@dataclass(frozen=True)
class BucketCosts:
    """A static step's forward seconds, by bucket and in the cost model's shapes.

    Attributes:
        seconds: Each bucket timed, priced up to every smaller bucket's time (never cheaper
            for more rows or a wider tree).
        one_row: One row's forward by its width, every width from 1 to the widest timed
            bucket's at the time of its bucket (`CostModel.curve`).
        batch: Several rows' forwards by width, one curve per row count from 2 to the most
            rows timed, each that of its bucket's row count (`CostModel.batch`); ``None``
            where only one-row buckets were timed.
    """

    seconds: Mapping[Bucket, float]
    one_row: CostCurve
    batch: BatchCosts | None


def bucket_costs(step: StaticStep, max_rows: int, max_width: int, *, progress: bool) -> BucketCosts:
    """The costs of ``step``'s buckets up to the ones holding ``max_rows`` rows and ``max_width``
    tokens per row (each capped at the step's largest): each bucket's forward over scratch
    columns (`StaticStep.fill_scratch`, its buffers filled inside the time, as a step's are),
    timed after a warm-up until its least time settles (`measure_curve`), with a progress bar
    per row count if ``progress``. Marked ``loaded`` if other work shared the cores meanwhile.
    Between any two steps: nothing but scratch columns is written."""
    if max_rows < 1 or max_width < 1:
        raise ValueError(f"bucket costs need max_rows and max_width >= 1, got {max_rows} and {max_width}")
    buckets = step.buckets
    last = buckets.fit(min(max_rows, buckets.most_rows), min(max_width, buckets.widest))
    ladder = [rows for rows in buckets.rows if rows <= last.rows]
    widths = tuple(width for width in buckets.widths if width <= last.width)
    timed: dict[int, CostCurve] = {}
    with watch_load() as seen:
        for rows in ladder:
            what = f"timing the static step's {rows}-row buckets"
            with progress_bar(progress, what, unit="forward") as bar:
                timed[rows] = measure_curve(_timer(step, rows), last.width, bar=bar, sizes=widths)
    loaded = seen[0].busy or any(curve.loaded for curve in timed.values())
    seconds = _priced_up(timed)
    curves = {rows: _by_width(seconds, rows, step, last.width, loaded) for rows in ladder}
    by_rows = tuple((rows, curves[buckets.fit(rows, 1).rows]) for rows in range(2, last.rows + 1))
    return BucketCosts(seconds, curves[1], BatchCosts(by_rows) if by_rows else None)


def _timer(step: StaticStep, rows: int) -> Callable[[int], float]:
    """Seconds of one forward of bucket (``rows``, width), its buffers filled, once the device
    has done it (a GPU returns once the work is queued)."""

    def seconds(width: int) -> float:
        start = time.perf_counter()
        step.forward(step.fill_scratch(Bucket(rows, width)))
        step.synchronize()
        return time.perf_counter() - start

    return seconds


def _priced_up(timed: Mapping[int, CostCurve]) -> dict[Bucket, float]:
    """Each bucket's time from its row count's curve (already never cheaper for a wider
    bucket), then never cheaper than the bucket as wide with fewer rows."""
    seconds: dict[Bucket, float] = {}
    below: tuple[float, ...] | None = None
    for rows in sorted(timed):
        curve = timed[rows]
        own = curve.seconds if below is None else tuple(map(max, curve.seconds, below))
        seconds.update({Bucket(rows, width): s for width, s in zip(curve.sizes, own, strict=True)})
        below = own
    return seconds


def _by_width(
    seconds: Mapping[Bucket, float], rows: int, step: StaticStep, widest: int, loaded: bool
) -> CostCurve:
    """The curve of ``rows``-row buckets at every width from 1 to ``widest``: a `CostCurve`
    interpolates between its sizes, and a step's cost is constant within its bucket."""
    sizes = tuple(range(1, widest + 1))
    return CostCurve(sizes, tuple(seconds[step.buckets.fit(rows, width)] for width in sizes), loaded)
