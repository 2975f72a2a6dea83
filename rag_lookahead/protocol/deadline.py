"""A local call's deadline (an adapter's ``timeout`` without a server): past it, the call stops
and its reader gets `TimeoutError`, as other chat models' timeouts raise, rather than a
silently cut answer."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rag_lookahead.streaming.stream import TextStream

__all__ = ["within_deadline"]

T = TypeVar("T")


def within_deadline(items: Iterable[T], stream: TextStream, seconds: float | None) -> Iterator[T]:
    """``items`` read off ``stream`` (its text pieces, or its `TextStream.chunks`), the stream
    closed once ``seconds`` have passed since the first was asked for; the reading then ends
    in `TimeoutError` (a call that finished first keeps its answer). ``None``: no deadline.

    The close comes from a timer thread, so that a call waiting for its turn ends too, a step
    later at most.
    """
    if seconds is None:
        yield from items
        return
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        stream.close()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield from items
    finally:
        timer.cancel()
    if expired.is_set() and stream.stats.finish_reason == "abandoned":
        raise TimeoutError(f"the call ran past its timeout of {seconds} s")
