"""The runner's forward of the built-in model, direct (`rag_lookahead.runtime.direct`) against
the model's own, by the tokens fed after a prefilled context, timed in the model's thread.

Two runners over one loaded model, one with ``direct=True``, one without, each over its own
copy of the same prefilled cache; for each context and width, rounds alternate the two (a
change in load meets both), each round the median of ``--reps`` forwards of a chain of
``width`` tokens (the cache cropped back after each). Every forward runs where the engine's
run: in the model's thread (`ModelThread`), on the linear kernels the engine chose. The logits
of the two are compared too (``identical``: bit for bit).

    python benchmarks/direct_forward.py --json benchmarks/direct-forward-epyc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.tuning import ModelTuning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="256,1024", help="cached tokens before the timed forward")
    parser.add_argument("--widths", default="1,4,16", help="tokens fed per timed forward (a chain)")
    parser.add_argument("--reps", type=int, default=15, help="timed forwards per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    engine = LookaheadEngine.from_pretrained(args.model)
    thread = engine.runner.thread
    thread.call(lambda: torch.set_num_threads(args.threads))
    runners = {
        "direct": ModelTuning(engine.model, engine.config.cpu_linear, thread=thread).runner,
        "model": ModelTuning(engine.model, engine.config.cpu_linear, False, thread=thread).runner,
    }
    assert runners["direct"].direct is not None, "the built-in model runs directly"
    rows = []
    for context in map(int, args.contexts.split(",")):
        for width in map(int, args.widths.split(",")):
            rows.append(thread.call(lambda c=context, w=width: _timed(runners, c, w, args.reps, args.rounds)))
            row = rows[-1]
            print(
                f"context {row['context']:>5}  width {row['width']:>3}  "
                f"direct {statistics.mean(row['direct_ms']):6.2f} ms  "
                f"model {statistics.mean(row['model_ms']):6.2f} ms  identical {row['identical']}"
            )
    summary = {
        "benchmark": "direct_forward",
        "threads": args.threads,
        "linear": str(runners["direct"].linear),
        "reps": args.reps,
        "rounds": args.rounds,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(json.dumps(summary, indent=2) + "\n")


def _timed(
    runners: dict[str, ModelRunner], context: int, width: int, reps: int, rounds: int
) -> dict[str, Any]:
    """Per runner, each round's median milliseconds of a forward of ``width`` chained tokens
    after ``context`` cached ones; and whether their logits were identical."""
    vocab = int(next(iter(runners.values())).model.config.vocab_size)
    prompt = torch.tensor([[(31 * i + 7) % vocab for i in range(context)]])
    tree = StepDraft(
        DraftTree(tuple((13 * i + 5) % vocab for i in range(width)), tuple(range(-1, width - 1)))
    )
    caches = {
        name: runner.forward(prompt, new_tree_cache(), last_only=True)[1] for name, runner in runners.items()
    }
    logits = {}
    figures: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            seconds = []
            for _ in range(reps):
                started = time.perf_counter()
                logits[name], _ = runner.forward_step(tree, caches[name], context)
                seconds.append(time.perf_counter() - started)
                caches[name].crop(-width)
            figures[name].append(round(1000 * statistics.median(seconds), 2))
    identical = torch.equal(logits["direct"], logits["model"])
    return {
        "context": context,
        "width": width,
        **{f"{n}_ms": f for n, f in figures.items()},
        "identical": identical,
    }


if __name__ == "__main__":
    main()
