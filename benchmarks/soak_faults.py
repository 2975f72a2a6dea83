"""Soak under faults: many threads answering through one pipeline, some of them misbehaving.

Each question is answered by one of ``--threads`` worker threads, which treats it in one of
five ways: reads it to the end, cancels it after a few chunks (``close``), raises in its
consumer loop (and carries on with the next question), drops the stream half-read without
closing it, or reads it through the asyncio bridge and stops early. At the end no trie node may
still be owned by any call, and every answer read to the end must equal the same question's
answer computed alone, single-threaded, with lookahead off.

    python benchmarks/soak_faults.py --data llma_msmarco_rag.jsonl --questions 400 --json out.json
    python benchmarks/soak_faults.py --data ... --tiny   # a tiny random model: the same traffic, fast
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import random
import resource
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from soak import rag_pipeline  # the same pipeline and tiny model as the plain soak (this folder)

from rag_lookahead import LookaheadConfig
from rag_lookahead.bench.run import load_records
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.rag import (
    RagPipeline,
    RetrievalConfig,
)
from rag_lookahead.streaming import aiterate

FATES = ("complete", "cancel", "raise", "abandon", "async_cancel")


class ConsumerFailed(Exception):
    """Raised on purpose inside a consumer loop."""


def consume(pipeline: RagPipeline, question: str, fate: str, tokens: int, rng: random.Random) -> str | None:
    """Treat one question as ``fate`` says; the whole answer when it is read to the end."""
    if fate == "complete":
        return pipeline.ask(question, max_new_tokens=tokens).text
    stream = pipeline.stream(question, max_new_tokens=tokens)
    stop_after = rng.randint(1, 4)
    if fate == "cancel":
        for n, _ in enumerate(stream, 1):
            if n >= stop_after:
                break
        stream.close()
    elif fate == "raise":
        try:
            for n, _ in enumerate(stream, 1):
                if n >= stop_after:
                    raise ConsumerFailed(question)
        except ConsumerFailed:
            pass
    elif fate == "abandon":
        for n, _ in enumerate(stream, 1):
            if n >= stop_after:
                break
    else:
        asyncio.run(_stop_early(stream, stop_after))
    return None


async def _stop_early(stream: object, stop_after: int) -> None:
    chunks = aiterate(stream.chunks())  # type: ignore[attr-defined]
    n = 0
    async for _ in chunks:
        n += 1
        if n >= stop_after:
            break
    await chunks.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--questions", type=int, default=400)
    parser.add_argument("--threads", type=int, default=8, help="worker threads answering at once")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--mode", default="trie", choices=("auto", "trie", "jacobi"))
    parser.add_argument("--tiny", action="store_true", help="a tiny random model instead of SmolLM2")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)

    records = load_records(args.data)
    pipeline = rag_pipeline(records, LookaheadConfig(mode=args.mode), args.tiny, args.model)
    engine, index = pipeline.engine, pipeline.index
    questions = [records[n % len(records)]["question"] for n in range(args.questions)]

    started = time.perf_counter()
    alone = RagPipeline(engine.plain(), index, RetrievalConfig(top_k=4))
    reference = {q: alone.ask(q, max_new_tokens=args.max_new_tokens).text for q in dict.fromkeys(questions)}
    reference_seconds = time.perf_counter() - started

    rng = random.Random(args.seed)
    work: queue.Queue[tuple[str, str, int]] = queue.Queue()
    for question in questions:
        work.put((question, rng.choice(FATES), rng.randrange(1 << 30)))
    results: list[tuple[str, str, str | None]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                question, fate, seed = work.get_nowait()
            except queue.Empty:
                return
            try:
                text = consume(pipeline, question, fate, args.max_new_tokens, random.Random(seed))
            except Exception as err:
                with lock:
                    errors.append(f"{fate}: {type(err).__name__}: {err}")
                continue
            with lock:
                results.append((question, fate, text))

    started = time.perf_counter()
    workers = [threading.Thread(target=worker, name=f"client-{i}") for i in range(args.threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    seconds = time.perf_counter() - started

    completed = [(q, t) for q, fate, t in results if fate == "complete"]
    owned = {o: engine.trie.count_owned(o) for o in engine.trie.owners() - {OUTPUT_OWNER}}
    report = {
        "data": args.data.name,
        "model": "tiny-random-llama" if args.tiny else args.model or "SmolLM2-135M-Instruct",
        "mode": args.mode,
        "questions": args.questions,
        "client_threads": args.threads,
        "torch_threads": args.torch_threads,
        "max_new_tokens": args.max_new_tokens,
        "fates": dict(Counter(fate for _, fate, _ in results)),
        "unexpected_errors": errors,
        "completed_identical_to_single_thread_plain": sum(reference[q] == t for q, t in completed),
        "completed": len(completed),
        "nodes_left_owned_by_calls": sum(owned.values()),
        "owners_left": len(owned),
        "final_trie_nodes": len(engine.trie),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "reference_seconds": round(reference_seconds, 1),
        "seconds": round(seconds, 1),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
