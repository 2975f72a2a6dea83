"""Where a run's time goes, step by step: any `rag-lookahead bench` command, traced.

    python benchmarks/step_trace.py [--grid GRID.json] [--json TRACE.json] -- bench \\
        --data dolly_context_qa.jsonl --limit 16 --max-new-tokens 128 --threads 2 \\
        --concurrency 8 --methods batched

Every engine the benchmark builds is traced from its first queued call to its last ended one
(its run): each iteration of its loop, each model forward inside one (by kind: ``batch``, a
step of drafts over several rows; ``fused``, such a step with a prompt's chunk in it; ``row``,
a step of one row's draft; ``prompt``, a prompt's chunk forwarded apart; ``plain``, a plain
one-token step), the tokens each step released, and when each call was queued and ended.
Per run it reports the seconds in forwards by kind, the host work inside iterations around
them (by phase: `PHASES`), the time no iteration ran (``idle``: no call to step, or the loop
changing hands), the rows a decode forward held on average (weighted by its seconds, as the
batch's throughput feels them), tokens per decode forward, the batched steps by width (how
many, their mean time and rows, the tokens a row released), the prompts' chunks, each
client's gap between its call's end and its next call's queueing (its thread's own work),
and with ``--grid`` (a step grid of ``step_costs.py``) how the decode forwards' seconds
compare with the grid's price of the same rows and width. Forwards outside a run's
iterations (the benchmark's references, its prompt timer, cost measurement) are not counted.
The wrappers add a few microseconds a phase, nothing to a forward's own time.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch_replay import CostGrid, load_grid

from rag_lookahead.cli import main
from rag_lookahead.engine import pricing as batching
from rag_lookahead.engine import scheduler as scheduling
from rag_lookahead.engine.pricing import Pricing
from rag_lookahead.engine.scheduler import Scheduler
from rag_lookahead.runtime.batch import BatchCache
from rag_lookahead.runtime.prefix import PrefixCache
from rag_lookahead.runtime.runner import ModelRunner

DECODE = ("batch", "fused", "row", "plain")
# Host work is reported by phase (each phase's own time: neither the forwards nor the phases
# inside it); the rest of an iteration's host work is counted under "other".
PHASES = (
    (
        Scheduler,
        (
            "_retire_cancelled",
            "_unfuse_costly_prefills",
            "_fuse_joining",
            "_batch_step",
            "_plan",
            "_update",
            "_alone_step",
            "_prefill",
            "_first_token",
            "_end",
            "_drop_rows",
        ),
    ),
    (BatchCache, ("add_row", "keep_accepted", "row_copy", "prepare")),
    (Pricing, ("plan_drafts",)),
    (PrefixCache, ("lookup", "store")),
    (scheduling, ("propose", "verify", "release")),
)


@dataclass
class Forward:
    kind: str
    rows: int
    width: int
    seconds: float
    tokens: int = 0  # released by the step after this forward
    expected: float | None = None  # the batch plan's expected tokens for its rows, if planned


@dataclass
class Run:
    """One engine's loop: its iterations, forwards and calls, in `time.perf_counter` seconds."""

    max_batch_size: int
    iterations: list[tuple[float, float]] = field(default_factory=list)
    forwards: list[Forward] = field(default_factory=list)
    queued: list[tuple[int, float]] = field(default_factory=list)  # (client thread, when)
    ended: list[tuple[int, float]] = field(default_factory=list)
    host: dict[str, float] = field(default_factory=dict)  # seconds outside forwards, by phase

    def summary(self, grid: CostGrid | None) -> dict[str, Any]:
        start = min(t for _, t in self.queued)
        span = max(t for _, t in self.ended) - start
        looping = sum(end - begin for begin, end in self.iterations)
        kinds = _grouped(self.forwards, lambda f: f.kind)
        by_kind = {k: kinds.get(k, []) for k in ("prompt", *DECODE)}
        forwarding = sum(f.seconds for f in self.forwards)
        decode = [f for f in self.forwards if f.kind in DECODE]
        decode_seconds = sum(f.seconds for f in decode) or 1e-9
        out: dict[str, Any] = {
            "max_batch_size": self.max_batch_size,
            "calls": len(self.queued),
            "seconds": round(span, 3),
            "new_tokens": sum(f.tokens for f in self.forwards),
            "forward_seconds": {k: round(sum(f.seconds for f in fs), 3) for k, fs in by_kind.items()},
            "forwards": {k: len(fs) for k, fs in by_kind.items()},
            "host_seconds": round(looping - forwarding, 3),
            "host_seconds_by_phase": {
                **{k: round(v, 3) for k, v in sorted(self.host.items())},
                "other": round(looping - forwarding - sum(self.host.values()), 3),
            },
            "idle_seconds": round(span - looping, 3),
            "rows_per_decode_forward": round(sum(f.rows * f.seconds for f in decode) / decode_seconds, 2),
            "tokens_per_decode_forward": round(sum(f.tokens for f in decode) / max(len(decode), 1), 2),
            "decode_tokens_per_forward_second": round(sum(f.tokens for f in decode) / decode_seconds, 2),
            "client_gap_seconds": _gaps(self.queued, self.ended),
            "prompt_chunks": [f.width for f in by_kind["prompt"]],
            "batch_by_width": _by_width(by_kind["batch"]),
        }
        if grid is not None and decode:
            out["decode_seconds_over_grid"] = _over_grid(decode, grid)
            by_rows = _grouped(decode, lambda f: f.rows)
            out["over_grid_by_rows"] = {rows: _over_grid(fs, grid) for rows, fs in by_rows.items()}
        return out


