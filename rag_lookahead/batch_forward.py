"""One forward over the drafts of every row in the batch, planned jointly.

The `Scheduler` decides which calls are rows; here their drafts are cut to what the batch
verifies (`plan_batch`, against the batch costs as calibrated by the forwards so far) and
run in one forward over the `BatchCache`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rag_lookahead.call import Call
from rag_lookahead.decoding.batch import BatchCache, batch_inputs
from rag_lookahead.decoding.costs import Calibration
from rag_lookahead.decoding.planner import plan_batch
from rag_lookahead.decoding.runner import ModelRunner
from rag_lookahead.decoding.tree import StepDraft

__all__ = ["BatchForward"]


class BatchForward:
    """The batch's forward on one model, and the calibration of its costs it learns from."""

    def __init__(self, runner: ModelRunner, max_tokens_per_forward: int) -> None:
        self.runner = runner
        self.max_tokens_per_forward = max_tokens_per_forward
        self.calibration = Calibration()

    def run(
        self, batch: BatchCache, calls: list[Call], proposals: list[StepDraft]
    ) -> tuple[list[StepDraft], torch.Tensor]:
        """Plan the rows' drafts jointly and verify them in one forward; the drafts and their
        logits ``[B, T, V]``."""
        costs = self.runner.costs.batched() if len(calls) > 1 else None
        drafts = self._plan(calls, proposals, costs)
        if batch.rows == 1:  # a call alone: exactly the forward it would have outside a batch
            started = time.perf_counter()
            logits, _ = self.runner.forward_step(drafts[0], batch.cache, batch.lengths[0])
            # Checks a cached cost curve against this forward (planning only; tokens never change).
            self.runner.costs.observe(len(drafts[0]), time.perf_counter() - started)
            return drafts, logits.unsqueeze(0)  # [1, T, V]
        batch.prepare()
        inputs = batch_inputs(drafts, batch.lengths, self.runner.device, self.runner.model.dtype)
        started = time.perf_counter()
        logits = self.runner.forward_batch(inputs, batch.cache, batch.lengths)  # [B, T, V]
        if costs is not None:
            width, seconds = inputs.input_ids.shape[1], time.perf_counter() - started
            self.calibration.record(len(calls), width, costs(len(calls), width), seconds)
        return drafts, logits

    def _plan(
        self, calls: list[Call], proposals: list[StepDraft], costs: Callable[[int, int], float] | None
    ) -> list[StepDraft]:
        if len(calls) == 1:
            call = calls[0]
            return [call.planner.plan(proposals[0], call.context_window - len(call.ids))]
        # Several rows: side rows stay out (each would widen every row), the plan is joint, by
        # width, against the batch costs as calibrated so far.
        ranked = [call.planner.rank(draft) for call, draft in zip(calls, proposals, strict=True)]
        rows = len(calls)
        by_width = None if costs is None else lambda w: costs(rows, w) * self.calibration.factor(rows, w)
        return [StepDraft(tree) for tree in plan_batch(ranked, by_width, self.max_tokens_per_forward)]
