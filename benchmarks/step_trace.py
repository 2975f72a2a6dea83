"""Where a run's time goes, step by step: any `rag-lookahead bench` command, traced.

    python benchmarks/step_trace.py [--grid GRID.json] [--json TRACE.json] -- bench \\
        --data dolly_context_qa.jsonl --limit 16 --max-new-tokens 128 --threads 2 \\
        --concurrency 8 --methods batched

Every engine's loop the benchmark runs is traced from its first queued call to its last ended
one (its run), by the engine's step observer (`rag_lookahead.engine.observe`): each iteration
of its loop, each model forward inside one (by kind: ``batch``, a step of drafts over several
rows; ``fused``, such a step with a prompt's chunk in it; ``row``, a step of one row's draft;
``prompt``, a prompt's chunk forwarded alone; ``plain``, a plain one-token step), the tokens
each step released, and when each call was queued and ended. Per run it reports the seconds in
forwards by kind, the host work inside iterations around them (a batch step's drafting,
planning and update, and the rest of the iteration: ``other``), the time no iteration ran
(``idle``: no call to step, or the loop changing hands), the rows a decode forward held on
average (weighted by its seconds, as the batch's throughput feels them), tokens per decode
forward, the batched steps by width (how many, their mean time and rows, the tokens a row
released), the prompts' chunks, each client's gap between its call's end and its next call's
queueing (its thread's own work), and with ``--grid`` (a step grid of ``step_costs.py``) how
the decode forwards' seconds compare with the grid's price of the same rows and width.
Forwards outside a run's iterations (the benchmark's references, its prompt timer, cost
measurement) are not counted. A packed step's width is its tokens per row, rounded up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch_replay import CostGrid, load_grid

from rag_lookahead.cli import main
from rag_lookahead.engine.observe import StepLog, observe_steps

DECODE = ("batch", "fused", "row", "plain")
# Host work inside a batch step, by phase (`rag_lookahead.engine.observe.Step`); the rest of an
# iteration's host work is counted under "other".
PHASES = ("draft", "plan", "update")


@dataclass
class Forward:
    kind: str
    rows: int
    width: int
    seconds: float
    tokens: int = 0  # released by the step after this forward


@dataclass
class Run:
    """One engine's loop: its iterations, forwards and calls, in `time.perf_counter` seconds."""

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


def runs_of(log: StepLog) -> list[Run]:
    """The log's records by loop, in the order the loops first queued a call."""
    runs: dict[int, Run] = {}
    for event in log.queued_calls:
        runs.setdefault(event.loop, Run()).queued.append((event.thread, event.time))
    for event in log.ended_calls:
        runs.setdefault(event.loop, Run()).ended.append((event.thread, event.time))
    for iteration in log.iterations:
        run = runs.setdefault(iteration.loop, Run())
        run.iterations.append((iteration.started, iteration.started + iteration.seconds))
        for step in iteration.steps:
            width = -(-step.tokens // len(step.rows)) if step.packed else step.width
            run.forwards.append(Forward(step.kind, len(step.rows), width, step.seconds, step.released))
            for phase in PHASES:
                seconds = getattr(step, f"{phase}_seconds")
                run.host[phase] = run.host.get(phase, 0.0) + seconds
    return list(runs.values())


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
        }
        for width, fs in _grouped(forwards, lambda f: f.width).items()
    }


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
            f"run {n} ({s['calls']} calls): {s['seconds']} s",
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
    log = StepLog()
    with observe_steps(log):
        code = main(rest)
    summaries = [run.summary(grid) for run in runs_of(log) if run.queued and run.ended]
    print(_table(summaries))
    if options.json:
        options.json.write_text(
            json.dumps({"command": rest, "runs": summaries}, indent=1) + "\n", encoding="utf-8"
        )
    raise SystemExit(code)
