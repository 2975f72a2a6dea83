"""The captured static step against eager decoding and transformers' compiled greedy (issue 62).

On a GPU (``benchmarks/cuda/captured.sh`` runs it there): builds a `StaticDecoder` whose
buckets are captured as CUDA graphs and one that runs the same buffers eagerly, then

1. checks exactness: every record's answer, plain and with trie drafts from its own prompt,
   captured and eager, against greedy `generate` (fp32: all identical);
2. times one step per bucket, captured replay against eager, and reports each bucket's capture
   time and the slot cache's memory;
3. times whole answers: greedy `generate` (eager, dynamic cache), transformers' compiled
   static-cache greedy (`rag_lookahead.bench.run.compiled_greedy`: one static cache under
   ``torch.compile`` with ``mode="reduce-overhead"``), today's eager engine (``engine_lookahead``),
   the static step plain and with trie drafts, eager and captured, one record at a time and all
   records as one batch of rows.

On a CPU nothing is captured (each bucket runs eagerly, so the captured figures repeat the
eager ones) and transformers' greedy is compiled by inductor: a smoke run of the same code.

    python benchmarks/captured_step.py --model PATH --data dolly.jsonl --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import GenerationParams, LookaheadEngine
from rag_lookahead.bench.run import compiled_greedy, gold_inputs, hf_generate, load_records
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter
from rag_lookahead.engine.static_decoder import StaticDecoder
from rag_lookahead.runtime.static import Buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--data", nargs="+", required=True, help="JSONL records with question and context")
    parser.add_argument("--limit", type=int, default=4, help="records per data set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", default="1,2,4,8", help="bucket row counts")
    parser.add_argument("--widths", default="1,4,8,16,32", help="bucket tree widths")
    parser.add_argument("--reps", type=int, default=20, help="timed steps per bucket")
    parser.add_argument(
        "--context", type=int, default=256, help="committed columns per row when timing steps"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads on a CPU (0: torch's)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = LookaheadEngine.from_pretrained(args.model, device=args.device, dtype=args.dtype)
    sets = {
        Path(path).stem: [
            item.prompt_ids for item in gold_inputs(engine, load_records(Path(path), args.limit))
        ]
        for path in args.data
    }
    buckets = Buckets(_ints(args.rows), _ints(args.widths))
    longest = max(len(p) for prompts in sets.values() for p in prompts)
    max_len = max(longest + args.max_new_tokens, args.context) + buckets.widest
    max_len += -max_len % 64
    summary: dict[str, Any] = {"device": _device_name(engine), "dtype": args.dtype, "model": args.model}
    summary |= {"max_new_tokens": args.max_new_tokens, "max_len": max_len, "torch": torch.__version__}
    start = time.perf_counter()
    captured = StaticDecoder(engine.model, max_len, buckets, capture=True)
    summary["build_seconds"] = time.perf_counter() - start
    eager = StaticDecoder(engine.model, max_len, buckets, capture=False)
    record = captured.step.record
    summary["captured_buckets"] = [str(b) for b in captured.step.captured]
    summary["capture_seconds"] = {str(b): s for b, s in record.seconds.items()}
    summary["capture_problems"] = record.problems
    summary["slot_cache_mb"] = captured.step.cache.nbytes() / 2**20
    summary["step_ms"] = _bucket_times(captured, eager, buckets, args.context, args.reps, engine.device)
    summary["sets"] = {
        name: {
            "records": len(prompts),
            "methods": _methods(engine, captured, eager, prompts, args.max_new_tokens),
        }
        for name, prompts in sets.items()
    }
    _report(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def _device_name(engine: LookaheadEngine) -> str:
    device = engine.device
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bucket_times(
    captured: StaticDecoder,
    eager: StaticDecoder,
    buckets: Buckets,
    context: int,
    reps: int,
    device: torch.device,
) -> dict[str, dict[str, float]]:
    """Median milliseconds of one step per bucket (chains of made-up tokens after ``context``
    columns), replayed and eager."""
    times: dict[str, dict[str, float]] = {}
    for bucket in buckets.all():
        trees = [
            DraftTree(tuple(range(5, 5 + bucket.width)), tuple(range(-1, bucket.width - 1)))
        ] * bucket.rows
        lengths = [context] * bucket.rows
        times[str(bucket)] = {
            name: _median_ms(functools.partial(decoder.step.run, trees, lengths), reps, device)
            for name, decoder in (("captured", captured), ("eager", eager))
        }
        # Of a captured step: filling its buffers (the masks built on the device), then the replay.
        times[str(bucket)]["fill"] = _median_ms(
            functools.partial(captured.step.prepare, trees, lengths), reps, device
        )
        times[str(bucket)]["replay"] = _median_ms(
            functools.partial(captured.step.forward, bucket), reps, device
        )
    return times


def _median_ms(step: Callable[[], Any], reps: int, device: torch.device) -> float:
    step()  # (a first eager run picks its kernels)
    seconds = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return 1000 * statistics.median(seconds)


def _methods(
    engine: LookaheadEngine,
    captured: StaticDecoder,
    eager: StaticDecoder,
    prompts: list[list[int]],
    new: int,
) -> dict[str, dict[str, Any]]:
    """Each method's answers over every record: tokens a second, and how many equal greedy's."""
    stop = set(engine.eos_token_ids)
    errors: dict[str, str] = {}
    compiled = compiled_greedy(engine, captured.step.max_len)
    try:
        for prompt in prompts:  # transformers compiles (on a GPU) here, untimed
            compiled(prompt, new)
    except Exception as err:  # a baseline that fails is reported, the rest still run
        errors["greedy_compiled"] = f"{type(err).__name__}: {err}"

    def static(decoder: StaticDecoder, drafts: bool) -> Callable[[list[list[int]]], list[list[int]]]:
        def answer(batch: list[list[int]]) -> list[list[int]]:
            drafters = _trie_drafters(batch) if drafts else None
            return decoder.generate(batch, new, drafters, stop).tokens

        return answer

    def one_by_one(answer: Callable[[list[int]], list[int]]) -> Callable[[list[list[int]]], list[list[int]]]:
        return lambda batch: [answer(prompt) for prompt in batch]

    methods: dict[str, Callable[[list[list[int]]], list[list[int]]]] = {
        "greedy": one_by_one(lambda p: hf_generate(engine, p, new)),
        "greedy_compiled": one_by_one(lambda p: compiled(p, new)),
        "engine_lookahead": one_by_one(
            lambda p: engine.stream(p, GenerationParams(max_new_tokens=new)).complete().token_ids
        ),
        "static_plain": one_by_one(lambda p: static(eager, False)([p])[0]),
        "static_lookahead": one_by_one(lambda p: static(eager, True)([p])[0]),
        "captured_plain": one_by_one(lambda p: static(captured, False)([p])[0]),
        "captured_lookahead": one_by_one(lambda p: static(captured, True)([p])[0]),
        "captured_plain_rows": static(captured, False),
        "captured_lookahead_rows": static(captured, True),
    }
    results: dict[str, dict[str, Any]] = {}
    for name, run in methods.items():
        if name in errors:
            continue
        try:
            results[name] = _timed(run, prompts, engine.device)
        except Exception as err:  # (as above)
            errors[name] = f"{type(err).__name__}: {err}"
    reference = results["greedy"].pop("answers")
    for result in results.values():
        answers = result.pop("answers", reference)
        result["identical"] = sum(a == r for a, r in zip(answers, reference, strict=True))
        result["of"] = len(reference)
    greedy = results.get("greedy_compiled", {}).get("tokens_per_s")
    for result in results.values():
        result["vs_greedy_compiled"] = result["tokens_per_s"] / greedy if greedy else None
    return {**results, **{name: {"error": error} for name, error in errors.items()}}


def _trie_drafters(batch: Sequence[Sequence[int]]) -> Callable[[int, Sequence[int]], TrieDrafter]:
    """Each prompt's drafter over a trie of its own prompt (its documents are in it)."""
    trie = TokenTrie()
    return lambda i, prompt: TrieDrafter(trie, f"call{i}", [prompt], min_match=1)


