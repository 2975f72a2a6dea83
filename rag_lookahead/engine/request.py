"""One generation call as the scheduler holds it, and a row's own work in a step.

A `Call` is the call's state (what it asked, where it is, what it produced); its `Decoder` is
what acts on it (settings, planner, chooser, stopping, grammar, drafter), given beside it. The
`Scheduler` coordinates the calls (who joins, which forward runs, who leaves); what a single
call does with its share of a step lives here: drafting, choosing and accepting the model's
tokens at its nodes (a `Verdict`), and releasing them through its `Stopping`.
"""

from __future__ import annotations

import enum
import functools
import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.constraint import GrammarState
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.decoding.verify import TokenChooser, accept, raw_logprobs
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.engine.step import Scored, Verdict
from rag_lookahead.planning.planner import StepPlanner
from rag_lookahead.streaming.logprobs import TokenLogprob, token_logprobs
from rag_lookahead.streaming.stats import FinishReason, StepRecorder
from rag_lookahead.streaming.stopping import Stopping
from rag_lookahead.streaming.stream import StreamChunk

__all__ = [
    "END",
    "Call",
    "CallStatus",
    "Decoder",
    "Preparation",
    "choose",
    "choose_next",
    "first_token",
    "hear_end",
    "let_go",
    "propose",
    "read",
    "release",
    "verify",
]

END = None  # the outbox's last item
T = TypeVar("T")
_READ_SLICE_S = 0.5


class CallStatus(enum.IntEnum):
    """Where a call is: set by the thread running the loop (`cancelled` is how others ask)."""

    WAITING = 0  # submitted, not admitted yet
    PREFILLING = 1  # its prompt is forwarded: apart, or riding in the batch's steps
    DECODING = 2  # a row of the batch, or decoding plainly outside it
    FINISHED_EOS = 3
    FINISHED_STOP_STRING = 4
    FINISHED_LENGTH = 5
    FINISHED_CONTEXT_WINDOW = 6
    FINISHED_ABANDONED = 7  # cancelled, closed, or ended by an error

    def is_finished(self) -> bool:
        return self >= CallStatus.FINISHED_EOS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)

    @staticmethod
    def finished(reason: FinishReason) -> CallStatus:
        return _FINISHED[reason]


_FINISH_REASONS: dict[CallStatus, FinishReason] = {
    CallStatus.FINISHED_EOS: "eos",
    CallStatus.FINISHED_STOP_STRING: "stop_string",
    CallStatus.FINISHED_LENGTH: "length",
    CallStatus.FINISHED_CONTEXT_WINDOW: "context_window",
    CallStatus.FINISHED_ABANDONED: "abandoned",
}
_FINISHED = {reason: status for status, reason in _FINISH_REASONS.items()}


class Preparation(Protocol):
    """What a call's drafter takes in before its first token (its long texts: `DrafterBuild`),
    taken in a slice at a time between two steps of the running calls."""

    @property
    def left(self) -> int:
        """The work still to do, in the entries `advance` counts."""
        ...

    def advance(self, budget: int) -> int:
        """Do about ``budget`` entries of the work (some, while any is left); how many."""
        ...

    def close(self) -> None:
        """Let go of what was done, unless the call's drafter was made from it."""
        ...


