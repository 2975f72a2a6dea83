"""The drafter protocol: token ids in, a draft tree out. Drafters never see the model."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from rag_lookahead.tree import DraftTree, SideRows

__all__ = ["Drafter", "WindowedDrafter"]


class Drafter(Protocol):
    """Proposes what may follow the context, and learns from what was accepted.

    One drafter serves one generation call; ``close`` releases what it holds for that call.
    """

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        """A tree rooted at ``context[-1]`` with at most ``budget`` draft tokens below it."""
        ...

    def observe(self, tokens: Sequence[int]) -> None:
        """The tokens the model emitted this step, in order."""
        ...

    def close(self) -> None:
        """The call is over (finished, failed or abandoned)."""
        ...


@runtime_checkable
class WindowedDrafter(Drafter, Protocol):
    """A drafter that also wants rows of its own in each forward (the Jacobi window)."""

    def side_rows(self) -> SideRows:
        """Rows for the next forward; the model's argmax at each comes back in `observe_side`."""
        ...

    def observe_side(self, predictions: Sequence[int]) -> None:
        """The model's most likely next token at each side row."""
        ...
