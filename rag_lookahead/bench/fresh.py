"""First-time questions: each asked once on a fresh engine, with lookahead and plainly.

A user's first questions find an empty trie of past answers and a planner that has learned
nothing; whatever they copy comes from the prompt and the retrieved chunks alone. For each
answer a new engine is made over the shared model (its own trie, no acceptance statistics,
not even stored ones); each path answers each question twice, in the order ABBA or BAAB, after
one warm-up of each, and keeps its faster run; the prefix cache is off so that neither reuses
the other's prompt. The ratio per answer is the plain engine's time over the lookahead
engine's (the answers are the same tokens), and the aggregate is the ratio of their totals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from rag_lookahead.bench.run import BenchInput, relative_costs, run_header
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.planning.costs import CostCurve

__all__ = ["format_fresh", "parse_cost_curve", "run_fresh"]


def run_fresh(
    engine: LookaheadEngine,
    inputs: Sequence[BenchInput],
    max_new_tokens: int,
    cost_curve: CostCurve | None = None,
    progress: Callable[[Iterable[Any]], Iterator[Any]] = iter,
) -> dict[str, Any]:
    """Time every input once per path on a fresh engine; return the JSON-ready summary.

    ``cost_curve`` replaces the engine's measured curve in the plan (e.g. a steeper CPU's).
    """
    if not inputs:
        raise ValueError("nothing to benchmark: no inputs")
    curve = cost_curve if cost_curve is not None else engine.cost_curve
    config = replace(engine.config, prefix_cache_mb=0)

    def fresh() -> LookaheadEngine:
        made = LookaheadEngine(
            engine.model,
            engine.tokenizer,
            config,
            cost_curve=curve,
            chat_template_kwargs=engine.chat_template_kwargs,
            model_thread=engine.runner.thread,
        )  # (probed as it is built: no answer pays for the probes)
        return made

    for path in (fresh(), fresh().plain()):  # kernels and buffers of this prompt length, untimed
        path.complete(inputs[0].prompt_ids, max_new_tokens=8, documents=inputs[0].documents)
    answers = []
    for i, item in enumerate(progress(inputs)):
        # Each path twice, each time on a fresh engine, in the order ABBA (BAAB for the next
        # question): a drifting machine slows both alike, and each keeps its least disturbed run.
        first, second = ("lookahead", "plain") if i % 2 == 0 else ("plain", "lookahead")
        runs: dict[str, list[dict[str, Any]]] = {"lookahead": [], "plain": []}
        for name in (first, second, second, first):
            made = fresh()
            runs[name].append(_timed(made if name == "lookahead" else made.plain(), item, max_new_tokens))
        fastest = {name: min(timed, key=lambda t: t["seconds"]) for name, timed in runs.items()}
        answers.append(_answer(fastest["lookahead"], fastest["plain"]))
    return _summary(engine, answers, max_new_tokens, cost_curve)


def _timed(engine: LookaheadEngine, item: BenchInput, max_new_tokens: int) -> dict[str, Any]:
    start = time.perf_counter()
    completion = engine.complete(item.prompt_ids, max_new_tokens=max_new_tokens, documents=item.documents)
    seconds = time.perf_counter() - start
    stats = completion.stats
    return {
        "tokens": completion.token_ids,
        "seconds": seconds,
        "prefill_seconds": stats.prefill_seconds,
        "tokens_per_step": stats.tokens_per_step,
        "drafted": sum(stats.drafted_per_step),
    }


def _answer(fast: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    decode = (plain["seconds"] - plain["prefill_seconds"]) / max(
        fast["seconds"] - fast["prefill_seconds"], 1e-9
    )
    return {
        "new_tokens": len(fast["tokens"]),
        "identical": fast["tokens"] == plain["tokens"],
        "lookahead_s": round(fast["seconds"], 4),
        "plain_s": round(plain["seconds"], 4),
        "ratio": round(plain["seconds"] / fast["seconds"], 4),
        "decode_ratio": round(decode, 4),
        "tokens_per_step": round(fast["tokens_per_step"], 3),
        "drafted": fast["drafted"],
    }


def _summary(
    engine: LookaheadEngine, answers: list[dict[str, Any]], max_new_tokens: int, injected: CostCurve | None
) -> dict[str, Any]:
    ratios = [a["ratio"] for a in answers]
    curve = injected if injected is not None else engine.cost_curve
    return {
        **run_header(engine, len(answers), max_new_tokens),
        "cost_curve": "injected" if injected is not None else "measured",
        "relative_costs": relative_costs(curve) if curve is not None else None,
        "aggregate_ratio": round(
            sum(a["plain_s"] for a in answers) / sum(a["lookahead_s"] for a in answers), 4
        ),
        "min_ratio": min(ratios),
        "answers_below_0.93": sum(r < 0.93 for r in ratios),
        "identical": sum(a["identical"] for a in answers),
        "answers": answers,
    }


def parse_cost_curve(text: str) -> CostCurve:
    """``"1:1,2:1.64,16:2.55"`` (forward size: relative cost) as a `CostCurve`."""
    try:
        points = sorted((int(size), float(cost)) for size, cost in (p.split(":") for p in text.split(",")))
        return CostCurve(tuple(s for s, _ in points), tuple(c for _, c in points))
    except ValueError as err:
        raise ValueError(
            f"--cost-curve takes size:cost pairs such as 1:1,2:1.64,16:2.55, got {text!r}"
        ) from err


def format_fresh(summary: dict[str, Any]) -> str:
    """Per-answer ratios, then the aggregate."""
    lines = [
        f"{summary['records']} fresh questions, {summary['max_new_tokens']} new tokens, "
        f"cost curve {summary['cost_curve']} {summary['relative_costs']}",
        "answer  tokens  plain s  lookahead s  ratio  tokens/forward  identical",
    ]
    for i, a in enumerate(summary["answers"], 1):
        lines.append(
            f"{i:>6}  {a['new_tokens']:>6}  {a['plain_s']:>7.2f}  {a['lookahead_s']:>11.2f}  "
            f"{a['ratio']:>5.2f}  {a['tokens_per_step']:>14.2f}  {a['identical']}"
        )
    lines.append(
        f"aggregate {summary['aggregate_ratio']:.3f}x, lowest {summary['min_ratio']:.3f}x, "
        f"{summary['answers_below_0.93']} below 0.93x, {summary['identical']}/{summary['records']} identical"
    )
    return "\n".join(lines)
