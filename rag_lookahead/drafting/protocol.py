"""The drafter protocol: token ids in, a step's draft out. Drafters never see the model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rag_lookahead.decoding.tree import StepDraft

__all__ = ["Drafter"]


class Drafter(Protocol):
    """Proposes what may follow the context, and learns from what the model emitted.

    One drafter serves one generation call; ``close`` releases what it holds for that call.
    """

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        """A tree rooted at ``context[-1]`` with at most ``budget`` draft tokens below it, and
        any side rows the drafter wants forwarded with it (the Jacobi window). A caller's
        drafter's drafts are checked, and cut to ``budget``, as they enter the engine
        (`rag_lookahead.drafting.checked`)."""
        ...

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        """The tokens the model emitted this step, in order, and its most likely next token at
        each side row of the last proposal (empty when the planner left them out)."""
        ...

    def close(self) -> None:
        """The call is over (finished, failed or abandoned)."""
        ...
