"""One generation call as the scheduler holds it, and a row's own work in a step.

The `Scheduler` coordinates the calls (who joins, which forward runs, who leaves); what a
single call does with its share of a step lives here: drafting, choosing and accepting the
model's tokens at its nodes, and releasing them through its `Stopping`.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.constraint import GrammarState
from rag_lookahead.decoding.planner import StepPlanner
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.decoding.verify import TokenChooser, accept, raw_logprobs
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.streaming.logprobs import TokenLogprob, token_logprobs
from rag_lookahead.streaming.stats import FinishReason, StepRecorder
from rag_lookahead.streaming.stopping import Stopping
from rag_lookahead.streaming.stream import StreamChunk

__all__ = ["END", "Call", "choose", "choose_next", "propose", "release", "verify"]

END = None  # the outbox's last item


@dataclass(eq=False)
class Call:
    """One generation call, from submission to its last token."""

    prompt_ids: list[int]
    config: LookaheadConfig
    planner: StepPlanner
    chooser: TokenChooser
    stopping: Stopping
    recorder: StepRecorder
    context_window: int
    make_drafter: Callable[[], Drafter] | None  # None: decode plainly (under its grammar if any)
    batchable: bool  # may share the batch cache (else: plain, in the model's own cache)
    grammar: GrammarState | None = None  # the grammar every token keeps to, if any
    outbox: queue.SimpleQueue[StreamChunk | BaseException | None] = field(default_factory=queue.SimpleQueue)
    cancelled: bool = False
    ended: threading.Event = field(default_factory=threading.Event)  # set once it holds nothing
    ids: list[int] = field(default_factory=list)
    cache: Any = None  # its own cache, while prefilling (and for calls outside the batch)
    prefilled: int = 0
    drafter: Drafter | None = None
    side_predictions: list[int] = field(default_factory=list)  # the model's argmax at the side rows
    top_logprobs: int | None = None  # most likely tokens reported per token; None: no logprobs
    # The step's chosen tokens' log probabilities and top pairs, until `release` passes them on.
    scored: tuple[list[float], list[list[tuple[int, float]]]] | None = None
    token_texts: dict[int, str] = field(default_factory=dict)  # decoded once: top tokens repeat

    def __post_init__(self) -> None:
        self.ids = list(self.prompt_ids)


def propose(call: Call) -> StepDraft:
    """The call's draft for its next step (its root alone when it may not draft)."""
    # Room for the drafted tokens plus the model's own one.
    budget = min(call.config.decoding_length, call.stopping.room() - 1)
    if call.drafter is None or budget <= 0:
        return StepDraft(DraftTree.root_only(call.ids[-1]))
    return call.drafter.propose(call.ids, budget)


def verify(call: Call, draft: StepDraft, logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """The accepted tokens and nodes of one row's ``draft`` given its ``logits`` [T, V]."""
    tree = draft.tree
    accepted = accept(tree, choose(call, logits[: len(tree)], tree))
    _score(call, logits, accepted.tokens, accepted.nodes)  # the accepted rows only
    call.side_predictions = logits[len(tree) : len(draft)].argmax(-1).tolist() if draft.side else []
    call.planner.learn(tree, accepted.nodes)
    call.recorder.step(len(tree) - 1, len(accepted.tokens) - 1, tree.source)
    return accepted.tokens, accepted.nodes


def choose(call: Call, logits: torch.Tensor, tree: DraftTree) -> list[int]:
    """The model's token at each node of ``tree`` (``logits`` [n, V]), within the call's grammar
    (and, for a grammar that closes in budget, within the tokens the call has left)."""
    if call.grammar is None:
        return call.chooser.choose(logits, call.ids, tree)
    chosen = call.chooser.choose(logits, call.ids, tree, call.grammar.allowed(tree))
    return call.grammar.within_budget(tree, chosen, call.stopping.room())


def choose_next(call: Call, logits: torch.Tensor) -> list[int]:
    """The model's next token from the last position's ``logits`` [1, V] (a plain step)."""
    tokens = choose(call, logits, DraftTree.root_only(call.ids[-1]))
    _score(call, logits, tokens, [0])
    return tokens


def _score(call: Call, logits: torch.Tensor, tokens: list[int], rows: list[int]) -> None:
    """Keep the log probabilities of the step's ``tokens``, chosen at ``rows`` of ``logits``
    [n, V], when the call asks for them; nothing is computed (or copied) otherwise."""
    if call.top_logprobs is not None:
        call.scored = raw_logprobs(logits[rows], tokens, call.top_logprobs)


def release(call: Call, tokens: list[int]) -> FinishReason | None:
    """Pass a step's tokens through the call's stopping to its outbox; why it stops, if it does
    (the caller then ends it)."""
    released = call.stopping.release(tokens)
    call.ids += released.token_ids
    if call.grammar is not None and released.reason is None:
        call.grammar.advance(released.token_ids)
    elif call.grammar is not None and released.reason == "eos":  # "eos" means complete
        call.grammar.finish(released.token_ids)
    call.recorder.new_tokens += len(released.token_ids)
    if call.drafter is not None:
        call.drafter.observe(released.token_ids, call.side_predictions)
    call.outbox.put(
        StreamChunk(released.token_ids, released.text, _released_logprobs(call, released.token_ids))
    )
    return released.reason


def _released_logprobs(call: Call, token_ids: list[int]) -> list[TokenLogprob] | None:
    """The scored step's log probabilities of the ``token_ids`` released (a prefix of the step's
    tokens: stopping only cuts its end)."""
    if call.scored is None:
        return None
    (chosen, top), call.scored = call.scored, None
    n = len(token_ids)
    return token_logprobs(functools.partial(_token_text, call), token_ids, chosen[:n], top[:n])


def _token_text(call: Call, token_id: int) -> str:
    """``token_id``'s own text, as `TokenLogprob.token` reads (decoded once per call)."""
    text = call.token_texts.get(token_id)
    if text is None:
        text = call.token_texts[token_id] = str(call.stopping.assembler.tokenizer.decode([token_id]))
    return text
