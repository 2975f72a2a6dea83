"""Watching the decoding loop: every iteration, every forward it ran and what each row came to.

Benchmarks and profilers see the loop through these records rather than by wrapping the
scheduler's methods, which change from one version to the next. An observer registered with
`observe_steps` sees every engine's loop in the process (those a command builds too):

    log = StepLog()
    with observe_steps(log):
        engine.complete(prompt, max_new_tokens=64)
    for iteration in log.iterations:
        for step in iteration.steps:
            print(step.kind, len(step.rows), step.width, step.seconds, step.released)

Each iteration of a loop (`Iteration`: its wall and CPU seconds) holds the forwards it ran, as
`Step` records: a step of the batch (``"batch"``; ``"fused"`` when a prompt's chunk rides in
it; ``"row"`` with one row), a prompt's chunk forwarded apart (``"prompt"``), a plain step of a
call decoding outside the batch (``"plain"``). Per row a step says what the drafter proposed,
what the plan forwarded of it and how many tokens the call released (`RowStep`). Calls are
reported as they are queued and as they end (`CallEvent`).

Observers run in the loop's thread (the model's thread: `ModelThread`), between its phases,
except `StepObserver.queued`, which runs in the thread that started the call: keep them quick.
An observer that raises is warned about and dropped; the calls go on. Nothing is recorded while
no observer is registered.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.engine.step import RowPlan, StepPlan
from rag_lookahead.streaming.stats import DecodeStats

__all__ = [
    "CallEvent",
    "Iteration",
    "RowStep",
    "Step",
    "StepKind",
    "StepLog",
    "StepObserver",
    "observe_steps",
]

StepKind = Literal["batch", "fused", "row", "prompt", "plain"]


@dataclass(frozen=True)
class RowStep:
    """One row's part of a forward."""

    forwarded: StepDraft  # what the row forwarded: the planned part of its draft, or a prompt's chunk
    proposed: StepDraft | None = None  # the drafter's proposal it was cut from (``None``: a prompt's chunk)
    prompt: bool = False  # a chunk of the call's prompt: every token kept, none verified
    released: int = 0  # tokens the call released after this forward (its first token after its prompt)


@dataclass(frozen=True)
class Step:
    """One forward of the loop, and what came of it.

    ``seconds`` is the forward's alone (on a GPU, until the device finished it). For a step of
    the batch, ``draft_seconds`` is the rows' drafting, ``plan_seconds`` the plan and the
    forward's inputs, ``update_seconds`` the verification, the cache's update and the release
    of every row's tokens.
    """

    kind: StepKind
    rows: tuple[RowStep, ...]
    seconds: float
    packed: bool = False  # the rows' tokens side by side, unpadded (else padded to the widest)
    draft_seconds: float = 0.0
    plan_seconds: float = 0.0
    update_seconds: float = 0.0

    @property
    def tokens(self) -> int:
        """Tokens forwarded, every row's, unpadded."""
        return sum(len(row.forwarded) for row in self.rows)

    @property
    def width(self) -> int:
        """The widest row's tokens: what every row pays for when the rows are padded."""
        return max((len(row.forwarded) for row in self.rows), default=0)

    @property
    def released(self) -> int:
        """Tokens the step's calls released after it."""
        return sum(row.released for row in self.rows)


@dataclass(frozen=True)
class Iteration:
    """One iteration of a loop: the forwards it ran, in order, and its time."""

    loop: int  # which loop: one per engine (its variants share it)
    started: float  # `time.perf_counter`
    seconds: float
    cpu_seconds: float  # the loop's thread's CPU time (`time.thread_time`): waits left out
    steps: tuple[Step, ...]

    @property
    def forward_seconds(self) -> float:
        return sum(step.seconds for step in self.steps)


@dataclass(frozen=True)
class CallEvent:
    """A call queued on a loop, or ended."""

    loop: int
    call: int  # numbers the calls of the process, in the order they were queued
    thread: int  # `threading.get_ident` of the thread that started the call
    time: float  # `time.perf_counter`
    stats: DecodeStats | None = None  # what the call did, once it ended


class StepObserver:
    """What an observer is told; each method does nothing unless overridden."""

    def queued(self, event: CallEvent) -> None:
        """A call was queued (in the thread that started it)."""

    def iteration(self, record: Iteration) -> None:
        """An iteration of a loop ended."""

    def ended(self, event: CallEvent) -> None:
        """A call ended: finished, cancelled or failed."""


class StepLog(StepObserver):
    """An observer that keeps every record, in order (readable once the calls ended)."""

    def __init__(self) -> None:
        self.iterations: list[Iteration] = []
        self.queued_calls: list[CallEvent] = []
        self.ended_calls: list[CallEvent] = []
        self._lock = threading.Lock()  # calls are queued from any thread

    def queued(self, event: CallEvent) -> None:
        with self._lock:
            self.queued_calls.append(event)

    def iteration(self, record: Iteration) -> None:
        self.iterations.append(record)

    def ended(self, event: CallEvent) -> None:
        self.ended_calls.append(event)

    @property
    def steps(self) -> list[Step]:
        """Every forward of every iteration, in order."""
        return [step for iteration in self.iterations for step in iteration.steps]


