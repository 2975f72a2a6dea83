"""What ``cpu_linear="auto"`` chooses, timing its classes by the runner's own forwards against
timing the linear layers alone, on a quiet machine and beside bursts of other work.

Per round, in one process: a new runner over a fresh copy of the built-in model (as a new
process loads it: no choice made for it yet) chooses its kernels as the engine does (by its
forwards, `rag_lookahead.tuning.kernel_choice.faster_linear`'s ``forwards``; nothing read from or
written to the disk), then the same choice is made from the layers alone (what every class was
timed by before). Then each kernel's own forwards, a runner on each, alternated: one token and
16 chained tokens after 256 cached (``--context``), and a prompt's 256-token chunk after 512
(the median of ``--reps`` each, per round).
With ``--load``, a second process multiplies 512x512 matrices on one thread in bursts (20
products, then 20 ms asleep) for the whole run, and is stopped at its end.

    python benchmarks/kernel_choice.py --rounds 3 --json benchmarks/kernel-choice-zen4.json
    python benchmarks/kernel_choice.py --rounds 4 --load --json benchmarks/kernel-choice-zen4-loaded-run2.json
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.runtime.kernels import OneDnnLayers
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.tuning import ModelTuning
from rag_lookahead.tuning.kernel_choice import faster_linear
from rag_lookahead.tuning.timers import chain_timer

KERNELS = ("torch", "onednn", "reordered")
# The other work of ``--load``: bounded by the run (stopped at its end) and by a deadline.
BURSTS = (
    "import time, torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(512, 512)\n"
    "end = time.time() + 3600\n"
    "while time.time() < end:\n"
    "    for _ in range(20): a @ a\n"
    "    time.sleep(0.02)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7, help="timed forwards per kernel and round")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--load", action="store_true", help="bursts of other work beside the run")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--context", type=int, default=256, help="cached tokens before a step (the chunk: as many)"
    )
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    engine = LookaheadEngine.from_pretrained(args.model, config=LookaheadConfig(cpu_linear="reordered"))
    thread = engine.runner.thread
    thread.call(lambda: torch.set_num_threads(args.threads))
    other = subprocess.Popen([sys.executable, "-c", BURSTS]) if args.load else None
    try:
        rounds = [thread.call(lambda: _round(engine, args.reps, args.context)) for _ in range(args.rounds)]
    finally:
        if other is not None:
            other.kill()
            other.wait()
    for i, row in enumerate(rounds, 1):
        forwards = "  ".join(f"{k} {v}" for k, v in row["forward_ms"].items())
        print(f"round {i}: by forwards {row['by_forwards']:<22} by layers {row['by_layers']:<22} {forwards}")
    summary = {"benchmark": "kernel_choice", "threads": args.threads, "load": args.load, "rounds": rounds}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(json.dumps(summary, indent=2) + "\n")


def _round(engine: LookaheadEngine, reps: int, context: int) -> dict[str, Any]:
    """One round: both choices, then each kernel's forwards (ms, median of ``reps``)."""
    model = copy.deepcopy(engine.model)  # a model no runner chose for yet, as in a new process
    tuning = ModelTuning(model, "auto", thread=engine.runner.thread)
    by_forwards = tuning.backend.linear_name
    layers = tuning.runner.linear.layers or OneDnnLayers(model)
    by_layers = str(faster_linear(model, reorder=True, layers=layers))
    return {
        "by_forwards": by_forwards,
        "by_layers": by_layers,
        "forward_ms": _forwards(model, engine, reps, context),
    }


def _forwards(model: Any, engine: LookaheadEngine, reps: int, context: int) -> dict[str, dict[str, float]]:
    """Per kernel (a runner on each), the median ms of a step of 1 and of 16 chained tokens
    after ``context`` cached, and of a prompt's chunk of as many after twice as many, the
    kernels alternated rep by rep."""
    vocab = int(model.config.vocab_size)
    prompt = torch.tensor([[(31 * i + 7) % vocab for i in range(2 * context)]])
    chunk = torch.tensor([[(17 * i + 3) % vocab for i in range(context)]])
    timed: dict[str, dict[str, Callable[[], float]]] = {}
    for kernel in KERNELS:
        runner = ModelTuning(model, kernel, thread=engine.runner.thread).runner  # type: ignore[arg-type]
        step = functools.partial(chain_timer(runner, context), runner)
        _, cache = runner.forward(prompt, new_tree_cache(), last_only=True)

        def prefill(runner: ModelRunner = runner, cache: Any = cache) -> float:
            started = time.perf_counter()
            runner.forward(chunk, cache, last_only=True)
            cache.crop(-chunk.shape[1])
            return time.perf_counter() - started

        timed[kernel] = {
            "1 token": lambda step=step: step(1),
            "16 tokens": lambda step=step: step(16),
            f"{context}-token chunk": prefill,
        }
    figures = {kernel: {name: [] for name in runs} for kernel, runs in timed.items()}
    for _ in range(reps):
        for kernel, runs in timed.items():
            for name, run in runs.items():
                figures[kernel][name].append(run())
    return {
        kernel: {name: round(1000 * statistics.median(s), 1) for name, s in by_name.items()}
        for kernel, by_name in figures.items()
    }


if __name__ == "__main__":
    main()
