"""A long prompt that starts alone, and the calls that arrive while it prefills: two trees of
the code alternated, each measurement a fresh process.

    git archive <before> | tar -x -C /tmp/before
    python benchmarks/lone_prompt.py --data dolly_context_qa.jsonl --before /tmp/before \\
        --out lone-prompt.json

Each process sets up as ``rag-lookahead serve`` does on a CPU (freed memory retained, the
working set reserved), loads the engine (its cost curves from the disk cache) and, on engines
that share the model but not their prefix caches, each after a short warm-up prompt:

- ``wave``: the first ``--clients`` prompts (each record's question about its own context, as
  `benchmarks/vllm_peer.py` formats them), the longest sent first and the others ``--lead``
  seconds later, all at once: what 8 clients starting together meet when the long one happens
  to come first. Each call's time to first token.
- ``alone``: the same longest prompt answered alone, ``--repeats`` times, each on an engine of
  its own (its prompt not cached): what chunking costs a caller nobody shares the model with.
  Time to first token and seconds per answer.

Every answer must be the same in both trees. Writes ``--out`` (JSON) and prints a table. Run it
on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from retrieval_build import cpu_name
from tables import lone_prompt_medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a JSONL set (question, context)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--lead", type=float, default=0.05, help="seconds the longest prompt leads by")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="lone answers per process")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="the other tree (its root); without it, this one alone")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: none)")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one process's run
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_process(args)))
        return
    trees = {"after": Path(__file__).resolve().parents[1]}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, root in trees.items():  # alternated: a change in load meets both
            env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
            command = [sys.executable, __file__, *sys.argv[1:], "--child"]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, {k: v for k, v in runs[name][-1].items() if k != "texts"}, flush=True)
    first = next(iter(runs.values()))[0]["texts"]
    same = all(run["texts"] == first for name in trees for run in runs[name])
    print(lone_prompt_medians(runs, same))
    if args.out is not None:
        settings = {k: v for k, v in vars(args).items() if k not in ("child", "out", "before")}
        header = {"benchmark": "lone_prompt", **settings, "data": Path(args.data).name}
        summary = {"cpu": cpu_name(), "cpus": os.cpu_count(), "identical_answers": same, "runs": runs}
        args.out.write_text(json.dumps(header | summary, indent=1, default=str) + "\n")


def _process(args: argparse.Namespace) -> dict[str, Any]:
    """This process's run: the wave, then the lone answers."""
    from rag_lookahead.runtime.memory import retain_freed_memory

    retain_freed_memory()  # before the model's thread starts
    import torch
    import vllm_peer  # (beside this script)

    from rag_lookahead.bench.run import fresh_engine

    torch.set_num_threads(args.threads)
    loaded = vllm_peer.loaded_engine(args.clients, args.model)
    prompts = vllm_peer.prompts_of(loaded.tokenizer, Path(args.data), args.clients)
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    warm = loaded.tokenizer(vllm_peer.WARM_UP).input_ids

    def fresh() -> Any:  # an engine of its own prefix cache and trie, over the same model
        engine = fresh_engine(loaded, loaded.config)  # its costs read back from the disk cache
        ask = vllm_peer.asker(engine, args.max_new_tokens)
        ask(warm, vllm_peer.Request())
        return ask

    wave = _wave(fresh(), prompts, longest, args.lead)
    alone = []
    for _ in range(args.repeats):
        ask = fresh()
        request = vllm_peer.Request(sent=time.perf_counter())
        ask(prompts[longest], request)
        alone.append(request)
    return {
        "prompt_tokens": [len(p) for p in prompts],
        "longest": longest,
        "wave_ttft_s": [round(r.first_chunk - r.sent, 3) for r in wave],
        "wave_seconds": round(max(r.done for r in wave) - min(r.sent for r in wave), 3),
        "alone_ttft_s": [round(r.first_chunk - r.sent, 3) for r in alone],
        "alone_seconds": [round(r.done - r.sent, 3) for r in alone],
        "texts": [r.text for r in wave] + [r.text for r in alone],
    }


def _wave(ask: Any, prompts: list[list[int]], longest: int, lead: float) -> list[Any]:
    """Every prompt answered from a thread of its own, the longest ``lead`` seconds first."""
    import vllm_peer

    requests = [vllm_peer.Request() for _ in prompts]

    def client(i: int) -> None:
        requests[i].sent = time.perf_counter()
        ask(prompts[i], requests[i])

    threads = [threading.Thread(target=client, args=(longest,))]
    threads[0].start()
    time.sleep(lead)
    threads += [threading.Thread(target=client, args=(i,)) for i in range(len(prompts)) if i != longest]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    return requests


if __name__ == "__main__":
    main()
