"""Padded against ragged rows: one batched step over rows of skewed cache lengths, timed in turn.

Builds a batch whose rows hold the given numbers of cached tokens (by default the 8 dolly rows
that showed the padding: one long row beside short ones) and times a step of each width with
every row attended over the longest row's columns (`padded`) and over its own (`ragged`,
`rag_lookahead.runtime.attention.ragged_rows`), alternated; it also reports the largest logit
difference and whether every row's greedy tokens agree.

    python benchmarks/ragged_rows.py --threads 2
    python benchmarks/ragged_rows.py --lengths 700,750,800,850,900,950,1000,980 --always-split
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime import attention
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import new_tree_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="247,1855,168,190,230,233,207,330", help="cached tokens per row")
    parser.add_argument("--widths", default="1,5,13", help="tokens per row of the step")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--always-split", action="store_true", help="ragged whatever the padding")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained()
    runner, lengths = engine.runner, [int(n) for n in args.lengths.split(",")]
    batch = BatchCache()
    for row, length in enumerate(lengths):
        cache = new_tree_cache()
        runner.forward(
            torch.tensor([[(7 * j + row) % 1000 + 5 for j in range(length)]]), cache, last_only=True
        )
        batch.add_row(cache)
    ragged_waste = 0.0 if args.always_split else attention._SPLIT_WASTE
    for width in (int(w) for w in args.widths.split(",")):
        draft = StepDraft(DraftTree(tuple(range(5, 5 + width)), tuple(range(-1, width - 1))))
        times: dict[str, list[float]] = {"padded": [], "ragged": []}
        logits: dict[str, torch.Tensor] = {}
        for _ in range(args.repeats):
            for variant, waste in (("padded", math.inf), ("ragged", ragged_waste)):
                attention._SPLIT_WASTE = waste
                batch.prepare()
                inputs = batch_inputs([draft] * len(lengths), batch.lengths, runner.device, torch.float32)
                start = time.perf_counter()
                logits[variant] = runner.forward_batch(inputs, batch.cache, batch.lengths)  # [B, T, V]
                times[variant].append(time.perf_counter() - start)
        padded, ragged = (1000 * statistics.median(times[v][2:]) for v in ("padded", "ragged"))
        diff = (logits["padded"] - logits["ragged"]).abs().max().item()
        same = bool((logits["padded"].argmax(-1) == logits["ragged"].argmax(-1)).all())
        print(
            f"width {width}: padded {padded:.1f} ms, ragged {ragged:.1f} ms ({padded / ragged:.2f}x); "
            f"largest logit difference {diff:.1e}, greedy tokens equal: {same}"
        )


if __name__ == "__main__":
    main()
