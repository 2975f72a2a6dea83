"""Continuous batching: every running call's step in one forward, driven by its readers.

Calls join at a step boundary and leave when they finish or are cancelled. A joining call's
prompt starts from the longest beginning it shares with a kept prompt (`PrefixCache`). Where
the measured costs say so (`BatchForward.fuses`: a wider forward is cheap, as on a GPU), the
call becomes a row of the batch (`BatchCache`) at once and the rest of its prompt rides in the
running rows' steps, chunk by chunk, straight into its row, for as long as the costs (timed
by those steps too) still say so; else it is prefilled in its own cache, in chunks between
their steps (a whole prompt at once when nobody waits on it), and that cache then becomes its
row.
Each step drafts for every row, plans how much of each draft the batch verifies
(`plan_batch`), runs one forward over all of them, and per row chooses the model's tokens,
accepts, keeps the accepted path in the cache and releases the tokens through the call's
`Stopping`. Calls that cannot share the batch (on a model that cannot verify trees) decode
plainly in their own cache, between steps.

Every row is computed as if it were alone (its own positions, its own columns of the cache),
so batching changes no output; only the rounding of batched kernels differs.

No thread of its own runs the loop: a reader waiting for its call's next chunk runs one
iteration for everybody (`LoopDriver`), so a lone caller decodes in its own thread, as a plain
`generate` call would. A call nobody reads advances while others are read, and is ended when
its stream is closed or dropped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

import torch

from rag_lookahead.decoding.batch import BatchCache
from rag_lookahead.decoding.kv_cache import new_tree_cache
from rag_lookahead.decoding.prefix import PrefixCache
from rag_lookahead.decoding.runner import ModelRunner
from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.engine.driving import LoopDriver
from rag_lookahead.engine.executor import BatchForward, PromptForwards
from rag_lookahead.engine.request import END as _END
from rag_lookahead.engine.request import Call, choose_next, propose, release, verify
from rag_lookahead.streaming.stream import StreamChunk

__all__ = ["Scheduler"]

T = TypeVar("T")


class Scheduler:
    """The decoding loop of every call on one model, run by whichever reader waits."""

    def __init__(
        self,
        runner: ModelRunner,
        max_batch_size: int,
        max_tokens_per_forward: int,
        prefix_cache_bytes: int = 0,
    ) -> None:
        self.runner = runner
        self.max_batch_size = max_batch_size
        self.max_tokens_per_forward = max_tokens_per_forward
        self._lock = threading.Lock()  # guards the waiting queue
        self._waiting: deque[Call] = deque()
        self.driver = LoopDriver(self._iterate)
        # Only the thread running an iteration touches these.
        self._joining: list[Call] = []
        self._rows: list[Call] = []  # the batch, in row order
        self._alone: list[Call] = []
        self._batch = BatchCache()
        self._forward = BatchForward(runner, max_tokens_per_forward)
        self._prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None

    @property
    def prompt_forwards(self) -> PromptForwards:
        """The prompts forwarded alone so far (chunks apart between steps, or a prompt with
        the model to itself): what a benchmark leaves out of decoding, as timed in its run."""
        return self._forward.prompt_forwards

    def submit(self, call: Call) -> None:
        """Queue ``call``; read what it releases with `chunks`."""
        with self._lock:
            self._waiting.append(call)

    def chunks(self, call: Call) -> Generator[StreamChunk, None, None]:
        """What ``call`` releases, in its reader's thread (which drives the loop while it
        waits); closing this generator (or an error in the reader's loop) cancels the call."""
        try:
            while True:
                item = self.driver.next_item(call.outbox)
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
                call.recorder.finish("abandoned")
                call.outbox.put(_END)
                call.ended.set()
        if wait and not self.driver.in_iteration():  # (a finaliser inside one: the next retires it)
            self.driver.wait(call.ended)

    # ------------------------------------------------------------------ the loop

    def _iterate(self) -> None:
        with self._lock:
            running = len(self._joining) + len(self._rows) + len(self._alone)
            while self._waiting and running < self.max_batch_size:
                self._joining.append(self._waiting.popleft())
                running += 1
        self._retire_cancelled()
        if self._rows:
            self._guarded(list(self._rows), self._leave_dear_steps, batch=True)
        self._fuse_joining()
        if self._rows:
            self._guarded(list(self._rows), self._batch_step, batch=True)
        for call in list(self._alone):
            self._guarded([call], self._alone_step)
        if self._joining:  # one chunk apart per iteration; the call steps from the next one
            self._guarded([self._joining[0]], self._prefill)

    def _fuse_joining(self) -> None:
        """Joining calls whose prompts ride in the batch's steps from now on (in order, while
        the costs say that slows the running rows less than prefilling them apart)."""
        for call in list(self._joining):
            if not call.batchable or call.cache is not None:  # (one prefilling apart goes on)
                return
            remaining = len(call.prompt_ids) - self._cached_prefix(call)
            if not self._forward.fuses(self._decode_rows(), remaining):
                return
            self._guarded([call], self._add_row)

    def _leave_dear_steps(self, rows: list[Call]) -> None:
        """Rows prefilling in the running rows' steps go on apart, from copies of their rows,
        where the costs as calibrated since (their own steps' timings among them) now say
        that is cheaper: a join misjudged costs a step, not the rest of its prompt."""
        decode_rows = self._decode_rows()
        if decode_rows == 0:  # nobody waits on them: the steps are theirs
            return
        fuses = self._forward.fuses
        leaving = [
            i
            for i, call in enumerate(rows)
            if _prefilling(call) and not fuses(decode_rows, len(call.prompt_ids) - call.prefilled)
        ]
        for i in reversed(leaving):  # first in the batch, first to go on
            rows[i].cache = self._batch.row_copy(i)
            self._joining.insert(0, rows[i])
        if leaving:
            self._drop_rows(leaving)

    def _decode_rows(self) -> int:
        return sum(1 for call in self._rows if not _prefilling(call))

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
        """``call`` becomes a row of the batch, where the rest of its prompt is prefilled."""
        self._batch.add_row(call.cache, min(self.max_batch_size, len(self._rows) + 1 + len(self._joining)))
        call.cache = None
        self._joining.remove(call)
        self._rows.append(call)

    def _guarded(self, calls: list[Call], run: Callable[..., None], batch: bool = False) -> None:
        """Run one phase on ``calls`` (a batch step takes them all, another phase the one);
        a failure ends the calls it concerns, with the error, and no others."""
        try:
            run(calls) if batch else run(calls[0])
        except Exception as err:
            for call in calls:
                self._end(call, err)
            if batch:  # the cache may be half updated: the batch starts afresh
                self._rows, self._batch = [], BatchCache()

    def _retire_cancelled(self) -> None:
        for group in (self._joining, self._alone):
            for call in [c for c in group if c.cancelled]:
                self._end(call)
        gone = [i for i, c in enumerate(self._rows) if c.cancelled]
        if gone:
            for i in gone:
                self._end(self._rows[i])
            self._drop_rows(gone)

    # ------------------------------------------------------------------ phases

    def _prefill(self, call: Call) -> None:
        """A chunk of ``call``'s prompt forwarded apart, in its own cache (all of it when
        nobody else runs)."""
        prompt = call.prompt_ids
        start, busy = self._cached_prefix(call), bool(self._rows or self._alone)
        end = start + self._forward.chunk(len(prompt) - start, self._decode_rows()) if busy else len(prompt)
        started = time.perf_counter()
        logits, call.cache = self.runner.forward(
            torch.tensor([prompt[start:end]]), call.cache, last_only=True
        )
        self._forward.observe_prompt(end - start, time.perf_counter() - started)
        call.prefilled = end
        if end < len(prompt):
            return
        if self._prefixes is not None and call.batchable:
            self._prefixes.store(prompt, call.cache)
        self._joining.remove(call)
        if self._first_token(call, logits[-1:]):
            return
        if call.batchable:
            self._batch.add_row(
                call.cache, min(self.max_batch_size, len(self._rows) + 1 + len(self._joining))
            )
            call.cache = None
            self._rows.append(call)
        else:
            self._alone.append(call)

    def _first_token(self, call: Call, logits: torch.Tensor) -> bool:
        """Its prompt prefilled (``logits`` ``[1, V]`` at its last token), ``call`` gets its
        drafter and its first token; whether that ended it."""
        # The trie takes the call's texts after the forward was launched (on a GPU it still runs).
        call.drafter = call.make_drafter() if call.make_drafter is not None else None
        tokens = choose_next(call, logits)
        call.recorder.prefill_seconds = time.perf_counter() - call.recorder.started
        return self._release(call, tokens)

    def _alone_step(self, call: Call) -> None:
        """One plain step of a call outside the batch, in the model's own cache."""
        logits, call.cache = self.runner.forward(torch.tensor([call.ids[-1:]]), call.cache)
        tokens = choose_next(call, logits[-1:])
        call.recorder.step(0, 0, "none")
        self._release(call, tokens)  # an ended call has left `_alone`

    def _batch_step(self, calls: list[Call]) -> None:
        """One step of every row. A row's own work (drafting, choosing its tokens, releasing
        them) failing ends that row's call with the error while the others step on; only a
        failure of the shared work (the forward, the cache) reaches `_guarded`."""
        proposals = [None if _prefilling(call) else _attempt(propose, call) for call in calls]
        failed = [i for i, p in enumerate(proposals) if isinstance(p, Exception)]
        if failed:  # they leave before the forward
            self._end_rows(calls, proposals, failed)
            calls = [c for i, c in enumerate(calls) if i not in failed]
            proposals = [p for i, p in enumerate(proposals) if i not in failed]
            if not calls:
                return
        rows = [p if isinstance(p, StepDraft) else None for p in proposals]
        drafts, logits = self._forward.run(self._batch, calls, rows)
        verdicts = [
            (list(draft.tree.tokens), list(range(len(draft))))  # a prompt's chunk: all kept
            if row is None
            else _attempt(verify, call, draft, logits[i])
            for i, (call, draft, row) in enumerate(zip(calls, drafts, rows, strict=True))
        ]
        # A failed row keeps only its root (the columns past it stay hidden) and leaves below.
        nodes = [[0] if isinstance(v, Exception) else v[1] for v in verdicts]
        self._batch.keep_accepted(max(len(d) for d in drafts), nodes)
        outcomes = [
            self._outcome(i, call, verdict, row is None, logits[i])
            for i, (call, verdict, row) in enumerate(zip(calls, verdicts, rows, strict=True))
        ]
        self._end_rows(calls, outcomes, [i for i, ended in enumerate(outcomes) if ended is not False])

    def _outcome(
        self,
        row: int,
        call: Call,
        verdict: tuple[list[int], list[int]] | Exception,
        prompt: bool,
        logits: torch.Tensor,
    ) -> bool | Exception:
        """What row ``row``'s step came to: its error, or whether its call has ended (its
        accepted tokens released, or, for a ``prompt``'s chunk, that chunk counted)."""
        if isinstance(verdict, Exception):
            return verdict
        if prompt:
            return _attempt(self._prefilled, row, call, len(verdict[0]), logits)
        return _attempt(self._release, call, verdict[0])

    def _prefilled(self, row: int, call: Call, tokens: int, logits: torch.Tensor) -> bool:
        """Row ``row`` prefilled ``tokens`` more of ``call``'s prompt; once all of it, the call
        gets its first token (``logits`` ``[1, V]``). Whether that ended the call."""
        call.prefilled += tokens
        if _prefilling(call):
            return False
        if self._prefixes is not None:
            self._prefixes.store(call.prompt_ids, self._batch.row_view(row))
        return self._first_token(call, logits)

    def _end_rows(self, calls: list[Call], outcomes: Sequence[object], gone: list[int]) -> None:
        """The rows ``gone`` leave the batch (``calls`` are its rows): those whose outcome is
        an error end with it (the others have ended already)."""
        for i in gone:
            outcome = outcomes[i]
            if isinstance(outcome, Exception):
                self._end(calls[i], outcome)
        if gone:
            self._drop_rows(gone)

    # ------------------------------------------------------------------ outcomes

    def _release(self, call: Call, tokens: list[int]) -> bool:
        """Pass a step's tokens through the call's stopping; whether the call has ended."""
        reason = release(call, tokens)
        if reason is None:
            return False
        call.recorder.finish(reason)
        self._end(call)
        return True

    def _end(self, call: Call, error: BaseException | None = None) -> None:
        """The call is over: record it, release what it holds, tell its consumer."""
        call.recorder.finish("abandoned")  # unless it finished
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
        call.outbox.put(error if error is not None else _END)
        call.ended.set()

    def _drop_rows(self, gone: list[int]) -> None:
        left = set(gone)
        keep = [i for i in range(len(self._rows)) if i not in left]
        self._rows = [self._rows[i] for i in self._batch.keep_rows(keep)]


def _prefilling(call: Call) -> bool:
    return call.prefilled < len(call.prompt_ids)


def _attempt(run: Callable[..., T], *args: Any) -> T | Exception:
    """``run(*args)``, or the error it raised: one row's work, whose failure is that row's alone."""
    try:
        return run(*args)
    except Exception as err:
        return err
