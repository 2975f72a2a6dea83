"""A fresh process's first 8-client phase, with glibc's defaults and with freed memory retained.

    python benchmarks/retained_memory.py --data dolly_context_qa.jsonl --rounds 3

Each round starts one process per way, alternating (``default``: glibc as it comes;
``retained``: `retain_freed_memory` before the engine loads and `reserve_heap` of the
working set after, as ``rag-lookahead serve`` does on CPU). Each process loads the engine (its
cost curves from the disk cache), answers a short warm-up prompt, then ``--limit`` prompts
(each record's question about its own context, as `benchmarks/vllm_peer.py` formats them),
``--clients`` clients at once, lookahead in process: the phase a freshly started server meets
first. Per process: tokens/s, the seconds its prompts' chunks took in forwards apart (the same
tokens every time), the page faults it took and the time the machine's cores were stolen by the
host (``/proc/stat``: a VM's host mapping pages in counts there), and the answers, which must be
the same both ways. Writes ``--out`` (JSON) and prints a table. Run it on an otherwise idle
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from retrieval_build import cpu_name

WAYS = ("default", "retained")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a JSONL set (question, context)")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: none)")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one process's run
    args = parser.parse_args()
    if args.way is not None:
        print(json.dumps(_phase(args)))
        return
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            command = [sys.executable, __file__, *sys.argv[1:], "--way", way]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(way, {k: v for k, v in runs[way][-1].items() if k != "texts"}, flush=True)
    same = all(run["texts"] == runs["default"][0]["texts"] for way in WAYS for run in runs[way])
    print(_table(runs, same))
    if args.out is not None:
        settings = {k: v for k, v in vars(args).items() if k not in ("way", "out")}
        header = {"benchmark": "retained_memory", **settings, "data": Path(args.data).name}
        summary = {"cpu": cpu_name(), "cpus": os.cpu_count(), "identical_answers": same, "runs": runs}
        args.out.write_text(json.dumps(header | summary, indent=1, default=str) + "\n")


def _phase(args: argparse.Namespace) -> dict[str, Any]:
    """This process's run, one way."""
    from rag_lookahead.runtime.memory import reserve_heap, retain_freed_memory, working_set_bytes

    retained = args.way == "retained" and retain_freed_memory()  # before the model's thread starts
    import torch
    import vllm_peer  # (beside this script)

    from rag_lookahead import LookaheadEngine

    torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model)
    engine.measure_costs()
    if retained:
        reserve_heap(working_set_bytes(engine.model, args.clients, engine.config.prefix_cache_mb << 20))
    prompts = vllm_peer.prompts_of(engine.tokenizer, Path(args.data), args.limit)
    ask = vllm_peer.asker(engine, args.max_new_tokens)
    ask(engine.tokenizer(vllm_peer.WARM_UP).input_ids, vllm_peer.Request())
    faults, stolen = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, _stolen()
    run = vllm_peer.timed(ask, prompts, vllm_peer.Phase("concurrent", args.clients), 0)
    return {
        "tokens_per_s": run["tokens_per_s"],
        "wall_seconds": run["wall_seconds"],
        "prompt_seconds": round(engine.scheduler.prompt_forwards.seconds, 3),
        "prompt_tokens": engine.scheduler.prompt_forwards.tokens,
        "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
        "stolen_seconds": round(_stolen() - stolen, 3),
        "p50_ttft_s": run["p50_ttft_s"],
        "texts": run["texts"],
    }


def _stolen() -> float:
    """The machine's stolen CPU seconds so far (all cores)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def _table(runs: dict[str, list[dict[str, Any]]], same: bool) -> str:
    keys = ("tokens_per_s", "prompt_seconds", "page_faults", "stolen_seconds", "p50_ttft_s")
    lines = [f"| median of {len(runs['default'])} | " + " | ".join(WAYS) + " |", "|---|---:|---:|"]
    for key in keys:
        cells = [f"{statistics.median(r[key] for r in runs[way]):g}" for way in WAYS]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append(f"| answers identical | {'yes' if same else 'NO'} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