def _grouped(forwards: list[Forward], key: Callable[[Forward], Any]) -> dict[Any, list[Forward]]:
    """``forwards`` by ``key``, in the key's order."""
    groups: dict[Any, list[Forward]] = {}
    for f in forwards:
        groups.setdefault(key(f), []).append(f)
    return dict(sorted(groups.items()))


def _over_grid(forwards: list[Forward], grid: CostGrid) -> float:
    """The forwards' seconds over the grid's price for the same rows and widths."""
    return round(sum(f.seconds for f in forwards) / sum(grid(f.rows, f.width) / 1000 for f in forwards), 3)


def _by_width(forwards: list[Forward]) -> dict[int, dict[str, float]]:
    """Batched steps by width: how many, their mean milliseconds and rows, and the tokens
    each of their rows released on average."""
    return {
        width: {
            "steps": len(fs),
            "ms": round(1000 * statistics.mean(f.seconds for f in fs), 1),
            "rows": round(statistics.mean(f.rows for f in fs), 2),
            "tokens_per_row": round(sum(f.tokens for f in fs) / sum(f.rows for f in fs), 2),
            "expected_per_row": _expected_per_row(fs),
        }
        for width, fs in _grouped(forwards, lambda f: f.width).items()
    }


def _expected_per_row(forwards: list[Forward]) -> float | None:
    """What the batch plans expected a row of these steps to release, on average."""
    planned = [f for f in forwards if f.expected is not None]
    if not planned:
        return None
    return round(sum(f.expected for f in planned if f.expected) / sum(f.rows for f in planned), 2)


def _gaps(queued: list[tuple[int, float]], ended: list[tuple[int, float]]) -> dict[str, float]:
    """Per client thread, from a call's end to the same thread's next call's queueing."""
    gaps = []
    for thread in {t for t, _ in queued}:
        ends = sorted(t for who, t in ended if who == thread)
        starts = sorted(t for who, t in queued if who == thread)[1:]
        gaps += [s - e for e, s in zip(ends, starts, strict=False) if s >= e]
    if not gaps:
        return {}
    return {"median": round(statistics.median(gaps), 4), "max": round(max(gaps), 4), "count": len(gaps)}


