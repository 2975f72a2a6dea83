"""Concurrency benchmark: many clients at once, against serialised and batched baselines.

Each method answers the same questions for ``c`` concurrent clients: all sent at once (each
client sends its next question when its previous answer is done), or arriving as a Poisson
process at a given rate (a question waits for a free client). Methods:

- ``serialised``: this engine with ``max_batch_size=1`` (one call at a time, arrival order);
- ``batched``: this engine as configured (continuous batching of lookahead steps);
- ``hf_static_batch``: transformers ``generate``, greedy, the questions as left-padded static
  batches of ``c``;
- ``hf_continuous_batching``: transformers ``generate_batch`` (its own paged cache), where this
  transformers has it, all questions at once;
- ``prompt_lookup``: transformers prompt lookup decoding, one question at a time.

Every output is compared with plain greedy ``generate`` of the same prompt alone.
``decode_tokens_per_s`` leaves out the prompts' forwards (timed alone, as the engine runs them,
once before the runs: the same work for every method, up to the kernels ``generate`` runs for
the ``hf_*`` methods). For this engine's methods ``run_decode_tokens_per_s`` leaves out the
prompts' forwards as timed in the run itself (`Scheduler.prompt_forwards`): on a machine whose
speed drifts between that first timing and the runs, the steadier of the two.
"""

from __future__ import annotations

import functools
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rag_lookahead.bench.divergence import describe, divergences
from rag_lookahead.bench.methods import CONCURRENCY_METHODS
from rag_lookahead.bench.run import (
    PROMPT_LOOKUP_TOKENS,
    BenchInput,
    fresh_engine,
    hf_generate,
    prefill_timer,
    run_header,
)
from rag_lookahead.engine import LookaheadEngine

__all__ = ["CONCURRENCY_METHODS", "format_concurrency", "poisson_arrivals", "quantile", "run_concurrency"]


@dataclass
class Served:
    """One question's answer and its timing, in seconds from the start of the run."""

    arrived: float
    first_token: float = 0.0
    done: float = 0.0
    tokens: list[int] = field(default_factory=list)


Method = Callable[[Sequence[BenchInput], Sequence[float], int], list[Served]]


def run_concurrency(
    engine: LookaheadEngine,
    inputs: Sequence[BenchInput],
    max_new_tokens: int,
    concurrency: Sequence[int],
    methods: Sequence[str] = CONCURRENCY_METHODS,
    arrival_rate: float | None = None,
    seed: int = 0,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run every method at every concurrency level; return the JSON-ready summary.

    With ``rounds`` > 1 the methods run that many times each, alternating (the order reversed
    every other round, so that a machine slowing down or speeding up favours none): each
    round's speedups are taken within the round, and each figure reported is the median over
    the rounds (answers identical: the fewest of any round), with every round's under
    ``"rounds"`` and each method's fastest figures under ``"best"`` (with their ratios, as a
    round's). On a machine whose speed drifts, a ratio of two methods timed
    minutes apart says little; the median of ratios timed side by side, and the ratio of the
    least disturbed rounds, say more."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    unknown = set(methods) - set(CONCURRENCY_METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {list(CONCURRENCY_METHODS)}")
    if not inputs:
        raise ValueError("nothing to benchmark: no inputs")
    # Every method's torch work runs in the model's thread (`ModelThread`), as the engine's
    # forwards do: no method adds an OpenMP team that would slow another down.
    reference = [hf_generate(engine, item.prompt_ids, max_new_tokens) for item in inputs]
    prompts = [item.prompt_ids for item in inputs]
    prefill = prefill_timer(engine)
    prefill_seconds = sum(prefill(item.prompt_ids) for item in inputs)
    levels: dict[str, Any] = {}
    for clients in concurrency:
        arrivals = poisson_arrivals(len(inputs), arrival_rate, seed)
        runs: list[dict[str, dict[str, Any]]] = []
        for round_ in range(rounds):
            order = methods if round_ % 2 == 0 else list(reversed(methods))
            results: dict[str, dict[str, Any]] = {}
            for name in order:
                run = _run_method(engine, name, inputs, arrivals, clients, max_new_tokens)
                if run is not None:
                    results[name] = {
                        **_measures(run, reference, prefill_seconds),
                        "divergences": _diverging(engine, prompts, run.served, reference),
                    }
            _ratios(results)
            runs.append({name: results[name] for name in methods if name in results})
        results = runs[0] if rounds == 1 else _medians(runs)
        arrival = "all at once" if arrival_rate is None else f"poisson {arrival_rate}/s"
        levels[str(clients)] = {"arrival": arrival, "methods": results}
    return {
        **run_header(engine, len(inputs), max_new_tokens),
        "prefill_seconds": round(prefill_seconds, 3),
        "lookahead_config": dict(vars(engine.config)),
        "concurrency": levels,
    }


