"""The batch: the calls decoding together, one row each, and one step of all of them.

A step is data (`rag_lookahead.engine.step`): each decoding row proposes a draft and the
pricing plans how much of each the batch verifies, beside the chunks of the prompts riding in
their rows (`PromptPlanner.riding`) — a `StepPlan`; the `Executor` runs one forward over all of
them (a `StepOutput`); per row the update chooses the model's tokens and accepts (a `Verdict`),
the cache keeps the accepted paths, and each call releases its tokens (or counts its prompt's
chunk, and takes its first token once all of it is in). Every row is computed as if it were
alone (its own positions, its own columns of the cache), so batching changes no output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.engine import observe
from rag_lookahead.engine.executor import Batch, Executor
from rag_lookahead.engine.prefill import PromptChunk, PromptPlanner
from rag_lookahead.engine.pricing import Pricing
from rag_lookahead.engine.request import Call, CallStatus, Decoder, first_token, propose, release, verify
from rag_lookahead.engine.step import RowPlan, StepOutput, StepPlan, Verdict
from rag_lookahead.runtime.batch import BatchCache
from rag_lookahead.runtime.static import StaticStep
from rag_lookahead.runtime.static.batch import StaticBatch
from rag_lookahead.streaming.stats import FinishReason

__all__ = ["Decoders", "Ending", "Keeping", "Rows"]

# Each running call's decoder (`Decoder`), as the scheduler holds them.
Decoders = Mapping[Call, Decoder]
# Ends a call (it has finished, or failed with the error): the scheduler's, which owns its queues.
Ending = Callable[[Call, BaseException | None], None]
# Keeps a call's prompt, as computed in the cache given (where the scheduler keeps prompts).
Keeping = Callable[[Call, Any], None]


class Rows:
    """The calls of the batch in row order, their cache, and the step that runs them."""

    def __init__(self, executor: Executor, pricing: Pricing, prompts: PromptPlanner) -> None:
        self.executor, self.pricing, self.prompts = executor, pricing, prompts
        self.calls: list[Call] = []
        self.cache: Batch = BatchCache()  # of the runner's kind as the first row joins (`add`)

    def __len__(self) -> int:
        return len(self.calls)

    def reset(self) -> None:
        """No rows: after a failure of the shared work, the cache may be half updated."""
        self.calls, self.cache = [], BatchCache()

    def add(self, call: Call, cache: Any, expected_rows: int) -> None:
        """``call`` becomes the last row: its ``cache`` (as prefilled so far) moves in."""
        if not self.calls and not self.executor.current(self.cache):
            # (in the layout of the runner's backend now: a change of the model may change it)
            self.cache = self.executor.new_batch()
        self.cache.add_row(cache, expected_rows)
        self.calls.append(call)

    def slots(self) -> StaticStep | None:
        """The static step in whose slots the rows decode (or the next row would, while there
        are none): ``None`` where their steps are eager. (The runner's may have changed since
        the first row joined, with the model: the rows go on where they are.)"""
        if self.calls:
            return self.cache.step if isinstance(self.cache, StaticBatch) else None
        return self.executor.runner.static

    def widest(self) -> int | None:
        """The widest step the rows may take: their static step's widest bucket (``None``:
        eager, any width)."""
        step = self.slots()
        return None if step is None else step.buckets.widest

    def takes(self, tokens: int) -> bool:
        """Whether a call of ``tokens`` tokens (its prompt and its most new ones) may join: a
        static step's slots hold so many, and room for the widest draft after them."""
        step = self.slots()
        return step is None or tokens + step.buckets.widest <= step.max_len

    def take_out(self, index: int) -> Any:
        """A copy of row ``index``'s cache, for its call to go on apart (`drop` the row)."""
        return self.cache.row_copy(index)

    def drop(self, gone: list[int]) -> None:
        """Rows ``gone`` leave; the rows after move into their places (`keep_rows`)."""
        if not gone:
            return
        left = set(gone)
        keep = [i for i in range(len(self.calls)) if i not in left]
        self.calls = [self.calls[i] for i in self.cache.keep_rows(keep)]

    # ------------------------------------------------------------------ a step

    def step(self, loop: object, decoders: Decoders, end: Ending, keep: Keeping) -> None:
        """One step of every row (each call's `Decoder` in ``decoders``): plan, one forward,
        update. A row's own work (drafting, choosing its tokens, releasing them) failing ends
        that row's call with the error while the others step on; a failure of the shared work
        (the forward, the cache) is raised (``loop``: whose step an observer is told of)."""
        began = time.perf_counter()  # (the phases' times for a step observer: `observe`)
        # 1. draft: each decoding row proposes; a row whose drafting fails leaves before the forward
        proposals = self._proposals(decoders, end)
        calls = list(self.calls)
        if not calls:
            return
        drafted = time.perf_counter()
        # 2. plan: the drafts cut to what the batch pays for, prompts' chunks beside them
        plan = self.plan(calls, decoders, proposals)
        # 3. execute: one forward over every row
        output = self.executor.run(plan, self.cache)
        self.pricing.observe(plan, output.seconds, self.cache.lengths[0])
        watching = observe.watching()
        released = [call.recorder.new_tokens for call in calls] if watching else []
        forwarded = time.perf_counter()
        # 4. update: verify, keep the accepted paths in the cache, release, end
        self._update(calls, decoders, plan, output, end, keep)
        if watching:
            released = [call.recorder.new_tokens - n for call, n in zip(calls, released, strict=True)]
            planned = forwarded - drafted - output.seconds
            seconds = (drafted - began, planned, output.seconds, time.perf_counter() - forwarded)
            proposed = [proposals.get(call) for call in calls]
            observe.batch_step(loop, plan, proposed, released, seconds, self.cache.packed)

    def plan(self, calls: list[Call], decoders: Decoders, proposals: dict[Call, StepDraft]) -> StepPlan:
        """Every row's part of the step: its draft as priced jointly with the other rows', or
        its prompt's chunk riding beside them (`PromptPlanner.riding`)."""
        decoding = [call for call in calls if call.status is CallStatus.DECODING]
        mine = [decoders[c] for c in decoding]
        drafts = (
            self.pricing.plan_drafts(decoding, mine, [proposals[c] for c in decoding]) if decoding else []
        )
        planned = dict(zip(decoding, drafts, strict=True))
        width = max((len(draft) for draft in drafts), default=0)
        chunks = {chunk.call: chunk for chunk in self.prompts.riding(calls, width)}
        return StepPlan(tuple(RowPlan(planned[c]) if c in planned else _prompt_row(chunks[c]) for c in calls))

    def _proposals(self, decoders: Decoders, end: Ending) -> dict[Call, StepDraft]:
        """Each decoding row's proposed draft (a prefilling row has none): a row whose drafter
        fails ends with its error and leaves the batch."""
        proposals: dict[Call, StepDraft] = {}
        failed: list[int] = []
        for i, call in enumerate(self.calls):
            if call.status is CallStatus.DECODING:
                try:
                    proposals[call] = propose(call, decoders[call])
                except Exception as err:
                    end(call, err)
                    failed.append(i)
        self.drop(failed)
        return proposals

    def _update(
        self,
        calls: list[Call],
        decoders: Decoders,
        plan: StepPlan,
        output: StepOutput,
        end: Ending,
        keep: Keeping,
    ) -> None:
        """Each row's verdict on its part of the step, the accepted paths kept in the cache,
        then each call's tokens released (or its prompt counted): the rows whose calls ended
        (or failed) leave the batch."""
        steps = list(zip(calls, plan.rows, output.logits, strict=True))
        verdicts = [_attempt(_verdict, call, decoders[call], row, logits) for call, row, logits in steps]
        self.cache.keep_accepted(plan.width, [verdict.nodes for verdict in verdicts])
        gone = []
        reason: FinishReason | None
        for i, ((call, row, logits), verdict) in enumerate(zip(steps, verdicts, strict=True)):
            error = verdict.error
            if error is None:
                try:
                    decoder = decoders[call]
                    if row.prompt:
                        reason = self._prefilled(i, call, decoder, row, logits, keep)
                    else:
                        reason = release(call, decoder, verdict)
                except Exception as err:
                    reason, error = "abandoned", err
            else:
                reason = "abandoned"
            if reason is not None:
                call.finish(reason)
                end(call, error)
                gone.append(i)
        self.drop(gone)

    def _prefilled(
        self, index: int, call: Call, decoder: Decoder, row: RowPlan, logits: torch.Tensor, keep: Keeping
    ) -> FinishReason | None:
        """Row ``index`` prefilled ``row``'s chunk of ``call``'s prompt; once all of it, the
        call gets its first token (``logits`` ``[1, V]``): why that ends it, if it does."""
        call.prefilled += len(row.draft)
        if call.prefilled < len(call.prompt_ids):
            return None
        keep(call, self.cache.row_view(index))
        return first_token(call, decoder, logits)


def _prompt_row(chunk: PromptChunk) -> RowPlan:
    """``chunk`` of a prompt riding in its row."""
    return RowPlan.prompt_chunk(chunk.call.prompt_ids, chunk.start, chunk.tokens)


def _verdict(call: Call, decoder: Decoder, row: RowPlan, logits: torch.Tensor) -> Verdict:
    """What row ``row`` of the step comes to for ``call``, given its ``logits``."""
    return Verdict.prompt_chunk(row) if row.prompt else verify(call, decoder, row.draft, logits)


def _attempt(run: Callable[..., Verdict], *args: Any) -> Verdict:
    """``run(*args)``, or the row's failure: one row's work, whose failure is that row's alone."""
    try:
        return run(*args)
    except Exception as err:
        return Verdict.failed(err)
