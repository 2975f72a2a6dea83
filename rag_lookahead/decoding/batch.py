"""Several calls in one forward: one KV cache of rows, each row with its own valid columns.

The batch keeps transformers' own `DynamicCache`, its layers ``[B, H, L, D]``. Column ``j`` of
row ``i`` is either one of that call's cached tokens or a hole: left padding from when the row
joined, a padded slot of a step, or a draft node the model did not accept. ``valid`` ``[B, L]``
says which; each row's mask hides its holes, and its position ids are its own, so a row is
computed as if it were alone. A step appends the same number of columns ``T`` to every row (its
draft, then pads); afterwards each row's accepted nodes are gathered to the front of those
columns and the batch keeps as many as the row that accepted most. `compact` squeezes the holes
out (rows right-aligned) once they are a large part of the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rag_lookahead.decoding.tree import StepDraft, TreeInputs

__all__ = ["BatchCache", "batch_inputs"]


def batch_inputs(
    drafts: Sequence[StepDraft],
    lengths: Sequence[int],
    valid: torch.Tensor,
    device: torch.device,
    dtype: torch.dtype,
) -> TreeInputs:
    """Inputs ``[B, T]`` and mask ``[B, 1, T, L + T]`` for one draft per row.

    ``lengths[i]`` is row ``i``'s logical cache length (its root's position); ``valid`` ``[B, L]``
    marks the columns each row may see. A padded slot sees only itself, so that every query
    row has a finite softmax (its output is never used, and its column is a hole).
    """
    rows, width = len(drafts), max(len(d) for d in drafts)
    past = valid.shape[1]
    hidden = torch.finfo(dtype).min
    mask = torch.full((rows, 1, width, past + width), hidden, dtype=dtype)
    ids = torch.zeros(rows, width, dtype=torch.long)
    positions = torch.zeros(rows, width, dtype=torch.long)
    pad = torch.eye(width, dtype=torch.bool)
    for i, (draft, length) in enumerate(zip(drafts, lengths, strict=True)):
        tokens, offsets, allowed = draft.layout()
        n = len(tokens)
        seen = pad.clone()
        seen[:n, :n] = allowed
        mask[i, 0, :, past:].masked_fill_(seen, 0.0)
        mask[i, 0, :n, :past].masked_fill_(valid[i].unsqueeze(0), 0.0)
        ids[i, :n] = torch.tensor(tokens)
        ids[i, n:] = tokens[0]
        positions[i, :n] = torch.tensor(offsets) + length
        positions[i, n:] = length
    return TreeInputs(ids.to(device), positions.to(device), mask.to(device))


@dataclass
class BatchCache:
    """The KV cache of the calls decoding together, one row each."""

    cache: DynamicCache
    valid: torch.Tensor  # [B, L] bool, on the CPU

    @classmethod
    def empty(cls) -> BatchCache:
        return cls(DynamicCache(), torch.zeros(0, 0, dtype=torch.bool))

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def width(self) -> int:
        """Physical columns ``L`` of every row."""
        return self.valid.shape[1]

    def holes(self) -> float:
        """The share of the cache's columns that are holes."""
        total = self.valid.numel()
        return 1.0 - float(self.valid.sum()) / total if total else 0.0

    def slack(self) -> float:
        """The share of columns that `compact` would remove: beyond the longest row's count."""
        if not self.width:
            return 0.0
        return 1.0 - int(self.valid.sum(dim=1).max()) / self.width

    def _layers(self) -> list[DynamicLayer]:
        return _dynamic_layers(self.cache)

    @torch.inference_mode()
    def add_row(self, row: DynamicCache) -> int:
        """Append a call's own (prefilled, batch-of-one) cache as a new row; returns its index."""
        length = row.get_seq_length()
        if self.rows == 0:
            self.cache = row
            self.valid = torch.ones(1, length, dtype=torch.bool)
            return 0
        if length > self.width:  # the newcomer is longer: every row gets leading holes
            self._pad_left(length - self.width)
        lead = self.width - length
        for mine, theirs in zip(self._layers(), _dynamic_layers(row), strict=True):
            assert mine.keys is not None and mine.values is not None
            assert theirs.keys is not None and theirs.values is not None
            mine.keys = torch.cat([mine.keys, _pad_columns(theirs.keys, lead)], dim=0)
            mine.values = torch.cat([mine.values, _pad_columns(theirs.values, lead)], dim=0)
        row_valid = torch.cat([torch.zeros(lead, dtype=torch.bool), torch.ones(length, dtype=torch.bool)])
        self.valid = torch.cat([self.valid, row_valid.unsqueeze(0)])
        return self.rows - 1

    @torch.inference_mode()
    def keep_rows(self, keep: Sequence[int]) -> None:
        """Keep only the rows ``keep`` (in that order): the others' calls have left."""
        if not keep:
            self.cache, self.valid = DynamicCache(), torch.zeros(0, 0, dtype=torch.bool)
            return
        for layer in self._layers():
            assert layer.keys is not None and layer.values is not None
            index = torch.tensor(list(keep), device=layer.keys.device)
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.valid = self.valid[list(keep)]

    @torch.inference_mode()
    def keep_accepted(self, past: int, width: int, nodes: Sequence[Sequence[int]]) -> None:
        """After a step of ``width`` columns over ``past`` ones, keep each row's accepted
        ``nodes`` (indices into its draft, root first) at the front of the new columns."""
        kept = max(len(n) for n in nodes)
        if any(list(n) != list(range(len(n))) for n in nodes):
            # Per row, the accepted columns, padded with the row's root to one length.
            index = torch.tensor([[past + k for k in n] + [past] * (kept - len(n)) for n in nodes])  # [B, A]
            for layer in self._layers():
                assert layer.keys is not None and layer.values is not None
                # Gather first (a new tensor), then write: the ranges overlap.
                layer.keys[:, :, past : past + kept] = _gather_columns(layer.keys, index)
                layer.values[:, :, past : past + kept] = _gather_columns(layer.values, index)
        if width > kept:
            self.cache.crop(-(width - kept))
        fresh = torch.tensor([[j < len(n) for j in range(kept)] for n in nodes], dtype=torch.bool)
        self.valid = torch.cat([self.valid, fresh], dim=1)

    @torch.inference_mode()
    def compact(self) -> None:
        """Squeeze the holes out: each row's valid columns, right-aligned, in their order."""
        counts = self.valid.sum(dim=1)  # [B]
        width = int(counts.max()) if self.rows else 0
        index = torch.zeros(self.rows, width, dtype=torch.long)
        for i in range(self.rows):
            columns = self.valid[i].nonzero().squeeze(1)
            index[i, width - len(columns) :] = columns
            if len(columns) < width:  # leading holes: any column will do, they stay hidden
                index[i, : width - len(columns)] = columns[0] if len(columns) else 0
        for layer in self._layers():
            assert layer.keys is not None and layer.values is not None
            layer.keys = _gather_columns(layer.keys, index)
            layer.values = _gather_columns(layer.values, index)
        self.valid = torch.arange(width).unsqueeze(0) >= (width - counts).unsqueeze(1)

    def _pad_left(self, columns: int) -> None:
        for layer in self._layers():
            assert layer.keys is not None and layer.values is not None
            layer.keys = _pad_columns(layer.keys, columns)
            layer.values = _pad_columns(layer.values, columns)
        self.valid = torch.cat([torch.zeros(self.rows, columns, dtype=torch.bool), self.valid], dim=1)


def _dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers: full-attention ones (`supports_tree` admitted the model)."""
    return [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]


def _gather_columns(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``states`` ``[B, H, L, D]`` at columns ``index`` ``[B, A]`` of each row: ``[B, H, A, D]``."""
    rows, heads, _, dim = states.shape
    where = index.to(states.device)[:, None, :, None].expand(rows, heads, index.shape[1], dim)
    return states.gather(2, where)


def _pad_columns(states: torch.Tensor, columns: int) -> torch.Tensor:
    """``states`` ``[B, H, L, D]`` with ``columns`` zero columns in front (holes: hidden, finite)."""
    if columns == 0:
        return states
    shape = (*states.shape[:2], columns, states.shape[3])
    return torch.cat([states.new_zeros(shape), states], dim=2)
