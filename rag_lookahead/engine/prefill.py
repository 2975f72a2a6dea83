"""Where the joining prompts go, step by step, within one budget of prompt tokens a step.

After vLLM's scheduler, which spends one ``max_num_batched_tokens`` a step on the running
requests and then on chunks of the waiting ones' prompts: each step spends at most
``max_prefill_tokens_per_step`` prompt tokens (a `Budget`), first on the chunks riding in the
batch's rows, then on chunks forwarded apart, between two steps, each in its call's own cache.
The `PromptPlanner` decides every case in one place, as data the scheduler carries out:

- a `Move` before the step: joining calls whose prompts ride in the batch's steps from now on
  (``fuse``: where the costs say that slows the running rows less than prefilling them apart,
  `Pricing.should_fuse`, as on a GPU), rows prefilling in the steps that go on apart, from
  copies of their rows (``unfuse``: where the costs as calibrated since now say the opposite:
  a join misjudged costs a step, not the rest of its prompt);
- a `PromptChunk` for each prompt that goes in a step: its call, where it starts, how many
  tokens, and whether apart or riding in its row.

Apart, the prompt with the least left goes first, less what went to others while it waited
(arrival order among equals): behind a long document short questions would all wait for it,
while it waits for them only as long as they are short — once as many tokens as it has left
went to others, it goes next. While no other call runs a prompt goes in larger chunks
(`Pricing.lone_chunk`), but still in chunks: calls arriving meanwhile start between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag_lookahead.engine.pricing import Pricing
from rag_lookahead.engine.request import Call, CallStatus

__all__ = ["Budget", "Move", "PromptChunk", "PromptPlanner"]


@dataclass(frozen=True)
class PromptChunk:
    """``tokens`` of ``call``'s prompt from ``start``: forwarded ``apart`` in its own cache, or
    riding in its row of the batch's step."""

    call: Call
    start: int
    tokens: int
    apart: bool

    @property
    def end(self) -> int:
        return self.start + self.tokens


@dataclass(frozen=True)
class Move:
    """The batch's rows changing before a step: the rows (by index) whose prompts go on apart,
    and the joining calls that become rows, their prompts riding in the steps from now on."""

    unfuse: tuple[int, ...] = ()
    fuse: tuple[Call, ...] = ()


@dataclass
class Budget:
    """The prompt tokens one step may spend: ``spent`` so far, riding and apart."""

    tokens: int
    spent: int = 0

    @property
    def left(self) -> int:
        return max(self.tokens - self.spent, 0)


class PromptPlanner:
    """Where each joining prompt goes, and how much of it, step by step: the one place the
    budget is spent and prompts are ranked."""

    def __init__(self, pricing: Pricing, max_prefill_tokens_per_step: int) -> None:
        self.pricing = pricing
        self.budget = Budget(max_prefill_tokens_per_step)
        # Prompt tokens forwarded apart for other joining calls while each waited (its aging).
        self._passed_over: dict[Call, int] = {}

    def move(
        self, rows: Sequence[Call], joining: Sequence[Call], remaining: Callable[[Call], int | None]
    ) -> Move:
        """Before a step: which of ``rows`` prefilling in it go on apart, or else which of the
        ``joining`` calls ride from now on, in order, while the costs say so (``remaining``: the
        tokens a call has left to prefill, asked in order; ``None`` for one that may not ride:
        not batchable, or prefilling apart already)."""
        decode_rows = _decode_rows(rows)
        if decode_rows == 0:  # nobody waits on them: the steps are theirs; nobody to ride with
            return Move()
        unfuse = tuple(
            i
            for i, call in enumerate(rows)
            if call.status is CallStatus.PREFILLING
            and not self.pricing.should_fuse(decode_rows, len(call.prompt_ids) - call.prefilled)
        )
        if unfuse:  # (they go on apart first: the joining calls wait behind them)
            return Move(unfuse=unfuse)
        fuse: list[Call] = []
        for call in joining:  # in order: one prefilling apart goes on first
            left = remaining(call)
            if left is None or not self.pricing.should_fuse(decode_rows, left):
                break
            fuse.append(call)
        return Move(fuse=tuple(fuse))

    def riding(self, rows: Sequence[Call], width: int) -> list[PromptChunk]:
        """The chunks of the prompts of ``rows`` still prefilling that ride in a step beside the
        decoding rows' drafts (``width`` wide at most): all that is left of a prompt alone in
        the batch (as outside a batch), else as priced beside the drafts; within the budget."""
        prompts = [call for call in rows if call.status is CallStatus.PREFILLING]
        left = [len(call.prompt_ids) - call.prefilled for call in prompts]
        if not prompts:
            return []
        if len(rows) == 1:
            tokens = left[0]
        else:
            tokens = self.pricing.fused_chunk(left, len(rows) - len(prompts), width)
        tokens = min(tokens, max(self.budget.left // len(prompts), 1))
        chunks = [
            PromptChunk(call, call.prefilled, min(tokens, n), apart=False)
            for call, n in zip(prompts, left, strict=True)
        ]
        self.budget.spent += sum(chunk.tokens for chunk in chunks)
        return chunks

    def next_apart(
        self, joining: Sequence[Call], rows: Sequence[Call], others_run: bool, cached: Callable[[Call], int]
    ) -> PromptChunk | None:
        """The next chunk forwarded apart, while the step's budget lasts (one is begun while any
        is left), from where its prompt is ``cached`` (looked up once it is chosen): the prompt
        with the least left, less what it was passed over by; ``None`` when none goes (no
        budget, or the chosen call was cancelled: it retires first)."""
        if not joining or self.budget.left <= 0:
            return None
        call = min(joining, key=lambda c: len(c.prompt_ids) - c.prefilled - self._passed_over.get(c, 0))
        if call.cancelled:
            return None
        remaining = len(call.prompt_ids) - cached(call)
        if others_run:
            tokens = self.pricing.prefill_chunk(remaining, _decode_rows(rows))
        else:
            tokens = self.pricing.lone_chunk(remaining, self.budget.tokens)
        return PromptChunk(call, call.prefilled, tokens, apart=True)

    def forwarded(self, chunk: PromptChunk, tokens: int, joining: Sequence[Call]) -> None:
        """``tokens`` of ``chunk`` were forwarded apart: spent, and every other ``joining`` call
        passed over by them."""
        self.budget.spent += tokens
        for other in joining:
            if other is not chunk.call:
                self._passed_over[other] = self._passed_over.get(other, 0) + tokens

    def end_step(self, joining: Sequence[Call]) -> None:
        """The step's budget is spent: the next one starts afresh (the calls no longer
        ``joining`` are forgotten)."""
        self.budget.spent = 0
        self._passed_over = {call: n for call, n in self._passed_over.items() if call in joining}


def _decode_rows(rows: Sequence[Call]) -> int:
    return sum(1 for call in rows if call.status is CallStatus.DECODING)
