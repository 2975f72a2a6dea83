"""The 8-client benchmark with the scheduler's join choice forced: `rag-lookahead bench` as is
(``planned``), with every joining prompt prefilled apart (``apart``), or with the batch priced
as before the floor of `BatchForward.cost` (``unfloored``: wide fused steps priced from the
batch curves extrapolated alone). Alternate the variants and compare their batched tok/s.

    python benchmarks/join_choice.py apart bench --data llma_msmarco_rag.jsonl --limit 16 \\
        --max-new-tokens 128 --threads 2 --concurrency 8 --methods batched
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from rag_lookahead.batch_forward import BatchForward, Cost
from rag_lookahead.cli import main


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

if __name__ == "__main__":
    usage = f"usage: join_choice.py {{{','.join(VARIANTS)}}} bench ARGS...\n\n{__doc__}"
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(usage)
        raise SystemExit(0)
    if sys.argv[1] not in VARIANTS:
        raise SystemExit(usage)
    VARIANTS[sys.argv[1]]()
    sys.argv = ["rag-lookahead", *sys.argv[2:]]
    main()
