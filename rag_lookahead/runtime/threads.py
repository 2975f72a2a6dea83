"""Running torch work in a thread of its own that ends with it.

On a CPU, torch's OpenMP runtime keeps a team of worker threads for every thread that has run
parallel work, for as long as that thread lives; once more threads hold teams than there are
cores, every team's workers must be woken for each parallel region, and a small model's forward
gets much slower. One-off work (the engine's setup measurements, a benchmark's reference runs)
therefore runs in a short-lived thread, so that it leaves no team behind in the caller's thread.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["in_passing_thread"]

T = TypeVar("T")


def in_passing_thread(work: Callable[[], T]) -> T:
    """``work()``, run in a new thread that ends with it; its result, or its exception."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), name="rag-lookahead-setup")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
