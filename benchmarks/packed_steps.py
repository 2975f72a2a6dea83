"""Padded against packed: one batched step over 8 rows, timed in turn, by the rows' draft sizes.

Builds a batch whose rows hold the given numbers of cached tokens (by default the 8 dolly rows:
one long row beside short ones) and times a step in which row ``i`` verifies a chain of
``sizes[i]`` tokens, run padded (every row's draft padded to the widest, one batched forward:
`ModelRunner.forward_batch`) and packed (the drafts side by side, unpadded, each row attending
over its own cache: `ModelRunner.forward_packed`), alternated, in the model's thread. It also
reports the largest logit difference between the two and whether every token's greedy choice
agrees.

    python benchmarks/packed_steps.py --threads 2 --json benchmarks/packed-steps-xeon.json
    python benchmarks/packed_steps.py --threads 2 --model gemma3-270m \
        --json benchmarks/packed-steps-gemma3-xeon.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from retrieval_build import cpu_name

from rag_lookahead import LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner

# Draft sizes per row: all plain, all alike, mixed as the plan leaves them, one wide row.
SIZES = ("1,1,1,1,1,1,1,1", "3,3,3,3,3,3,3,3", "1,1,3,2,1,4,1,2", "1,1,1,1,1,1,1,8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="247,1855,168,190,230,233,207,330", help="cached tokens per row")
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), help="draft tokens per row, a step each")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model)
    runner, lengths = engine.runner, [int(n) for n in args.lengths.split(",")]
    if not runner.packs():
        raise SystemExit("this model's steps are not packed on this device (see ModelRunner.packs)")
    steps = [[int(n) for n in sizes.split(",")] for sizes in args.sizes]
    results = runner.thread.call(lambda: [_compare(runner, lengths, s, args.repeats) for s in steps])
    print(f"{'draft sizes':<22} {'padded ms':>10} {'packed ms':>10} {'faster':>7} {'max |diff|':>11} same")
    for result in results:
        sizes = ",".join(map(str, result["sizes"]))
        print(
            f"{sizes:<22} {result['padded_ms']:>10.1f} {result['packed_ms']:>10.1f} "
            f"{result['padded_ms'] / result['packed_ms']:>6.2f}x {result['max_abs_diff']:>11.1e} "
            f"{'yes' if result['same_greedy'] else 'NO'}"
        )
    if args.json:
        meta = {"cpu": cpu_name(), "threads": args.threads}
        model = args.model or "SmolLM2-135M-Instruct"
        record = {**meta, "model": model, "lengths": lengths, "repeats": args.repeats, "steps": results}
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)


def prefilled_rows(runner: ModelRunner, lengths: Sequence[int], packed: bool = True) -> BatchCache:
    """A batch (``packed`` or padded) of rows of ``lengths`` cached tokens (each its own
    made-up prompt)."""
    batch = BatchCache(packed=packed)
    vocab = min(1000, int(runner.model.config.vocab_size) - 5)  # (a tiny model's is smaller)
    for row, length in enumerate(lengths):
        cache = new_tree_cache()
        prompt = torch.tensor([[(7 * j + row) % vocab + 5 for j in range(length)]])
        runner.forward(prompt, cache, last_only=True)
        batch.add_row(cache, expected_rows=len(lengths))
    return batch


def chain(tokens: int, vocab: int = 1 << 30) -> StepDraft:
    """A draft of ``tokens`` tokens in one branch (ids under ``vocab``)."""
    ids = tuple(5 + n % (vocab - 5) for n in range(tokens))
    return StepDraft(DraftTree(ids, tuple(range(-1, tokens - 1))))


def _compare(runner: ModelRunner, lengths: list[int], sizes: list[int], repeats: int) -> dict[str, Any]:
    """One step of ``sizes`` tokens per row over rows of ``lengths``, padded and packed in turn."""
    rows, batch = prefilled_rows(runner, lengths, packed=False), prefilled_rows(runner, lengths)
    drafts = [chain(n) for n in sizes]
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for _ in range(repeats):
        rows.prepare()
        padded = batch_inputs(drafts, rows.lengths, runner.device, torch.float32)
        start = time.perf_counter()
        wide = runner.forward_batch(padded, rows.cache, rows.lengths)  # [B, T, V]
        times["padded"].append(time.perf_counter() - start)
        packed = runner.packed_inputs(drafts, batch.lengths)
        batch.prepare(packed)
        start = time.perf_counter()
        flat = runner.forward_packed(packed, batch.cache, batch.lengths)  # [N, V]
        times["packed"].append(time.perf_counter() - start)
    want = torch.cat([wide[i, :n] for i, n in enumerate(sizes)])  # [N, V]
    return {
        "sizes": sizes,
        "padded_ms": 1000 * statistics.median(times["padded"][2:]),
        "packed_ms": 1000 * statistics.median(times["packed"][2:]),
        "max_abs_diff": (flat - want).abs().max().item(),
        "same_greedy": bool((flat.argmax(-1) == want.argmax(-1)).all()),
    }


if __name__ == "__main__":
    main()
