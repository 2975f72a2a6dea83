"""`auto` against greedy on a set, planning by the machine's own cost curve or by round 4's
loaded one (issue 40: timed on an AVX2-only EPYC while other work ran), read back from a cache.

The cost cache is copied into a temporary directory and the engine reads it from there, so the
user's cache is never touched (the check may retire the curve it reads: from the copy). With
``--curve loaded`` the built-in model's single-row curve in the copy (the one this process
reads back) is written over with round 4's shape: one token ``262/108`` of the machine's own
time, then the ratios ``LOADED`` between the sizes given (linear between, the last beyond),
stored as a quiet curve, as that machine's file was. Then ``greedy`` and ``auto`` answer the
records as `rag-lookahead bench --methods greedy,auto` does, and the summary is that command's.

    python benchmarks/loaded_curve.py --data piarena_rag_qa.jsonl --limit 8 --curve own \\
        --json benchmarks/auto-piarena_rag_qa-zen4-quiet.json
    python benchmarks/loaded_curve.py --data piarena_rag_qa.jsonl --limit 8 --curve loaded \\
        --json benchmarks/auto-piarena_rag_qa-zen4-loaded-curve.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import shutil
import tempfile
from pathlib import Path

import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.bench.run import format_table, gold_inputs, load_records, run_benchmark
from rag_lookahead.models import default_cache_dir
from rag_lookahead.planning.costs import CostCurve, cached_curve

# Round 4's loaded curve against one token: (tokens, ratio), and its one token against the
# quiet one's on that machine.
LOADED = ((1, 1.0), (2, 1.40), (8, 0.96), (13, 0.76))
LOADED_LEVEL = 262 / 108


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a JSONL set (question, context)")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--curve", choices=("own", "loaded"), required=True)
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = LookaheadEngine.from_pretrained(args.model)
    loaded.runner.thread.call(lambda: torch.set_num_threads(args.threads))
    own = loaded.measure_costs()  # from the user's cache (measured there if missing)
    with tempfile.TemporaryDirectory(prefix="loaded-curve-") as directory:
        copy = Path(directory)
        shutil.copytree(default_cache_dir() / "costs", copy / "costs")
        if args.curve == "loaded":
            _write_loaded(copy / "costs", own)
        engine = LookaheadEngine(
            loaded.model, loaded.tokenizer, loaded.config, cache_dir=copy, model_thread=loaded.runner.thread
        )
        engine.measure_costs()
        inputs = gold_inputs(engine, load_records(args.data, args.limit))
        summary = run_benchmark(engine, inputs, args.max_new_tokens, ["greedy", "auto"])
    summary |= {"data": args.data.name, "curve": args.curve}
    print(format_table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def _write_loaded(directory: Path, own: CostCurve) -> None:
    """Round 4's shape over the stored single-row curve equal to ``own`` (the one this process
    reads back), as the project's cache writes a curve."""
    for path in directory.glob("costs-*.json"):
        stored = json.loads(path.read_text())
        if "rows" in stored["key"]:
            continue
        if CostCurve(tuple(stored["sizes"]), tuple(stored["seconds"])).seconds == own.seconds:
            seconds = tuple(own.seconds[0] * LOADED_LEVEL * _ratio(n) for n in own.sizes)
            write = functools.partial(CostCurve, own.sizes, seconds)
            cached_curve(directory, stored["key"], write, remeasure=True)
            return
    raise SystemExit("the curve this process read back is not in the cost cache")


def _ratio(tokens: int) -> float:
    """Round 4's loaded cost of ``tokens`` against one token, linear between its sizes (not a
    `CostCurve`: that one is fitted monotone, and this shape is not)."""
    for (low, at_low), (high, at_high) in itertools.pairwise(LOADED):
        if tokens <= high:
            return at_low + (at_high - at_low) * (max(tokens, low) - low) / (high - low)
    return LOADED[-1][1]


if __name__ == "__main__":
    main()
