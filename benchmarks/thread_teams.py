"""Why the engine keeps torch work in as few live threads as it can (CPU).

Times one decoding forward of the default model (one token after ~1,000 cached ones): in the
only thread that has done torch work, then in a second thread while the first one, idle but
alive, still holds its OpenMP team (as a thread that embedded a question would), then again
after that first thread has ended. (The engine runs all of a model's torch work in one
thread, `rag_lookahead.runtime.threads.ModelThread`, for this reason.)

    python benchmarks/thread_teams.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from rag_lookahead.models import load_model

T = TypeVar("T")


def in_passing_thread(work: Callable[[], T]) -> T:
    """``work()`` run in a new thread that ends with it (and takes its OpenMP team along)."""
    outcome: list[T] = []
    thread = threading.Thread(target=lambda: outcome.append(work()))
    thread.start()
    thread.join()
    return outcome[0]


def step_ms(model: Any, cache: Any, repeats: int = 15) -> float:
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            model(torch.tensor([[5]]), cache=cache, use_cache=True)
            cache.crop(-1)
            times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--context", type=int, default=1000, help="prompt tokens before the timed steps")
    parser.add_argument("--model", help="a model directory or built-in name (default: the default model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model)
    high = min(20_000, int(model.config.vocab_size))  # (a tiny model's vocabulary is smaller)
    prompt = torch.randint(min(100, high - 1), high, (1, args.context))

    def prefill() -> Any:
        with torch.inference_mode():
            return model(prompt, use_cache=True).past_key_values

    cache = in_passing_thread(prefill)
    figures = {"one_thread_ms": in_passing_thread(lambda: step_ms(model, cache))}
    holder_ready, release = threading.Event(), threading.Event()

    def holder() -> None:  # torch work, then idle but alive: its team stays
        step_ms(model, cache, repeats=2)
        holder_ready.set()
        release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    holder_ready.wait()
    figures["beside_an_idle_thread_with_a_team_ms"] = in_passing_thread(lambda: step_ms(model, cache))
    release.set()
    thread.join()
    figures["after_it_ended_ms"] = in_passing_thread(lambda: step_ms(model, cache))
    figures["threads"] = args.threads
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
