"""The 8-client benchmark with the scheduler's join choice forced: `rag-lookahead bench` as is
(``planned``), with every joining prompt prefilled apart (``apart``), or with the batch priced
as before the floor of `BatchForward.cost` (``unfloored``: wide fused steps priced from the
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
from rag_lookahead.engine.executor import BatchForward, Cost
from rag_lookahead.engine.scheduler import Scheduler

KINDS = {
    "decode": (BatchForward, "_decode"),
    "fused": (BatchForward, "_fused"),
    "apart": (Scheduler, "_prefill"),
}


def _unfloored(self: BatchForward) -> Cost | None:
    curve, batched = self.runner.costs.curve, self.runner.costs.batched()
    if curve is None or batched is None:
        return None
    return lambda rows, width: (
        curve(width) if rows == 1 else batched(rows, width) * self.calibration.factor(rows, width)
    )


def _never(self: BatchForward, decode_rows: int, remaining: int) -> bool:
    return False


VARIANTS: dict[str, Callable[[], None]] = {
    "planned": lambda: None,
    "apart": lambda: setattr(BatchForward, "fuses", _never),
    "unfloored": lambda: setattr(BatchForward, "cost", _unfloored),
}


def time_kinds() -> dict[str, list[float]]:
    """Seconds of each phase by kind (`KINDS`), timed from now on, in every engine."""
    spent: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for kind, (owner, name) in KINDS.items():
        setattr(owner, name, _timed(getattr(owner, name), spent[kind]))
    return spent


def _timed(method: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
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
