"""A call's drafter under its grammar: the tokens the grammar forces come first, the call's own
drafters continue after them, and nothing the grammar refuses is drafted."""

from __future__ import annotations

from collections.abc import Sequence

from rag_lookahead.decoding.constraint import GrammarState
from rag_lookahead.decoding.tree import DraftTree, StepDraft
from rag_lookahead.drafting.protocol import Drafter

__all__ = ["GrammarDrafter"]


class GrammarDrafter:
    """``inner``'s drafts behind the chain ``grammar`` forces, pruned to what it admits."""

    def __init__(self, inner: Drafter, grammar: GrammarState) -> None:
        self.inner = inner
        self.grammar = grammar

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        forced = self.grammar.forced(budget)
        extended, room = [*context, *forced], budget - len(forced)
        draft = (
            self.inner.propose(extended, room) if room > 0 else StepDraft(DraftTree.root_only(extended[-1]))
        )
        if forced:
            chain = DraftTree((context[-1], *forced), tuple(range(-1, len(forced))), "grammar")
            # The inner drafter's side rows sit past its own root, not this tree's: left out.
            draft = StepDraft(chain.merge(draft.tree, at=len(forced)))
        return StepDraft(self.grammar.admitted(draft.tree), draft.side)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        self.inner.observe(tokens, side_predictions)

    def close(self) -> None:
        self.inner.close()
