"""A caller's drafter, each of its drafts checked where it enters the engine.

The engine's own drafters draft from token ids it has checked; a caller's `Drafter` may
propose anything, and its draft becomes one row of a forward the whole batch shares. A token
outside the vocabulary there ends every call of the batch; a tree rooted at another token than
the context's last verifies another context, so its answer is no longer plain decoding's; a
source or an estimate the acceptance table cannot keep spoils what every later call is planned
by. So each proposal is checked as the caller's code hands it over, within the call's own
drafting, whose failure ends that call alone: a clear error that names the drafter.

A draft beyond its budget is cut, not refused: its first ``budget`` nodes (parents come before
children) are still a tree, and verifying less changes no answer. Side rows that would make
the forward wider than ``max_tokens_per_forward`` are left out of the step, as the planner may
leave any out (the drafter then observes no predictions for them).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

from rag_lookahead.decoding.tree import MAX_SOURCE_LENGTH, DraftTree, SideRows, StepDraft
from rag_lookahead.drafting.protocol import Drafter

__all__ = ["CheckedDrafter", "checked_draft"]


class CheckedDrafter:
    """``inner``'s drafts, each checked and cut to its budget (`checked_draft`)."""

    def __init__(self, inner: Drafter, vocab_size: int, max_tokens_per_forward: int) -> None:
        self.inner = inner
        self.vocab_size = vocab_size
        self.max_tokens_per_forward = max_tokens_per_forward
        self.name = type(inner).__name__

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        return checked_draft(
            self.inner.propose(context, budget),
            context[-1],
            budget,
            vocab_size=self.vocab_size,
            max_tokens_per_forward=self.max_tokens_per_forward,
            name=self.name,
        )

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        self.inner.observe(tokens, side_predictions)

    def close(self) -> None:
        self.inner.close()


def checked_draft(
    draft: object, root: int, budget: int, *, vocab_size: int, max_tokens_per_forward: int, name: str
) -> StepDraft:
    """``draft``, proposed by the drafter ``name`` after a context ending in ``root``, as a step
    may forward it: a `StepDraft` rooted at ``root`` whose token ids (integers, numpy's
    included, made Python's) lie in the vocabulary, whose estimates are chances and whose
    sources are names the acceptance table keeps, cut to ``budget`` nodes below its root; its
    side rows consistent, or left out where the forward would exceed ``max_tokens_per_forward``.

    Raises:
        TypeError: Something that is not a draft, or a token id, offset, estimate or source of
            the wrong type.
        ValueError: A value out of its range, or a tree rooted elsewhere.
    """
    if not isinstance(draft, StepDraft):
        raise TypeError(f"{name} proposed {type(draft).__name__}, not a StepDraft")
    if not isinstance(draft.tree, DraftTree):
        raise TypeError(f"{name} proposed a StepDraft of {type(draft.tree).__name__}, not of a DraftTree")
    tree = _checked_tree(draft.tree, root, vocab_size, name)
    if len(tree) - 1 > budget:
        tree = tree.subtree(range(1, max(budget, 0) + 1))  # the first nodes keep their parents
    side = _checked_side(draft.side, vocab_size, name)
    if side is not None and len(tree) + len(side) > max_tokens_per_forward:
        side = None
    if tree is draft.tree and side is draft.side:
        return draft
    return StepDraft(tree, side)


def _checked_tree(tree: DraftTree, root: int, vocab_size: int, name: str) -> DraftTree:
    """``tree`` with Python ints for ids (its parents come first: `DraftTree` refuses others)."""
    tokens = _integers(tree.tokens, name, "token id")
    if tokens[0] != root:
        raise ValueError(
            f"{name} rooted its draft at token {tokens[0]}, not at {root}, the context's last token"
        )
    _check_vocabulary(tokens, vocab_size, name, "token id")
    _check_estimates(tree.estimates, name)
    _check_sources(tree.sources[1:], name)  # (the root's is never counted)
    parents = _integers(tree.parents, name, "parent")
    if tokens is tree.tokens and parents is tree.parents:
        return tree
    return DraftTree(tokens, parents, tree.sources, tree.estimates)


def _checked_side(side: object, vocab_size: int, name: str) -> SideRows | None:
    """``side`` with Python ints, each row at an offset past the root and seeing only side rows
    that exist; none for no rows."""
    if side is None:
        return None
    if not isinstance(side, SideRows):
        raise TypeError(f"{name} proposed side rows of {type(side).__name__}, not SideRows")
    rows = len(side.tokens)
    if not rows == len(side.offsets) == len(side.visible):
        raise ValueError(
            f"{name} proposed {rows} side-row tokens, {len(side.offsets)} offsets and "
            f"{len(side.visible)} visible lists: side rows need one of each"
        )
    if rows == 0:
        return None
    tokens = _integers(side.tokens, name, "side-row token id")
    _check_vocabulary(tokens, vocab_size, name, "side-row token id")
    offsets = _integers(side.offsets, name, "side-row offset")
    if min(offsets) < 1:
        raise ValueError(f"{name} proposed side-row offset {min(offsets)}: side rows sit after the root")
    visible = tuple(_integers(seen, name, "visible side row") for seen in side.visible)
    listed = [row for seen in visible for row in seen]
    if listed and not 0 <= min(listed) <= max(listed) < rows:
        bad = min(listed) if min(listed) < 0 else max(listed)
        raise ValueError(f"{name} proposed a side row seeing side row {bad}; its draft has {rows}")
    return SideRows(tokens, offsets, visible)


def _integers(values: Sequence[int], name: str, what: str) -> tuple[int, ...]:
    """``values`` as Python ints (``values`` itself where they are already), else TypeError."""
    if isinstance(values, tuple) and set(map(type, values)) == {int}:
        return values
    return tuple(_integer(value, name, what) for value in values)


def _integer(value: object, name: str, what: str) -> int:
    # operator.index takes numpy's and torch's integer scalars, not floats; a bool is no id.
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{name} proposed {what} {value!r}, not an integer")


def _check_vocabulary(ids: tuple[int, ...], vocab_size: int, name: str, what: str) -> None:
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} proposed {what} {bad}, outside the model's {vocab_size}-token vocabulary")


def _check_estimates(estimates: Sequence[float], name: str) -> None:
    """Each estimate a chance, from 0 to 1 (the acceptance table buckets them by tenths)."""
    try:
        if math.isfinite(math.fsum(estimates)) and min(estimates) >= 0 and max(estimates) <= 1:
            return
    except (TypeError, ValueError):  # (not numbers; fsum refuses inf - inf)
        pass
    for estimate in estimates:
        if not isinstance(estimate, numbers.Real):
            raise TypeError(f"{name} proposed estimate {estimate!r}, not a number")
        if not 0 <= estimate <= 1:  # NaN too
            raise ValueError(f"{name} proposed estimate {estimate!r}, not from 0 to 1")


def _check_sources(sources: Sequence[str], name: str) -> None:
    """Each source a name the acceptance table keeps (it learns, and saves, per source)."""
    if not sources:
        return
    if set(map(type, sources)) == {str}:
        lengths = [len(source) for source in sources]
        if min(lengths) >= 1 and max(lengths) <= MAX_SOURCE_LENGTH:
            return
    for source in sources:
        if not isinstance(source, str):
            raise TypeError(f"{name} proposed source {source!r}, not a string")
        if not 1 <= len(source) <= MAX_SOURCE_LENGTH:
            raise ValueError(
                f"{name} proposed source {source!r}, not a name of 1 to {MAX_SOURCE_LENGTH} characters"
            )
