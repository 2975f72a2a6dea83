"""Benchmark: plain greedy `generate`, HF prompt lookup, and this engine on the same prompts.

Methods run alternately per record (the order rotates), so a busy machine slows all of them
alike; compare the ratios, not one absolute time.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.bench.divergence import describe, divergences
from rag_lookahead.bench.methods import METHODS
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.planning.costs import CostCurve, processor
from rag_lookahead.prompts import rag_messages
from rag_lookahead.runtime.kv_cache import cache_kwarg, new_tree_cache

__all__ = [
    "METHODS",
    "PROMPT_LOOKUP_TOKENS",
    "BenchInput",
    "MethodResult",
    "compiled_greedy",
    "format_table",
    "fresh_engine",
    "gold_inputs",
    "hf_generate",
    "load_records",
    "prefill_timer",
    "relative_costs",
    "run_benchmark",
    "run_header",
]

PROMPT_LOOKUP_TOKENS = 10
_GENERATE = ("greedy", "greedy_compiled", "prompt_lookup")  # the methods that run transformers' generate


@dataclass(frozen=True)
class BenchInput:
    """One prompt as every method sees it; ``documents`` also feed the engine's drafts."""

    prompt_ids: list[int]
    documents: tuple[str, ...] = ()


@dataclass
class MethodResult:
    """Totals for one method over all records."""

    seconds: float = 0.0
    new_tokens: int = 0
    identical_to_greedy: int = 0
    steps: int = 0  # forward passes after the prefill (engine only)
    drafted_steps: int = 0  # of them, those that verified a draft (engine only)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def load_records(path: Path, limit: int | None = None) -> list[dict[str, str]]:
    """JSONL records with at least ``question`` and ``context``."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not {"question", "context"} <= record.keys():
                raise ValueError(f"{path}:{n}: a record needs 'question' and 'context' fields")
            records.append(record)
            if limit is not None and len(records) >= limit:
                break
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


def gold_inputs(engine: LookaheadEngine, records: Sequence[dict[str, str]]) -> list[BenchInput]:
    """Each record's question asked about its own (gold) context."""
    return [BenchInput(engine.encode(rag_messages(r["question"], r["context"]))) for r in records]


Runner = Callable[[BenchInput], tuple[list[int], int, int]]  # tokens, steps, drafted steps


def hf_generate(
    engine: LookaheadEngine, prompt: Sequence[int], max_new_tokens: int, **extra: Any
) -> list[int]:
    """Plain transformers ``generate`` of one prompt, greedy (``extra``: e.g. prompt lookup),
    in the model's thread as the engine's own forwards (`ModelThread`)."""
    input_ids = torch.tensor([list(prompt)], device=engine.device)

    def generate() -> torch.Tensor:
        with torch.inference_mode():
            return engine.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=engine.eos_token_ids[0] if engine.eos_token_ids else None,
                **extra,
            )

    out = engine.runner.thread.call(generate)
    return list(out[0, len(prompt) :].tolist())


