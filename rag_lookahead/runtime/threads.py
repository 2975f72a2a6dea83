"""The thread that runs a model's torch work.

On a CPU, torch's OpenMP runtime keeps a team of worker threads for every thread that has run
parallel work, for as long as that thread lives; once more threads hold teams than there are
cores, every team's workers must be woken for each parallel region, and a small model's forward
gets much slower. So a model's torch work all runs in one long-lived thread (`ModelThread`):
its loading (`LookaheadEngine.from_pretrained`), the measurements of its costs and kernels, and
the decoding loop that batches every call's forwards, as vLLM's engine core runs apart from its
frontend. The threads that ask, stream and serve only hand work over and wait for its results.

The team is the process's, not a model's: so, unless given another, every engine (and the
embedder of a pipeline or server) runs in one thread per process, `ModelThread.shared()`; two
models then take turns, as their forwards would on the same cores anyway.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Loop", "ModelThread"]

T = TypeVar("T")
_log = logging.getLogger(__name__)
# How long the end of a model thread waits for the round it is in (a forward, a measurement).
_END_WAIT_S = 60.0


class Loop(Protocol):
    """A loop a `ModelThread` runs while it has work (a `Scheduler`)."""

    def has_work(self) -> bool: ...

    def iterate(self) -> None: ...


class ModelThread:
    """One long-lived daemon thread that runs a model's work: the loops attached to it, one
    iteration at a time while they have work, and between iterations what `call` hands over.
    It ends once this object is collected (the engines using it are gone)."""

    _shared: ModelThread | None = None
    _sharing = threading.Lock()

    @classmethod
    def shared(cls) -> ModelThread:
        """The process's model thread, started on first use: every engine's unless given
        another (one OpenMP team in the process)."""
        with cls._sharing:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def __init__(self, name: str = "rag-lookahead-model") -> None:
        self._worker = _Worker()
        self._holder: threading.Thread | None = None
        self._thread = threading.Thread(target=self._worker.run, name=name, daemon=True)
        self._thread.start()
        # Also at exit: a thread still holding its OpenMP team when the process ends aborts it.
        weakref.finalize(self, _end, self._worker, self._thread)

    def call(self, work: Callable[[], T]) -> T:
        """``work()`` run in this thread (between two iterations, in the caller's context) and
        its result or exception; run at once when called from this thread."""
        if self.in_thread():
            return work()
        job: _Job[T] = _Job(work, contextvars.copy_context())
        self._worker.put(job)
        return job.result()

    def attach(self, loop: Loop) -> None:
        """Run ``loop`` (held weakly: it may be collected) whenever it has work."""
        self._worker.attach(weakref.ref(loop))

    def wake(self) -> None:
        """Look again whether the loops have work (after a call was submitted or cancelled)."""
        self._worker.wake()

    def in_thread(self) -> bool:
        """Whether the current thread runs the model's work: this thread (a finaliser run
        inside an iteration), or the one holding it (`held`)."""
        return threading.current_thread() in (self._thread, self._holder)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The current thread takes this one's place while the block runs: this thread waits
        between two iterations, and the block may run a loop's iterations itself (a test steps
        a loop one iteration at a time) and `call` runs its work at once."""
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            holding.set()
            release.wait()

        job: _Job[None] = _Job(hold, contextvars.copy_context())
        self._worker.put(job)
        holding.wait()
        self._holder = threading.current_thread()
        try:
            yield
        finally:
            self._holder = None
            release.set()
            job.result()


def _end(worker: _Worker, thread: threading.Thread) -> None:
    """Stop ``worker`` and wait for its thread to end (it finishes the round it is in)."""
    worker.stop()
    if threading.current_thread() is not thread:
        thread.join(timeout=_END_WAIT_S)


@dataclass
class _Job(Generic[T]):
    work: Callable[[], T]
    context: contextvars.Context
    done: threading.Event = field(default_factory=threading.Event)
    outcome: list[T] = field(default_factory=list)
    failure: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        try:
            self.outcome.append(self.context.run(self.work))
        except BaseException as exc:  # re-raised in the caller's thread
            self.failure.append(exc)
        finally:
            self.done.set()

    def result(self) -> T:
        self.done.wait()
        if self.failure:
            raise self.failure[0]
        return self.outcome[0]


class _Worker:
    """The thread's side: what it holds (nothing that keeps a `ModelThread` alive)."""

    def __init__(self) -> None:
        self._ready = threading.Condition()  # guards the jobs, the loops and ``stopped``
        self._jobs: deque[_Job[Any]] = deque()
        self._loops: list[weakref.ref[Loop]] = []
        self._stopped = False

    def put(self, job: _Job[Any]) -> None:
        with self._ready:
            if self._stopped:
                raise RuntimeError("this model's thread has been closed")
            self._jobs.append(job)
            self._ready.notify()

    def attach(self, loop: weakref.ref[Loop]) -> None:
        with self._ready:
            self._loops.append(loop)
            self._ready.notify()

    def wake(self) -> None:
        with self._ready:
            self._ready.notify()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()

    def run(self) -> None:
        while self._round():
            pass

    def _round(self) -> bool:
        """Wait for work, run it; whether to go on. What it ran is let go when it returns, so
        that a loop whose engines are gone can be collected while the thread waits."""
        with self._ready:
            # Looked at under the condition's lock, which `wake` takes: no wake-up is lost.
            busy = self._busy_loops()
            while not (self._jobs or self._stopped or busy):
                self._ready.wait()
                busy = self._busy_loops()
            if self._stopped and not self._jobs:
                return False
            jobs, self._jobs = self._jobs, deque()
        for job in jobs:
            job.run()
        for loop in busy:
            self._iterate(loop)
        return True

    def _busy_loops(self) -> list[Loop]:
        self._loops = [ref for ref in self._loops if ref() is not None]
        loops = (ref() for ref in self._loops)
        return [loop for loop in loops if loop is not None and loop.has_work()]

    @staticmethod
    def _iterate(loop: Loop) -> None:
        try:
            loop.iterate()
        except Exception:  # a loop ends its own calls' failures; this one would stop them all
            _log.exception("rag-lookahead: a decoding iteration failed outside every call")
