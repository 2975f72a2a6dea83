"""The engine end to end on its captured step (issue 62, item 5), against transformers' greedy
`generate`, its compiled static-cache greedy and today's eager engine.

One process and one model (on a GPU, `benchmarks/cuda/captured.sh` runs it), in two stages,
each over every data set before the next begins, the JSON written after each set:

1. ``step``: the engine with ``--step`` (captured by default) over slots of ``max_model_len``
   columns (by default the set's longest prompt, its new tokens and the widest bucket):
   greedy ``generate`` (the reference), the engine plain (``off``) and with lookahead
   (`run_benchmark`); then ``--clients`` clients at once against the same engine one call at a
   time (`run_concurrency`: ``batched`` and ``serialised``); and, where the engine runs a
   static step (``engine.runner.static``), its capture seconds per bucket, what could not be
   captured, its slot cache's memory and the median milliseconds of one step per bucket (its
   buffers filled, then its forward replayed over scratch columns only).
2. ``baselines``: ``--baseline-methods`` on the eager engine (``step="eager"``), greedy again
   as the reference: by default transformers' compiled greedy (``greedy_compiled``, compiled at
   its warm-up, the slow part) and the eager engine plain and with lookahead.

Then the issue's targets, each ratio against its bar: the step's plain decoding at least the
compiled greedy's tokens a second, lookahead at least 2x it on llma and 1.5x on dolly, the
clients at least 2x the same engine serialised, and (fp32) every answer identical to greedy.

On a CPU it only shows that the script runs (``--step static``, ``--stages step``, a record).

    python benchmarks/captured_engine.py --model PATH --data dolly.jsonl llma.jsonl --device cuda \\
        --json captured-engine.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.concurrency import run_concurrency
from rag_lookahead.bench.run import BenchInput, fresh_engine, gold_inputs, load_records, run_benchmark
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.runtime.static import Buckets, StaticStep

STAGES = ("step", "baselines")
# The bars: lookahead per stream against the compiled greedy, by data set.
LOOKAHEAD_BARS = {"llma": 2.0, "dolly": 1.5}
CLIENTS_BAR = 2.0


def main() -> None:
    args = _arguments()
    if args.threads:
        torch.set_num_threads(args.threads)
    # The eager engine: the baselines' own, and the model every other engine shares.
    eager = LookaheadEngine.from_pretrained(
        args.model, device=args.device, dtype=args.dtype, config=LookaheadConfig(step="eager")
    )
    eager.measure_ahead()  # (its costs, read back by each engine the benchmarks derive)
    sets = {Path(path).stem: _inputs(eager, Path(path), max(args.limit, args.clients)) for path in args.data}
    summary: dict[str, Any] = {
        "device": _device_name(eager.device),
        "dtype": args.dtype,
        "model": args.model,
        "torch": torch.__version__,
        "step": args.step,
        "max_new_tokens": args.max_new_tokens,
        "sets": {name: {} for name in sets},
    }
    for stage in (s for s in STAGES if s in args.stages):
        for name, inputs in sets.items():
            _say(f"{stage}: {name}")
            figures = summary["sets"][name]
            try:  # (a stage that fails on one set is reported; the others still run)
                figures[stage] = _stage(stage, eager, inputs, args, figures)
            except Exception as err:
                figures[stage] = {"error": f"{type(err).__name__}: {err}"}
                _say(f"{stage}: {name} failed: {figures[stage]['error']}")
            figures["targets"] = _targets(name, figures, args.step, args.dtype)
            _write(args.json, summary)
    _report(summary)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--data", nargs="+", required=True, help="JSONL records with question and context")
    parser.add_argument("--limit", type=int, default=4, help="records per data set, one stream")
    parser.add_argument("--clients", type=int, default=8, help="clients at once, a record each (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--step", default="captured", choices=["auto", "eager", "static", "captured"])
    parser.add_argument("--max-model-len", type=int, default=None, help="(default: fitted to each set)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"a comma-separated subset of {STAGES}")
    parser.add_argument("--baseline-methods", default="greedy_compiled,off,lookahead")
    parser.add_argument("--reps", type=int, default=20, help="timed steps per bucket")
    parser.add_argument("--context", type=int, default=256, help="committed columns per row, timing a bucket")
    parser.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (0: torch's)")
    parser.add_argument("--json", type=Path, help="write the figures here (after each set)")
    args = parser.parse_args()
    args.stages = [stage for stage in args.stages.split(",") if stage]
    if not set(args.stages) <= set(STAGES):
        parser.error(f"--stages: choose from {STAGES}")
    return args


def _stage(
    stage: str,
    eager: LookaheadEngine,
    inputs: list[BenchInput],
    args: argparse.Namespace,
    figures: dict[str, Any],
) -> dict[str, Any]:
    """One stage's figures on one set (`figures`, the set's, gets its slots' columns)."""
    if stage == "baselines":
        methods = [m for m in args.baseline_methods.split(",") if m]
        return run_benchmark(eager, inputs[: args.limit], args.max_new_tokens, methods)
    figures["max_model_len"] = args.max_model_len or _fitted(inputs, args.max_new_tokens)
    config = replace(eager.config, step=args.step, max_model_len=figures["max_model_len"])
    return _step_stage(fresh_engine(eager, config), inputs, args)


