"""One forward over the drafts of every row in the batch, planned jointly.

The `Scheduler` decides which calls are rows; here their drafts are cut to what the batch
verifies (`plan_batch`, against the batch costs as calibrated by the forwards so far) and
run in one forward over the `BatchCache`. A row may still be prefilling its prompt: a chunk
of it rides in the forward as a chain (`fused_prefill` plans its width), and where that would
cost the running rows more than forwarding the chunk apart (`separate_prefill`), a joining
call prefills apart instead, between steps.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rag_lookahead.decoding.batch import BatchCache, batch_inputs
from rag_lookahead.decoding.costs import Calibration
from rag_lookahead.decoding.planner import fused_prefill, plan_batch, separate_prefill
from rag_lookahead.decoding.runner import ModelRunner
from rag_lookahead.decoding.tree import DraftTree, StepDraft, TreeInputs
from rag_lookahead.engine.request import Call

__all__ = ["BatchForward", "PromptForwards", "prompt_chunk"]

Cost = Callable[[int, int], float]  # seconds of a forward by rows and width


@dataclass(frozen=True)
class PromptForwards:
    """The prompts' forwards run alone so far (a chunk apart, or a prompt that had the batch
    to itself): how many, their tokens and their seconds. A chunk riding in the batch's steps
    is not among them (its forward is the running rows' too)."""

    forwards: int = 0
    tokens: int = 0
    seconds: float = 0.0


class BatchForward:
    """The batch's forward on one model, and the calibration of its costs it learns from."""

    def __init__(self, runner: ModelRunner, max_tokens_per_forward: int) -> None:
        self.runner = runner
        self.max_tokens_per_forward = max_tokens_per_forward
        self.calibration = Calibration()
        # The one-row curve is measured for drafts, a few tokens wide, and only extrapolated
        # to a prompt's chunks: how much steeper or flatter the prompts forwarded alone find
        # it past its last measured size.
        self.prompts = Calibration()
        self.width = 1  # the running rows' drafts in the last step: what a join plans against
        self.prompt_forwards = PromptForwards()  # replaced, never changed: readable from any thread

    def run(
        self, batch: BatchCache, calls: list[Call], proposals: Sequence[StepDraft | None]
    ) -> tuple[list[StepDraft], list[torch.Tensor]]:
        """Plan the rows' drafts jointly and verify them in one forward; the drafts and each
        row's logits: ``[T, V]`` for a draft, ``[1, V]`` (its last token) for a prompt whose
        chunk ends it, ``[0, V]`` for a prompt not yet done. A row's proposal is ``None``
        while it prefills its prompt."""
        if all(p is not None for p in proposals):
            drafts, logits = self._decode(batch, calls, [p for p in proposals if p is not None])
            return drafts, list(logits)
        return self._fused(batch, calls, proposals)

    def cost(self) -> Cost | None:
        """Seconds of a forward by rows and width, as calibrated so far (``None``: unmeasured).

        The batch curves are measured a few tokens wide and extrapolated past that, where a
        joining prompt's chunk widens every row; a batch is never priced below its tokens in
        one row forwarded alone (`alone`, calibrated by the prompts' chunks), which is what its
        linear layers cost at least."""
        curve, batched, alone = self.runner.costs.curve, self.runner.costs.batched(), self.alone()
        if curve is None or batched is None or alone is None:
            return None

        def seconds(rows: int, width: int) -> float:
            if rows == 1:
                return curve(width)
            return max(batched(rows, width) * self.calibration.factor(rows, width), alone(rows * width))

        return seconds

    def alone(self) -> Callable[[int], float] | None:
        """Seconds of a prompt's chunk forwarded alone, by its tokens, as calibrated so far:
        never less for more tokens (each class of sizes learns its own ratio)."""
        curve = self.runner.costs.curve
        if curve is None:
            return None
        last = curve.sizes[-1]

        @functools.cache  # (one decision's closure: each class's end is priced once)
        def calibrated(tokens: int) -> float:
            return curve(last) + (curve(tokens) - curve(last)) * self.prompts.factor(1, tokens)

        def seconds(tokens: int) -> float:
            if tokens <= last:
                return curve(tokens)
            return max(calibrated(size) for size in Calibration.class_ends(tokens, last + 1))

        return seconds

    def _measured(self) -> Callable[[int], float] | None:
        """Seconds of so many tokens in one row, on the one-row curve as measured: the shape
        of the kernels, which grows with the tokens past the measured sizes. A join's floor
        (`fused_prefill`) and a chunk's size (`chunk`) read it rather than the calibrated
        `alone`, whose classes learn their ratios at different moments and context depths
        (it is flat where a smaller class was timed dearer)."""
        return self.runner.costs.curve

    def observe_prompt(self, tokens: int, seconds: float) -> None:
        """A prompt's chunk of ``tokens`` forwarded alone took ``seconds``."""
        done = self.prompt_forwards
        self.prompt_forwards = PromptForwards(done.forwards + 1, done.tokens + tokens, done.seconds + seconds)
        curve = self.runner.costs.curve
        if curve is None or tokens <= curve.sizes[-1] or curve(tokens) <= curve(curve.sizes[-1]):
            return
        beyond = curve(curve.sizes[-1])
        self.prompts.record(1, tokens, curve(tokens) - beyond, max(seconds - beyond, 1e-6))

    def fuses(self, decode_rows: int, remaining: int) -> bool:
        """Whether a prompt of ``remaining`` tokens to prefill costs the ``decode_rows``
        running rows less in their steps' forwards than forwarded apart between them."""
        cost, alone = self.cost(), self.alone()
        if cost is None or alone is None or decode_rows == 0:
            return False
        limit, missed, floor = self.max_tokens_per_forward, self.missed(decode_rows), self._measured()
        fused = fused_prefill([remaining], decode_rows, self.width, cost, limit, missed, floor)
        return fused.rate >= separate_prefill(remaining, alone, limit, missed).rate

    def chunk(self, remaining: int, decode_rows: int) -> int:
        """The chunk of a prompt of ``remaining`` tokens to forward apart, between two steps
        of the ``decode_rows`` running rows.

        Sized on the `_measured` curve: on the calibrated one, a larger class timed in a slow
        moment would make smaller chunks look cheaper per token, and smaller chunks cost more
        per token and keep the call out of the batch for more steps."""
        measured = self._measured()
        if measured is None:
            return min(remaining, self.max_tokens_per_forward)
        missed = self.missed(decode_rows)
        return separate_prefill(remaining, measured, self.max_tokens_per_forward, missed).tokens

    def missed(self, decode_rows: int) -> float:
        """What a step loses by a call not decoding in it yet: a row's share of its cost (a
        plain step's, for calls decoding outside the batch)."""
        cost = self.cost()
        if cost is None:
            return 0.0
        return cost(decode_rows, self.width) / decode_rows if decode_rows else cost(1, 1)

    def _decode(
        self, batch: BatchCache, calls: list[Call], proposals: list[StepDraft]
    ) -> tuple[list[StepDraft], torch.Tensor]:
        costs = self.runner.costs.batched() if len(calls) > 1 else None
        drafts = self._plan(calls, proposals, costs)
        self.width = max(len(d) for d in drafts)
        if batch.rows == 1:  # a call alone: exactly the forward it would have outside a batch
            past, started = batch.lengths[0], time.perf_counter()
            logits, _ = self.runner.forward_step(drafts[0], batch.cache, past)
            # Calibrates the cost curve by this forward (planning only; tokens never change).
            self.runner.costs.observe(len(drafts[0]), time.perf_counter() - started, context=past)
            return drafts, logits.unsqueeze(0)  # [1, T, V]
        batch.prepare()
        inputs = batch_inputs(drafts, batch.lengths, self.runner.device, self.runner.model.dtype)
        return drafts, self._forward(batch, inputs)  # [B, T, V]

    def _fused(
        self, batch: BatchCache, calls: list[Call], proposals: Sequence[StepDraft | None]
    ) -> tuple[list[StepDraft], list[torch.Tensor]]:
        """A step in which some rows prefill: their prompts' next chunks ride as chains."""
        decoding = [i for i, p in enumerate(proposals) if p is not None]
        costs = self.runner.costs.batched() if len(decoding) > 1 else None
        decode = [p for p in proposals if p is not None]
        planned = iter(self._plan([calls[i] for i in decoding], decode, costs) if decode else [])
        drafts: list[StepDraft | None] = [next(planned) if p is not None else None for p in proposals]
        width = max((len(d) for d in drafts if d is not None), default=0)
        left = [len(c.prompt_ids) - c.prefilled for c, d in zip(calls, drafts, strict=True) if d is None]
        if batch.rows == 1:  # the prompt alone: all of it at once, as outside a batch
            chunk = prompt_chunk(calls[0], left[0])
            started = time.perf_counter()
            logits, _ = self.runner.forward(torch.tensor([chunk.tree.tokens]), batch.cache, last_only=True)
            self.observe_prompt(len(chunk), time.perf_counter() - started)
            return [chunk], [logits[-1:]]
        cost = self.cost()
        if cost is not None:
            missed = self.missed(len(decoding))
            tokens = fused_prefill(
                left, len(decoding), width, cost, self.max_tokens_per_forward, missed, self._measured()
            ).tokens
        else:
            tokens = max(min(max(left), self.max_tokens_per_forward // len(calls)), width, 1)
        steps = [
            d if d is not None else prompt_chunk(c, min(tokens, len(c.prompt_ids) - c.prefilled))
            for c, d in zip(calls, drafts, strict=True)
        ]
        # Logits only where they are read: the drafts' nodes, and the last token of a prompt.
        last = [
            len(s) - 1 if d is None and c.prefilled + len(s) == len(c.prompt_ids) else None
            for c, d, s in zip(calls, drafts, steps, strict=True)
        ]
        keep = sorted(set(range(width)) | {n for n in last if n is not None})
        batch.prepare()
        inputs = batch_inputs(steps, batch.lengths, self.runner.device, self.runner.model.dtype)
        logits = self._forward(batch, inputs, keep)  # [B, K, V]
        rows = []
        for i, (step, draft, end) in enumerate(zip(steps, drafts, last, strict=True)):
            if draft is not None:
                rows.append(logits[i, : len(step)])
            else:  # [1, V] at a prompt's last token, [0, V] before it
                rows.append(logits[i, [keep.index(end)]] if end is not None else logits[i, :0])
        return steps, rows

    def _forward(self, batch: BatchCache, inputs: TreeInputs, keep: list[int] | None = None) -> torch.Tensor:
        """The batch's forward, timed into the calibration: a step whose prompt chunks widen
        every row is priced from its own timings from then on, as a step of drafts is."""
        started = time.perf_counter()
        logits = self.runner.forward_batch(inputs, batch.cache, batch.lengths, keep)
        seconds, costs = time.perf_counter() - started, self.runner.costs.batched()
        if costs is not None:
            rows, width = inputs.input_ids.shape
            self.calibration.record(rows, width, costs(rows, width), seconds)
        return logits

    def _plan(self, calls: list[Call], proposals: list[StepDraft], costs: Cost | None) -> list[StepDraft]:
        if len(calls) == 1:
            call = calls[0]
            room, cached = call.context_window - len(call.ids), len(call.ids) - 1  # all but the root
            return [call.planner.plan(proposals[0], room, cached)]
        # Several rows: side rows stay out (each would widen every row), the plan is joint, by
        # width, against the batch costs as calibrated so far.
        ranked = [call.planner.rank(draft) for call, draft in zip(calls, proposals, strict=True)]
        widest = max(len(r.tree) for r in ranked)
        by_width = None if costs is None else self._by_width(costs, len(calls), widest)
        return [StepDraft(tree) for tree in plan_batch(ranked, by_width, self.max_tokens_per_forward)]

    def _by_width(self, costs: Cost, rows: int, widest: int) -> Callable[[int], float]:
        """Seconds of a step of ``rows`` rows by width, as calibrated, never cheaper for a
        wider step: each width class has its own calibration, and a wider class calibrated
        lower than a narrower one must not make the plan draft wider to save time."""
        calibrated = (costs(rows, w) * self.calibration.factor(rows, w) for w in range(1, widest + 1))
        seconds = list(itertools.accumulate(calibrated, max))
        return lambda width: seconds[min(width, widest) - 1]


def prompt_chunk(call: Call, tokens: int) -> StepDraft:
    """The next ``tokens`` of ``call``'s prompt as a chain: a causal draft at the positions
    after what it has prefilled."""
    start = call.prefilled
    return StepDraft(DraftTree(tuple(call.prompt_ids[start : start + tokens]), tuple(range(-1, tokens - 1))))
