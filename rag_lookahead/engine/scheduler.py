"""Continuous batching: every running call's step in one forward, in the model's thread.

Calls join at a step boundary and leave when they finish or are cancelled. A joining call's
prompt goes in within one budget of prompt tokens a step, riding in the batch's steps or in
chunks apart in its own cache (`CallCaches`), as the `PromptPlanner` plans. The batch's step
(`Rows.step`) computes every row as if it were alone, so batching changes no output. Calls that
cannot share the batch decode plainly in their own cache, between steps.

The loop runs in the model's own thread (`ModelThread`), one iteration after another while
any call is queued or running: a submitted call starts at once, whether or not it is read yet,
and the threads that read its chunks only wait for them. A call nobody reads advances with the
others, and is ended when its stream is closed or dropped. A call whose drafter has long texts
to take in (documents, a scope's) takes them in first, a slice between two steps of the running
calls (`Preparation`), taking turns with other such calls; then its prompt is prefilled.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Generator

from rag_lookahead.drafting.compose import TEXT_SLICE
from rag_lookahead.engine import observe
from rag_lookahead.engine.caches import CallCaches
from rag_lookahead.engine.executor import Executor
from rag_lookahead.engine.kept import KeptPrompts
from rag_lookahead.engine.prefill import PromptChunk, PromptPlanner
from rag_lookahead.engine.pricing import Pricing, PromptForwards
from rag_lookahead.engine.request import (
    Call,
    CallStatus,
    Decoder,
    choose_next,
    first_token,
    hear_end,
    let_go,
    read,
    release,
)
from rag_lookahead.engine.rows import Rows
from rag_lookahead.planning.costs import CostModel
from rag_lookahead.streaming.stats import FinishReason
from rag_lookahead.streaming.stream import StreamChunk
from rag_lookahead.tuning.tuner import ModelTuning

__all__ = ["Scheduler"]


class Scheduler:
    """The decoding loop of every call on one model, run by the model's thread."""

    def __init__(
        self,
        tuning: ModelTuning,
        costs: CostModel,
        max_batch_size: int,
        max_tokens_per_forward: int,
        max_prefill_tokens_per_step: int,
        prefix_cache_bytes: int = 0,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_tokens_per_forward = max_tokens_per_forward
        self.max_prefill_tokens_per_step = max_prefill_tokens_per_step
        self._lock = threading.Lock()  # guards the waiting queue
        self._waiting: deque[Call] = deque()
        # Only the thread running an iteration touches these.
        self._preparing: list[Call] = []  # taking their drafters' long texts in, in turn
        self._joining: list[Call] = []  # prefilling apart, in order
        self._alone: list[Call] = []  # decoding plainly outside the batch
        self._decoders: dict[Call, Decoder] = {}  # what acts on each call, given with it
        self._executor = Executor(tuning.runner)
        # (the rows' widest step, asked of them at each plan: they are made with the pricing)
        self.pricing = Pricing(costs, max_tokens_per_forward, tuning.runner.packs, widest=self._widest)
        self._prompts = PromptPlanner(self.pricing, max_prefill_tokens_per_step)
        self._rows = Rows(self._executor, self.pricing, self._prompts)  # some may still be prefilling
        self._kept = KeptPrompts(prefix_cache_bytes, tuning.generation)
        self._caches = CallCaches(self._executor, self.pricing, self._kept)  # the others' own
        self._tuning = tuning
        self._thread = tuning.thread
        self._thread.attach(self)

    @property
    def prompt_forwards(self) -> PromptForwards:
        """The prompts forwarded alone so far (chunks apart between steps, or a prompt with
        the model to itself): what a benchmark leaves out of decoding, as timed in its run."""
        return self.pricing.prompt_forwards

    def _widest(self) -> int | None:
        return self._rows.widest()

    def submit(self, call: Call, decoder: Decoder) -> None:
        """Queue ``call``, decoded by ``decoder``: it starts at the next step boundary; read
        what it releases with `chunks`."""
        observe.queued(self, call)  # (before the loop can end it)
        with self._lock:
            self._decoders[call] = decoder
            self._waiting.append(call)
        self._thread.wake()

    def chunks(self, call: Call) -> Generator[StreamChunk, None, None]:
        """What ``call`` releases, as the model's thread releases it; closing this generator
        (or an error in the reader's loop) cancels the call."""
        return read(call)

    def cancel(self, call: Call, wait: bool = True) -> None:
        """Stop ``call`` at the next step boundary (nothing if it has ended); with ``wait``,
        return once it has left and released what it held (at most one step later)."""
        call.cancelled = True
        with self._lock:
            if call in self._waiting:  # not started yet: it ends here, holding nothing
                self._waiting.remove(call)
                self._decoders.pop(call, None)
                call.finish("abandoned")
                hear_end(call)
        self._thread.wake()
        if wait and not self._thread.in_thread():  # (a finaliser inside one: the next retires it)
            call.ended.wait()

    def has_work(self) -> bool:
        """Whether a call is queued or running (asked by the model's thread, between
        iterations: only the queue may change meanwhile)."""
        return bool(self._waiting or self._preparing or self._joining or self._rows or self._alone)

    # ------------------------------------------------------------------ the loop

    def iterate(self) -> None:
        """One iteration of the loop, in the model's thread; a fault outside every phase's
        guard ends every call with it (none is left waiting on a loop that cannot go on)."""
        try:
            with observe.iteration(self):
                self._iterate()
        except Exception as err:
            with self._lock:
                waiting, self._waiting = list(self._waiting), deque()
            for call in [*waiting, *self._preparing, *self._joining, *self._rows.calls, *self._alone]:
                self._end(call, err)
            self._rows.reset()

    def _iterate(self) -> None:
        # 1. admit waiting calls, up to the batch size
        self._admit()
        # 2. end what was cancelled
        self._retire_cancelled()
        # 3. prompts that go on apart, or ride in the batch's steps from now on
        if self._rows:
            self._guarded(self._rows.calls, self._move, batch=True)
        # 4. one step of the batch: the drafts, and the prompts' chunks riding in it
        if self._rows:
            step = functools.partial(self._rows.step, self, self._decoders, self._end, self._kept.keep)
            self._guarded(self._rows.calls, step, batch=True)
        # 5. one step of each call outside the batch
        for call in list(self._alone):
            self._guarded([call], functools.partial(self._alone_step, call))
        # 6. a slice of a joining call's long texts (it prefills once all are in)
        if self._preparing:
            call = self._preparing.pop(0)
            self._guarded([call], functools.partial(self._prepare, call))
        # 7. joining prompts' chunks apart, with what the step left of the budget
        self._prefill_joining()

    def _admit(self) -> None:
        """Waiting calls join, in order, while fewer than ``max_batch_size`` run."""
        self._kept.refresh(self._tuning.generation)
        with self._lock:
            running = len(self._preparing) + len(self._joining) + len(self._rows) + len(self._alone)
            while self._waiting and running < self.max_batch_size:
                call = self._waiting.popleft()
                call.status = CallStatus.PREFILLING
                # Texts that would hold the loop up go in first, in slices; short ones at the first token.
                prepare = self._decoders[call].prepare
                long_texts = prepare is not None and prepare.left > TEXT_SLICE
                (self._preparing if long_texts else self._joining).append(call)
                call.generation = self._kept.generation
                running += 1

    def _retire_cancelled(self) -> None:
        for group in (self._preparing, self._joining, self._alone):
            for call in [c for c in group if c.cancelled]:
                self._end(call)
        gone = [i for i, c in enumerate(self._rows.calls) if c.cancelled]
        for i in gone:
            self._end(self._rows.calls[i])
        self._rows.drop(gone)

    def _guarded(self, calls: list[Call], run: Callable[[], None], batch: bool = False) -> None:
        """Run one phase concerning ``calls`` (all the ``batch``'s, or one): a failure ends
        them, with the error, and no others."""
        calls = list(calls)  # (as they were: the phase may change the rows)
        try:
            run()
        except Exception as err:
            for call in calls:
                self._end(call, err)
            if batch:  # the cache may be half updated: the batch starts afresh
                self._rows.reset()

    # ------------------------------------------------------------------ prompts

    def _move(self) -> None:
        """Rows whose prompts go on apart, from copies of their rows (first in the batch, first
        to go on), or joining calls whose prompts ride in the batch's steps from now on."""
        move = self._prompts.move(self._rows.calls, self._joining, self._ridable)
        for i in reversed(move.unfuse):
            call = self._rows.calls[i]
            self._caches.put(call, self._rows.take_out(i))
            self._joining.insert(0, call)
        self._rows.drop(list(move.unfuse))
        for call in move.fuse:
            self._guarded([call], functools.partial(self._add_row, call))

    def _ridable(self, call: Call) -> int | None:
        """The prompt tokens ``call`` has left, if it may ride in the batch's steps."""
        if not call.batchable or call in self._caches:  # (one prefilling apart goes on)
            return None
        if self._rows.slots() is not None:  # (a static step's rows only decode)
            return None
        return len(call.prompt_ids) - self._caches.cached_prefix(call)

    def _add_row(self, call: Call) -> None:
        """``call`` becomes a row of the batch (its cache, as prefilled so far, moves in)."""
        if call in self._joining:
            self._joining.remove(call)
        expected = min(self.max_batch_size, len(self._rows) + 1 + len(self._joining))
        self._rows.add(call, self._caches.take(call), expected)

    def _prepare(self, call: Call) -> None:
        """A slice of ``call``'s long texts taken in (it is out of `_preparing`): then it
        prefills, or waits its next turn behind the other calls taking texts in."""
        prepare = self._decoders[call].prepare
        assert prepare is not None
        prepare.advance(TEXT_SLICE)
        (self._joining if prepare.left <= 0 else self._preparing).append(call)

    def _prefill_joining(self) -> None:
        """Chunks of the joining prompts forwarded apart while the step's budget lasts (as the
        planner chooses them, `PromptPlanner.next_apart`): prompts arriving together start
        within a few steps of each other, not one chunk per step of the running rows."""
        try:
            begun = False
            while self._joining:
                if begun:  # calls submitted meanwhile (clients starting together) compete too
                    self._admit()
                others, cached = bool(self._rows or self._alone), self._caches.cached_prefix
                chunk = self._prompts.next_apart(self._joining, self._rows.calls, others, cached)
                if chunk is None:
                    return
                begun, before = True, self.pricing.prompt_forwards.tokens
                self._guarded([chunk.call], functools.partial(self._prefill, chunk))
                forwarded = self.pricing.prompt_forwards.tokens - before
                if forwarded == 0 and chunk.call in self._joining:
                    return  # (nothing went: never spin on one call)
                self._prompts.forwarded(chunk, forwarded, self._joining)
        finally:
            self._prompts.end_step(self._joining)

    def _prefill(self, chunk: PromptChunk) -> None:
        """``chunk`` of a call's prompt forwarded apart, in its own cache; once all of it is,
        the call takes its first token and becomes a row (or decodes alone)."""
        call, released = chunk.call, chunk.call.recorder.new_tokens
        logits, seconds = self._caches.prefill(chunk)
        if chunk.end == len(call.prompt_ids):
            self._kept.keep(call, self._caches[call])
            self._joining.remove(call)
            decoder = self._decoders[call]
            if not self._settle(call, first_token(call, decoder, logits)):
                if call.batchable and self._rows.takes(
                    len(call.prompt_ids) + decoder.stopping.max_new_tokens
                ):
                    self._add_row(call)
                else:
                    if call.batchable:  # (longer than a static step's slots: plainly, alone)
                        call.recorder.drafting_off = "beyond_max_model_len"
                    self._alone.append(call)
        if observe.watching():
            released = call.recorder.new_tokens - released
            observe.prompt_apart(self, call.prompt_ids, chunk.end, chunk.tokens, seconds, released)

    def _alone_step(self, call: Call) -> None:
        """One plain step of a call outside the batch, in the model's own cache."""
        token, released, decoder = call.ids[-1], call.recorder.new_tokens, self._decoders[call]
        logits, seconds = self._caches.plain_step(call)
        verdict = choose_next(call, decoder, logits)
        call.recorder.step(0, 0, "none")
        self._settle(call, release(call, decoder, verdict))  # an ended call has left `_alone`
        observe.plain_step(self, token, seconds, call.recorder.new_tokens - released)

    # ------------------------------------------------------------------ endings

    def _settle(self, call: Call, reason: FinishReason | None) -> bool:
        """``call`` ends, if ``reason`` says it stops; whether it has ended."""
        if reason is None:
            return False
        call.finish(reason)
        self._end(call)
        return True

    def _end(self, call: Call, error: BaseException | None = None) -> None:
        """The call is over: out of every queue, what it holds released, its reader told."""
        for group in (self._preparing, self._joining, self._alone):
            if call in group:
                group.remove(call)
        call.finish("abandoned")  # unless it finished
        self._caches.take(call)
        decoder = self._decoders.pop(call, None)
        error = let_go(decoder, error) if decoder is not None else error
        observe.ended(self, call)  # (before its reader hears of it)
        hear_end(call, error)