class Tracer:
    """Wraps the scheduler's and the runner's methods (for every engine from now on)."""

    def __init__(self) -> None:
        self.runs: list[Run] = []  # in the order their engines first queued a call
        self._local = threading.local()  # the run whose iteration this thread is in
        self._callers: dict[int, int] = {}  # call id -> the thread that queued it

    def install(self) -> None:
        Scheduler._iterate = self._iteration(Scheduler._iterate)  # type: ignore[method-assign]
        Scheduler.submit = self._submit(Scheduler.submit)  # type: ignore[method-assign]
        Scheduler._end = self._end(Scheduler._end)  # type: ignore[method-assign]
        Scheduler._release = self._release(Scheduler._release)  # type: ignore[method-assign]
        for owner, names in PHASES:
            for name in names:
                setattr(owner, name, self._phase(name.strip("_"), getattr(owner, name)))
        batching.plan_batch = self._plan(batching.plan_batch)
        batching.plan_packed = self._plan(batching.plan_packed)
        runner = ModelRunner
        runner.forward = self._forward(runner.forward, _chunk_kind)  # type: ignore[method-assign]
        runner.forward_step = self._forward(runner.forward_step, _step_kind)  # type: ignore[method-assign]
        runner.forward_batch = self._forward(runner.forward_batch, _batch_kind)  # type: ignore[method-assign]
        runner.forward_packed = self._forward(runner.forward_packed, _packed_kind)  # type: ignore[method-assign]

    def _run(self, scheduler: Scheduler) -> Run:
        run: Run | None = getattr(scheduler, "_traced_run", None)  # (ids of freed engines recur)
        if run is None:
            run = Run(scheduler.max_batch_size)
            scheduler._traced_run = run  # type: ignore[attr-defined]
            self.runs.append(run)
        return run

    def _iteration(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def iterate(scheduler: Scheduler) -> Any:
            run, started = self._run(scheduler), time.perf_counter()
            self._local.run = run
            try:
                return method(scheduler)
            finally:
                self._local.run = None
                run.iterations.append((started, time.perf_counter()))

        return iterate

    def _phase(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def phase(*args: Any, **kwargs: Any) -> Any:
            run: Run | None = getattr(self._local, "run", None)
            if run is None:
                return method(*args, **kwargs)
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # what this phase's time leaves out: forwards and inner phases
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - started
                run.host[name] = run.host.get(name, 0.0) + seconds - stack.pop()
                if stack:
                    stack[-1] += seconds

        return phase

    def _plan(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """The batch plan, remembering the tokens it expects for the next forward's rows."""

        @functools.wraps(method)
        def plan(drafts: Any, *args: Any, **kwargs: Any) -> Any:
            trees = method(drafts, *args, **kwargs)
            self._local.expected = sum(d.gain(len(t)) for d, t in zip(drafts, trees, strict=True))
            return trees

        return plan

    def _submit(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def submit(scheduler: Scheduler, call: Any) -> Any:
            me = threading.get_ident()
            self._callers[id(call)] = me
            self._run(scheduler).queued.append((me, time.perf_counter()))
            return method(scheduler, call)

        return submit

    def _end(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def end(scheduler: Scheduler, call: Any, *args: Any, **kwargs: Any) -> Any:
            out = method(scheduler, call, *args, **kwargs)
            self._run(scheduler).ended.append((self._callers.get(id(call), 0), time.perf_counter()))
            return out

        return end

    def _release(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def release(scheduler: Scheduler, call: Any, verdict: Any) -> Any:
            run = self._run(scheduler)
            if run.forwards:
                run.forwards[-1].tokens += len(verdict.tokens)
            return method(scheduler, call, verdict)

        return release

    def _forward(
        self, method: Callable[..., Any], kind: Callable[..., tuple[str, int, int]]
    ) -> Callable[..., Any]:
        @functools.wraps(method)
        def forward(runner: ModelRunner, *args: Any, **kwargs: Any) -> Any:
            run: Run | None = getattr(self._local, "run", None)
            if run is None or getattr(self._local, "inside", False):  # (forward_step calls forward)
                return method(runner, *args, **kwargs)
            self._local.inside = True
            started = time.perf_counter()
            try:
                return method(runner, *args, **kwargs)
            finally:
                seconds = time.perf_counter() - started
                self._local.inside = False
                name, rows, width = kind(*args, **kwargs)
                expected = getattr(self._local, "expected", None) if name == "batch" else None
                self._local.expected = None
                run.forwards.append(Forward(name, rows, width, seconds, expected=expected))
                stack = self._local.__dict__.get("stack")
                if stack:
                    stack[-1] += seconds

        return forward


def _chunk_kind(input_ids: Any, *args: Any, **kwargs: Any) -> tuple[str, int, int]:
    width = int(input_ids.shape[-1])
    return ("prompt" if width > 1 else "plain"), 1, width


def _step_kind(draft: Any, *args: Any, **kwargs: Any) -> tuple[str, int, int]:
    return "row", 1, len(draft)


def _batch_kind(inputs: Any, cache: Any, lengths: Any, keep: Any = None) -> tuple[str, int, int]:
    rows, width = inputs.input_ids.shape
    return ("batch" if keep is None else "fused"), int(rows), int(width)


def _packed_kind(inputs: Any, cache: Any, lengths: Any, keep: Any = None) -> tuple[str, int, int]:
    """A packed step: its width is its tokens per row, rounded up; a prompt's chunk in it leaves
    some of its tokens unread."""
    rows, tokens = len(inputs.sizes), int(inputs.input_ids.shape[1])
    fused = keep is not None and len(keep) < tokens
    return ("fused" if fused else "batch"), rows, -(-tokens // rows)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and the ``rag-lookahead`` command after ``--``."""
    parser = argparse.ArgumentParser(
        prog="step_trace.py",
        usage="step_trace.py [--grid GRID] [--json JSON] -- bench ARGS...",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--grid", type=Path, help="a step grid (step_costs.py --json) to price decode forwards"
    )
    parser.add_argument("--json", type=Path, help="write every run's summary here")
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    if split == len(argv):
        parser.error("name the command to trace after --")
    return options, argv[split + 1 :]


def _table(summaries: list[dict[str, Any]]) -> str:
    lines = []
    for n, s in enumerate(summaries):
        kinds = ", ".join(
            f"{k} {v} s ({s['forwards'][k]})" for k, v in s["forward_seconds"].items() if s["forwards"][k]
        )
        lines += [
            f"run {n} (max_batch_size {s['max_batch_size']}, {s['calls']} calls): {s['seconds']} s",
            f"  forwards: {kinds}",
            f"  host {s['host_seconds']} s, idle {s['idle_seconds']} s; rows per decode forward "
            f"{s['rows_per_decode_forward']}, tokens per decode forward {s['tokens_per_decode_forward']}, "
            f"{s['decode_tokens_per_forward_second']} tokens per decode-forward second",
            f"  host by phase {s['host_seconds_by_phase']}",
            f"  batched steps by width {s['batch_by_width']}",
            f"  client gaps {s['client_gap_seconds']}",
        ]
        if "decode_seconds_over_grid" in s:
            over, by_rows = s["decode_seconds_over_grid"], s["over_grid_by_rows"]
            lines.append(f"  decode forwards over the grid: {over}x, by rows {by_rows}")
    return "\n".join(lines)


if __name__ == "__main__":
    options, rest = _parse(sys.argv[1:])
    grid = load_grid(options.grid) if options.grid else None
    tracer = Tracer()
    tracer.install()
    sys.argv = ["rag-lookahead", *rest]
    code = main()
    summaries = [run.summary(grid) for run in tracer.runs if run.queued and run.ended]
    print(_table(summaries))
    if options.json:
        options.json.write_text(
            json.dumps({"command": rest, "runs": summaries}, indent=1) + "\n", encoding="utf-8"
        )
    raise SystemExit(code)
