"""The batch's rows in a static step's slots: the `BatchCache` of a scheduler whose steps are
static (`StaticBatch`).

Row ``i`` lives in slot ``i`` of the step's `SlotCache`, so that a step of ``n`` rows is a
bucket of the first ``n`` slots. A joining call's prompt, prefilled apart in its own cache,
is copied into the next slot; a leaving call's slot is filled by a row from past the kept count
(each row copied at most once, as `BatchCache.keep_rows` does); after a step each row's
accepted path is gathered to its next columns (`StaticStep.keep`). Nothing here forwards: the
executor runs the step (`StaticStep.prepare`, `StaticStep.forward`) over ``lengths``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from rag_lookahead.runtime.batch import filled_holes, viewed_row
from rag_lookahead.runtime.kv_cache import new_tree_cache
from rag_lookahead.runtime.static.slot_cache import prompt_entries
from rag_lookahead.runtime.static.step import StaticStep

__all__ = ["StaticBatch"]


class StaticBatch:
    """The calls decoding together, one slot of ``step``'s cache each, in order."""

    packed = False  # (every step is padded to its bucket)

    def __init__(self, step: StaticStep) -> None:
        self.step = step
        self.lengths: list[int] = []  # each row's committed columns

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def add_row(self, row: DynamicCache, expected_rows: int = 0) -> int:
        """A call's own prefilled cache copied into the next slot; returns its index."""
        index = self.rows
        if index >= self.step.buckets.most_rows:
            raise ValueError(f"a static step's {self.step.buckets.most_rows} slots are all taken")
        length = row.get_seq_length()
        if length + self.step.buckets.widest > self.step.max_len:
            raise ValueError(f"a row of {length} tokens leaves no room in {self.step.max_len} columns")
        if length:
            self.step.load(index, prompt_entries(row))
        self.lengths.append(length)
        return index

    def row_view(self, index: int) -> DynamicCache:
        """Row ``index``'s committed entries as a cache of its own: views of its slot."""
        rows = self.step.cache.rows()
        return viewed_row(
            [(keys[index : index + 1], values[index : index + 1]) for keys, values in rows],
            self.lengths[index],
        )

    @torch.inference_mode()
    def row_copy(self, index: int) -> DynamicCache:
        """Row ``index``'s committed entries copied into a tree cache of its own."""
        cache = new_tree_cache()
        for layer, (keys, values) in enumerate(prompt_entries(self.row_view(index))):
            cache.update(keys, values, layer)  # copied in
        return cache

    def keep_rows(self, keep: Sequence[int]) -> list[int]:
        """Keep only the rows ``keep`` (ascending); returns them in their new order (a row
        past the kept count moves into a hole before it, its entries copied)."""
        assert list(keep) == sorted(set(keep)), "rows are listed in order"
        order = filled_holes(keep)
        for target, source in enumerate(order):
            if source != target:
                self.step.copy_slot(source, target, self.lengths[source])
        self.lengths[:] = [self.lengths[i] for i in order]
        return order

    def keep_accepted(self, width: int, nodes: Sequence[Sequence[int]]) -> None:
        """After a step, keep each row's accepted ``nodes`` (indices into its draft, root
        first) at its next columns and grow its length by them (``width`` is the bucket's
        business: the step wrote each row's draft from its length on)."""
        for row, accepted in enumerate(nodes):
            self.step.keep(row, self.lengths[row], accepted)
            self.lengths[row] += len(accepted)
