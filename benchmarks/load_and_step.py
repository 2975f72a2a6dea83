"""What building an engine costs, and one plain decoding step, for the default model and a tiny
random one: a before/after check for changes to how an engine is put together.

Per model, an engine is built over fresh copies of the loaded model (what a new process loads)
with the kernel choice kept under one directory of this run: the first build chooses the linear
kernels (``cpu_linear="auto"``) and stores the choice, the ``--builds`` later ones read it back
— the construction a process pays on a machine that has run the engine before (``warm``: their
median), and its first call (one token) timed: what a build leaves to it (a probe, say) is paid
there. Then
the warm engine, decoding plainly (``mode="off"``), answers one prompt ``--rounds`` times,
``--max-new-tokens`` tokens each with end-of-sequence ignored; the step time is the median
over the rounds of the seconds per decoded token after the first (the prefill excluded).
Public names only, so that it runs unchanged on two versions of the code (the other one's tree
first on ``PYTHONPATH``), alternated run by run.

    python benchmarks/load_and_step.py --json load-and-step.json
    PYTHONPATH=../before python benchmarks/load_and_step.py --json load-and-step-before.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.testing import AsciiTokenizer, tiny_model

_PROMPT = "The library keeps a token trie of the documents a call retrieved, and drafts from it."


def _built(model: Any, tokenizer: Any, cache_dir: Path) -> tuple[LookaheadEngine, float]:
    """An engine over a fresh copy of ``model`` (its kernels chosen anew or read back from
    ``cache_dir``), and the seconds its construction took."""
    fresh = copy.deepcopy(model)
    started = time.perf_counter()
    engine = LookaheadEngine(fresh, tokenizer, LookaheadConfig(mode="off"), cache_dir=cache_dir)
    return engine, time.perf_counter() - started


def _step_seconds(engine: LookaheadEngine, tokens: int, rounds: int) -> list[float]:
    """Seconds per decoded token after the first, one figure per round."""
    figures = []
    for _ in range(rounds):
        stream = engine.stream(_PROMPT, max_new_tokens=tokens, eos_token_id=[])
        "".join(stream)
        stats = stream.stats
        figures.append((stats.seconds - stats.prefill_seconds) / (stats.new_tokens - 1))
    return figures


def _measure(name: str, model: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        cache_dir = Path(directory)
        engine, cold = _built(model, tokenizer, cache_dir)
        warm = []
        for _ in range(args.builds):
            del engine  # (one copy of the model at a time)
            engine, seconds = _built(model, tokenizer, cache_dir)
            warm.append(seconds)
        started = time.perf_counter()
        engine.complete(_PROMPT, max_new_tokens=1)
        first_call = time.perf_counter() - started
        _step_seconds(engine, 8, 1)  # warm-up
        steps = _step_seconds(engine, args.max_new_tokens, args.rounds)
    return {
        "model": name,
        "construction_seconds": {
            "cold": round(cold, 3),
            "warm": round(statistics.median(warm), 3),
            "warm_builds": [round(s, 3) for s in warm],
        },
        "first_call_seconds": round(first_call, 3),
        "step_ms": {
            "median": round(1000 * statistics.median(steps), 3),
            "rounds": [round(1000 * s, 3) for s in steps],
        },
    }


def _cpu_name() -> str:
    """The CPU's model name (as ``lscpu`` shows it), else the machine's architecture."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--builds", type=int, default=3, help="warm builds (their median is reported)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    base = LookaheadEngine.from_pretrained()
    results = [
        _measure("default", base.model, base.tokenizer, args),
        _measure("tiny-llama", tiny_model("llama"), AsciiTokenizer(), args),
    ]
    summary = {
        "processor": _cpu_name(),
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "results": results,
    }
    for result in results:
        built, step = result["construction_seconds"], result["step_ms"]
        print(
            f"{result['model']:<12} built {built['cold']:.2f} s cold, {built['warm']:.2f} s warm, "
            f"first call {result['first_call_seconds']:.2f} s; "
            f"step {step['median']:.2f} ms (median of {args.rounds})"
        )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