@dataclass(eq=False)
class Call:
    """One generation call's state, from submission to its last token: what it asked, where it
    is, what it has produced so far, its record, and the queue its reader reads.

    What acts on it is not here: its `Decoder` (how its tokens are drafted, chosen and
    released) and its caches are the scheduler's, held beside it while it runs, so a call
    outlives none of them and a test builds one from its prompt alone."""

    prompt_ids: list[int]
    recorder: StepRecorder  # its stats, as its stream reads them
    batchable: bool = True  # may share the batch cache (else: plain, in the model's own cache)
    top_logprobs: int | None = None  # most likely tokens reported per token; None: no logprobs
    status: CallStatus = CallStatus.WAITING
    outbox: queue.SimpleQueue[StreamChunk | BaseException | None] = field(default_factory=queue.SimpleQueue)
    cancelled: bool = False  # asked from any thread; the loop ends it at a step boundary
    ended: threading.Event = field(default_factory=threading.Event)  # set once it holds nothing
    ids: list[int] = field(default_factory=list)
    prefilled: int = 0
    generation: int = -1  # the model's changes seen when it was admitted (`Scheduler._admit`)
    token_texts: dict[int, str] = field(default_factory=dict)  # decoded once: top tokens repeat

    def __post_init__(self) -> None:
        self.ids = list(self.prompt_ids)

    def finish(self, reason: FinishReason) -> None:
        """Record why it ended; the first reason stands."""
        if not self.status.is_finished():
            self.status = CallStatus.finished(reason)
        self.recorder.finish(reason)


@dataclass(eq=False)
class Decoder:
    """What decodes one call: the engine's settings and step planner, the call's own chooser,
    stopping and grammar, and its drafter, made once its prompt is in (from the long texts
    ``prepare`` takes in first). Given with the call to `Scheduler.submit`, which holds it
    beside the call until the call ends and lets go of its drafter (`let_go`)."""

    config: LookaheadConfig
    planner: StepPlanner
    chooser: TokenChooser
    stopping: Stopping  # also the one owner of the context window
    make_drafter: Callable[[], Drafter] | None = None  # None: decode plainly (under its grammar if any)
    prepare: Preparation | None = None  # what ``make_drafter`` takes in: before the prefill if long
    grammar: GrammarState | None = None  # the grammar every token keeps to, if any
    drafter: Drafter | None = None


def propose(call: Call, decoder: Decoder) -> StepDraft:
    """The call's draft for its next step (its root alone when it may not draft)."""
    # Room for the drafted tokens plus the model's own one, in the window and in one forward.
    config = decoder.config
    budget = min(config.decoding_length, config.max_tokens_per_forward - 1, decoder.stopping.room() - 1)
    if decoder.drafter is None or budget <= 0:
        return StepDraft(DraftTree.root_only(call.ids[-1]))
    return decoder.drafter.propose(call.ids, budget)


def verify(call: Call, decoder: Decoder, draft: StepDraft, logits: torch.Tensor) -> Verdict:
    """What one row's ``draft`` comes to given its ``logits`` [T, V]."""
    tree = draft.tree
    accepted = accept(tree, choose(call, decoder, logits[: len(tree)], tree))
    scored = _score(call, logits, accepted.tokens, accepted.nodes)  # the accepted rows only
    side = logits[len(tree) : len(draft)].argmax(-1).tolist() if draft.side else []
    decoder.planner.learn(tree, accepted.nodes)
    call.recorder.step(len(tree) - 1, len(accepted.tokens) - 1, tree.source)
    return Verdict(accepted.tokens, accepted.nodes, side, scored)


def choose(call: Call, decoder: Decoder, logits: torch.Tensor, tree: DraftTree) -> list[int]:
    """The model's token at each node of ``tree`` (``logits`` [n, V]), within the call's grammar
    (and, for a grammar that closes in budget, within the tokens the call has left)."""
    grammar = decoder.grammar
    if grammar is None:
        return decoder.chooser.choose(logits, call.ids, tree)
    chosen = decoder.chooser.choose(logits, call.ids, tree, grammar.allowed(tree))
    return grammar.within_budget(tree, chosen, decoder.stopping.room())


def choose_next(call: Call, decoder: Decoder, logits: torch.Tensor) -> Verdict:
    """The model's next token from the last position's ``logits`` [1, V] (a plain step)."""
    tokens = choose(call, decoder, logits, DraftTree.root_only(call.ids[-1]))
    return Verdict(tokens, [0], scored=_score(call, logits, tokens, [0]))


