"""Who may generate now: at most ``max_running`` requests, ``max_waiting`` more in line.

A request beyond both is answered at once (429, with ``Retry-After``) rather than queued
without bound; once the server is closing, new requests are refused (503).
"""

from __future__ import annotations

import asyncio

from rag_lookahead.serve.errors import ApiError
from rag_lookahead.serve.metrics import ServerMetrics

__all__ = ["Admission", "Slot"]


class Slot:
    """One running request's place; `release` (idempotent) hands it to the next in line."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._leave()


class Admission:
    """Running and waiting requests, counted on the event loop (no locks needed)."""

    def __init__(
        self, max_running: int, max_waiting: int, retry_after_s: int, metrics: ServerMetrics
    ) -> None:
        self._slots = asyncio.Semaphore(max_running)
        self._max_waiting = max_waiting
        self._retry_after = str(retry_after_s)
        self._metrics = metrics
        self.running = 0
        self.waiting = 0
        self.closing = False

    async def enter(self) -> Slot:
        """A running slot, once one is free; 503 when closing, 429 when the line is full."""
        if self.closing:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if self._slots.locked() and self.waiting >= self._max_waiting:
            raise ApiError(
                429,
                f"too many requests: {self.running} running and {self.waiting} waiting; retry later",
                code="queue_full",
                headers={"Retry-After": self._retry_after},
            )
        self._count(waiting=1)
        try:
            await self._slots.acquire()
        finally:
            self._count(waiting=-1)
        self._count(running=1)
        return Slot(self)

    def close(self) -> None:
        """Refuse new requests from now on; those admitted run to their end."""
        self.closing = True

    def _leave(self) -> None:
        self._count(running=-1)
        self._slots.release()

    def _count(self, *, running: int = 0, waiting: int = 0) -> None:
        self.running += running
        self.waiting += waiting
        self._metrics.running.set(self.running)
        self._metrics.waiting.set(self.waiting)
