"""The prefill of a process's first long prompt against its later ones, for two trees of the
code alternated (each measurement a fresh process: the C allocator's state is per process).

Each process builds an engine without drafts (``mode="off"``, no prefix cache), asks a short
warm-up question (as `vllm_peer.py` does), then the longest context of the first ``--limit`` records of
``--data`` ``--repeats`` times (as `rag-lookahead bench` asks it: `rag_messages`), one token
each; the figures are each call's prefill seconds.

    python benchmarks/first_long_prompt.py --data dolly_context_qa.jsonl --before /tmp/before \\
        --json first-long-prompt.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def _prefills(data: Path, limit: int, repeats: int, model: str | None) -> dict[str, Any]:
    """In this process: the long prompt's prefill seconds, call after call."""
    from rag_lookahead import LookaheadConfig, LookaheadEngine, rag_messages
    from rag_lookahead.bench.run import load_records

    engine = LookaheadEngine.from_pretrained(model, config=LookaheadConfig(mode="off", prefix_cache_mb=0))
    record = max(load_records(data, limit), key=lambda r: len(r["context"]))
    longest = rag_messages(record["question"], record["context"])
    "".join(engine.stream("The weather today is", max_new_tokens=1))  # the warm-up
    seconds, tokens = [], 0
    for _ in range(repeats):
        stream = engine.stream(longest, max_new_tokens=1)
        "".join(stream)
        seconds.append(round(stream.stats.prefill_seconds, 3))
        tokens = stream.stats.prompt_tokens
    return {"prompt_tokens": tokens, "prefill_seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a JSONL set with context and question")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="the other tree (its root); without it, this one alone")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_prefills(args.data, args.limit, args.repeats, args.model)))
        return
    trees = {"after": Path(__file__).resolve().parents[1]}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, root in trees.items():  # alternated: a change in load meets both
            env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
            child = [sys.executable, __file__, "--child", "--data", str(args.data)]
            child += ["--limit", str(args.limit), "--repeats", str(args.repeats)]
            child += ["--model", args.model] if args.model else []
            out = subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"{name:<7} prefill seconds, call after call: {runs[name][-1]['prefill_seconds']}")
    if args.json:
        summary = {"data": args.data.name, "records": args.limit, "runs": runs}
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
