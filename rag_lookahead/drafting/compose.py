"""The drafters a mode asks for, composed into one: one draft per step from all of them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.constraint import GrammarState
from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.drafting.checked import CheckedDrafter
from rag_lookahead.drafting.constrained import GrammarDrafter
from rag_lookahead.drafting.jacobi import JacobiDrafter
from rag_lookahead.drafting.prediction import PredictionDrafter
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.drafting.suffix import SuffixDrafter
from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.drafting.trie_drafter import TrieDrafter

__all__ = ["ComposedDrafter", "SharedDocuments", "build_drafter", "call_drafter"]


class SharedDocuments(Protocol):
    """Documents inserted for several calls (a `DocumentScope`): their owner and token ids."""

    @property
    def owner(self) -> str: ...

    @property
    def sequences(self) -> Sequence[Sequence[int]]: ...


def build_drafter(
    config: LookaheadConfig,
    trie: TokenTrie,
    sequences: Sequence[Sequence[int]],
    shared: SharedDocuments | None = None,
    prediction: Sequence[int] = (),
) -> ComposedDrafter:
    """The drafters ``config.mode`` asks for, for one call whose prompt is ``sequences[0]``.

    With ``shared`` documents the call's branches join theirs, which outlive the call. A
    ``prediction`` is the suffix drafter's preferred text, or without one a drafter of its own,
    first (see `rag_lookahead.drafting.prediction`).
    """
    drafters: list[Drafter] = []
    pooled = [*sequences, *shared.sequences] if shared is not None else list(sequences)
    if config.mode in ("auto", "trie") and config.draft_policy == "suffix":
        drafters.append(SuffixDrafter(pooled, config.min_query_length, prediction=prediction))
    elif prediction:
        drafters.append(PredictionDrafter(prediction))
    if config.mode in ("auto", "trie"):
        owner = shared.owner if shared is not None else f"call-{uuid.uuid4().hex}"
        drafters.append(
            TrieDrafter(
                trie,
                owner,
                sequences,
                config.min_query_length,
                eliminate_on_close=shared is None,
            )
        )
    if config.mode in ("auto", "jacobi"):
        drafters.append(JacobiDrafter(pooled, config.window_size, config.ngram_size, config.guess_set_size))
    return ComposedDrafter(drafters)


def call_drafter(
    config: LookaheadConfig,
    trie: TokenTrie,
    sequences: Sequence[Sequence[int]],
    shared: SharedDocuments | None,
    grammar: GrammarState | None,
    own: Drafter | None,
    prediction: Sequence[int] = (),
    *,
    vocab_size: int,
) -> Drafter:
    """A call's drafter (the caller's ``own``, each of its drafts checked against the model's
    ``vocab_size`` tokens and cut to its budget, behind a `PredictionDrafter` of its
    ``prediction`` if it has one; else one over its prompt's, documents' and prediction's token
    ids, inserted into the trie once its prefill is under way), under its grammar if it has one."""
    if own is None:
        drafter: Drafter = build_drafter(config, trie, sequences, shared, prediction)
    else:
        checked = CheckedDrafter(own, vocab_size, config.max_tokens_per_forward)
        drafter = ComposedDrafter([PredictionDrafter(prediction), checked]) if prediction else checked
    return drafter if grammar is None else GrammarDrafter(drafter, grammar)


class ComposedDrafter:
    """Several drafters as one: their trees merged under the budget, the first one's first.

    At most one of them has side rows in a step; the model's predictions there go back to it.
    """

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        if not drafters:
            raise ValueError("a composed drafter needs at least one drafter")
        self.drafters = list(drafters)
        self._side_owner: Drafter | None = None

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        draft = self.drafters[0].propose(context, budget)
        tree, side, self._side_owner = draft.tree, draft.side, self.drafters[0] if draft.side else None
        for drafter in self.drafters[1:]:
            room = budget - (len(tree) - 1)
            if room <= 0 and side is not None:
                break
            more = drafter.propose(context, max(room, 0))
            tree = tree.merge(more.tree)
            if side is None and more.side is not None:
                side, self._side_owner = more.side, drafter
        return StepDraft(tree, side)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        for drafter in self.drafters:
            drafter.observe(tokens, side_predictions if drafter is self._side_owner else ())

    def close(self) -> None:
        for drafter in self.drafters:
            drafter.close()
