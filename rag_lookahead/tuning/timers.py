"""Forwards timed: what the kernel choice and the cost curves are made of.

Each timer prefills a made-up prompt once, on the runner given, then times one forward of so
many tokens after it on whichever runner it is handed (the kernel choice hands it one runner
per candidate kernel: `rag_lookahead.tuning.kernel_choice`), once the device has done the work,
and rolls the cache back, so that every timing sees the same context.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.runtime.batch import BatchCache, batch_inputs
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.runner import ModelRunner

__all__ = ["Timer", "batch_timer", "chain_timer", "chunk_timer", "context_for"]

# Seconds of one forward of so many tokens by the runner given (after the timer's prompt).
Timer = Callable[[ModelRunner, int], float]


def context_for(runner: ModelRunner, wanted: int) -> int:
    """The prompt a timer prefills: ``wanted`` tokens, or half the model's window if shorter."""
    window = getattr(runner.model.config, "max_position_embeddings", None) or 512
    return min(wanted, window // 2)


def _prompt(runner: ModelRunner, length: int, start: int = 7) -> list[int]:
    """Made-up tokens of ``runner``'s vocabulary (``start`` tells two rows' apart)."""
    vocab = int(runner.model.config.vocab_size)
    return [(31 * i + start) % vocab for i in range(length)]


def chain_timer(prefill: ModelRunner, context_length: int) -> Timer:
    """Seconds of one forward over k chained draft tokens after ``context_length`` tokens
    (prefilled by ``prefill``)."""
    prompt = _prompt(prefill, context_length)
    _, cache = prefill.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)

    def seconds(runner: ModelRunner, tokens: int) -> float:
        chain = tuple(prompt[i % context_length] for i in range(tokens))
        tree = DraftTree(chain, tuple(range(-1, tokens - 1)))
        start = time.perf_counter()
        runner.forward_step(StepDraft(tree), cache, context_length)
        runner.synchronize()
        elapsed = time.perf_counter() - start
        cache.crop(-tokens)
        return elapsed

    return seconds


def chunk_timer(prefill: ModelRunner, context_length: int) -> Timer:
    """Seconds of one forward of a prompt's chunk of k tokens after ``context_length`` tokens
    (prefilled by ``prefill``; its logits at its last token alone)."""
    prompt = _prompt(prefill, context_length)
    _, cache = prefill.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)

    def seconds(runner: ModelRunner, tokens: int) -> float:
        ids = torch.tensor([[prompt[(5 * i + 3) % context_length] for i in range(tokens)]])
        start = time.perf_counter()
        runner.forward(ids, cache, last_only=True)
        runner.synchronize()
        elapsed = time.perf_counter() - start
        cache.crop(-tokens)
        return elapsed

    return seconds


def batch_timer(runner: ModelRunner, rows: int, context_length: int) -> Callable[[int], float]:
    """Seconds of one batched forward of ``rows`` rows of ``context_length`` cached tokens,
    each a chain of ``width`` tokens, laid out as the runner's steps are (`ModelRunner.packs`)."""
    packs = runner.packs()
    batch = BatchCache(packed=packs)
    for row in range(rows):
        prompt = _prompt(runner, context_length, start=7 * row + 3)
        _, cache = runner.forward(torch.tensor([prompt]), new_tree_cache(), last_only=True)
        batch.add_row(cache)

    def seconds(width: int) -> float:
        chain = DraftTree(tuple(range(3, 3 + width)), tuple(range(-1, width - 1)))
        drafts = [StepDraft(chain)] * rows
        if packs:
            packed = runner.packed_inputs(drafts, batch.lengths)
            batch.prepare(packed)
            start = time.perf_counter()
            runner.forward_packed(packed, batch.cache, batch.lengths)
        else:
            batch.prepare()
            inputs = batch_inputs(drafts, batch.lengths, runner.device, runner.model.dtype)
            start = time.perf_counter()
            runner.forward_batch(inputs, batch.cache, batch.lengths)
        runner.synchronize()
        return time.perf_counter() - start  # nothing kept: the rows' lengths stay as they were

    return seconds