def first_token(call: Call, decoder: Decoder, logits: torch.Tensor) -> FinishReason | None:
    """Its prompt prefilled (``logits`` ``[1, V]`` at its last token), ``call`` gets its drafter
    and its first token; why that ends it, if it does (the caller then ends it)."""
    call.status = CallStatus.DECODING
    # The trie takes the call's texts after the forward was launched (on a GPU it still runs).
    decoder.drafter = decoder.make_drafter() if decoder.make_drafter is not None else None
    verdict = choose_next(call, decoder, logits)
    call.recorder.prefill_seconds = time.perf_counter() - call.recorder.started
    return release(call, decoder, verdict)


def let_go(decoder: Decoder, error: BaseException | None) -> BaseException | None:
    """Release what an ended call's ``decoder`` holds (its drafter, the texts taken in for a
    drafter never made): ``error``, or the first failure doing so (its drafter's branches stay
    in the trie: that call's error alone)."""
    drafter, decoder.drafter = decoder.drafter, None
    for resource in (drafter, decoder.prepare):
        if resource is not None:
            try:
                resource.close()
            except Exception as err:
                error = error or err
    return error


def hear_end(call: Call, error: BaseException | None = None) -> None:
    """``call``'s reader hears that it ended (with ``error``, if it failed): it holds nothing."""
    call.outbox.put(error if error is not None else END)
    call.ended.set()


def _score(call: Call, logits: torch.Tensor, tokens: list[int], rows: list[int]) -> Scored | None:
    """The log probabilities of the step's ``tokens``, chosen at ``rows`` of ``logits`` [n, V],
    when the call asks for them; nothing is computed (or copied) otherwise."""
    if call.top_logprobs is None:
        return None
    return raw_logprobs(logits[rows], tokens, call.top_logprobs)


def release(call: Call, decoder: Decoder, verdict: Verdict) -> FinishReason | None:
    """Pass a step's accepted tokens through the call's stopping to its outbox; why it stops, if
    it does (the caller then ends it)."""
    released = decoder.stopping.release(verdict.tokens)
    call.ids += released.token_ids
    grammar = decoder.grammar
    if grammar is not None and released.reason is None:
        grammar.advance(released.token_ids)
    elif grammar is not None and released.reason == "eos":  # "eos" means complete
        grammar.finish(released.token_ids)
    call.recorder.released(released.token_ids)
    if decoder.drafter is not None:
        decoder.drafter.observe(released.token_ids, verdict.side_predictions)
    logprobs = _released_logprobs(call, decoder, verdict.scored, released.token_ids)
    call.outbox.put(StreamChunk(released.token_ids, released.text, logprobs))
    return released.reason


def _released_logprobs(
    call: Call, decoder: Decoder, scored: Scored | None, token_ids: list[int]
) -> list[TokenLogprob] | None:
    """The log probabilities of the ``token_ids`` released (a prefix of the step's tokens:
    stopping only cuts its end)."""
    if scored is None:
        return None
    chosen, top = scored
    n = len(token_ids)
    return token_logprobs(functools.partial(_token_text, call, decoder), token_ids, chosen[:n], top[:n])


def _token_text(call: Call, decoder: Decoder, token_id: int) -> str:
    """``token_id``'s own text, as `TokenLogprob.token` reads (decoded once per call)."""
    text = call.token_texts.get(token_id)
    if text is None:
        text = call.token_texts[token_id] = str(decoder.stopping.assembler.tokenizer.decode([token_id]))
    return text


def read(call: Call) -> Generator[StreamChunk, None, None]:
    """What ``call`` releases, as the model's thread releases it; closing this generator (or an
    error in the reader's loop) cancels the call."""
    try:
        while True:
            item = _next(call.outbox)
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        call.cancelled = True  # nothing to stop if it has ended


def _next(outbox: queue.SimpleQueue[T]) -> T:
    """The next item of ``outbox``, waited for in slices so that a signal (Ctrl-C) reaches a
    reader in the main thread."""
    while True:
        try:
            return outbox.get(timeout=_READ_SLICE_S)
        except queue.Empty:
            continue
