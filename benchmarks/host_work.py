"""Host work per batched step against the forward's time, at a full batch.

Runs ``--clients`` concurrent calls (one question each, all sent at once) on the batched engine
and, for every loop iteration that ran one step of the batch at exactly ``--clients`` rows and
nothing else (nobody joining), splits its time into the model's forward and the rest (drafting,
planning, the inputs and mask, choosing and accepting tokens, the cache's bookkeeping, stop
strings and the text): the host work, in wall time and in the driving thread's CPU time (which
waiting for the CPU or for the GIL leaves out; the forward counted at its wall time, as the
thread computes its share of it). Both come from the same run, so their ratio holds under load
better than the absolute milliseconds do. The iterations are the engine's step observer's
(`rag_lookahead.engine.observe`). ``--profile`` adds the functions that cost most in the
model's thread over the run (the forwards' torch calls among them). Also reported, to hold
against the batch replay's prices (`benchmarks/batch_replay.py`): the tokens a row gained per
full step, and the forward's median time by its width (tokens per row).

    python benchmarks/host_work.py --data dolly_context_qa.jsonl              # SmolLM2
    python benchmarks/host_work.py --tiny                                       # no data, tiny model
    python benchmarks/host_work.py --data set.jsonl --model DIR                 # another model
    python benchmarks/host_work.py --parts                                      # no model
    python benchmarks/host_work.py --drafts --data dolly_context_qa.jsonl --max-new-tokens 128  # no model

``--parts`` times two pieces of a step's host work against what they replaced, alternating
the two within one run, on the shapes of a full batch of SmolLM2 (8 rows of 700 to 1,000
cached tokens, 17-node trees, a 49,152-token vocabulary): the inputs and mask built row by row
(`rag_lookahead.testing.row_by_row_inputs`) against the batch's tensor build, and torch's
argmax over each row's logits against `first_argmax`.

``--drafts`` times one row's draft per step for each draft policy (``trie``: the trie's drafter;
``suffix``: the call's own text first, then the trie in the room left; and the suffix drafter
alone), on the first ``--records`` records of ``--data``: each prompt (chat template, the
default model's tokenizer) is drafted from after every token of the record's reference answer
(its first ``--max-new-tokens``), the policies timed in turn at every step (each the fastest
of three runs of the same draft), each policy with its own trie that keeps the answers given
so far, as the engine's does. Their ratio is what holds under load; run it with an older
checkout on ``PYTHONPATH`` to compare code.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.bench.run import gold_inputs, load_records
from rag_lookahead.decoding.argmax import first_argmax
from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.drafting.compose import build_drafter
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.engine.observe import Iteration, StepObserver, observe_steps
from rag_lookahead.models import BUILTIN_MODELS, DEFAULT_MODEL, builtin_model_dir
from rag_lookahead.prompts import encode_prompt, rag_messages
from rag_lookahead.runtime.batch import batch_inputs
from rag_lookahead.testing import random_tree, row_by_row_inputs


class StepClock(StepObserver):
    """Each loop iteration that ran one step of the batch at ``rows`` rows, none of them
    prefilling (told by the engine's step observer, `rag_lookahead.engine.observe`)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        # (iteration, forward, driving thread's CPU outside the forward) seconds at full batch
        self.steps: list[tuple[float, float, float]] = []
        self.shapes: list[tuple[int, int]] = []  # (tokens per row, tokens gained by the rows) a full step

    def iteration(self, record: Iteration) -> None:
        if len(record.steps) != 1:  # a prompt forwarded apart beside the step: someone joining
            return
        step = record.steps[0]
        if step.kind != "batch" or len(step.rows) != self.rows:
            return
        # The driving thread computes its share of the forward throughout: its CPU time outside
        # the forward is the iteration's less the forward's wall time.
        self.steps.append((record.seconds, step.seconds, max(record.cpu_seconds - step.seconds, 0.0)))
        width = -(-step.tokens // len(step.rows)) if step.packed else step.width
        self.shapes.append((width, step.released))

    def summary(self) -> dict[str, Any]:
        if not self.steps:
            raise SystemExit(f"no step ran with {self.rows} rows: raise --max-new-tokens")
        host = [total - forward for total, forward, _ in self.steps]
        forwards = [forward for _, forward, _ in self.steps]
        host_cpu = [cpu for _, _, cpu in self.steps]
        by_width: dict[int, list[float]] = {}
        for (width, _), forward in zip(self.shapes, forwards, strict=True):
            by_width.setdefault(width, []).append(forward)
        return {
            "steps_at_full_batch": len(self.steps),
            "host_ms_median": round(1000 * statistics.median(host), 3),
            "host_cpu_ms_median": round(1000 * statistics.median(host_cpu), 3),
            "forward_ms_median": round(1000 * statistics.median(forwards), 3),
            "host_over_forward": round(sum(host) / sum(forwards), 4),
            "host_cpu_over_forward": round(sum(host_cpu) / sum(forwards), 4),
            # What the batch replay prices: its widths, their forwards, the tokens they gained.
            "tokens_per_row_per_step": round(
                sum(g for _, g in self.shapes) / len(self.shapes) / self.rows, 3
            ),
            "forward_ms_by_width": {
                w: [len(ms), round(1000 * statistics.median(ms), 1)] for w, ms in sorted(by_width.items())
            },
        }


def run_clients(
    engine: LookaheadEngine, prompts: Sequence[list[int]], max_new_tokens: int, stop: Sequence[str]
) -> None:
    """Every prompt streamed by its own thread, all started together."""

    def answer(prompt: list[int]) -> None:
        # No end-of-sequence token: every answer runs its whole budget, so the batch stays full.
        params = {"max_new_tokens": max_new_tokens, "stop_strings": tuple(stop), "eos_token_id": ()}
        with engine.stream(prompt, **params) as stream:
            for _ in stream.chunks():
                pass

    threads = [threading.Thread(target=answer, args=(prompt,)) for prompt in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def tiny_setup(clients: int) -> tuple[LookaheadEngine, list[list[int]]]:
    """The tests' tiny random model and prompts that repeat themselves (so drafts are long)."""
    from rag_lookahead.testing import CharTokenizer, tiny_model

    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=clients)
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), config)
    prompts = [[(7 * j + 3 * row) % 50 + 3 for j in range(40)] * 6 for row in range(clients)]
    return engine, prompts


