"""The drafters a mode asks for, composed into one: one draft per step from all of them."""

from __future__ import annotations

import sys
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

__all__ = [
    "TEXT_SLICE",
    "ComposedDrafter",
    "DrafterBuild",
    "SharedDocuments",
    "build_drafter",
    "call_drafter",
]

# Entries of long texts (see `DrafterBuild`) taken in between two steps of the running calls: a
# call's documents before its prefill, a scope's as they are added. Less work than a small
# model's step on a CPU: the running calls slow down while long documents go in, never stop.
TEXT_SLICE = 1 << 13


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
    first (see `rag_lookahead.drafting.prediction`). Built at once: `DrafterBuild` builds the
    same drafter a slice at a time.
    """
    return DrafterBuild(config, trie, sequences, shared, prediction).drafter()


class DrafterBuild:
    """`build_drafter`'s drafter, its texts taken in a slice at a time (`advance`), so that the
    model's thread steps the running calls between two slices rather than wait for a call's
    long documents (or a scope's) all at once; `drafter` takes what is left and hands the
    drafter over.

    Work is counted in entries: a trie node counted (a token inserted counts ``ngram_length``
    of them) or a token indexed by one of the call's own drafters. The texts go in whole,
    parted only where a slice ends: the drafter is the same however it was sliced.
    """

    def __init__(
        self,
        config: LookaheadConfig,
        trie: TokenTrie,
        sequences: Sequence[Sequence[int]],
        shared: SharedDocuments | None = None,
        prediction: Sequence[int] = (),
    ) -> None:
        self._config, self._trie, self._shared, self._prediction = config, trie, shared, prediction
        self.owner = shared.owner if shared is not None else f"call-{uuid.uuid4().hex}"
        # The call's own texts (prompt, documents) go into the trie; a scope's are there already.
        self._texts = [*sequences, *shared.sequences] if shared is not None else list(sequences)
        self._into_trie = len(sequences) if config.mode in ("auto", "trie") else 0
        self._indexes = config.mode in ("auto", "trie") and config.draft_policy == "suffix"
        self._pools = config.mode in ("auto", "jacobi")
        self._suffix: SuffixDrafter | None = None
        self._jacobi: JacobiDrafter | None = None
        self._next, self._at = 0, 0  # the next token to take in: self._texts[self._next][self._at]
        self._started = self._inserted = self._handed = self._closed = False
        self._left = self._start_cost() + sum(self._cost(i) * len(t) for i, t in enumerate(self._texts))

    @property
    def left(self) -> int:
        """The entries still to take in."""
        return self._left

    def advance(self, budget: int) -> int:
        """Take about ``budget`` entries more in (one token's at least, while any is left); how
        many were taken."""
        spent = 0 if self._started else self._start()
        while self._next < len(self._texts) and spent < budget:
            spent += self._take(budget - spent)
        self._left -= spent
        return spent

    def drafter(self) -> ComposedDrafter:
        """The drafter, the rest of its texts taken in first; it owns the branches from now on."""
        self.advance(sys.maxsize)
        config = self._config
        drafters: list[Drafter] = []
        if self._suffix is not None:
            drafters.append(self._suffix)
        elif self._prediction:
            drafters.append(PredictionDrafter(self._prediction))
        if config.mode in ("auto", "trie"):
            # Its texts are in the trie already: the drafter only reads them, and counts outputs.
            alone = self._shared is None  # else the scope's branches, which outlive the call
            drafters.append(
                TrieDrafter(self._trie, self.owner, (), config.min_query_length, eliminate_on_close=alone)
            )
        if self._jacobi is not None:
            drafters.append(self._jacobi)
        composed = ComposedDrafter(drafters)
        self._handed = True
        return composed

    def close(self) -> None:
        """Let go of what was taken in, unless the drafter was handed over (its own then): a
        call that ends before its first token leaves none of its branches in the trie."""
        if self._handed or self._closed:
            return
        self._closed = True
        self._suffix = self._jacobi = None
        if self._inserted and self._shared is None:  # (a scope's branches are the scope's)
            self._trie.eliminate(self.owner)

    def _cost(self, text: int) -> int:
        """Entries of one token of text number ``text``."""
        trie = self._trie.ngram_length if text < self._into_trie else 0
        return trie + int(self._indexes) + int(self._pools and text > 0)

    def _start_cost(self) -> int:
        """The entries of the drafters' first texts: the suffix drafter's prediction, the
        Jacobi pool's prompt (seeding its window)."""
        pooled = len(self._texts[0]) if self._pools and self._texts else 0
        return (len(self._prediction) if self._indexes else 0) + pooled

    def _start(self) -> int:
        self._started = True
        config = self._config
        if self._indexes:
            self._suffix = SuffixDrafter((), config.min_query_length, prediction=self._prediction)
        if self._pools:
            first = self._texts[:1]
            self._jacobi = JacobiDrafter(first, config.window_size, config.ngram_size, config.guess_set_size)
        return self._start_cost()

    def _take(self, room: int) -> int:
        """As many tokens of the next text as ``room`` entries pay for (one at least); the
        entries taken."""
        i, start, text = self._next, self._at, self._texts[self._next]
        cost = self._cost(i)
        end = len(text) if cost == 0 else min(len(text), start + max(1, room // cost))
        if i < self._into_trie:
            width = self._trie.ngram_length  # the n-grams starting here end past the slice
            self._trie.insert(text[start : end + width - 1], self.owner, starts=end - start)
            self._inserted = True
        if self._suffix is not None:
            self._suffix.add_text(text[start:end], ends=end == len(text))
        if self._jacobi is not None and i > 0:
            self._jacobi.pool.add_sequence(text[start : end + self._config.ngram_size - 1])
        self._next, self._at = (i + 1, 0) if end == len(text) else (i, end)
        return cost * (end - start)


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
    build: DrafterBuild | None = None,
) -> Drafter:
    """A call's drafter (the caller's ``own``, each of its drafts checked against the model's
    ``vocab_size`` tokens and cut to its budget, behind a `PredictionDrafter` of its
    ``prediction`` if it has one; else one over its prompt's, documents' and prediction's token
    ids, inserted into the trie once its prefill is under way, or by ``build`` beforehand), under
    its grammar if it has one."""
    if own is None:
        texts = build if build is not None else DrafterBuild(config, trie, sequences, shared, prediction)
        drafter: Drafter = texts.drafter()
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