@dataclass
class _Run:
    """One method's run: what each question got, the wall clock, and (for this engine) the
    seconds its prompts' forwards took in the run."""

    served: list[Served]
    wall: float
    prompt_seconds: float | None


def _run_method(
    engine: LookaheadEngine,
    name: str,
    inputs: Sequence[BenchInput],
    arrivals: Sequence[float],
    clients: int,
    max_new_tokens: int,
) -> _Run | None:
    """One run of method ``name`` (on a fresh engine, after a warm-up on another one); ``None``
    where this transformers lacks the method."""
    warm = _method(engine, name, clients, max_new_tokens)
    if warm is None:
        return None
    warming, _ = warm
    # A warm-up (allocations, kernels), then a fresh start.
    warming(inputs[:1], [0.0], clients)
    prepared = _method(engine, name, clients, max_new_tokens)
    assert prepared is not None
    method, variant = prepared
    started = time.perf_counter()
    served = method(inputs, arrivals, clients)
    wall = time.perf_counter() - started
    prompts = None if variant is None else variant.scheduler.prompt_forwards.seconds
    return _Run(served, wall, prompts)


def _medians(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per method, the median of each figure over the rounds (answers identical: the fewest),
    its fastest figures under ``"best"`` and every round's under ``"rounds"``."""
    merged: dict[str, dict[str, Any]] = {}
    for name in runs[0]:
        each = [run[name] for run in runs if name in run]
        figures: dict[str, Any] = {}
        for key, value in each[0].items():
            if key == "identical_to_greedy":
                figures[key] = min(m[key] for m in each)
            elif key == "divergences":  # the round whose count of identical answers is reported
                figures[key] = min(each, key=lambda m: m["identical_to_greedy"])[key]
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                figures[key] = round(statistics.median(m[key] for m in each), 3)
            else:
                figures[key] = value
        merged[name] = {**figures, "best": _best(each), "rounds": each}
    _ratios({name: figures["best"] for name, figures in merged.items()})  # side by side
    return merged


def _best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A method's least disturbed figures over its rounds: other work on the machine only
    ever slows a round down, so the fastest is the nearest to the method's own speed (as the
    cost curves keep each forward's least time)."""
    fastest = {key: max(m[key] for m in rounds) for key in _SPEEDUPS if key in rounds[0]}
    return {**fastest, "p95_latency_s": min(m["p95_latency_s"] for m in rounds)}


def poisson_arrivals(count: int, rate: float | None, seed: int) -> list[float]:
    """``count`` arrival times in seconds from the start, a Poisson process of ``rate`` per
    second drawn with ``seed`` (the first at 0); all at 0 when ``rate`` is ``None``."""
    if rate is None:
        return [0.0] * count
    rng, now, times = random.Random(seed), 0.0, []
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def _method(
    engine: LookaheadEngine, name: str, clients: int, max_new_tokens: int
) -> tuple[Method, LookaheadEngine | None] | None:
    """Method ``name``, and the fresh engine it runs on where it is this engine's."""
    if name in ("serialised", "batched"):
        size = 1 if name == "serialised" else max(engine.config.max_batch_size, clients)
        tokens = max(engine.config.max_tokens_per_forward, size)
        config = replace(engine.config, max_batch_size=size, max_tokens_per_forward=tokens)
        variant = fresh_engine(engine, config)  # (its batch costs read back too)
        return _clients(lambda item, served: _stream(variant, item, max_new_tokens, served)), variant
    if name == "prompt_lookup":

        def lookup(item: BenchInput, served: Served) -> None:
            served.tokens = hf_generate(
                engine, item.prompt_ids, max_new_tokens, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS
            )
            served.first_token = served.done = time.perf_counter()

        # One client thread: one request at a time, and one thread doing torch work.
        return (lambda inputs, arrivals, _: _clients(lookup)(inputs, arrivals, 1)), None
    if name == "hf_static_batch":
        return (
            lambda inputs, arrivals, size: _static_batches(engine, inputs, arrivals, size, max_new_tokens)
        ), None
    if not hasattr(engine.model, "generate_batch"):
        return None
    return (lambda inputs, arrivals, size: _continuous(engine, inputs, arrivals, max_new_tokens)), None


def _clients(answer: Callable[[BenchInput, Served], None]) -> Method:
    """``clients`` threads taking questions in order, each once it has arrived."""

    def run(inputs: Sequence[BenchInput], arrivals: Sequence[float], clients: int) -> list[Served]:
        start = time.perf_counter()
        served = [Served(start + t) for t in arrivals]
        queue = iter(range(len(inputs)))
        lock = threading.Lock()

        def client() -> None:
            while True:
                with lock:
                    i = next(queue, None)
                if i is None:
                    return
                time.sleep(max(0.0, served[i].arrived - time.perf_counter()))
                answer(inputs[i], served[i])

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [_relative(s, start) for s in served]

    return run


def _stream(engine: LookaheadEngine, item: BenchInput, max_new_tokens: int, served: Served) -> None:
    with engine.stream(item.prompt_ids, max_new_tokens=max_new_tokens, documents=item.documents) as stream:
        for chunk in stream.chunks():
            if not served.first_token:
                served.first_token = time.perf_counter()
            served.tokens += chunk.token_ids
    served.done = time.perf_counter()


def _static_batches(
    engine: LookaheadEngine,
    inputs: Sequence[BenchInput],
    arrivals: Sequence[float],
    size: int,
    max_new_tokens: int,
) -> list[Served]:
    start = time.perf_counter()
    served = [Served(start + t) for t in arrivals]
    pad = engine.eos_token_ids[0] if engine.eos_token_ids else 0
    for first in range(0, len(inputs), size):
        group = range(first, min(first + size, len(inputs)))
        time.sleep(max(0.0, max(served[i].arrived for i in group) - time.perf_counter()))
        width = max(len(inputs[i].prompt_ids) for i in group)
        ids = torch.full((len(group), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(group):
            prompt = inputs[i].prompt_ids
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        out = engine.runner.thread.call(
            functools.partial(
                _generate_batch, engine, ids.to(engine.device), mask.to(engine.device), max_new_tokens, pad
            )
        )
        done = time.perf_counter()
        for row, i in enumerate(group):
            served[i].tokens = _unpadded(out[row, width:].tolist(), engine.eos_token_ids)
            served[i].first_token = served[i].done = done  # a static batch returns all at once
    return [_relative(s, start) for s in served]


def _generate_batch(
    engine: LookaheadEngine, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, pad: int
) -> torch.Tensor:
    with torch.inference_mode():
        return engine.model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
        )


def _continuous(
    engine: LookaheadEngine, inputs: Sequence[BenchInput], arrivals: Sequence[float], max_new_tokens: int
) -> list[Served]:
    """transformers' continuous batching, all questions submitted at once (arrivals ignored)."""
    from transformers import GenerationConfig

    eos = engine.eos_token_ids[0] if engine.eos_token_ids else -1
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
    )
    start = time.perf_counter()
    outputs = engine.model.generate_batch(
        inputs=[list(item.prompt_ids) for item in inputs],
        generation_config=config,
        record_timestamps=True,
        progress_bar=False,
        warmup=False,
    )
    done = time.perf_counter()
    served = []
    for i in range(len(inputs)):
        out = outputs[f"req_{i}"]
        stamps = list(getattr(out, "timestamps", None) or [])
        # Its timestamps are on its own clock: times relative to the request's creation.
        first = stamps[0] - out.created_time if stamps else done - start
        last = stamps[-1] - out.created_time if stamps else done - start
        served.append(Served(0.0, first, last, _unpadded(list(out.generated_tokens), engine.eos_token_ids)))
    return served


def _unpadded(tokens: list[int], eos: Sequence[int]) -> list[int]:
    """A batch row's tokens up to and including its first EOS (the rest is padding)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def _relative(served: Served, start: float) -> Served:
    return Served(served.arrived - start, served.first_token - start, served.done - start, served.tokens)


def _measures(run: _Run, reference: list[list[int]], prefill: float) -> dict[str, Any]:
    served, wall = run.served, run.wall
    tokens = sum(len(s.tokens) for s in served)
    latency = sorted(s.done - s.arrived for s in served)
    ttft = sorted(s.first_token - s.arrived for s in served)
    own: dict[str, float] = {}
    if run.prompt_seconds is not None:
        own = {
            "prompt_forward_seconds": round(run.prompt_seconds, 3),
            "run_decode_tokens_per_s": round(tokens / max(wall - run.prompt_seconds, 1e-9), 3),
        }
    return {
        "tokens_per_s": round(tokens / wall, 3),
        "decode_tokens_per_s": round(tokens / max(wall - prefill, 1e-9), 3),
        **own,
        "p50_latency_s": round(quantile(latency, 0.5), 3),
        "p95_latency_s": round(quantile(latency, 0.95), 3),
        "p50_ttft_s": round(quantile(ttft, 0.5), 3),
        "answers": len(served),
        "identical_to_greedy": sum(s.tokens == r for s, r in zip(served, reference, strict=True)),
        "seconds": round(wall, 3),
        "new_tokens": tokens,
    }


def _diverging(
    engine: LookaheadEngine, prompts: list[list[int]], served: list[Served], reference: list[list[int]]
) -> list[dict[str, Any]]:
    """The answers that are not greedy's, each with where it leaves greedy's and ``generate``'s
    margin there (`divergences`), worked out after the timed run."""
    answers = [s.tokens for s in served]
    return divergences(engine, prompts, answers, reference)


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values``, sorted ascending."""
    return values[min(len(values) - 1, int(q * len(values)))]


# Each rate, and the name of its ratio to a base method's.
_SPEEDUPS = {
    "tokens_per_s": "speedup",
    "decode_tokens_per_s": "decode_speedup",
    "run_decode_tokens_per_s": "run_decode_speedup",
}


def _ratios(results: dict[str, dict[str, Any]]) -> None:
    for base in ("serialised", "hf_static_batch"):
        if base not in results:
            continue
        for measures in results.values():
            for key, ratio in _SPEEDUPS.items():
                if key in measures and key in results[base]:
                    measures[f"{ratio}_vs_{base}"] = round(measures[key] / results[base][key], 3)
            measures[f"p95_latency_vs_{base}"] = round(
                measures["p95_latency_s"] / max(results[base]["p95_latency_s"], 1e-9), 3
            )


def format_concurrency(summary: dict[str, Any]) -> str:
    """A plain-text table per concurrency level."""
    head = (
        f"{'method':<24}{'tok/s':>8}{'decode':>9}{'in run':>9}{'p50 s':>8}{'p95 s':>8}{'ttft s':>8}"
        f"{'same':>7}{'vs serial':>10}{'vs static':>10}"
    )
    lines = []
    for clients, level in summary["concurrency"].items():
        lines += [f"{clients} clients, {level['arrival']}", head, "-" * len(head)]
        for name, m in level["methods"].items():
            lines.append(
                f"{name:<24}{m['tokens_per_s']:>8.2f}{m['decode_tokens_per_s']:>9.2f}"
                f"{m.get('run_decode_tokens_per_s', 0):>9.2f}"
                f"{m['p50_latency_s']:>8.2f}{m['p95_latency_s']:>8.2f}{m['p50_ttft_s']:>8.2f}"
                f"{m['identical_to_greedy']:>4}/{m['answers']:<2}"
                f"{m.get('speedup_vs_serialised', 0):>9.2f}x{m.get('speedup_vs_hf_static_batch', 0):>9.2f}x"
            )
        for name, m in level["methods"].items():
            lines += describe(name, m.get("divergences", ()))
        lines.append("")
    return "\n".join(lines)
