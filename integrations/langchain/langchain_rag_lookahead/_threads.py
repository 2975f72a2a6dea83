"""Async iteration over a blocking iterator, which runs in a worker thread."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

__all__ = ["iterate_in_thread"]

T = TypeVar("T")

_ITEM, _ERROR, _DONE = "item", "error", "done"


async def iterate_in_thread(iterator: Iterator[T]) -> AsyncIterator[T]:
    """Yield ``iterator``'s items while a worker thread advances it; the loop never blocks.

    The iterator is advanced and closed only by the worker, never concurrently. When the
    consumer stops early (``aclose``, cancellation, an exception), the worker stops before the
    next item and closes the iterator, which ends generation and releases what it held.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stop = threading.Event()

    def send(kind: str, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass

    def produce() -> None:
        try:
            try:
                for item in iterator:
                    if stop.is_set():
                        break
                    send(_ITEM, item)
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer to re-raise
            send(_ERROR, exc)
        else:
            send(_DONE, None)

    # The worker sees the caller's context variables (tracing, config), as asyncio.to_thread does.
    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(produce,), name="rag-lookahead", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == _ITEM:
                yield value
            elif kind == _ERROR:
                raise value
            else:
                return
    finally:
        stop.set()