def _inputs(engine: LookaheadEngine, path: Path, limit: int) -> list[BenchInput]:
    return gold_inputs(engine, load_records(path, limit))


def _fitted(inputs: list[BenchInput], new: int) -> int:
    """Slot columns for the longest prompt, its new tokens and the widest bucket, in 64s."""
    columns = max(len(item.prompt_ids) for item in inputs) + new + Buckets().widest
    return columns + -columns % 64


def _step_stage(
    engine: LookaheadEngine, inputs: list[BenchInput], args: argparse.Namespace
) -> dict[str, Any]:
    """One stream (greedy, plain, lookahead), then the clients, then the static step's figures."""
    new = args.max_new_tokens
    figures: dict[str, Any] = {
        "backend_step": engine.backend.step,
        "single": run_benchmark(engine, inputs[: args.limit], new, ["greedy", "off", "lookahead"]),
    }
    if args.clients:
        figures["clients"] = run_concurrency(
            engine, inputs[: args.clients], new, [args.clients], ["serialised", "batched"]
        )
    figures["static"] = _static_figures(engine, args.context, args.reps)
    return figures


def _static_figures(engine: LookaheadEngine, context: int, reps: int) -> dict[str, Any] | None:
    """What the engine's static step cost to build and what one step costs per bucket
    (``None`` where the engine runs eager steps)."""
    step = engine.runner.static
    if step is None:
        return None
    figures: dict[str, Any] = {
        "captured": [str(bucket) for bucket in step.captured],
        "capture_seconds": {str(bucket): seconds for bucket, seconds in step.record.seconds.items()},
        "problems": list(step.record.problems),
        "slot_cache_mib": step.cache.nbytes() / 2**20,
    }
    columns = min(context, step.max_len - 2 * step.buckets.widest)
    try:  # (a timing that fails is reported; the figures above still are)
        figures["step_ms"] = engine.runner.thread.call(functools.partial(_bucket_ms, step, columns, reps))
    except Exception as err:
        figures["step_ms_error"] = f"{type(err).__name__}: {err}"
    return figures


def _bucket_ms(step: StaticStep, context: int, reps: int) -> dict[str, dict[str, float]]:
    """Median milliseconds per bucket: filling its buffers with chains of made-up tokens after
    ``context`` columns, and its forward (replayed where captured) over scratch columns, which
    no row's entries reach; their sum, one step."""
    times: dict[str, dict[str, float]] = {}
    for bucket in step.buckets.all():
        chain = DraftTree(tuple(range(5, 5 + bucket.width)), tuple(range(-1, bucket.width - 1)))
        trees, lengths = [chain] * bucket.rows, [context] * bucket.rows
        fill = _median_ms(functools.partial(step.prepare, trees, lengths), reps, step.device)
        step.fill_scratch(bucket)
        forward = _median_ms(functools.partial(step.forward, bucket), reps, step.device)
        times[str(bucket)] = {"fill": fill, "forward": forward, "step": fill + forward}
    return times