# Replaced whole, never changed: the loop reads it without a lock.
_observers: tuple[StepObserver, ...] = ()
_registering = threading.Lock()
_numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_loops, _calls = itertools.count(), itertools.count()
# Each loop's iteration under way, while observed: its steps so far and the thread running it.
_open: weakref.WeakKeyDictionary[Any, tuple[list[Step], int]] = weakref.WeakKeyDictionary()
_closing = threading.Condition()  # guards `_open`; notified as an iteration ends
# How long leaving `observe_steps` waits for the iterations under way to end.
_EXIT_WAIT_S = 30.0
_starters: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # call -> its thread


@contextlib.contextmanager
def observe_steps(observer: StepObserver) -> Iterator[StepObserver]:
    """Within this block ``observer`` is told of every loop's iterations and calls. Leaving it
    waits for the iterations under way to end and be told (a call's reader returns before the
    iteration that ended the call does)."""
    global _observers
    with _registering:
        _observers = (*_observers, observer)
    try:
        yield observer
    finally:
        me = threading.get_ident()
        with _closing:  # (not the iteration this thread is in, if it is the loop's)
            pending = [id(steps) for steps, thread in _open.values() if thread != me]
            _closing.wait_for(
                lambda: not {id(steps) for steps, _ in _open.values()} & set(pending), _EXIT_WAIT_S
            )
        with _registering:
            _observers = tuple(o for o in _observers if o is not observer)


def watching() -> bool:
    """Whether an observer is registered (the loop builds no record otherwise)."""
    return bool(_observers)


def _tell(method: str, record: Any) -> None:
    global _observers
    for observer in _observers:
        try:
            getattr(observer, method)(record)
        except Exception as err:  # a benchmark's bug must not end the calls
            warnings.warn(f"rag-lookahead: step observer {observer!r} failed, dropped: {err!r}", stacklevel=2)
            with _registering:
                _observers = tuple(o for o in _observers if o is not observer)


def _number(counter: Iterator[int], thing: Any) -> int:
    with _registering:
        number = _numbers.get(thing)
        if number is None:
            number = _numbers[thing] = next(counter)
        return number


def queued(loop: Any, call: Any) -> None:
    """``call`` was queued on ``loop`` (by the calling thread)."""
    if _observers:
        event = CallEvent(
            _number(_loops, loop), _number(_calls, call), threading.get_ident(), time.perf_counter()
        )
        _starters[call] = event.thread  # told again as it ends, from the loop's thread
        _tell("queued", event)


def ended(loop: Any, call: Any) -> None:
    """``call`` (queued on ``loop``) ended."""
    if _observers:
        thread = _starters.get(call, 0)
        stats = call.recorder.stats()
        event = CallEvent(_number(_loops, loop), _number(_calls, call), thread, time.perf_counter(), stats)
        _tell("ended", event)


@contextlib.contextmanager
def iteration(loop: Any) -> Iterator[None]:
    """One iteration of ``loop``: the steps recorded meanwhile (`step`) are its own."""
    if not _observers:
        yield
        return
    steps: list[Step] = []
    with _closing:
        _open[loop] = (steps, threading.get_ident())
    started, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
        try:
            _tell("iteration", Iteration(_number(_loops, loop), started, seconds, cpu, tuple(steps)))
        finally:
            with _closing:
                _open.pop(loop, None)
                _closing.notify_all()


def step(loop: Any, record: Step) -> None:
    """``loop`` ran ``record`` in the iteration under way."""
    entry = _open.get(loop)
    if entry is not None:
        entry[0].append(record)


def batch_step(
    loop: Any,
    plan: StepPlan,
    proposals: Sequence[StepDraft | None],
    released: Sequence[int],
    seconds: tuple[float, float, float, float],
    packed: bool,
) -> None:
    """A step of the batch: ``plan``, each row's proposal, the tokens each row's call released,
    and the seconds of its draft, plan, forward and update."""
    rows = tuple(
        RowStep(row.draft, proposal, row.prompt, count)
        for row, proposal, count in zip(plan.rows, proposals, released, strict=True)
    )
    draft, planned, forward, update = seconds
    kind: StepKind = "fused" if plan.prompts else "batch"
    if len(rows) == 1:  # the forward a call alone runs (`Executor`)
        kind = "prompt" if plan.prompts else "row"
    step(loop, Step(kind, rows, forward, packed and len(rows) > 1, draft, planned, update))


def prompt_apart(
    loop: Any, prompt: Sequence[int], end: int, tokens: int, seconds: float, released: int
) -> None:
    """The ``tokens`` of ``prompt`` before ``end`` forwarded apart, in ``seconds``."""
    chunk = RowPlan.prompt_chunk(prompt, end - tokens, tokens)
    step(loop, Step("prompt", (RowStep(chunk.draft, None, True, released),), seconds))


def plain_step(loop: Any, token: int, seconds: float, released: int) -> None:
    """A plain step after ``token`` of a call outside the batch."""
    if not _observers or _open.get(loop) is None:  # (nothing to build while nobody watches)
        return
    row = RowStep(StepDraft(DraftTree((token,), (-1,))), None, False, released)
    step(loop, Step("plain", (row,), seconds))
