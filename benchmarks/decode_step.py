"""The engine's plain decoding step by the kernel of its linear layers (`cpu_linear`) and by
its forward (`direct_forward`), the variants alternated in one process.

For each kernel an engine without drafts (``mode="off"``, no prefix cache) over the same loaded
model answers the first ``--limit`` records of ``--data`` (as `rag-lookahead bench` asks them:
`rag_messages`), ``--max-new-tokens`` tokens each with end-of-sequence ignored, so that
every call decodes as many steps; the figure is the mean over the records of the call's
milliseconds per decoded token after its first (the prefill excluded), per round. With
``--forwards direct,model`` each kernel runs both ways: the direct forward and the model's own
(named ``kernel/forward``). Run it once
per tree to compare two versions of the code (``PYTHONPATH=<other tree>``; ``--kernels
onednn`` where the other lacks ``packed``).

    python benchmarks/decode_step.py --data dolly_context_qa.jsonl --json decode-step.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine, rag_messages
from rag_lookahead.bench.run import load_records


def _ms_per_token(engine: LookaheadEngine, records: list[dict[str, str]], tokens: int) -> float:
    """Mean milliseconds per decoded token (after the first) over ``records``."""
    figures = []
    for record in records:
        stream = engine.stream(
            rag_messages(record["question"], record["context"]), max_new_tokens=tokens, eos_token_id=[]
        )
        "".join(stream)
        stats = stream.stats
        figures.append(1000 * (stats.seconds - stats.prefill_seconds) / (stats.new_tokens - 1))
    return statistics.mean(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a JSONL set with context and question")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", default="onednn,reordered,torch", help="cpu_linear values, alternated")
    parser.add_argument("--forwards", default="direct", help="direct and/or model, alternated")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    records = load_records(args.data, args.limit)
    base = LookaheadEngine.from_pretrained(args.model)
    forwards = args.forwards.split(",")
    engines = {
        kernel if len(forwards) == 1 else f"{kernel}/{forward}": LookaheadEngine(
            base.model,
            base.tokenizer,
            LookaheadConfig(
                mode="off",
                cpu_linear=kernel,
                prefix_cache_mb=0,
                # (set only when asked: a tree before the direct forward runs the default)
                **({} if forwards == ["direct"] else {"direct_forward": forward == "direct"}),
            ),
            model_thread=base.runner.thread,
        )
        for kernel in args.kernels.split(",")
        for forward in forwards
    }
    rounds: dict[str, list[float]] = {kernel: [] for kernel in engines}
    _ms_per_token(next(iter(engines.values())), records[:1], 8)  # warm-up
    for _ in range(args.rounds):
        for kernel, engine in engines.items():
            rounds[kernel].append(round(_ms_per_token(engine, records, args.max_new_tokens), 2))
    summary: dict[str, Any] = {
        "data": args.data.name,
        "records": len(records),
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "ms_per_token": rounds,
        "kernels": {kernel: str(engine.runner.linear) for kernel, engine in engines.items()},
        "direct": {
            name: getattr(engine.runner, "direct", None) is not None for name, engine in engines.items()
        },
    }
    for kernel, figures in rounds.items():
        print(f"{kernel:<14} ms per token by round: {figures}  (mean {statistics.mean(figures):.1f})")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
