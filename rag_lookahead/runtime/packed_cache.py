"""The KV cache of a packed batch: each row in buffers of its own, written in place.

In a packed step (`rag_lookahead.decoding.tree.PackedInputs`) every row's queries attend over
that row's keys alone, so the rows need not share one rectangular buffer: each row keeps the
buffers its call prefilled into (`layer_rooms`: ``[1, KV, capacity, D]`` per layer, the row's
``lengths[i]`` entries in the first columns) and its step's new columns are written right
after them. A call joins without a copy, a long one grows its own buffers alone (a
rectangular buffer would grow every row to the longest, and fault in fresh memory for all of
them), and a leaving call takes nothing from the others.

`PackedRowLayer.update` returns each row's keys and values (`RowStates`), not one tensor: the
engine's packed attention (`rag_lookahead.runtime.attention.PackedRows`) reads them row by
row; a model that used them otherwise fails the runner's probe and steps padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rag_lookahead.runtime.kv_cache import with_room

__all__ = ["PackedRowCache", "PackedRowLayer", "RowStates"]

# Per row, per layer: its keys' and values' buffers, ``[1, KV, capacity, D]`` each.
Rooms = list[list[tuple[torch.Tensor, torch.Tensor]]]


class RowStates(tuple[torch.Tensor, ...]):
    """One layer's keys (or values) of each row of a packed step, ``[1, KV, lengths[i] +
    sizes[i], D]`` each: what `PackedRowLayer.update` hands the attention."""


class _Placement:
    """The rows of a packed batch and where the step under way puts each row's tokens."""

    def __init__(self, rooms: Rooms, lengths: list[int]) -> None:
        self.rooms = rooms  # per row, its layers' buffers (rows join and leave through the batch)
        self.lengths = lengths  # the batch's own list, kept up to date by it
        self.spans: tuple[tuple[int, int], ...] = ()  # per row, its tokens' offset and count


class PackedRowLayer(DynamicLayer):
    """Layer ``index`` of every row of a packed batch."""

    def __init__(self, placement: _Placement, index: int) -> None:
        super().__init__()
        self._placement = placement
        self._index = index
        self.is_initialized = True

    def update(
        self,
        key_states: torch.Tensor,  # [1, KV, N, D]
        value_states: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        placement = self._placement
        assert len(placement.spans) == len(placement.lengths), "place the rows' tokens first"
        keys, values = [], []
        for row, (offset, size) in enumerate(placement.spans):
            length, end = placement.lengths[row], placement.lengths[row] + size
            key_room, value_room = _fitted(placement.rooms[row], self._index, key_states, length, end)
            key_room[:, :, length:end] = key_states[:, :, offset : offset + size]
            value_room[:, :, length:end] = value_states[:, :, offset : offset + size]
            keys.append(key_room[:, :, :end])
            values.append(value_room[:, :, :end])
        # (the attention reads the rows one by one: see the module's docstring)
        return cast(torch.Tensor, RowStates(keys)), cast(torch.Tensor, RowStates(values))

    def get_seq_length(self) -> int:
        return max(self._placement.lengths, default=0)


class PackedRowCache(DynamicCache):
    """A cache of `PackedRowLayer`s over the rows of a packed batch."""

    def __init__(self, rooms: Rooms, lengths: list[int]) -> None:
        super().__init__()
        self.placement = _Placement(rooms, lengths)
        self.layer_class_to_replicate = None
        self.layers = [
            PackedRowLayer(self.placement, index) for index in range(max(map(len, rooms), default=0))
        ]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= layer_idx:  # (rows that all joined empty)
            self.layers.append(PackedRowLayer(self.placement, len(self.layers)))
        layer = self.layers[layer_idx]
        assert isinstance(layer, PackedRowLayer)
        return layer.update(key_states, value_states)

    @property
    def rooms(self) -> Rooms:
        """Per row, per layer: its keys' and values' buffers (the batch adds and drops rows)."""
        return self.placement.rooms

    def place(self, offsets: Sequence[int], sizes: Sequence[int]) -> None:
        """Before a packed forward: row ``i``'s tokens are ``sizes[i]`` from ``offsets[i]``."""
        self.placement.spans = tuple(zip(offsets, sizes, strict=True))

    @torch.inference_mode()
    def keep_nodes(self, row: int, nodes: Sequence[int]) -> None:
        """Row ``row``'s accepted ``nodes`` (of the step's columns after its length) gathered
        to the front of them."""
        length = self.placement.lengths[row]
        index = torch.tensor(nodes, dtype=torch.long) + length
        for keys, values in self.rooms[row]:
            where = index.to(keys.device)
            # Index first, then write: source and destination ranges may overlap.
            keys[:, :, length : length + len(nodes)] = keys[:, :, where]
            values[:, :, length : length + len(nodes)] = values[:, :, where]


def _fitted(
    rooms: list[tuple[torch.Tensor, torch.Tensor]], index: int, states: torch.Tensor, length: int, end: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``index``'s buffers of one row with room for ``end`` columns: grown (this row's
    ``length`` entries copied) if not, or made for a row that joined empty."""
    if index < len(rooms) and rooms[index][0].shape[2] >= end:
        return rooms[index]
    _, heads, _, dim = states.shape
    grown = []
    for old in rooms[index] if index < len(rooms) else (None, None):
        room = states.new_empty((1, heads, with_room(end), dim))
        if old is not None and length:
            room[:, :, :length] = old[:, :, :length]
        grown.append(room)
    pair = (grown[0], grown[1])
    if index < len(rooms):
        rooms[index] = pair
    else:  # a row that joined empty gets its layers in the order they are written
        assert index == len(rooms), "a packed row's layers are written in order"
        rooms.append(pair)
    return pair