def compiled_greedy(engine: LookaheadEngine, max_length: int) -> Callable[[Sequence[int], int], list[int]]:
    """``generate`` as transformers documents its fastest plain decoding, as a function of a
    prompt and its new tokens' count: one static cache of ``max_length`` positions, reset
    before each call (so that the compiled step keeps one shape, and the addresses its graphs
    read, and is compiled once: at the first call), and the decoding forward compiled with
    ``mode="reduce-overhead"`` (on a GPU, replayed CUDA graphs; a prompt's forward runs as it
    is). Greedy, in the model's thread (`hf_generate`)."""
    from transformers import StaticCache
    from transformers.generation import CompileConfig

    cache = StaticCache(config=engine.model.config, max_cache_len=max_length)
    config = CompileConfig(mode="reduce-overhead")
    # transformers compiles on its own only on accelerators; on a CPU it is asked to by this
    # flag, its only way to (its docs: "often not optimal").
    if engine.device.type == "cpu":
        config._compile_all_devices = True  # type: ignore[assignment]  # (typed None there)
    extra = {cache_kwarg(engine.model): cache, "compile_config": config}

    def reset() -> None:
        with torch.inference_mode():  # (generate made its tensors there)
            cache.reset()

    def generate(prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        if len(prompt) + max_new_tokens > max_length:
            raise ValueError(
                f"{len(prompt)} + {max_new_tokens} tokens exceed the static cache's {max_length}"
            )
        engine.runner.thread.call(reset)
        return hf_generate(engine, prompt, max_new_tokens, **extra)

    return generate


def run_header(engine: LookaheadEngine, records: int, max_new_tokens: int) -> dict[str, Any]:
    """What every benchmark summary starts with: the model, the machine's settings, the run."""
    return {
        "model": str(getattr(engine.model.config, "_name_or_path", "") or type(engine.model).__name__),
        "device": str(engine.device),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        # What ran the forwards: machines (and processes, for `cpu_linear="auto"`) differ here,
        # each choice with where it came from (measured now, read from the cache, named).
        "processor": processor(engine.device),
        "backend": engine.backend.as_dict(),
        "records": records,
        "max_new_tokens": max_new_tokens,
    }


def relative_costs(curve: CostCurve) -> dict[str, float]:
    """A cost curve's forward seconds by size, relative to one token's."""
    return {str(k): round(v / curve(1), 3) for k, v in zip(curve.sizes, curve.seconds, strict=True)}


def _hf_runner(engine: LookaheadEngine, max_new_tokens: int, **extra: Any) -> Runner:
    return lambda item: (hf_generate(engine, item.prompt_ids, max_new_tokens, **extra), 0, 0)


def _compiled_runner(engine: LookaheadEngine, inputs: Sequence[BenchInput], max_new_tokens: int) -> Runner:
    generate = compiled_greedy(engine, max(len(item.prompt_ids) for item in inputs) + max_new_tokens)
    return lambda item: (generate(item.prompt_ids, max_new_tokens), 0, 0)


def prefill_timer(engine: LookaheadEngine, own: bool = True) -> Callable[[list[int]], float]:
    """Seconds of the prompt's forward alone, as the engine runs it (``own``: its kernels) or
    as ``generate`` does: the same for every method of one kind, so it is timed apart."""

    takes_keep = "logits_to_keep" in inspect.signature(engine.model.forward).parameters
    keep = {"logits_to_keep": 1} if takes_keep else {}

    def run(ids: list[int]) -> float:
        return engine.runner.thread.call(lambda: timed(ids))  # where the engine's forwards run

    def timed(ids: list[int]) -> float:
        input_ids = torch.tensor([ids], device=engine.device)
        start = time.perf_counter()
        if own:
            logits, _ = engine.runner.forward(input_ids, new_tree_cache(), last_only=True)  # [1, V]
        else:
            with torch.inference_mode():
                logits = engine.model(input_ids, use_cache=True, **keep).logits[0]  # [1, V]
        logits[-1].argmax().item()  # waits for the device
        return time.perf_counter() - start

    return run


def fresh_engine(engine: LookaheadEngine, config: LookaheadConfig) -> LookaheadEngine:
    """``engine``'s model, tokenizer, cost curve and template variables under ``config``, with a
    trie of its own: no benchmarked method drafts from another's answers. Planning by costs
    (``auto``), it reads them back as a new process would (`LookaheadEngine.measure_costs`):
    its own steps calibrate them and check a curve read from the disk."""
    fresh = LookaheadEngine(
        engine.model,
        engine.tokenizer,
        config,
        cost_curve=engine.cost_curve,
        cache_dir=engine.cache_dir,
        chat_template_kwargs=engine.chat_template_kwargs,
        model_thread=engine.runner.thread,
    )
    if config.mode == "auto" and engine.cost_curve is not None and fresh.tree_verification:
        fresh.measure_costs()
    return fresh


def _engine_runner(engine: LookaheadEngine, max_new_tokens: int) -> Runner:
    def run(item: BenchInput) -> tuple[list[int], int, int]:
        completion = engine.complete(item.prompt_ids, max_new_tokens=max_new_tokens, documents=item.documents)
        stats = completion.stats
        return completion.token_ids, stats.steps, sum(n > 0 for n in stats.drafted_per_step)

    return run


def run_benchmark(
    engine: LookaheadEngine,
    inputs: Sequence[BenchInput],
    max_new_tokens: int,
    methods: Iterable[str] = METHODS,
    progress: Callable[[Iterable[Any]], Iterator[Any]] = iter,
) -> dict[str, Any]:
    """Time each method on each input (see `gold_inputs`); return the JSON-ready summary."""
    methods = list(methods)
    chosen = ["greedy", *(m for m in METHODS if m in methods and m != "greedy")]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {list(METHODS)}")
    if not inputs:
        raise ValueError("nothing to benchmark: no inputs")
    runners = {
        "greedy": _hf_runner(engine, max_new_tokens),
        "prompt_lookup": _hf_runner(engine, max_new_tokens, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS),
        "lookahead": _engine_runner(engine, max_new_tokens),
    }
    # The engine forced into one mode, with its own trie: only those chosen (each engine builds
    # its own step, captured graphs and slots included where its step is static).
    for mode in ("trie", "jacobi", "auto", "off"):
        if mode in chosen:
            runners[mode] = _engine_runner(
                fresh_engine(engine, replace(engine.config, mode=mode)), max_new_tokens
            )
    if "greedy_compiled" in chosen:
        runners["greedy_compiled"] = _compiled_runner(engine, inputs, max_new_tokens)
    # The engine's prompt forward and generate's run on different kernels on a CPU (`cpu_linear`).
    prefills = {"generate": prefill_timer(engine, own=False), "engine": prefill_timer(engine)}
    warm = BenchInput(inputs[0].prompt_ids[-32:])
    for name in chosen:  # warm-up: first-call costs (allocations, the probe) are not timed
        runners[name](warm)
    for timer in prefills.values():
        timer(warm.prompt_ids)
    results = {name: MethodResult() for name in chosen}
    prefill_seconds = dict.fromkeys(prefills, 0.0)
    for i, item in enumerate(progress(inputs)):
        for kind, timer in prefills.items():
            prefill_seconds[kind] += timer(item.prompt_ids)
        order = chosen[i % len(chosen) :] + chosen[: i % len(chosen)]
        for name in order:
            start = time.perf_counter()
            tokens, steps, drafted = runners[name](item)
            result = results[name]
            result.seconds += time.perf_counter() - start
            result.new_tokens += len(tokens)
            result.steps += steps
            result.drafted_steps += drafted
            result.outputs.append(tokens)
    return _summary(engine, results, inputs, max_new_tokens, prefill_seconds)


def _summary(
    engine: LookaheadEngine,
    results: dict[str, MethodResult],
    inputs: Sequence[BenchInput],
    max_new_tokens: int,
    prefill_seconds: dict[str, float],
) -> dict[str, Any]:
    records, prompts = len(inputs), [item.prompt_ids for item in inputs]
    greedy = results["greedy"]
    greedy_decode = greedy.seconds - prefill_seconds["generate"]
    pld = results.get("prompt_lookup")
    methods = {}
    for name, r in results.items():
        r.identical_to_greedy = sum(a == b for a, b in zip(r.outputs, greedy.outputs, strict=True))
        prefill = prefill_seconds["generate" if name in _GENERATE else "engine"]
        methods[name] = {
            "seconds": round(r.seconds, 4),
            "new_tokens": r.new_tokens,
            "tokens_per_s": round(r.tokens_per_s, 3),
            "identical_to_greedy": r.identical_to_greedy,
            # Tokens per forward after the prefill (each record's first token is the prefill's).
            "mean_accepted_per_step": round((r.new_tokens - records) / r.steps, 3) if r.steps else None,
            # The share of those forwards that verified a draft (`auto` skips drafts it prices too dear).
            "drafted_step_share": round(r.drafted_steps / r.steps, 3) if r.steps else None,
            "speedup_vs_greedy": round(r.tokens_per_s / greedy.tokens_per_s, 3),
            "speedup_vs_prompt_lookup": round(r.tokens_per_s / pld.tokens_per_s, 3) if pld else None,
            # The same ratio after each method's prompt forward is taken out.
            "decode_speedup_vs_greedy": round(greedy_decode / (r.seconds - prefill), 3),
            # Answers that are not greedy's: where each leaves it, and generate's margin there.
            "divergences": divergences(engine, prompts, r.outputs, greedy.outputs),
        }
    return {
        **run_header(engine, records, max_new_tokens),
        "prefill_seconds": round(prefill_seconds["generate"], 4),
        "engine_prefill_seconds": round(prefill_seconds["engine"], 4),
        "lookahead_config": dict(vars(engine.config)),
        # The forward costs `auto` plans against (README: "2 tokens cost ~1.7x one").
        "cost_curve": _cost_curve(engine),
        "methods": methods,
    }


def _cost_curve(engine: LookaheadEngine) -> dict[str, float] | None:
    if engine.config.mode != "auto" or not engine.tree_verification:
        return None
    return relative_costs(engine.cost_curve or engine.measure_costs())


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary."""
    head = (
        f"{'method':<14}{'seconds':>9}{'tokens':>8}{'tok/s':>8}{'same':>6}{'acc/step':>9}"
        f"{'vs greedy':>10}{'vs PLD':>8}{'decode':>8}"
    )
    lines = [head, "-" * len(head)]
    for name, m in summary["methods"].items():
        acc = f"{m['mean_accepted_per_step']:.2f}" if m["mean_accepted_per_step"] else "-"
        pld = f"{m['speedup_vs_prompt_lookup']:.2f}x" if m["speedup_vs_prompt_lookup"] else "-"
        lines.append(
            f"{name:<14}{m['seconds']:>9.2f}{m['new_tokens']:>8}{m['tokens_per_s']:>8.2f}"
            f"{m['identical_to_greedy']:>4}/{summary['records']:<1}{acc:>9}"
            f"{m['speedup_vs_greedy']:>9.2f}x{pld:>8}{m['decode_speedup_vs_greedy']:>7.2f}x"
        )
    for name, m in summary["methods"].items():
        lines += describe(name, m.get("divergences", ()))
    return "\n".join(lines)
