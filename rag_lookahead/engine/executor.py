"""The forwards the scheduler plans, run on the model and timed; nothing here plans or prices.

A `StepPlan` runs as one forward over the `BatchCache`: every row's draft (or its prompt's
next chunk) at its own positions — side by side, unpadded, where the runner `packs` (on a CPU),
else padded to the widest. A batch of one row runs exactly the
forward it would have alone (the model's own causal path for a chain, its tree masks for a
draft). Where the runner has a static step (`rag_lookahead.runtime.static`), the batch is a
`StaticBatch` of its slots and every step, of one row or several, is that step's forward,
padded to its bucket (replayed where captured); its rows only decode (their prompts are
prefilled apart). Besides the batch's steps, a prompt's chunk forwarded apart in the call's own cache,
and a plain step of a call decoding outside the batch. Each returns its seconds, for the
`Pricing` to learn from (on a GPU, once the device has done the work, not once it was queued).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rag_lookahead.engine.step import StepOutput, StepPlan
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.static.batch import StaticBatch

__all__ = ["Batch", "Executor"]

# The batch's rows and their cache: over growing caches, or in a static step's slots.
Batch = BatchCache | StaticBatch


class Executor:
    """Runs planned forwards of one model."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def packs(self) -> bool:
        """Whether this executor's batches are packed (`new_batch`): where the runner packs."""
        return self.runner.packs()

    def new_batch(self) -> Batch:
        """An empty batch for the forwards `run` runs."""
        static = self.runner.static
        return StaticBatch(static) if static is not None else BatchCache(packed=self.packs())

    def current(self, batch: Batch) -> bool:
        """Whether ``batch`` (empty) is of the kind `new_batch` makes now: a change of the
        model may have changed the runner's layout or static step."""
        if isinstance(batch, StaticBatch):
            return batch.step is self.runner.static
        return self.runner.static is None and batch.packed == self.packs()

    def run(self, plan: StepPlan, batch: Batch) -> StepOutput:
        """One forward over every row of ``batch`` (from `new_batch`) as ``plan`` says (the
        cache then holds the step's columns; `keep_accepted` keeps those the rows accept)."""
        if isinstance(batch, StaticBatch):
            return self._static(plan, batch)
        if batch.rows == 1:
            return self._one_row(plan, batch)
        if batch.packed:
            return self._packed(plan, batch)
        steps = [row.draft for row in plan.rows]
        keep = plan.logit_positions()
        batch.prepare()
        inputs = batch_inputs(steps, batch.lengths, self.runner.device, self.runner.model.dtype)
        started = time.perf_counter()
        logits = self.runner.forward_batch(inputs, batch.cache, batch.lengths, keep)  # [B, K, V]
        self.runner.synchronize()
        seconds = time.perf_counter() - started
        rows = []
        for i, row in enumerate(plan.rows):
            if not row.prompt:  # K starts with every draft's nodes
                rows.append(logits[i, : len(row.draft)])
            elif row.ends_prompt and keep is not None:
                rows.append(logits[i, [keep.index(len(row.draft) - 1)]])  # [1, V]
            else:
                rows.append(logits[i, :0])  # [0, V]
        return StepOutput(tuple(rows), seconds)

    def _static(self, plan: StepPlan, batch: StaticBatch) -> StepOutput:
        """Every row's draft padded to the static step's bucket: one forward (a replay where
        the bucket is captured); each row's logits at its own nodes, views of a captured
        bucket's output, which the next replay overwrites (the step's update reads them first)."""
        if plan.prompts:
            raise ValueError("a static step's rows only decode: their prompts are prefilled apart")
        drafts = [row.draft for row in plan.rows]
        step = batch.step
        started = time.perf_counter()
        bucket = step.prepare(drafts, batch.lengths)
        logits = step.forward(bucket)  # [R, W, V]
        rows = tuple(logits[i, : len(draft)] for i, draft in enumerate(drafts))
        self.runner.synchronize()
        return StepOutput(rows, time.perf_counter() - started)

    def _packed(self, plan: StepPlan, batch: BatchCache) -> StepOutput:
        """The rows' drafts side by side in one sequence, each over its own cache."""
        drafts = [row.draft for row in plan.rows]
        inputs = self.runner.packed_inputs(drafts, batch.lengths)
        keep: list[int] = []  # the tokens whose logits are read, ascending
        read = []  # per row, its part of them
        for row, offset, size in zip(plan.rows, inputs.offsets, inputs.sizes, strict=True):
            if not row.prompt:
                tokens = range(offset, offset + size)
            else:
                tokens = range(offset + size - 1, offset + size) if row.ends_prompt else range(0)
            read.append(slice(len(keep), len(keep) + len(tokens)))
            keep += tokens
        batch.prepare(inputs)
        started = time.perf_counter()
        logits = self.runner.forward_packed(inputs, batch.cache, batch.lengths, keep)  # [K, V]
        self.runner.synchronize()
        seconds = time.perf_counter() - started
        return StepOutput(tuple(logits[part] for part in read), seconds)

    def prompt_apart(self, tokens: list[int], cache: Any) -> tuple[torch.Tensor, Any, float]:
        """A prompt's ``tokens`` forwarded in its own ``cache`` (``None``: a new one): the
        logits at the last token ``[1, V]``, the cache, and the seconds."""
        started = time.perf_counter()
        logits, cache = self.runner.forward(torch.tensor([tokens]), cache, last_only=True)
        self.runner.synchronize()
        return logits[-1:], cache, time.perf_counter() - started

    def plain_step(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        """One plain step of a call outside the batch, in the model's own ``cache``: the logits
        ``[1, V]`` after ``token``, and the cache."""
        logits, cache = self.runner.forward(torch.tensor([[token]]), cache)
        return logits[-1:], cache

    def _one_row(self, plan: StepPlan, batch: BatchCache) -> StepOutput:
        """A batch of one row: exactly the forward the call would have outside a batch."""
        (row,) = plan.rows
        started = time.perf_counter()
        if row.prompt:  # the whole prompt at once, as outside a batch
            logits, _ = self.runner.forward(
                torch.tensor([row.draft.tree.tokens]), batch.cache, last_only=True
            )
            logits = logits[-1:] if row.ends_prompt else logits[:0]  # [1, V] or [0, V]
        else:
            logits, _ = self.runner.forward_step(row.draft, batch.cache, batch.lengths[0])  # [T, V]
        self.runner.synchronize()
        return StepOutput((logits,), time.perf_counter() - started)
