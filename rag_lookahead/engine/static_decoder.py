"""Greedy lookahead decoding of several prompts through one `StaticStep`.

Each prompt runs its prefill through the model's own forward (any length, eager:
`StaticStep.prefill`), its entries are copied into a slot, and from then on every step of
every active row is one static forward: each row's draft tree (a `Drafter`'s, or the lone
root), padded to the step's bucket, verified greedily (`rag_lookahead.decoding.verify.accept`),
its accepted path kept. Rows are kept in the lowest slots (a finished row's slot takes the last
row's entries), so that a step of ``n`` rows is a bucket of the first slots; waiting prompts
join as slots free up. Standalone: the engine's scheduler does not call it yet.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag_lookahead.decoding.argmax import first_argmax
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.decoding.verify import accept
from rag_lookahead.drafting.protocol import Drafter
from rag_lookahead.runtime.static.buckets import Bucket, Buckets
from rag_lookahead.runtime.static.step import StaticStep

__all__ = ["DecodeResult", "StaticDecoder"]


@dataclass
class DecodeResult:
    """Each prompt's new tokens (in the prompts' order) and the forwards that made them."""

    tokens: list[list[int]]
    steps: int = 0  # static forwards (prefills not counted)
    buckets: Counter[Bucket] = field(default_factory=Counter)


@dataclass
class _Row:
    index: int  # the prompt's place in the call
    context: list[int]  # prompt, then every emitted token
    length: int  # committed columns of its slot
    drafter: Drafter | None
    emitted: int = 0

    @property
    def root(self) -> int:
        return self.context[-1]  # emitted, not yet in the cache


class StaticDecoder:
    """Greedy decoding through a `StaticStep` of ``model`` (see the module's docstring).

    ``max_len`` bounds every prompt plus its new tokens plus the widest bucket; ``capture``
    captures the buckets as CUDA graphs where the model is on a CUDA device and can be
    (`StaticStep.capture`; ``step.record.problems`` says why not).
    """

    def __init__(
        self, model: Any, max_len: int, buckets: Buckets | None = None, *, capture: bool = True
    ) -> None:
        self.step = StaticStep(model, max_len, buckets)
        if capture:  # (or says in ``step.record.problems`` why not: on a CPU, always)
            self.step.capture()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        drafters: Callable[[int, Sequence[int]], Drafter | None] | None = None,
        stop: Collection[int] = (),
    ) -> DecodeResult:
        """Each prompt's greedy continuation of at most ``max_new_tokens`` tokens (ending at
        the first of ``stop``). ``drafters(i, prompt)``: prompt ``i``'s drafter (``None``:
        plain decoding), closed when its row finishes."""
        widest = self.step.buckets.widest
        longest = max((len(p) for p in prompts), default=0)
        if longest + max_new_tokens + widest > self.step.max_len:
            raise ValueError(
                f"prompts of up to {longest} tokens, {max_new_tokens} new and trees of {widest} "
                f"do not fit the step's {self.step.max_len} columns"
            )
        if any(not p for p in prompts) or max_new_tokens < 1:
            raise ValueError("every prompt needs a token, and a call at least one new token")
        result = DecodeResult([[] for _ in prompts])
        waiting = deque(enumerate(prompts))
        rows: list[_Row] = []
        while waiting or rows:
            while waiting and len(rows) < self.step.buckets.most_rows:
                index, prompt = waiting.popleft()
                drafter = drafters(index, prompt) if drafters is not None else None
                row, first = self._admit(index, prompt, drafter, len(rows))
                rows.append(row)
                self._emit(row, [first], result, max_new_tokens, stop)
            self._leave(
                [i for i, row in enumerate(rows) if self._done(row, result, max_new_tokens, stop)], rows
            )
            if rows:
                self._step(rows, result, max_new_tokens, stop)
                self._leave(
                    [i for i, row in enumerate(rows) if self._done(row, result, max_new_tokens, stop)], rows
                )
        return result

    def _admit(
        self, index: int, prompt: Sequence[int], drafter: Drafter | None, slot: int
    ) -> tuple[_Row, int]:
        """Prefill ``prompt`` into ``slot``: its row, and the first new token."""
        first = int(first_argmax(self.step.prefill(slot, prompt)))
        return _Row(index, list(prompt), len(prompt), drafter), first

    def _step(
        self, rows: list[_Row], result: DecodeResult, max_new_tokens: int, stop: Collection[int]
    ) -> None:
        """One static forward of every row: draft, forward, verify, keep, emit."""
        widest = self.step.buckets.widest
        trees = [self._draft(row, widest) for row in rows]
        logits = self.step.run(trees, [row.length for row in rows])  # [R, W, V]
        result.steps += 1
        result.buckets[self.step.buckets.fit(len(trees), max(len(t) for t in trees))] += 1
        chosen = first_argmax(logits[: len(rows)]).tolist()  # [R, W]
        for slot, (row, tree) in enumerate(zip(rows, trees, strict=True)):
            accepted = accept(tree, chosen[slot][: len(tree)])
            self.step.keep(slot, row.length, accepted.nodes)
            row.length += len(accepted.nodes)
            self._emit(row, accepted.tokens, result, max_new_tokens, stop)
            if row.drafter is not None:
                row.drafter.observe(accepted.tokens)

    def _draft(self, row: _Row, widest: int) -> DraftTree:
        if row.drafter is None or widest == 1:
            return DraftTree.root_only(row.root)
        tree = row.drafter.propose(row.context, widest - 1).tree
        if tree.tokens[0] != row.root:
            raise ValueError(f"a draft rooted at {tree.tokens[0]} for a row whose last token is {row.root}")
        return tree if len(tree) <= widest else tree.subtree(range(widest))

    @staticmethod
    def _emit(
        row: _Row, tokens: Sequence[int], result: DecodeResult, most: int, stop: Collection[int]
    ) -> None:
        out = result.tokens[row.index]
        for token in tokens:
            if len(out) >= most or (out and out[-1] in stop):
                break
            out.append(token)
            row.context.append(token)

    @staticmethod
    def _done(row: _Row, result: DecodeResult, most: int, stop: Collection[int]) -> bool:
        out = result.tokens[row.index]
        return len(out) >= most or bool(out and out[-1] in stop)

    def _leave(self, finished: list[int], rows: list[_Row]) -> None:
        """Drop the finished rows; the last row takes each freed slot (highest first)."""
        for slot in sorted(finished, reverse=True):
            done = rows[slot]
            if done.drafter is not None:
                done.drafter.close()
            last = len(rows) - 1
            if slot != last:
                self.step.copy_slot(last, slot, rows[last].length)
                rows[slot] = rows[last]
            rows.pop()
