"""Jacobi lookahead (arXiv 2402.02057): a W x N window of guesses and a pool of n-grams.

The window holds ``N - 1`` levels of ``W`` guessed tokens. It rides along in the same forward
as the draft tree: level 0 is a guessed continuation of the root (a causal chain), and the
token at level ``l``, column ``j`` sits at offset ``l + j + 1`` after the root and sees level 0
up to column ``j`` plus the tokens above it in its own column (the staircase). The model's
prediction at each window token is its next Jacobi iterate. Each column then reads as an
n-gram (its ``N - 1`` guesses and the last level's prediction), which goes into the pool; the
levels shift up and the predictions become the new last level. Candidates for the next step
are the pool's n-grams that start with the current root token.

The window never changes an output: its rows are invisible to the draft tree, and its cache
entries are dropped after the forward. Only pool candidates are verified, like any draft.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft

__all__ = ["JacobiDrafter", "JacobiWindow", "NGramPool", "WindowLayout"]


class NGramPool:
    """N-grams keyed by their first token, at most ``guess_set_size`` per key (newest kept)."""

    def __init__(self, ngram_size: int, guess_set_size: int) -> None:
        if ngram_size < 2 or guess_set_size < 1:
            raise ValueError("an n-gram pool needs ngram_size >= 2 and guess_set_size >= 1")
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self._pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())

    def add(self, ngram: Sequence[int]) -> None:
        """Remember ``ngram`` (exactly ``ngram_size`` tokens); a repeat becomes the newest."""
        if len(ngram) != self.ngram_size:
            raise ValueError(f"expected an {self.ngram_size}-gram, got {len(ngram)} tokens")
        key, rest = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        entries = self._pool.setdefault(key, OrderedDict())
        entries[rest] = None
        entries.move_to_end(rest)
        if len(entries) > self.guess_set_size:
            entries.popitem(last=False)

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Every n-gram of ``tokens`` (a prompt or an output)."""
        n = self.ngram_size
        for start in range(len(tokens) - n + 1):
            self.add(tokens[start : start + n])

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """Continuations of ``key`` (``ngram_size - 1`` tokens each), newest first."""
        return list(reversed(self._pool.get(key, ())))


@dataclass(frozen=True)
class WindowLayout:
    """Where the window's ``(N - 1) * W`` rows sit, level by level, column by column."""

    window_size: int
    levels: int  # N - 1

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """Position of each row after the root's."""
        return tuple(level + j + 1 for level in range(self.levels) for j in range(self.window_size))

    @cached_property
    def visible(self) -> tuple[tuple[int, ...], ...]:
        """For each row, the window rows it sees (itself included); every row also sees the root."""
        w = self.window_size
        rows = []
        for level in range(self.levels):
            for j in range(w):
                seen = list(range(j + 1)) + [k * w + j for k in range(1, level + 1)]
                rows.append(tuple(sorted(set(seen))))
        return tuple(rows)


class JacobiWindow:
    """The guesses of one generation call and how they advance each step."""

    def __init__(self, window_size: int, ngram_size: int, seed_tokens: Sequence[int]) -> None:
        if window_size < 1 or ngram_size < 2:
            raise ValueError("a Jacobi window needs window_size >= 1 and ngram_size >= 2")
        if not seed_tokens:
            raise ValueError("a Jacobi window is seeded from at least one token")
        self.layout = WindowLayout(window_size, ngram_size - 1)
        size = window_size * (ngram_size - 1)
        # Any tokens will do as first guesses; the prompt's make the first n-grams less random.
        self.tokens = [int(seed_tokens[i % len(seed_tokens)]) for i in range(size)]

    def advance(self, predictions: Sequence[int]) -> list[tuple[int, ...]]:
        """Take the model's prediction at every row; return the n-grams the columns completed."""
        w, levels = self.layout.window_size, self.layout.levels
        if len(predictions) != len(self.tokens):
            raise ValueError("one prediction per window row is needed")
        last = predictions[(levels - 1) * w :]
        ngrams = [(*(self.tokens[level * w + j] for level in range(levels)), int(last[j])) for j in range(w)]
        # Level 0 takes the new guesses of level 1 (its own predictions when there is one level).
        if levels == 1:
            self.tokens = [int(t) for t in last]
        else:
            self.tokens = self.tokens[w:] + [int(t) for t in last]
        return ngrams


class JacobiDrafter:
    """Drafts the pool's n-grams that follow the last token; runs the window when asked.

    The pool starts with the call's prompt and documents, and learns from the window's
    trajectories and from the accepted output.
    """

    source = "jacobi"

    def __init__(
        self,
        sequences: Sequence[Sequence[int]],
        window_size: int,
        ngram_size: int,
        guess_set_size: int,
    ) -> None:
        self.pool = NGramPool(ngram_size, guess_set_size)
        for seq in sequences:
            self.pool.add_sequence(seq)
        self.window = JacobiWindow(window_size, ngram_size, sequences[0][-window_size * ngram_size :])
        self._tail: list[int] = list(sequences[0][-(ngram_size - 1) :])

    def propose(self, context: Sequence[int], budget: int) -> StepDraft:
        """The pool's n-grams after ``context[-1]`` under ``budget``, and the window's rows."""
        branches = self.pool.candidates(int(context[-1]))
        tree = DraftTree.root_only(int(context[-1]))
        for branch in branches:
            grown = tree.merge(_chain(tree.tokens[0], branch[: max(budget, 0)], self.source))
            if len(grown) - 1 > budget:
                break
            tree = grown
        layout = self.window.layout
        side = SideRows(tuple(self.window.tokens), layout.offsets, layout.visible)
        return StepDraft(_with_frequencies(tree, branches), side)

    def observe(self, tokens: Sequence[int], side_predictions: Sequence[int] = ()) -> None:
        if side_predictions:  # the window ran: advance it, and pool the n-grams its columns completed
            for ngram in self.window.advance(side_predictions):
                self.pool.add(ngram)
        self._tail += [int(t) for t in tokens]
        self.pool.add_sequence(self._tail)
        self._tail = self._tail[-(self.pool.ngram_size - 1) :]

    def close(self) -> None:
        pass


def _chain(root: int, tokens: Sequence[int], source: str) -> DraftTree:
    return DraftTree((root, *tokens), tuple(range(-1, len(tokens))), source)


def _with_frequencies(tree: DraftTree, branches: Sequence[tuple[int, ...]]) -> DraftTree:
    """Estimates from how many candidate branches pass through each node."""
    through = [0] * len(tree)
    for branch in branches:
        node = 0
        through[0] += 1
        for token in branch:
            child = tree.child(node, token)
            if child is None:
                break
            node = child
            through[node] += 1
    estimates = tuple(
        1.0 if i == 0 else through[i] / max(through[tree.parents[i]], 1) for i in range(len(tree))
    )
    return DraftTree(tree.tokens, tree.parents, tree.sources, estimates)
