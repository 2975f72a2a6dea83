"""A blocking iterator (a `TextStream`, its chunks, an adapter's pieces) as an async iterator.

Both integrations stream through this one bridge, so cancellation behaves the same in each.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncGenerator, Iterator
from typing import Any, TypeVar

__all__ = ["aiterate"]

T = TypeVar("T")

_ITEM, _ERROR, _DONE = "item", "error", "done"


async def aiterate(iterator: Iterator[T]) -> AsyncGenerator[T, None]:
    """Yield ``iterator``'s items while a worker thread advances it; the loop never blocks.

    The iterator is advanced and closed only by the worker, never concurrently. When the
    consumer stops early (``aclose``, cancellation, an exception), the worker stops before the
    next item and closes the iterator (its ``close``, if it has one), which ends generation and
    releases what the call held. The worker sees the caller's context variables (tracing,
    callbacks), as `asyncio.to_thread` does.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stop = threading.Event()

    def send(kind: str, value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

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
        except BaseException as exc:
            send(_ERROR, exc)
        else:
            send(_DONE, None)

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
