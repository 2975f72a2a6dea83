"""A call that fails ends alone: its neighbours in the batch answer exactly as they would solo.

Each failure is one call's own (its grammar, its drafter, its tokenizer's text), injected while
greedy, seeded-sampled and constrained neighbours share the batch with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rag_lookahead import GenerationParams, LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.streaming.stream import Completion, TextStream
from rag_lookahead.structured import Grammar
from rag_lookahead.testing import ASCII_VOCAB, ascii_fast_tokenizer, read_all, tiny_model

N = 40
FAILING_PROMPT = [40, 41, 42, 0, 33, 34]
NEIGHBOURS = [
    ([7, 8, 9, 10, 7, 8], GenerationParams(max_new_tokens=N)),
    ([23, 42, 4, 8], GenerationParams(max_new_tokens=N, do_sample=True, temperature=1.3, seed=11)),
    (
        [50, 51, 52],
        GenerationParams(max_new_tokens=N, grammar=Grammar.regex(r"[a-f]{2,6}( [a-f]{2,6}){0,5}\.")),
    ),
]
# The ASCII vocabulary cannot spell "é": llguidance allows a token it then cannot continue from.
DEAD_END = Grammar.regex("aaa\u00e9")


def engine_for(tokenizer: Any = None) -> LookaheadEngine:
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    config = LookaheadConfig(mode="trie", min_query_length=1, max_batch_size=4)
    return LookaheadEngine(model, tokenizer or ascii_fast_tokenizer(), config)


def solo() -> list[list[int]]:
    """The neighbours' answers, each alone, on an engine of their own: the batch's engine has
    none of their outputs in its trie, so they take many steps beside the failing call."""
    engine = engine_for()
    return [engine.complete(prompt, params).token_ids for prompt, params in NEIGHBOURS]


def beside_neighbours(engine: LookaheadEngine, failing: Callable[[], TextStream]) -> tuple[list[Any], Any]:
    """The neighbours started and stepping, then the failing call; all read in threads. The
    neighbours' completions, and what the failing call's reading raised (or returned)."""
    streams = [engine.stream(prompt, params) for prompt, params in NEIGHBOURS]
    for stream in streams:
        next(stream.chunks(), None)
    streams.append(failing())
    results = read_all(streams)
    return results[:-1], results[-1]


def assert_neighbours_unchanged(
    engine: LookaheadEngine, neighbours: list[Any], alone: list[list[int]]
) -> None:
    assert all(isinstance(c, Completion) for c in neighbours), neighbours
    assert [c.token_ids for c in neighbours] == alone
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # nobody's branches linger
    assert engine.complete(*NEIGHBOURS[0]).token_ids == alone[0]  # and the engine still answers


def test_a_grammar_that_dead_ends_ends_its_call_alone() -> None:
    alone = solo()
    engine = engine_for()
    neighbours, failed = beside_neighbours(
        engine, lambda: engine.stream(FAILING_PROMPT, max_new_tokens=N, grammar=DEAD_END)
    )
    assert isinstance(failed, RuntimeError) and "dead end" in str(failed), failed
    assert_neighbours_unchanged(engine, neighbours, alone)


class BrokenDrafter:
    """Drafts the root alone (the model's own token), until its ``fails_at``-th proposal."""

    def __init__(self, fails_at: int) -> None:
        self.left = fails_at
        self.closed = False

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        self.left -= 1
        if self.left <= 0:
            raise LookupError("the drafter broke")
        return StepDraft(DraftTree.root_only(context[-1]))

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_drafter_that_fails_ends_its_call_alone() -> None:
    alone = solo()
    engine = engine_for()
    broken = BrokenDrafter(fails_at=1)
    neighbours, failed = beside_neighbours(
        engine, lambda: engine.stream(FAILING_PROMPT, max_new_tokens=N, drafter=broken)
    )
    assert isinstance(failed, LookupError), failed
    assert broken.closed
    assert_neighbours_unchanged(engine, neighbours, alone)


def test_a_first_row_whose_drafter_fails_leaves_the_others_rows_in_order() -> None:
    """The failing call is the batch's first row, and fails once the neighbours step beside
    it: the rows after it move into its place, and each keeps its own cache and answer."""
    alone = solo()
    engine = engine_for()
    broken = BrokenDrafter(fails_at=8)
    first = engine.stream(FAILING_PROMPT, max_new_tokens=N, drafter=broken)
    next(first.chunks(), None)  # the failing call is row 0
    neighbours, failed = beside_neighbours(engine, lambda: first)
    assert isinstance(failed, LookupError), failed
    assert_neighbours_unchanged(engine, neighbours, alone)


def poisoned_tokenizer(poison: int) -> Any:
    """The ASCII tokenizer, except that decoding text with the ``poison`` token fails."""
    tokenizer = ascii_fast_tokenizer()
    decode = tokenizer.decode

    def poisoned(ids: Any, *args: Any, **kwargs: Any) -> str:
        if poison in list(ids):
            raise UnicodeDecodeError("ascii", b"\xff", 0, 1, "a poisoned token")
        return str(decode(ids, *args, **kwargs))

    tokenizer.decode = poisoned
    return tokenizer


def test_a_text_that_fails_to_decode_ends_its_call_alone() -> None:
    alone = solo()
    engine = engine_for()
    failing_answer = engine_for().complete(FAILING_PROMPT, max_new_tokens=N).token_ids
    seen = {t for ids in alone for t in ids}
    poison = next(t for t in failing_answer[2:] if t not in seen)  # in its answer, no neighbour's
    engine = engine_for(poisoned_tokenizer(poison))
    neighbours, failed = beside_neighbours(engine, lambda: engine.stream(FAILING_PROMPT, max_new_tokens=N))
    assert isinstance(failed, UnicodeDecodeError), failed
    assert_neighbours_unchanged(engine, neighbours, alone)


def test_a_document_the_tokenizer_refuses_fails_its_call_before_any_work() -> None:
    alone = solo()
    engine = engine_for()
    tokenize = engine._tokenize

    def refusing(text: str) -> list[int]:
        if text == "poison":
            raise ValueError("the tokenizer cannot take this document")
        return tokenize(text)

    engine._tokenize = refusing  # type: ignore[method-assign]

    def failing() -> TextStream:
        with pytest.raises(ValueError, match="cannot take this document"):  # in the caller's thread
            engine.stream(FAILING_PROMPT, max_new_tokens=N, documents=["poison"])
        return engine.stream(FAILING_PROMPT, max_new_tokens=N)

    neighbours, _ = beside_neighbours(engine, failing)
    assert_neighbours_unchanged(engine, neighbours, alone)


def test_a_failing_forward_still_ends_the_whole_batch() -> None:
    engine = engine_for()
    streams = [engine.stream(prompt, params) for prompt, params in NEIGHBOURS[:2]]
    for stream in streams:
        next(stream.chunks(), None)
    name = "forward_packed" if engine.runner.packs() else "forward_batch"
    forward = getattr(engine.runner, name)
    setattr(engine.runner, name, _raises(RuntimeError("the device is gone")))
    for stream in streams:
        with pytest.raises(RuntimeError, match="the device is gone"):
            stream.complete()
    setattr(engine.runner, name, forward)
    assert engine.trie.owners() <= {OUTPUT_OWNER}
    assert engine.complete(*NEIGHBOURS[0]).token_ids == engine_for().complete(*NEIGHBOURS[0]).token_ids


def _raises(error: Exception) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail
