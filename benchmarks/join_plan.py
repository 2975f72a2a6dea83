"""How a joining prompt is prefilled beside running rows, as the scheduler plans it.

From the default model's measured forward costs (cached on disk, measured once otherwise):
for each number of running rows and draft width, the chunk a join forwards apart between
their steps (the most prompt tokens per second of its forward, up to
``max_tokens_per_forward``) and the width it would ride at inside their steps (the most
prompt tokens per second it adds to theirs; both count as a second too the row's share of a
step that the joining call misses while it prefills), which of the two the scheduler takes, and how
many of the running rows' steps a prompt of ``--prompt`` tokens then spans. Beyond the cost
measurement, one prompt of that size is timed alone, as the scheduler calibrates by the
prompts it forwards: the figures follow the curves and that one forward.

    python benchmarks/join_plan.py --threads 2
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.engine.pricing import Pricing
from rag_lookahead.planning.planner import fused_prefill, separate_prefill
from rag_lookahead.runtime.kv_cache import new_tree_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=800, help="tokens of the joining prompt")
    parser.add_argument(
        "--prompt-ms", type=float, help="milliseconds of that prompt's forward alone (else timed once here)"
    )
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model, config=LookaheadConfig(prefix_cache_mb=0))
    engine.measure_costs()
    limit = engine.config.max_tokens_per_forward
    pricing = Pricing(engine.costs, limit, engine.runner.packs)
    # The scheduler calibrates prompts' chunks by the prompts it forwards alone: one here.
    vocab = min(1000, int(engine.model.config.vocab_size))  # (a tiny model's is smaller)
    prompt = torch.tensor([[(7 * i + 3) % vocab for i in range(args.prompt)]])
    started = time.perf_counter()
    engine.runner.forward(prompt, new_tree_cache(), last_only=True)
    seconds = time.perf_counter() - started if args.prompt_ms is None else args.prompt_ms / 1000
    pricing.observe_prompt(args.prompt, seconds)
    cost, alone = pricing.step_seconds, pricing.prefill_seconds
    chunks = math.ceil(args.prompt / limit)
    print(f"before: {chunks} chunks of {limit} apart, each a {1000 * alone(limit):.0f} ms wait")
    print(
        "rows | width | step ms | apart: chunk, wait ms, tok/ms"
        " | inside: width, added ms, tok/ms | taken | steps"
    )
    for rows in range(1, engine.config.max_batch_size):
        for width in (1, 2, 4):
            base = cost(rows, width)
            missed = base / rows  # a row's share of the step, which the joining call misses
            apart = separate_prefill(args.prompt, alone, limit, missed)
            inside = fused_prefill([args.prompt], rows, width, cost, limit, missed)
            fused = inside.rate > apart.rate
            chunk = inside.tokens if fused else apart.tokens
            added = cost(rows + 1, inside.tokens) - base
            print(
                f"{rows} | {width} | {1000 * base:.0f} | {apart.tokens}, {1000 * alone(apart.tokens):.0f}, "
                f"{apart.rate / 1000:.2f} | {inside.tokens}, {1000 * added:.0f}, {inside.rate / 1000:.2f} | "
                f"{'inside' if fused else 'apart'} | {math.ceil(args.prompt / chunk)}"
            )


if __name__ == "__main__":
    main()
