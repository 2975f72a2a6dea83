"""Which thread runs the decoding loop: whichever reader waits, preferring the last one.

No thread of its own runs the `Scheduler`'s loop. A reader waiting for its call's next chunk
runs one iteration for everybody, unless another reader already is (then it waits for its
chunk). The loop stays with the thread that last ran it while that thread keeps reading, since
every thread that runs torch work on a CPU slows all of them down
(`rag_lookahead.runtime.threads`); another reader takes it over once that thread has stopped
reading for a moment, or has ended.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["LoopDriver"]

T = TypeVar("T")

# How long a reader waits for its item before it checks whether it should drive the loop.
_POLL_SECONDS = 0.02
# How long the thread that last drove the loop may be away (between two chunks, or between
# one call and its next) before another reader takes the loop over.
_HANDOVER_SECONDS = 0.05


class LoopDriver:
    """Runs ``iterate`` (one iteration of a loop) in the threads that wait on the loop."""

    def __init__(self, iterate: Callable[[], None]) -> None:
        self._iterate = iterate
        self._lock = threading.Lock()  # guards the readers and the owner's leaving time
        self._driving = threading.Lock()  # held by the thread running an iteration
        self._driver: threading.Thread | None = None
        self._owner: threading.Thread | None = None  # the thread that last drove
        self._reading: dict[threading.Thread, int] = {}  # readers now waiting, by thread
        self._owner_left = 0.0  # when the owner last stopped reading

    @property
    def owner(self) -> threading.Thread | None:
        """The thread that last ran an iteration."""
        return self._owner

    def in_iteration(self) -> bool:
        """Whether the current thread is running an iteration (a finaliser called inside it)."""
        return threading.current_thread() is self._driver

    def next_item(self, outbox: queue.SimpleQueue[T]) -> T:
        """The next item of ``outbox``, driving the loop while it is empty (when this thread
        may), else waiting for another thread's iteration to fill it."""
        try:
            return outbox.get_nowait()
        except queue.Empty:
            pass
        with self.reading():
            while True:
                if not self.drive():  # another reader drives: wait for this item
                    try:
                        return outbox.get(timeout=_POLL_SECONDS)
                    except queue.Empty:
                        continue
                try:
                    return outbox.get_nowait()
                except queue.Empty:
                    pass

    def wait(self, done: threading.Event) -> None:
        """Drive the loop (or wait for another thread to) until ``done`` is set."""
        with self.reading():
            while not done.is_set():
                if not self.drive():
                    done.wait(_POLL_SECONDS)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Mark the current thread as waiting on the loop while the block runs."""
        me = threading.current_thread()
        with self._lock:
            self._reading[me] = self._reading.get(me, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._reading[me] -= 1
                if not self._reading[me]:
                    del self._reading[me]
                    if me is self._owner:
                        self._owner_left = time.monotonic()

    def drive(self) -> bool:
        """Run one iteration unless another thread is, or the loop stays with its owner;
        whether this thread did."""
        if not self._may_drive() or not self._driving.acquire(blocking=False):
            return False
        self._driver = self._owner = threading.current_thread()
        try:
            self._iterate()
        finally:
            self._driver = None
            self._driving.release()
        return True

    def _may_drive(self) -> bool:
        me, owner = threading.current_thread(), self._owner
        if owner is None or owner is me or not owner.is_alive():
            return True
        with self._lock:
            away = owner not in self._reading and time.monotonic() - self._owner_left > _HANDOVER_SECONDS
        return away