def real_setup(
    data: Path, clients: int, model: str | None, mode: str, policy: str
) -> tuple[LookaheadEngine, list[list[int]]]:
    config = LookaheadConfig(mode=mode, max_batch_size=clients, draft_policy=policy)  # type: ignore[arg-type]
    engine = LookaheadEngine.from_pretrained(model, config=config)
    return engine, [item.prompt_ids for item in gold_inputs(engine, load_records(data, clients))]


def parts(rows: int, repeats: int) -> dict[str, Any]:
    """Median milliseconds of the old and new build of a step's inputs and greedy tokens, the two
    timed in turn on the same inputs."""
    rng = random.Random(0)
    drafts = [StepDraft(random_tree(rng, 17)) for _ in range(rows)]
    lengths = [rng.randint(700, 1000) for _ in drafts]
    logits = torch.randn(rows, 17, 49152)  # [B, T, V]
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "inputs_and_mask": (
            lambda: row_by_row_inputs(drafts, lengths, torch.float32),
            lambda: batch_inputs(drafts, lengths, torch.device("cpu"), torch.float32),
        ),
        "greedy_tokens": (
            lambda: [logits[i].argmax(-1).tolist() for i in range(rows)],
            lambda: [first_argmax(logits[i]).tolist() for i in range(rows)],
        ),
    }
    out: dict[str, Any] = {}
    for name, (old, new) in pairs.items():
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(repeats):
            for run, kept in ((old, times[0]), (new, times[1])):
                start = time.perf_counter()
                run()
                kept.append(time.perf_counter() - start)
        before, after = (statistics.median(t) for t in times)
        out[name] = {"before_ms": round(1000 * before, 3), "after_ms": round(1000 * after, 3)}
        out[name]["speedup"] = round(before / after, 2)
    return out