def _median_ms(run: Callable[[], Any], reps: int, device: torch.device) -> float:
    run()  # (a first eager run picks its kernels)
    seconds = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return 1000 * statistics.median(seconds)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _targets(name: str, figures: dict[str, Any], step_name: str, dtype: str) -> list[dict[str, Any]]:
    """The issue's targets that this set's figures so far can be held to."""
    step = figures.get("step", {})
    single = step.get("single", {}).get("methods", {})
    base = figures.get("baselines", {}).get("methods", {})
    compiled = base.get("greedy_compiled", {}).get("tokens_per_s")
    rows = []
    if compiled and single:
        plain = single["off"]["tokens_per_s"] / compiled
        rows.append(_target(f"{step_name} plain / compiled greedy", plain, 1.0))
        bar = next((b for key, b in LOOKAHEAD_BARS.items() if key in name), None)
        lookahead = single["lookahead"]["tokens_per_s"] / compiled
        rows.append(_target(f"{step_name} lookahead / compiled greedy", lookahead, bar))
    for method in ("off", "lookahead"):  # against today's eager engine (no bar)
        if method in single and method in base:
            ratio = single[method]["tokens_per_s"] / base[method]["tokens_per_s"]
            rows.append(_target(f"{step_name} {method} / eager {method}", ratio, None))
    for clients, level in step.get("clients", {}).get("concurrency", {}).items():
        ratio = level["methods"]["batched"].get("speedup_vs_serialised")
        if ratio is not None:
            rows.append(_target(f"{step_name} {clients} clients / serialised", ratio, CLIENTS_BAR))
    same, answers = _identical(figures)
    if answers:
        bar = 1.0 if dtype == "float32" else None  # (bf16 near-ties may part: reported, no bar)
        rows.append(_target(f"answers identical ({same}/{answers})", same / answers, bar))
    return rows


def _target(what: str, ratio: float, bar: float | None) -> dict[str, Any]:
    return {
        "target": what,
        "ratio": round(ratio, 3),
        "bar": bar,
        "met": None if bar is None else ratio >= bar,
    }


def _identical(figures: dict[str, Any]) -> tuple[int, int]:
    """Answers identical to greedy's, and answers, over every method run on this set."""
    step = figures.get("step", {})
    runs = [run for run in (step.get("single"), figures.get("baselines")) if run and "methods" in run]
    same = sum(m["identical_to_greedy"] for run in runs for m in run["methods"].values())
    answers = sum(run["records"] * len(run["methods"]) for run in runs)
    for level in step.get("clients", {}).get("concurrency", {}).values():
        same += sum(m["identical_to_greedy"] for m in level["methods"].values())
        answers += sum(m["answers"] for m in level["methods"].values())
    return same, answers


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _say(what: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {what}", flush=True)


def _write(path: Path | None, summary: dict[str, Any]) -> None:
    """Write ``summary`` whole or not at all (a run stopped at its time limit keeps the last)."""
    if path is not None:
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        partial.replace(path)


def _report(summary: dict[str, Any]) -> None:
    new = summary["max_new_tokens"]
    print(f"{summary['device']} {summary['dtype']}, step {summary['step']}, {new} new tokens")
    for name, figures in summary["sets"].items():
        step = figures.get("step", {})
        print(f"{name} (slots of {figures.get('max_model_len', '-')} columns):")
        print(f"  {'method':<28} {'tok/s':>8} identical")
        for label, run in ((summary["step"], step.get("single")), ("eager", figures.get("baselines"))):
            for method, m in (run or {}).get("methods", {}).items():
                shown = f"{method} ({label} run)" if method.startswith("greedy") else f"{label} {method}"
                print(f"  {shown:<28} {m['tokens_per_s']:>8.1f} {m['identical_to_greedy']}/{run['records']}")
        for clients, level in step.get("clients", {}).get("concurrency", {}).items():
            for method, m in level["methods"].items():
                shown = f"{clients} clients {method}"
                print(f"  {shown:<28} {m['tokens_per_s']:>8.1f} {m['identical_to_greedy']}/{m['answers']}")
        if "static" in step:
            _report_static(step["static"])
        for stage in STAGES:
            if "error" in figures.get(stage, {}):
                print(f"  {stage} failed: {figures[stage]['error']}")
        for row in figures.get("targets", []):
            bar = (
                "" if row["bar"] is None else f" (bar {row['bar']:.2f}: {'met' if row['met'] else 'NOT met'})"
            )
            print(f"  {row['target']:<40} {row['ratio']:>6.2f}x{bar}")


def _report_static(static: dict[str, Any] | None) -> None:
    if static is None:
        print("  no static step (the engine ran eager steps)")
        return
    print(f"  slot cache {static['slot_cache_mib']:.1f} MiB, {len(static['captured'])} buckets captured")
    for problem in static["problems"]:
        print(f"    {problem}")
    print(f"  {'bucket':>7} {'step ms':>8} {'fill':>6} {'forward':>8} {'capture s':>10}")
    for bucket, ms in static.get("step_ms", {}).items():
        seconds = static["capture_seconds"].get(bucket)
        shown = "-" if seconds is None else f"{seconds:.2f}"
        print(f"  {bucket:>7} {ms['step']:>8.2f} {ms['fill']:>6.2f} {ms['forward']:>8.2f} {shown:>10}")
    if "step_ms_error" in static:
        print(f"    bucket timing failed: {static['step_ms_error']}")


if __name__ == "__main__":
    main()
