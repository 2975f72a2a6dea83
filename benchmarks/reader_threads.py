"""One call read from the thread that loaded the model, then from a new thread: ms per token.

torch's OpenMP runtime keeps a team of workers for every thread that ran parallel work; the
engine's loop runs in whichever reader's thread waits, so a reader other than the loader adds a
second team on the same cores. Run it under each wait policy to compare, e.g.

    python benchmarks/reader_threads.py --threads 2
    OMP_WAIT_POLICY=PASSIVE python benchmarks/reader_threads.py --threads 2
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from rag_lookahead import LookaheadConfig, LookaheadEngine


def per_token(engine: LookaheadEngine, prompt: list[int], tokens: int) -> float:
    """Seconds per token of one plain call, after its first token (prefill left out)."""
    chunks = iter(engine.stream(prompt, max_new_tokens=tokens + 1).chunks())
    next(chunks)
    started, count = time.perf_counter(), 0
    for chunk in chunks:
        count += len(chunk.token_ids)
    return (time.perf_counter() - started) / max(count, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=500, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = LookaheadConfig(mode="off", prefix_cache_mb=0)
    engine = LookaheadEngine.from_pretrained(args.model, config=config)
    vocab = min(1000, engine.vocab_size)  # (a tiny model's is smaller)
    prompt = [(7 * i + 3) % vocab for i in range(args.context)]
    for _ in range(args.rounds):
        main_thread = per_token(engine, prompt, args.tokens)
        other: list[float] = []

        def read(into: list[float] = other) -> None:
            into.append(per_token(engine, prompt, args.tokens))

        reader = threading.Thread(target=read)
        reader.start()
        reader.join()
        print(f"main thread {1000 * main_thread:.1f} ms/token | a new thread {1000 * other[0]:.1f} ms/token")


if __name__ == "__main__":
    main()
