"""Prefix reuse on a run where questions repeat: the same traffic with and without it.

The first ``--questions`` records are asked, then asked again, by ``--clients`` concurrent
clients through the batched engine; once with ``prefix_cache_mb=0`` and once with the cap given.
Both runs draft from the answers given so far (a repeated question drafts from its first
answer either way), so the difference is the prompts' reused KV entries.

    python benchmarks/prefix_reuse.py --data dolly_context_qa.jsonl --json prefix-reuse.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.bench.concurrency import run_concurrency
from rag_lookahead.bench.run import gold_inputs, load_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--cache-mb", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model)
    engine.measure_costs()
    inputs = gold_inputs(engine, load_records(args.data, args.questions))
    repeated = list(inputs) + list(inputs)
    report: dict[str, object] = {"data": args.data.name, "questions": len(inputs), "asked": len(repeated)}
    for cap in (0, args.cache_mb):
        variant = _with_prefix_cache(engine, cap)
        summary = run_concurrency(variant, repeated, args.max_new_tokens, [args.clients], methods=["batched"])
        measures = summary["concurrency"][str(args.clients)]["methods"]["batched"]
        report[f"prefix_cache_mb={cap}"] = measures
        print(f"prefix_cache_mb={cap}: " + ", ".join(f"{k} {v}" for k, v in measures.items()), flush=True)
    off, on = report["prefix_cache_mb=0"], report[f"prefix_cache_mb={args.cache_mb}"]
    assert isinstance(off, dict) and isinstance(on, dict)
    report["speedup"] = round(on["tokens_per_s"] / off["tokens_per_s"], 3)
    report["ttft_ratio"] = round(on["p50_ttft_s"] / off["p50_ttft_s"], 3)
    print(f"end-to-end speedup {report['speedup']}x, p50 TTFT ratio {report['ttft_ratio']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def _with_prefix_cache(engine: LookaheadEngine, cap: int) -> LookaheadEngine:
    """Another engine over ``engine``'s model keeping ``cap`` MB of prompts (the prefix cache is
    set per engine), its costs read back from the cache ``engine`` measured them into."""
    variant = LookaheadEngine(
        engine.model,
        engine.tokenizer,
        replace(engine.config, prefix_cache_mb=cap),
        cache_dir=engine.cache_dir,
        chat_template_kwargs=engine.chat_template_kwargs,
        model_thread=engine.runner.thread,
    )
    variant.measure_costs()
    return variant


if __name__ == "__main__":
    main()
