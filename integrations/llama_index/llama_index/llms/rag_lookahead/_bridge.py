"""Driving the engine's blocking `TextStream` from asyncio without blocking the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator

from rag_lookahead import Chunk, TextStream

__all__ = ["aiter_chunks"]


async def aiter_chunks(stream: TextStream) -> AsyncGenerator[Chunk, None]:
    """The stream's chunks, each decoding step run in a worker thread.

    Cancelling the consumer stops generation after the step in flight: that step cannot be
    interrupted, so the close is queued behind it instead of racing it from the loop.
    """
    chunks = stream.chunks()
    # A generator may run in one thread at a time; steps and the final close take turns.
    lock = threading.Lock()

    def step() -> Chunk | None:
        with lock:
            return next(chunks, None)

    def close() -> None:
        with lock:
            stream.close()

    loop = asyncio.get_running_loop()
    finished = False
    try:
        while (chunk := await asyncio.to_thread(step)) is not None:
            yield chunk
        finished = True
    finally:
        if finished:
            stream.close()  # already closed by exhaustion; this is a no-op
        else:
            try:
                loop.run_in_executor(None, close)
            except RuntimeError:  # the loop's executor is gone (interpreter or loop shutdown)
                close()