def _timed(
    run: Callable[[list[list[int]]], list[list[int]]], prompts: list[list[int]], device: torch.device
) -> dict[str, Any]:
    _sync(device)
    start = time.perf_counter()
    answers = run(prompts)
    _sync(device)
    seconds = time.perf_counter() - start
    tokens = sum(len(a) for a in answers)
    return {"seconds": seconds, "new_tokens": tokens, "tokens_per_s": tokens / seconds, "answers": answers}


def _report(summary: dict[str, Any]) -> None:
    print(f"{summary['device']} {summary['dtype']}: built in {summary['build_seconds']:.1f} s")
    print(
        f"slot cache {summary['slot_cache_mb']:.1f} MiB, captured {len(summary['captured_buckets'])} buckets"
    )
    for problem in summary["capture_problems"]:
        print(f"  {problem}")
    print(f"{'bucket':>7} {'captured ms':>12} {'fill':>6} {'replay':>7} {'eager ms':>9} {'capture s':>10}")
    for bucket, ms in summary["step_ms"].items():
        seconds = summary["capture_seconds"].get(bucket)
        shown = "-" if seconds is None else f"{seconds:.2f}"
        print(
            f"{bucket:>7} {ms['captured']:>12.2f} {ms['fill']:>6.2f} {ms['replay']:>7.2f} {ms['eager']:>9.2f}"
            f" {shown:>10}"
        )
    for name, figures in summary["sets"].items():
        print(f"{name + ':':<24} {'tok/s':>8} {'x compiled':>10} identical")
        for method, result in figures["methods"].items():
            if "error" in result:
                print(f"  {method:<22} failed: {result['error']}")
                continue
            ratio = result["vs_greedy_compiled"]
            shown = "-" if ratio is None else f"{ratio:.2f}x"
            same = f"{result['identical']}/{result['of']}"
            print(f"  {method:<22} {result['tokens_per_s']:>8.1f} {shown:>10} {same}")


if __name__ == "__main__":
    main()
