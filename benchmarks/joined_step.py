"""A joining prompt's chunk inside a packed step, against the chunk forwarded apart plus the
running rows' step without it.

Builds 8 rows holding the dolly rows' numbers of cached tokens (``--lengths``), each drafting a chain of 2
tokens, and one joining row (10 cached tokens) whose next chunk is ``--chunk`` tokens. Times,
alternated in the model's thread: the packed step with the chunk beside the drafts (its inputs
built in the timing), the chunk forwarded alone in its own cache, and the packed step of the 8
rows alone. What joins priced as packed steps would save per chunk (issue 42's third item).

    python benchmarks/joined_step.py --threads 2 --json benchmarks/joined-step-epyc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from packed_steps import chain, prefilled_rows
from retrieval_build import cpu_name

from rag_lookahead import LookaheadEngine
from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.runtime.batch import BatchCache
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner

LENGTHS = (247, 1855, 168, 190, 230, 233, 207, 330)  # the dolly rows' cached tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=240, help="tokens of the joining prompt's chunk")
    parser.add_argument(
        "--lengths", default=",".join(map(str, LENGTHS)), help="cached tokens per running row"
    )
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runner = LookaheadEngine.from_pretrained(args.model).runner
    lengths = tuple(int(n) for n in args.lengths.split(","))
    if not runner.packs():
        raise SystemExit("this model's steps are not packed on this device (see ModelRunner.packs)")
    ms = runner.thread.call(lambda: _time(runner, lengths, args.chunk, args.repeats))
    apart = ms["chunk_apart"] + ms["step_without_chunk"]
    for name, value in ms.items():
        print(f"{name:<24} {value:>7.1f} ms")
    together = ms["packed_step_with_chunk"]
    print(f"{'apart, chunk and step':<24} {apart:>7.1f} ms: packed together {apart / together:.2f}x faster")
    if args.json:
        record = {"cpu": cpu_name(), "threads": args.threads, "chunk": args.chunk, "lengths": lengths, **ms}
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)


def _packed(runner: ModelRunner, batch: BatchCache, drafts: list[StepDraft]) -> float:
    """Seconds of one packed step, its inputs built in the timing (nothing kept)."""
    start = time.perf_counter()
    inputs = runner.packed_inputs(drafts, batch.lengths)
    batch.prepare(inputs)
    runner.forward_packed(inputs, batch.cache, batch.lengths, [0])
    return time.perf_counter() - start


def _time(runner: ModelRunner, lengths: tuple[int, ...], chunk: int, repeats: int) -> dict[str, float]:
    joined, running = prefilled_rows(runner, (*lengths, 10)), prefilled_rows(runner, lengths)
    vocab, rows = int(runner.model.config.vocab_size), len(lengths)
    names = ("packed_step_with_chunk", "chunk_apart", "step_without_chunk")
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        with_chunk = [chain(2)] * rows + [chain(chunk, vocab)]
        times["packed_step_with_chunk"].append(_packed(runner, joined, with_chunk))
        cache = new_tree_cache()
        runner.forward(torch.tensor([[5] * 10]), cache, last_only=True)
        start = time.perf_counter()
        runner.forward(torch.tensor([list(chain(chunk, vocab).tree.tokens)]), cache, last_only=True)
        times["chunk_apart"].append(time.perf_counter() - start)
        times["step_without_chunk"].append(_packed(runner, running, [chain(2)] * rows))
    return {name: round(1000 * statistics.median(values[2:]), 1) for name, values in times.items()}


if __name__ == "__main__":
    main()