def fastest(drafter: Drafter, context: list[int], budget: int, repeats: int = 3) -> float:
    """Seconds of the fastest of ``repeats`` drafts of ``context`` (a draft changes nothing):
    on a busy machine, what the other processes' time slices and the collector leave."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        drafter.propose(context, budget)
        best = min(best, time.perf_counter() - start)
    return best


def draft_times(data: Path, records: int, model: str | None, mode: str, answer_tokens: int) -> dict[str, Any]:
    """Microseconds per step of one row's draft for each policy (the same steps, timed in turn,
    each the fastest of 3 runs), and each against the trie policy's."""
    from transformers import AutoTokenizer

    name = model or DEFAULT_MODEL
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir(name) if name in BUILTIN_MODELS else name)
    calls = [
        (
            encode_prompt(tokenizer, rag_messages(r["question"], r["context"])),
            tokenizer(r.get("answer", ""), add_special_tokens=False).input_ids[:answer_tokens],
        )
        for r in load_records(data, records)
    ]
    policies = ("trie", "suffix")
    configs = {p: LookaheadConfig(mode=mode, draft_policy=p) for p in policies}  # type: ignore[arg-type]
    tries = {p: TokenTrie() for p in policies}
    times: dict[str, list[float]] = {p: [] for p in (*policies, "suffix_drafter_alone")}
    for prompt, answer in calls:
        drafters = {p: build_drafter(configs[p], tries[p], [prompt]) for p in policies}
        timed = {**drafters, "suffix_drafter_alone": drafters["suffix"].drafters[0]}
        context = list(prompt)
        for step, token in enumerate(answer):
            for label in list(timed)[:: 1 if step % 2 else -1]:  # each first in turn
                times[label].append(fastest(timed[label], context, configs["trie"].decoding_length))
            for drafter in drafters.values():
                drafter.observe([token])
            context.append(token)
        for drafter in drafters.values():
            drafter.close()
    out: dict[str, Any] = {
        "records": len(calls),
        "steps": len(times["trie"]),
        "prompt_tokens_mean": round(statistics.mean(len(p) for p, _ in calls), 1),
    }
    for label, kept in times.items():
        out[label] = {
            "us_mean": round(1e6 * statistics.mean(kept), 1),
            "us_median": round(1e6 * statistics.median(kept), 1),
            "over_trie": round(sum(kept) / sum(times["trie"]), 2),
        }
    return out


def top_host_functions(profile: cProfile.Profile, count: int) -> None:
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(count)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="JSONL questions with their contexts (the real model)")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random model instead")
    parser.add_argument("--model", default=None, help="a built-in model's name or a local directory")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--mode", default="trie", choices=("auto", "trie"), help="the engine's mode (real model)"
    )
    parser.add_argument("--draft-policy", default="suffix", choices=("suffix", "trie"))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--profile", type=int, default=0, help="print this many costliest host functions")
    parser.add_argument("--parts", action="store_true", help="time the replaced pieces only (no model)")
    parser.add_argument("--repeats", type=int, default=50, help="with --parts: timings of each")
    parser.add_argument(
        "--drafts", action="store_true", help="time one row's draft per policy (--data; no model)"
    )
    parser.add_argument("--records", type=int, default=40, help="with --drafts: records of --data")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.parts:
        print(json.dumps({"rows": args.clients, **parts(args.clients, args.repeats)}, indent=2))
        return
    if args.drafts:
        if args.data is None:
            parser.error("--drafts needs --data")
        times = draft_times(args.data, args.records, args.model, args.mode, args.max_new_tokens)
        print(json.dumps(times, indent=2))
        return
    if not args.tiny and args.data is None:
        parser.error("give --data (the real model), --tiny or --parts")
    engine, prompts = (
        tiny_setup(args.clients)
        if args.tiny
        else real_setup(args.data, args.clients, args.model, args.mode, args.draft_policy)
    )
    # Warm-up: the first forwards and the tree probe, and every prompt into the prefix cache,
    # so that the calls below join at once (a prompt's prefill is no step of the batch).
    for prompt in prompts:
        run_clients(engine, [prompt], 1, args.stop)
    clock = StepClock(args.clients)
    profile = cProfile.Profile() if args.profile else None
    thread = engine.runner.thread  # where the loop runs: a profile is per thread
    if profile is not None:
        thread.call(profile.enable)
    with observe_steps(clock):
        run_clients(engine, prompts, args.max_new_tokens, args.stop)
    if profile is not None:
        thread.call(profile.disable)
    summary = {
        "model": "tiny" if args.tiny else engine.model.name_or_path,
        "rows": args.clients,
        **clock.summary(),
    }
    print(json.dumps(summary, indent=2))
    if profile is not None:
        top_host_functions(profile, args.profile)


if __name__ == "__main__":
    main()
