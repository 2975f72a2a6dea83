"""Hostile drafters, as a user might write them: whatever a drafter proposes, every answer
stays plain decoding's and a bad draft ends its own call alone.

Each table row is a caller's `Drafter` proposing something malformed (a token outside the
vocabulary, a tree rooted elsewhere, side rows that do not add up ...) in a batch beside
well-behaved calls: its call ends with a clear error naming the drafter, the others answer as
alone, and nothing the engine shares (the trie, the learned acceptance table) keeps a trace.
A drafter that overreaches its budget has its draft cut instead, and its answer is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.planning.acceptance import AcceptanceModel
from rag_lookahead.planning.costs import CostCurve
from rag_lookahead.streaming.stream import Completion
from rag_lookahead.structured import Grammar
from rag_lookahead.testing import (
    ASCII_VOCAB,
    VOCAB,
    CharTokenizer,
    ascii_fast_tokenizer,
    greedy_reference,
    read_all,
    tiny_model,
)

N = 24
HOSTILE_PROMPT = [40, 41, 42, 0, 33]
NEIGHBOURS = [[3, 14, 15, 9, 26], [7, 8, 9, 10, 7, 8]]
CURVE = CostCurve((1, 2, 8, 16, 64), (1.0, 1.6, 1.65, 1.9, 3.5))  # for mode="auto", not measured

Make = Callable[[list[int], int], Any]


class HostileDrafter:
    """Proposes whatever ``make`` builds from the context and the budget."""

    def __init__(self, make: Make) -> None:
        self.make = make
        self.side_predictions = 0  # predictions the engine sent back for its side rows
        self.closed = False

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        return self.make(list(context), budget)  # type: ignore[no-any-return]

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        self.side_predictions += len(side_predictions)

    def close(self) -> None:
        self.closed = True


def below(tokens: Sequence[Any], root: Callable[[list[int]], Any] = lambda c: c[-1], **tree: Any) -> Make:
    """A chain of ``tokens`` below ``root(context)`` (fields of `DraftTree.from_draft` in ``tree``)."""
    parents = list(range(-1, len(tokens) - 1))
    return lambda c, b: StepDraft(DraftTree.from_draft(root(c), tokens, parents, **{"source": "x", **tree}))


def beside(side: Any) -> Make:
    """A lone root with ``side`` as its side rows."""
    return lambda c, b: StepDraft(DraftTree.root_only(c[-1]), side)


def side_rows(tokens: Sequence[Any], offsets: Sequence[Any], visible: Sequence[Sequence[Any]]) -> SideRows:
    return SideRows(tuple(tokens), tuple(offsets), tuple(tuple(v) for v in visible))


def node_before_its_parent(context: list[int], budget: int) -> StepDraft:
    return StepDraft(DraftTree((context[-1], 5, 6), (-1, 2, 0)))


# (case, what the drafter proposes, the error expected, words of its message)
HOSTILE_DRAFTS: list[tuple[str, Make, type[Exception], str]] = [
    (
        "a token id past the vocabulary",
        below([5, 70000]),
        ValueError,
        f"HostileDrafter proposed token id 70000, outside the model's {VOCAB}-token vocabulary",
    ),
    ("a negative token id", below([-3]), ValueError, "HostileDrafter proposed token id -3, outside"),
    ("a None token id", below([5, None]), TypeError, "HostileDrafter proposed token id None"),
    ("a float token id", below([5.0]), TypeError, "HostileDrafter proposed token id 5.0"),
    ("a bool token id", below([True]), TypeError, "HostileDrafter proposed token id True"),
    (
        "a tree rooted at another token",
        below([5], root=lambda c: (c[-1] + 1) % VOCAB),
        ValueError,
        "rooted its draft at token",
    ),
    ("a root past the vocabulary", below([5], root=lambda c: VOCAB + 1), ValueError, "context's last token"),
    ("a node before its parent", node_before_its_parent, ValueError, "parents must come first"),
    ("no draft at all", lambda c, b: None, TypeError, "HostileDrafter proposed NoneType, not a StepDraft"),
    (
        "a bare tree",
        lambda c, b: DraftTree.root_only(c[-1]),
        TypeError,
        "HostileDrafter proposed DraftTree, not a StepDraft",
    ),
    ("an estimate of NaN", below([5], estimates=[float("nan")]), ValueError, "estimate nan"),
    ("a negative estimate", below([5], estimates=[-2.0]), ValueError, "estimate -2.0"),
    ("an estimate past 1", below([5], estimates=[7.0]), ValueError, "estimate 7.0, not from 0 to 1"),
    ("an estimate as text", below([5], estimates=["high"]), TypeError, "estimate 'high'"),
    ("a source that is a number", below([5], source=[7]), TypeError, "source 7"),
    ("an empty source", below([5], source=""), ValueError, "source ''"),
    ("a source of 65 characters", below([5], source="s" * 65), ValueError, "1 to 64 characters"),
    (
        "a side row past the vocabulary",
        beside(side_rows([VOCAB + 3], [1], [[0]])),
        ValueError,
        f"token id {VOCAB + 3}, outside",
    ),
    ("a side row of None", beside(side_rows([None], [1], [[0]])), TypeError, "token id None"),
    (
        "side rows of three lengths",
        beside(side_rows([5, 6], [1], [[0], [1], [2]])),
        ValueError,
        "2 side-row tokens, 1 offsets and 3 visible lists",
    ),
    ("a side row at the root's position", beside(side_rows([5], [0], [[0]])), ValueError, "offset 0"),
    ("a side row at a float offset", beside(side_rows([5], [1.5], [[0]])), TypeError, "offset 1.5"),
    (
        "a side row seeing a row that is not there",
        beside(side_rows([5, 6], [1, 2], [[0], [1, 2]])),
        ValueError,
        "seeing side row 2; its draft has 2",
    ),
    ("side rows of another type", beside([5, 6]), TypeError, "side rows of list, not SideRows"),
]

# (case, what the drafter proposes, a check of its completion and of the drafter)
OVERREACHING_DRAFTS: list[tuple[str, Make, Callable[[Completion, HostileDrafter], bool]]] = [
    (
        "a chain of 60 tokens whatever the budget",
        below(list(range(1, 61))),
        lambda done, drafter: max(done.stats.drafted_per_step) <= LookaheadConfig().decoding_length,
    ),
    (
        "a tree of 60 branches whatever the budget",
        lambda c, b: StepDraft(DraftTree.from_draft(c[-1], list(range(60)), [-1] * 60, "x")),
        lambda done, drafter: max(done.stats.drafted_per_step) <= LookaheadConfig().decoding_length,
    ),
    (
        "more side rows than a forward takes",
        beside(side_rows([5] * 300, [1] * 300, [[k] for k in range(300)])),
        lambda done, drafter: drafter.side_predictions == 0,
    ),
    ("no side rows at all", beside(side_rows([], [], [])), lambda done, drafter: True),
]


def engine_for(mode: str, cache_dir: Path) -> LookaheadEngine:
    config = LookaheadConfig(mode=mode, min_query_length=1)  # type: ignore[arg-type]
    curve = CURVE if mode == "auto" else None
    model = tiny_model("llama")
    return LookaheadEngine(model, CharTokenizer(), config, cost_curve=curve, cache_dir=cache_dir)


def beside_neighbours(engine: LookaheadEngine, drafter: HostileDrafter, new_tokens: int = N) -> list[Any]:
    """The neighbours decoding, then the hostile call joining them; each read in a thread.
    What each call's reading returned (or raised), the hostile call's last."""
    streams = [engine.stream(prompt, max_new_tokens=N) for prompt in NEIGHBOURS]
    for stream in streams:
        next(stream.chunks(), None)
    streams.append(engine.stream(HOSTILE_PROMPT, max_new_tokens=new_tokens, drafter=drafter))
    return read_all(streams)


def assert_nothing_else_changed(engine: LookaheadEngine, neighbours: list[Any], drafter: Any) -> None:
    alone = [greedy_reference(engine.model, prompt, N) for prompt in NEIGHBOURS]
    assert [c.token_ids for c in neighbours] == alone, neighbours
    assert drafter.closed
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # nobody's branches linger
    AcceptanceModel().load_state(engine.planner.acceptance.state())  # what is learned stays loadable
    assert engine.complete(NEIGHBOURS[0], max_new_tokens=N).token_ids == alone[0]  # it still answers


@pytest.mark.parametrize("mode", ["trie", "auto"])
@pytest.mark.parametrize(
    ("case", "make", "error", "words"), HOSTILE_DRAFTS, ids=[c[0] for c in HOSTILE_DRAFTS]
)
def test_a_hostile_draft_ends_its_own_call_alone(tmp_path, mode, case, make, error, words) -> None:
    engine = engine_for(mode, tmp_path)
    drafter = HostileDrafter(make)
    *neighbours, failed = beside_neighbours(engine, drafter)
    assert isinstance(failed, error), failed
    assert words in str(failed), str(failed)
    assert_nothing_else_changed(engine, neighbours, drafter)


@pytest.mark.parametrize(
    ("case", "make", "check"), OVERREACHING_DRAFTS, ids=[c[0] for c in OVERREACHING_DRAFTS]
)
def test_an_overreaching_draft_is_cut_and_its_answer_exact(tmp_path, case, make, check) -> None:
    """In mode trie a draft is verified whole: beyond its budget it is cut (its first nodes, a
    tree still), side rows beyond a forward's tokens are left out. The hostile call outlasts
    its neighbours, so it also steps alone."""
    engine = engine_for("trie", tmp_path)
    drafter = HostileDrafter(make)
    *neighbours, done = beside_neighbours(engine, drafter, new_tokens=2 * N)
    assert isinstance(done, Completion), done
    assert done.token_ids == greedy_reference(engine.model, HOSTILE_PROMPT, 2 * N)
    assert check(done, drafter)
    assert_nothing_else_changed(engine, neighbours, drafter)


def test_numpy_token_ids_are_token_ids(tmp_path) -> None:
    """A drafter built on numpy arrays drafts as well as one of Python ints."""
    engine = engine_for("trie", tmp_path)
    tokens = np.arange(5, 9)
    drafter = HostileDrafter(
        lambda c, b: StepDraft(DraftTree.from_draft(np.int64(c[-1]), tokens, np.arange(-1, 3), "np"))
    )
    *neighbours, done = beside_neighbours(engine, drafter)
    assert isinstance(done, Completion), done
    assert done.token_ids == greedy_reference(engine.model, HOSTILE_PROMPT, N)
    assert_nothing_else_changed(engine, neighbours, drafter)


GRAMMAR = Grammar.regex(r"[a-f]{2,6}( [a-f]{2,6}){0,5}\.")


@pytest.mark.parametrize("prediction", [None, "abc def."])
def test_a_draft_under_a_grammar_is_checked_against_what_the_grammar_forced(tmp_path, prediction) -> None:
    """Under a grammar the caller's drafter continues after the tokens it forces, and beside a
    prediction it drafts after the prediction's drafter: a draft rooted where it is asked is
    verified (the answer exact), one outside the vocabulary names its drafter, not the grammar."""
    model = tiny_model("llama", 0, ASCII_VOCAB + 1)
    model.generation_config.eos_token_id = ASCII_VOCAB
    prompt = [50, 51, 52]
    plain = LookaheadEngine(model, ascii_fast_tokenizer(), LookaheadConfig(mode="off"))
    reference = plain.complete(prompt, max_new_tokens=N, grammar=GRAMMAR).token_ids
    engine = LookaheadEngine(model, ascii_fast_tokenizer(), LookaheadConfig(mode="trie"), cache_dir=tmp_path)
    kept = HostileDrafter(below([65, 66]))
    done = engine.complete(prompt, max_new_tokens=N, grammar=GRAMMAR, drafter=kept, prediction=prediction)
    assert done.token_ids == reference
    hostile = HostileDrafter(below([70000]))
    with pytest.raises(ValueError, match="HostileDrafter proposed token id 70000, outside"):
        engine.complete(prompt, max_new_tokens=N, grammar=GRAMMAR, drafter=hostile, prediction=prediction)
    assert hostile.closed


def test_a_document_holding_tokens_the_model_cannot_embed_drafts_none_of_them() -> None:
    """A tokenizer may know tokens the model has no row for (added ones): a document that holds
    them must not draft them, or the batch's forward fails for every call in it."""
    model = tiny_model("llama")
    engine = LookaheadEngine(model, CharTokenizer(), LookaheadConfig(mode="trie", min_query_length=1))
    prompt = NEIGHBOURS[0]
    answer = greedy_reference(model, prompt, N)
    outside = [VOCAB + 7, VOCAB + 300]
    document = CharTokenizer().decode(prompt + outside[:1] + answer[:4] + outside[1:] + answer[4:])
    calls = [engine.stream(prompt, max_new_tokens=N, documents=[document])]
    calls += [engine.stream(ids, max_new_tokens=N) for ids in NEIGHBOURS[1:]]
    assert calls[0].complete().token_ids == answer
    assert calls[1].complete().token_ids == greedy_reference(model, NEIGHBOURS[1], N)
