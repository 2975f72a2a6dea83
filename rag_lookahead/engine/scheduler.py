"""Continuous batching: every running call's step in one forward, in the model's thread.

Calls join at a step boundary and leave when they finish or are cancelled. A joining call's
prompt starts from the longest beginning it shares with a kept prompt (`PrefixCache`). Where
the measured costs say so (`Pricing.should_fuse`: a wider forward is cheap, as on a GPU), the
call becomes a row of the batch (`BatchCache`) at once and the rest of its prompt rides in the
running rows' steps, chunk by chunk, straight into its row, for as long as the costs (timed
by those steps too) still say so; else it is prefilled in its own cache, in chunks between
their steps (up to a budget of the joining prompts' tokens between two steps, the shortest
first; a long prompt alone in larger chunks, so that calls arriving meanwhile start between
them), and that cache then becomes its row.
Each step is data (`rag_lookahead.engine.step`): it drafts for every row and plans how much
of each draft the batch verifies (a `StepPlan`, priced by `Pricing`), the `Executor` runs one
forward over all of them (a `StepOutput`), and per row the update chooses the model's tokens,
accepts (a `Verdict`), keeps the accepted path in the cache and releases the tokens through
the call's `Stopping`. Calls that cannot share the batch (on a model that cannot verify trees) decode
plainly in their own cache, between steps.

Every row is computed as if it were alone (its own positions, its own columns of the cache),
so batching changes no output; only the rounding of batched kernels differs.

The loop runs in the model's own thread (`ModelThread`), one iteration after another while
any call is queued or running: a submitted call starts at once, whether or not it is read yet,
and the threads that read its chunks only wait for them. A call nobody reads advances with the
others, and is ended when its stream is closed or dropped. A call whose drafter has long texts
to take in (documents, a scope's) takes them in first, a slice between two steps of the running
calls (`Preparation`), taking turns with other such calls; then its prompt is prefilled.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import torch

from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.drafting.compose import TEXT_SLICE
from rag_lookahead.engine import observe
from rag_lookahead.engine.executor import Executor
from rag_lookahead.engine.prefill import PromptChunk, PromptPlanner
from rag_lookahead.engine.pricing import Pricing, PromptForwards
from rag_lookahead.engine.request import END as _END
from rag_lookahead.engine.request import Call, CallStatus, choose_next, propose, release, verify
from rag_lookahead.engine.step import RowPlan, StepOutput, StepPlan, Verdict
from rag_lookahead.planning.costs import CostModel
from rag_lookahead.runtime.batch import BatchCache
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.prefix import PrefixCache
from rag_lookahead.streaming.stream import StreamChunk
from rag_lookahead.tuning.tuner import ModelTuning

__all__ = ["Scheduler"]

T = TypeVar("T")
_READ_SLICE_S = 0.5


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
        self._rows: list[Call] = []  # the batch, in row order (some may still be prefilling)
        self._alone: list[Call] = []  # decoding plainly outside the batch
        self._executor = Executor(tuning.runner)
        self._batch = BatchCache()  # packed or not as the first row joins (`_add_row`)
        self.pricing = Pricing(costs, max_tokens_per_forward, tuning.runner.packs)
        self._prompts = PromptPlanner(self.pricing, max_prefill_tokens_per_step)
        self._prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
        # The model's changes seen (`ModelTuning.refresh`) when the kept prompts were computed:
        # only calls admitted since keep theirs (`_forget_stale_prompts`, `_keeps_prompt`).
        self._tuning = tuning
        self._generation = tuning.generation
        self._thread = tuning.thread
        self._thread.attach(self)

    @property
    def prompt_forwards(self) -> PromptForwards:
        """The prompts forwarded alone so far (chunks apart between steps, or a prompt with
        the model to itself): what a benchmark leaves out of decoding, as timed in its run."""
        return self.pricing.prompt_forwards

    def submit(self, call: Call) -> None:
        """Queue ``call``: it starts at the next step boundary; read what it releases with
        `chunks`."""
        observe.queued(self, call)  # (before the loop can end it)
        with self._lock:
            self._waiting.append(call)
        self._thread.wake()

    def chunks(self, call: Call) -> Generator[StreamChunk, None, None]:
        """What ``call`` releases, as the model's thread releases it; closing this generator
        (or an error in the reader's loop) cancels the call."""
        try:
            while True:
                item = _next(call.outbox)
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            call.cancelled = True  # nothing to stop if it has ended

    def cancel(self, call: Call, wait: bool = True) -> None:
        """Stop ``call`` at the next step boundary (nothing if it has ended); with ``wait``,
        return once it has left and released what it held (at most one step later)."""
        call.cancelled = True
        with self._lock:
            if call in self._waiting:  # not started yet: it ends here, holding nothing
                self._waiting.remove(call)
                call.finish("abandoned")
                call.outbox.put(_END)
                call.ended.set()
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
            for call in [*waiting, *self._preparing, *self._joining, *self._rows, *self._alone]:
                self._end(call, err)
            self._rows, self._batch = [], BatchCache()

    def _iterate(self) -> None:
        # 1. admit waiting calls, up to the batch size
        self._admit()
        # 2. end what was cancelled
        self._retire_cancelled()
        # 3. prompts that go on apart, or ride in the batch's steps from now on
        if self._rows:
            self._guarded(list(self._rows), self._move, batch=True)
        # 4. one step of the batch: the drafts, and the prompts' chunks riding in it
        if self._rows:
            self._guarded(list(self._rows), functools.partial(self._batch_step, list(self._rows)), batch=True)
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
        self._forget_stale_prompts()
        with self._lock:
            running = len(self._preparing) + len(self._joining) + len(self._rows) + len(self._alone)
            while self._waiting and running < self.max_batch_size:
                call = self._waiting.popleft()
                call.status = CallStatus.PREFILLING
                # Texts that would hold the loop up go in first, in slices; short ones at the first token.
                long_texts = call.prepare is not None and call.prepare.left > TEXT_SLICE
                (self._preparing if long_texts else self._joining).append(call)
                call.generation = self._generation
                running += 1

    def _forget_stale_prompts(self) -> None:
        """After the model changed (seen as each call starts: `ModelTuning.refresh`, before it is
        queued), the kept prompts' entries are stale: they go, and only the calls admitted from
        now on keep theirs (a running call's were partly computed before the change: a change
        while calls run is the caller's race, but it outlives them in no kept prompt)."""
        generation = self._tuning.generation
        if generation == self._generation:
            return
        self._generation = generation
        if self._prefixes is not None:
            self._prefixes = PrefixCache(self._prefixes.max_bytes)

    def _keeps_prompt(self, call: Call) -> bool:
        """Whether ``call``'s prompt may be kept: it was admitted after the model's last change."""
        return call.generation == self._generation

    def _move(self) -> None:
        """Rows whose prompts go on apart, from copies of their rows (first in the batch, first
        to go on), or joining calls whose prompts ride in the batch's steps from now on."""
        move = self._prompts.move(self._rows, self._joining, self._ridable)
        for i in reversed(move.unfuse):
            self._rows[i].cache = self._batch.row_copy(i)
            self._joining.insert(0, self._rows[i])
        self._drop_rows(list(move.unfuse))
        for call in move.fuse:
            self._guarded([call], functools.partial(self._add_row, call))

    def _ridable(self, call: Call) -> int | None:
        """The prompt tokens ``call`` has left, if it may ride in the batch's steps."""
        if not call.batchable or call.cache is not None:  # (one prefilling apart goes on)
            return None
        return len(call.prompt_ids) - self._cached_prefix(call)

    def _cached_prefix(self, call: Call) -> int:
        """How much of ``call``'s prompt is cached already (its cache from there, once)."""
        if call.cache is None and call.batchable:
            call.cache, call.prefilled = (
                self._prefixes.lookup(call.prompt_ids)
                if self._prefixes is not None
                else (new_tree_cache(), 0)
            )
            call.recorder.cached_prompt_tokens = call.prefilled
        return call.prefilled

    def _add_row(self, call: Call) -> None:
        """``call`` becomes a row of the batch (its cache, as prefilled so far, moves in)."""
        if call in self._joining:
            self._joining.remove(call)
        if not self._rows and self._batch.packed != self._executor.packs():
            # (in the layout of the runner's backend now: a change of the model may change it)
            self._batch = self._executor.new_batch()
        self._batch.add_row(call.cache, min(self.max_batch_size, len(self._rows) + 1 + len(self._joining)))
        call.cache = None
        self._rows.append(call)

    def _guarded(self, calls: list[Call], run: Callable[[], None], batch: bool = False) -> None:
        """Run one phase concerning ``calls`` (all the ``batch``'s, or one): a failure ends
        them, with the error, and no others."""
        try:
            run()
        except Exception as err:
            for call in calls:
                self._end(call, err)
            if batch:  # the cache may be half updated: the batch starts afresh
                self._rows, self._batch = [], BatchCache()

    def _retire_cancelled(self) -> None:
        for group in (self._preparing, self._joining, self._alone):
            for call in [c for c in group if c.cancelled]:
                self._end(call)
        gone = [i for i, c in enumerate(self._rows) if c.cancelled]
        for i in gone:
            self._end(self._rows[i])
        self._drop_rows(gone)

    # ------------------------------------------------------------------ phases

    def _prepare(self, call: Call) -> None:
        """A slice of ``call``'s long texts taken in (it is out of `_preparing`): then it
        prefills, or waits its next turn behind the other calls taking texts in."""
        assert call.prepare is not None
        call.prepare.advance(TEXT_SLICE)
        (self._joining if call.prepare.left <= 0 else self._preparing).append(call)

    def _prefill_joining(self) -> None:
        """Chunks of the joining prompts forwarded apart while the step's budget lasts (as the
        planner chooses them, `PromptPlanner.next_apart`): prompts arriving together start
        within a few steps of each other, not one chunk per step of the running rows."""
        try:
            begun = False
            while self._joining:
                if begun:  # calls submitted meanwhile (clients starting together) compete too
                    self._admit()
                others = bool(self._rows or self._alone)
                chunk = self._prompts.next_apart(self._joining, self._rows, others, self._cached_prefix)
                if chunk is None:
                    return
                begun, call = True, chunk.call
                before, released = self.pricing.prompt_forwards, call.recorder.new_tokens
                self._guarded([call], functools.partial(self._prefill, chunk))
                forwarded = self.pricing.prompt_forwards.tokens - before.tokens
                if forwarded and observe.watching():
                    seconds = self.pricing.prompt_forwards.seconds - before.seconds
                    released = call.recorder.new_tokens - released
                    observe.prompt_apart(self, call.prompt_ids, call.prefilled, forwarded, seconds, released)
                if forwarded == 0 and call in self._joining:
                    return  # (nothing went: never spin on one call)
                self._prompts.forwarded(chunk, forwarded, self._joining)
        finally:
            self._prompts.end_step(self._joining)

    def _prefill(self, chunk: PromptChunk) -> None:
        """``chunk`` of a call's prompt forwarded apart, in its own cache; once all of it is,
        the call takes its first token and becomes a row (or decodes alone)."""
        call, prompt = chunk.call, chunk.call.prompt_ids
        logits, call.cache, seconds = self._executor.prompt_apart(prompt[chunk.start : chunk.end], call.cache)
        self.pricing.observe_prompt(chunk.tokens, seconds)
        call.prefilled = chunk.end
        if chunk.end < len(prompt):
            return
        if self._prefixes is not None and call.batchable and self._keeps_prompt(call):
            self._prefixes.store(prompt, call.cache)
        self._joining.remove(call)
        if self._first_token(call, logits):
            return
        if call.batchable:
            self._add_row(call)
        else:
            self._alone.append(call)

    def _first_token(self, call: Call, logits: torch.Tensor) -> bool:
        """Its prompt prefilled (``logits`` ``[1, V]`` at its last token), ``call`` gets its
        drafter and its first token; whether that ended it."""
        call.status = CallStatus.DECODING
        # The trie takes the call's texts after the forward was launched (on a GPU it still runs).
        call.drafter = call.make_drafter() if call.make_drafter is not None else None
        verdict = choose_next(call, logits)
        call.recorder.prefill_seconds = time.perf_counter() - call.recorder.started
        return self._release(call, verdict)

    def _alone_step(self, call: Call) -> None:
        """One plain step of a call outside the batch, in the model's own cache."""
        token, released, started = call.ids[-1], call.recorder.new_tokens, time.perf_counter()
        logits, call.cache = self._executor.plain_step(token, call.cache)
        seconds = time.perf_counter() - started
        verdict = choose_next(call, logits)
        call.recorder.step(0, 0, "none")
        self._release(call, verdict)  # an ended call has left `_alone`
        observe.plain_step(self, token, seconds, call.recorder.new_tokens - released)

    def _batch_step(self, calls: list[Call]) -> None:
        """One step of every row: plan, one forward, update. A row's own work (drafting,
        choosing its tokens, releasing them) failing ends that row's call with the error while
        the others step on; only a failure of the shared work (the forward, the cache) reaches
        `_guarded`."""
        began = time.perf_counter()  # (the phases' times for a step observer: `observe`)
        # 1. draft: each decoding row proposes; a row whose drafting fails leaves before the forward
        calls, proposals = self._proposals(calls)
        if not calls:
            return
        drafted = time.perf_counter()
        # 2. plan: the drafts cut to what the batch pays for, prompts' chunks beside them
        plan = self._plan(calls, proposals)
        # 3. execute: one forward over every row
        output = self._executor.run(plan, self._batch)
        self.pricing.observe(plan, output.seconds, self._batch.lengths[0])
        watching = observe.watching()
        released = [call.recorder.new_tokens for call in calls] if watching else []
        forwarded = time.perf_counter()
        # 4. update: verify, keep the accepted paths in the cache, release, end
        self._update(calls, plan, output)
        if watching:
            released = [call.recorder.new_tokens - n for call, n in zip(calls, released, strict=True)]
            planned = forwarded - drafted - output.seconds
            seconds = (drafted - began, planned, output.seconds, time.perf_counter() - forwarded)
            proposed = [proposals.get(call) for call in calls]
            observe.batch_step(self, plan, proposed, released, seconds, self._batch.packed)

    def _proposals(self, calls: list[Call]) -> tuple[list[Call], dict[Call, StepDraft]]:
        """The rows still stepping, and each decoding row's proposed draft (a prefilling row
        has none): a row whose drafter fails ends with its error and leaves the batch."""
        proposals: dict[Call, StepDraft] = {}
        failed: list[int] = []
        for i, call in enumerate(calls):
            if call.status is CallStatus.DECODING:
                try:
                    proposals[call] = propose(call)
                except Exception as err:
                    self._end(call, err)
                    failed.append(i)
        self._drop_rows(failed)
        return list(self._rows), proposals

    def _plan(self, calls: list[Call], proposals: dict[Call, StepDraft]) -> StepPlan:
        """Every row's part of the step: its draft as priced jointly with the other rows', or
        its prompt's chunk riding beside them (`PromptPlanner.riding`)."""
        decoding = [call for call in calls if call.status is CallStatus.DECODING]
        drafts = self.pricing.plan_drafts(decoding, [proposals[c] for c in decoding]) if decoding else []
        planned = dict(zip(decoding, drafts, strict=True))
        width = max((len(draft) for draft in drafts), default=0)
        chunks = {chunk.call: chunk for chunk in self._prompts.riding(calls, width)}
        return StepPlan(tuple(RowPlan(planned[c]) if c in planned else _prompt_row(chunks[c]) for c in calls))

    def _update(self, calls: list[Call], plan: StepPlan, output: StepOutput) -> None:
        """Each row's verdict on its part of the step, the accepted paths kept in the cache,
        then each call's tokens released (or its prompt counted): the rows whose calls ended
        (or failed) leave the batch."""
        steps = list(zip(calls, plan.rows, output.logits, strict=True))
        verdicts = [_attempt(_verdict, call, row, logits) for call, row, logits in steps]
        self._batch.keep_accepted(plan.width, [verdict.nodes for verdict in verdicts])
        gone = [
            i
            for i, (step, verdict) in enumerate(zip(steps, verdicts, strict=True))
            if self._settle(i, *step, verdict)
        ]
        self._drop_rows(gone)

    def _settle(self, index: int, call: Call, row: RowPlan, logits: torch.Tensor, verdict: Verdict) -> bool:
        """Row ``index``'s step carried through to its call (its tokens released, or its prompt's
        chunk counted); whether the call has ended (a failure ends it, with the error)."""
        if verdict.error is not None:
            self._end(call, verdict.error)
            return True
        try:
            return (
                self._prefilled(index, call, len(verdict.tokens), logits)
                if row.prompt
                else self._release(call, verdict)
            )
        except Exception as err:
            self._end(call, err)
            return True

    def _prefilled(self, row: int, call: Call, tokens: int, logits: torch.Tensor) -> bool:
        """Row ``row`` prefilled ``tokens`` more of ``call``'s prompt; once all of it, the call
        gets its first token (``logits`` ``[1, V]``). Whether that ended the call."""
        call.prefilled += tokens
        if call.prefilled < len(call.prompt_ids):
            return False
        if self._prefixes is not None and self._keeps_prompt(call):
            self._prefixes.store(call.prompt_ids, self._batch.row_view(row))
        return self._first_token(call, logits)

    # ------------------------------------------------------------------ endings

    def _release(self, call: Call, verdict: Verdict) -> bool:
        """Pass a step's tokens through the call's stopping; whether the call has ended."""
        reason = release(call, verdict)
        if reason is None:
            return False
        call.finish(reason)
        self._end(call)
        return True

    def _end(self, call: Call, error: BaseException | None = None) -> None:
        """The call is over: record it, release what it holds, tell its consumer."""
        call.finish("abandoned")  # unless it finished
        if call in self._preparing:
            self._preparing.remove(call)
        if call in self._joining:
            self._joining.remove(call)
        if call in self._alone:
            self._alone.remove(call)
        drafter, call.drafter, call.cache = call.drafter, None, None
        if drafter is not None:
            try:
                drafter.close()
            except Exception as err:  # its branches stay in the trie: this call's error alone
                error = error or err
        if call.prepare is not None:  # texts taken in for a drafter never made leave too
            try:
                call.prepare.close()
            except Exception as err:
                error = error or err
        observe.ended(self, call)  # (before its reader hears of it)
        call.outbox.put(error if error is not None else _END)
        call.ended.set()

    def _drop_rows(self, gone: list[int]) -> None:
        if not gone:
            return
        left = set(gone)
        keep = [i for i in range(len(self._rows)) if i not in left]
        self._rows = [self._rows[i] for i in self._batch.keep_rows(keep)]


def _next(outbox: queue.SimpleQueue[T]) -> T:
    """The next item of ``outbox``, waited for in slices so that a signal (Ctrl-C) reaches a
    reader in the main thread."""
    while True:
        try:
            return outbox.get(timeout=_READ_SLICE_S)
        except queue.Empty:
            continue


def _prompt_row(chunk: PromptChunk) -> RowPlan:
    """``chunk`` of a prompt riding in its row."""
    return RowPlan.prompt_chunk(chunk.call.prompt_ids, chunk.start, chunk.tokens)


def _verdict(call: Call, row: RowPlan, logits: torch.Tensor) -> Verdict:
    """What row ``row`` of the step comes to for ``call``, given its ``logits``."""
    return Verdict.prompt_chunk(row) if row.prompt else verify(call, row.draft, logits)


def _attempt(run: Callable[..., Verdict], *args: Any) -> Verdict:
    """``run(*args)``, or the row's failure: one row's work, whose failure is that row's alone."""
    try:
        return run(*args)
    except Exception as err:
        return Verdict.failed(err)
