"""Forward and host costs behind the batching and first-time-question notes.

Prints, for the default model: a batched step's milliseconds by rows (1, 2, 4, 8; ~700 to 1,000
tokens of context each) and tokens per row (1, 2, 4), each cell the least of ``--rounds``
timings taken in turn over the whole grid; the one-off tree probe; and the time to build a
call's drafter (its prompt into the trie) for the first dolly prompts.

    python benchmarks/step_costs.py --data dolly_context_qa.jsonl
    python benchmarks/step_costs.py --data dolly_context_qa.jsonl --rows 1,8 \
        --widths 1,2,3,4,6,8,12,16 --grid-only --json grid.json

``--json`` writes the grid (rows by tokens per row, milliseconds) in the form the batch replay
reads (``python benchmarks/replay.py batch ... --grid grid.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.run import gold_inputs, load_records
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.compose import call_drafter
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.tuning.probes import tree_support_problem


def median_ms(run: Callable[[], object], repeats: int = 7) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 1)


def step_ms(engine: LookaheadEngine, batch: BatchCache, width: int) -> float:
    """Milliseconds of one step of ``width`` chained tokens per row (nothing kept)."""
    runner, rows = engine.runner, batch.rows
    ids = tuple(5 + n % (engine.vocab_size - 5) for n in range(width))
    draft = StepDraft(DraftTree(ids, tuple(range(-1, width - 1))))
    start = time.perf_counter()
    if rows == 1:
        runner.forward_step(draft, batch.cache, batch.lengths[0])
        batch.cache.crop(-width)
    else:
        batch.prepare()
        inputs = batch_inputs([draft] * rows, batch.lengths, runner.device, torch.float32)
        runner.forward_batch(inputs, batch.cache, batch.lengths)
    return 1000 * (time.perf_counter() - start)


def batch_grid(
    engine: LookaheadEngine,
    widths: tuple[int, ...],
    row_counts: tuple[int, ...],
    rounds: int = 7,
    context: int = 850,
) -> list[list[float]]:
    """Milliseconds of a step by rows (``row_counts``) and tokens per row (``widths``): each
    cell the least of ``rounds`` timings, the rounds going over every cell in turn (as
    `measure_curve` does: other work only adds time, and a burst of it hits one timing of a
    cell rather than all of them). One row holds ``context`` cached tokens, several rows 150
    fewer to 150 more each."""
    rng = random.Random(0)
    vocab = min(1000, engine.vocab_size)  # (a tiny model's is smaller)
    batches = []
    for rows in row_counts:
        batch = BatchCache()
        for row in range(rows):
            length = rng.randint(max(context - 150, 1), context + 150) if rows > 1 else context
            prompt = torch.tensor([[(7 * j + row) % vocab for j in range(length)]])
            cache = new_tree_cache()
            engine.runner.forward(prompt, cache, last_only=True)
            batch.add_row(cache)
        batches.append(batch)
    least = [[math.inf] * len(widths) for _ in row_counts]
    for round_ in range(rounds + 1):  # the first: a warm-up of every shape
        for cells, batch in zip(least, batches, strict=True):
            for i, width in enumerate(widths):
                ms = step_ms(engine, batch, width)
                cells[i] = min(cells[i], ms) if round_ else cells[i]
    grid = [[round(ms, 1) for ms in cells] for cells in least]
    for rows, cells in zip(row_counts, grid, strict=True):
        print(f"{rows} rows: {', '.join(map(str, widths))} tokens per row: {cells} ms", flush=True)
    return grid


def grid_json(
    engine: LookaheadEngine,
    widths: tuple[int, ...],
    rows: tuple[int, ...],
    ms: list[list[float]],
    rounds: int,
    context: int = 850,
) -> dict[str, object]:
    """The grid as `benchmarks/batch_replay.py.load_grid` reads it, with its settings."""
    return {
        "format": "rag-lookahead-step-grid",
        "model": str(getattr(engine.model.config, "_name_or_path", "")),
        "device": str(engine.device),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "context": f"one row: {context:,} tokens; several rows: "
        f"{max(context - 150, 1):,} to {context + 150:,} tokens each",
        "cell": f"the least of {rounds} timings, taken in turn over the grid",
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": list(rows),
        "widths": list(widths),
        "ms": ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--widths", default="1,2,4", help="tokens per row, comma-separated")
    parser.add_argument("--rows", default="1,2,4,8", help="rows of the batch, comma-separated")
    parser.add_argument("--grid-only", action="store_true", help="only the rows-by-width grid")
    parser.add_argument("--json", type=Path, help="also write the grid here, for the batch replay")
    parser.add_argument("--rounds", type=int, default=7, help="timings of each cell (its least is kept)")
    parser.add_argument(
        "--context", type=int, default=850, help="cached tokens of one row (several: 150 fewer to 150 more)"
    )
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model, config=LookaheadConfig(prefix_cache_mb=0))
    widths, rows = _numbers(args.widths), _numbers(args.rows)
    ms = batch_grid(engine, widths, rows, args.rounds, args.context)
    if args.json is not None:
        grid = grid_json(engine, widths, rows, ms, args.rounds, args.context)
        args.json.write_text(json.dumps(grid, indent=1) + "\n")
    if args.grid_only:
        return
    runner = engine.runner
    probe = median_ms(
        lambda: tree_support_problem(engine.model, runner.cache_arg, runner.layer_masks), repeats=5
    )
    print(f"tree probe: {probe} ms")
    inputs = gold_inputs(engine, load_records(args.data, 12))
    drafters = [median_ms(_drafter_made(engine, list(item.prompt_ids)), 3) for item in inputs]
    tokens = statistics.median(len(item.prompt_ids) for item in inputs)
    print(f"drafter creation: {statistics.median(drafters)} ms (median prompt {tokens} tokens)")


def _drafter_made(engine: LookaheadEngine, prompt: list[int]) -> Callable[[], None]:
    """Make (and close) the drafter of a call of ``prompt``: its prompt into the trie and out."""
    config, trie, vocab = engine.config, engine.trie, engine.vocab_size
    return lambda: call_drafter(config, trie, [prompt], None, None, None, vocab_size=vocab).close()


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


if __name__ == "__main__":
    main()
