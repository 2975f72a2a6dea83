"""The 8-client benchmark with the scheduler's join choice forced: `rag-lookahead bench` as is
(``planned``), with every joining prompt prefilled apart (``apart``), or with the batch priced
as before the floor of `Pricing.step_seconds` (``unfloored``: wide fused steps priced from the
batch curves extrapolated alone). Alternate the variants and compare their batched tok/s.

    python benchmarks/join_choice.py apart bench --data llma_msmarco_rag.jsonl --limit 16 \\
        --max-new-tokens 128 --threads 2 --concurrency 8 --methods batched

After the benchmark it prints the engine's time by the kind of forward, over all its methods'
runs: batched steps of drafts alone (``decode``), batched steps with a prompt's chunk in them
(``fused``), prompt chunks forwarded apart between steps (``apart``), each with the planning
and bookkeeping of its phase, and how many of each ran.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from rag_lookahead.cli import main
from rag_lookahead.engine.pricing import Pricing
from rag_lookahead.engine.request import CallStatus
from rag_lookahead.engine.scheduler import Scheduler

KINDS = ("decode", "fused", "apart")


def _unfloored(self: Pricing, rows: int, width: int) -> float:
    curve, batched = self.costs.curve, self.costs.batched()
    assert curve is not None and batched is not None
    return curve(width) if rows == 1 else batched(rows, width) * self.calibration.factor(rows, width)


def _never(self: Pricing, decode_rows: int, remaining: int) -> bool:
    return False


VARIANTS: dict[str, Callable[[], None]] = {
    "planned": lambda: None,
    "apart": lambda: setattr(Pricing, "should_fuse", _never),
    "unfloored": lambda: setattr(Pricing, "step_seconds", _unfloored),
}


def time_kinds() -> dict[str, list[float]]:
    """Seconds of each phase by kind (`KINDS`), timed from now on, in every engine: a batch
    step is ``fused`` when a row in it still prefills its prompt."""
    spent: dict[str, list[float]] = {kind: [] for kind in KINDS}

    def step_kind(scheduler: Scheduler, calls: list[Any]) -> str:
        return "fused" if any(c.status is CallStatus.PREFILLING for c in calls) else "decode"

    Scheduler._batch_step = _timed(Scheduler._batch_step, spent, step_kind)  # type: ignore[method-assign]
    Scheduler._prefill = _timed(Scheduler._prefill, spent, lambda *_: "apart")  # type: ignore[method-assign]
    return spent


def _timed(
    method: Callable[..., Any], spent: dict[str, list[float]], kind: Callable[..., str]
) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        into, started = spent[kind(*args, **kwargs)], time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - started)

    return timed


if __name__ == "__main__":
    usage = f"usage: join_choice.py {{{','.join(VARIANTS)}}} bench ARGS...\n\n{__doc__}"
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(usage)
        raise SystemExit(0)
    if sys.argv[1] not in VARIANTS:
        raise SystemExit(usage)
    VARIANTS[sys.argv[1]]()
    spent = time_kinds()
    sys.argv = ["rag-lookahead", *sys.argv[2:]]
    code = main()
    kinds = ", ".join(f"{kind} {sum(times):.1f} s ({len(times)})" for kind, times in spent.items())
    print(f"engine time by kind of forward: {kinds}")
    raise SystemExit(code)
