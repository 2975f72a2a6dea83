"""The static step on a CPU: eager and compiled by inductor, against the engine's own step, by bucket.

Issue 62 asks that a CPU run the static step's buckets through whichever is faster on the
machine: the engine's direct eager forward or a compiled one. This times, for each bucket
(``rows x width``: chains of ``width`` made-up tokens after ``--context`` cached ones per row),

- ``engine``: the engine's step as it runs today, by its runner on the backend it chose (the
  direct forward over the rows' growing caches; one row by `ModelRunner.forward_step`, several
  by a packed step, `ModelRunner.forward_packed`);
- ``static-eager-N``: a `StaticStep` of ``max_len`` N, the model's own forward run eagerly
  over the slot cache (every one of the N columns read, the unused ones masked);
- ``static-<mode>-N``: the same step with the model's forward compiled by ``torch.compile``
  (inductor, ``dynamic=False``: one graph per bucket), in mode ``default``, ``frozen``
  (weights folded in as constants, so inductor may pack them for oneDNN) or ``autotune``
  (``max-autotune-no-cudagraphs`` with frozen weights).

A static step is timed as `StaticStep.prepare` (its buffers filled) plus `StaticStep.forward`.
Each compiled bucket's first call (its compilation) is timed apart, before the timed rounds
(the 1x1 bucket's graph is compiled as the step is built, by its first forward: ``build``);
in each round every variant runs ``--reps`` steps of each bucket in turn, the order rotated
between rounds, so a change in the machine's load meets every variant. Reported per bucket:
each variant's median milliseconds, and its ratio to ``engine``'s (the median of the rounds'
ratios); and each variant's largest logit difference from ``engine``'s and whether every
greedy choice agrees. Everything runs in the model's thread, as the engine's forwards do.

    python benchmarks/static_step_cpu.py --json benchmarks/static-step-cpu-xeon.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from retrieval_build import cpu_name

from rag_lookahead import LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime.batch import BatchCache
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.static import Bucket, Buckets, StaticStep, prompt_entries

# torch.compile's arguments per mode.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "frozen": {"options": {"freezing": True}},
    # (``mode="max-autotune-no-cudagraphs"``'s options: torch takes a mode or options, not both)
    "autotune": {"options": {"max_autotune": True, "triton.cudagraphs": False, "freezing": True}},
}


@dataclass
class Variant:
    """One way to run a bucket's step: ``step(bucket)`` returns its logits ``[R, W, V]``."""

    name: str
    step: Callable[[Bucket], torch.Tensor]
    buckets: list[Bucket]
    first_call_s: dict[str, float] = field(default_factory=dict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=256, help="cached tokens per row before a step")
    parser.add_argument("--buckets", default="1x1,1x4,1x8,1x16,4x4", help="rows x width of each step")
    parser.add_argument("--eager-max-lens", default="320,1024", help="max_len of each eager static step")
    parser.add_argument("--compiled-max-len", type=int, default=320, help="max_len of the compiled steps")
    parser.add_argument(
        "--modes", default="default,frozen,autotune", help=f"compile modes among {','.join(MODES)}"
    )
    parser.add_argument(
        "--autotune-buckets", default="1x1", help="the buckets the autotune mode compiles, if chosen"
    )
    parser.add_argument("--reps", type=int, default=8, help="timed steps per variant, bucket and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--round-limit-s",
        type=float,
        default=600,
        help="start no further round after this many seconds of rounds",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    buckets = [_bucket(text) for text in args.buckets.split(",")]
    engine = LookaheadEngine.from_pretrained(args.model)
    runner = engine.runner
    started = time.perf_counter()
    result = runner.thread.call(lambda: _measure(runner, args, buckets))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result = {
        "benchmark": "static_step_cpu",
        "cpu": cpu_name(),
        "model": args.model or "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "torch": torch.__version__,
        "threads": args.threads,
        "context": args.context,
        "reps": args.reps,
        "rounds": args.rounds,
        "engine_backend": str(runner.backend),
        **result,
    }
    _print(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(json.dumps(result, indent=1) + "\n")


def _bucket(text: str) -> Bucket:
    rows, _, width = text.partition("x")
    return Bucket(int(rows), int(width))


def _measure(runner: ModelRunner, args: argparse.Namespace, buckets: list[Bucket]) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    # Every compiled bucket of every mode is one more graph of the model's forward: none may
    # fall back to eager for having too many.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 256
    ladder = Buckets(
        tuple(sorted({1, *(b.rows for b in buckets)})), tuple(sorted({1, *(b.width for b in buckets)}))
    )
    vocab = int(runner.model.config.vocab_size)
    prompt = torch.tensor([[(31 * i + 7) % vocab for i in range(args.context)]])  # [1, C]
    with torch.inference_mode():
        cache = new_tree_cache()
        runner.model(input_ids=prompt, cache=cache, use_cache=True)
    entries = prompt_entries(cache)
    variants = [_engine(runner, prompt, ladder, buckets)]
    for max_len in map(int, args.eager_max_lens.split(",")):
        variants.append(
            Variant(f"static-eager-{max_len}", _static(runner, max_len, ladder, entries, args), buckets)
        )
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        covered = buckets if mode != "autotune" else [_bucket(t) for t in args.autotune_buckets.split(",")]
        start = time.perf_counter()
        step = _static(runner, args.compiled_max_len, ladder, entries, args, MODES[mode])
        variant = Variant(f"static-{mode}-{args.compiled_max_len}", step, covered)
        variant.first_call_s["build"] = round(time.perf_counter() - start, 2)
        variants.append(variant)
    logits: dict[str, dict[Bucket, torch.Tensor]] = {v.name: {} for v in variants}
    for variant in variants:  # first calls: the compilations
        for bucket in variant.buckets:
            start = time.perf_counter()
            logits[variant.name][bucket] = variant.step(bucket).clone()
            variant.first_call_s[str(bucket)] = round(time.perf_counter() - start, 2)
            print(f"{variant.name} {bucket}: first call {variant.first_call_s[str(bucket)]} s", flush=True)
    seconds: dict[tuple[str, Bucket], list[list[float]]] = {}
    rounds_started = time.perf_counter()
    for round_ in range(args.rounds):
        if round_ and time.perf_counter() - rounds_started > args.round_limit_s:
            print(f"round limit reached after {round_} rounds", flush=True)
            break
        shift = round_ % len(variants)
        for bucket in buckets:
            for variant in variants[shift:] + variants[:shift]:
                if bucket in variant.buckets:
                    seconds.setdefault((variant.name, bucket), []).append(
                        _timed(variant.step, bucket, args.reps)
                    )
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    return {
        "rounds_run": len(next(iter(seconds.values()))),
        "buckets": [str(b) for b in buckets],
        "compile_first_call_s": {v.name: v.first_call_s for v in variants if v.name.startswith("static-")},
        "step_ms": _table(variants, buckets, seconds, logits),
    }


def _engine(runner: ModelRunner, prompt: torch.Tensor, ladder: Buckets, buckets: list[Bucket]) -> Variant:
    """The engine's step: one row over its own cache, several as one packed step."""
    caches: dict[int, Any] = {}
    batches: dict[int, BatchCache] = {}
    context = prompt.shape[1]

    def step(bucket: Bucket) -> torch.Tensor:
        rows, width = bucket
        tree = _chain(width)
        if rows == 1:
            if 1 not in caches:
                caches[1] = runner.forward(prompt, new_tree_cache(), last_only=True)[1]
            logits, cache = runner.forward_step(StepDraft(tree), caches[1], context)  # [W, V]
            cache.crop(-width)  # (the next step writes the same columns again)
            return logits[None]
        if rows not in batches:
            batches[rows] = BatchCache(packed=True)
            for _ in range(rows):
                row = runner.forward(prompt, new_tree_cache(), last_only=True)[1]
                batches[rows].add_row(row, expected_rows=rows)
        batch = batches[rows]
        packed = runner.packed_inputs([StepDraft(tree)] * rows, batch.lengths)
        batch.prepare(packed)  # (steps not kept: every one writes the same columns)
        return runner.forward_packed(packed, batch.cache, batch.lengths).view(rows, width, -1)

    return Variant("engine", step, buckets)


def _static(
    runner: ModelRunner,
    max_len: int,
    ladder: Buckets,
    entries: list[tuple[torch.Tensor, torch.Tensor]],
    args: argparse.Namespace,
    compile_args: dict[str, Any] | None = None,
) -> Callable[[Bucket], torch.Tensor]:
    """A static step whose every slot holds the prompt's entries, over the model compiled with
    ``compile_args`` where given (its first forward, which allocates the slot cache, compiles
    the 1x1 bucket)."""
    model = (
        runner.model if compile_args is None else torch.compile(runner.model, dynamic=False, **compile_args)
    )
    static = StaticStep(model, max_len, ladder)
    for slot in range(ladder.most_rows):
        static.load(slot, entries)

    def step(bucket: Bucket) -> torch.Tensor:
        rows, width = bucket
        return static.run([_chain(width)] * rows, [args.context] * rows)  # [R, W, V]

    return step


def _chain(width: int) -> DraftTree:
    return DraftTree(tuple((13 * i + 5) for i in range(width)), tuple(range(-1, width - 1)))


def _timed(step: Callable[[Bucket], torch.Tensor], bucket: Bucket, reps: int) -> list[float]:
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        step(bucket)
        seconds.append(time.perf_counter() - start)
    return seconds


def _table(
    variants: list[Variant],
    buckets: list[Bucket],
    seconds: dict[tuple[str, Bucket], list[list[float]]],
    logits: dict[str, dict[Bucket, torch.Tensor]],
) -> dict[str, dict[str, Any]]:
    """Per bucket and variant: median ms over every rep, each round's median, the median of the
    rounds' ratios to the engine's, and the logits against the engine's."""
    table: dict[str, dict[str, Any]] = {}
    for bucket in buckets:
        engine_rounds = [statistics.median(r) for r in seconds[("engine", bucket)]]
        reference = logits["engine"][bucket]
        row: dict[str, Any] = {}
        for variant in variants:
            if bucket not in variant.buckets:
                continue
            rounds = [statistics.median(r) for r in seconds[(variant.name, bucket)]]
            got = logits[variant.name][bucket]
            row[variant.name] = {
                "median_ms": round(
                    1e3 * statistics.median(s for r in seconds[(variant.name, bucket)] for s in r), 2
                ),
                "round_medians_ms": [round(1e3 * r, 2) for r in rounds],
                "ratio_to_engine": round(
                    statistics.median(r / e for r, e in zip(rounds, engine_rounds, strict=True)), 3
                ),
                "max_abs_logit_difference": float((got - reference).abs().max()),
                "argmax_agrees": bool(torch.equal(got.argmax(-1), reference.argmax(-1))),
            }
        table[str(bucket)] = row
    return table


def _print(result: dict[str, Any]) -> None:
    print(f"{result['cpu']}, {result['threads']} threads; ratio to the engine's step (median ms)")
    for bucket, row in result["step_ms"].items():
        cells = "  ".join(
            f"{name} {v['ratio_to_engine']:.2f}x ({v['median_ms']:.1f})" for name, v in row.items()
        )
        print(f"{bucket:>5}  {cells}")


if __name__ == "__main__":
    main()
