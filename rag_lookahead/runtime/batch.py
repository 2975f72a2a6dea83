"""Several calls in one forward: one KV buffer of rows, each row written at its own length.

The batch's cache is a `RowCache`: per layer, buffers ``[B, H, capacity, D]`` in which row
``i`` holds its call's ``lengths[i]`` cached tokens in its first columns. A step's new columns
are written, for each row, right after its own tokens (`RowLayer.update`), so rows of different
lengths never leave holes in one another; the attention sees the first ``max(lengths) + T``
columns, and each row's mask shows it only its own tokens and its own draft (with its own
positions), so a row is computed as if it were alone. After the step each row keeps its
accepted nodes (gathered to the front of its new columns) and its length grows by them;
whatever lies beyond a row's length is stale and stays hidden.

That is the padded batch (every row's step as wide as the widest). A packed batch (its rows'
tokens side by side, on a CPU: `rag_lookahead.runtime.attention.PackedRows`) attends each row
over its own keys alone, so its rows need no common buffer: it keeps each row in the buffers
its call prefilled into (`rag_lookahead.runtime.packed_cache.PackedRowCache`), and a call
joins, grows and leaves without copying any other row.

A call alone decodes in its own `GrowingCache` instead, exactly as it would outside a batch;
the batch converts between the two when a second call joins or the last but one leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rag_lookahead.decoding.tree import PackedInputs, step_inputs
from rag_lookahead.runtime.kv_cache import (
    GrowingCache,
    growing_cache,
    keep_accepted,
    layer_rooms,
    new_tree_cache,
    with_room,
)
from rag_lookahead.runtime.packed_cache import PackedRowCache

__all__ = ["BatchCache", "RowCache", "RowLayer", "batch_inputs", "filled_holes", "viewed_row"]


# A batch's step inputs: one draft per row, each after its own cache length.
batch_inputs = step_inputs


class _Rows:
    """Where each row's next columns go: shared by the layers of one `RowCache`."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths  # the batch's own list, kept up to date by it
        self.starts: torch.Tensor | None = None  # [B], on the device, for the forward in flight


class RowLayer(DynamicLayer):
    """Keys and values of several rows in one buffer; each row appends after its own length.

    The buffers have room for more rows and columns than are in use (a joining call is
    copied into a free row, a leaving one is closed up in place); ``rows()`` are the used ones.
    """

    def __init__(self, rows: _Rows) -> None:
        super().__init__()
        self._rows = rows
        self.key_buffer: torch.Tensor | None = None  # [rows capacity, H, columns capacity, D]
        self.value_buffer: torch.Tensor | None = None

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The used rows' buffers, ``[B, H, capacity, D]`` views."""
        assert self.key_buffer is not None and self.value_buffer is not None
        count = len(self._rows.lengths)
        return self.key_buffer[:count], self.value_buffer[:count]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[-2]
        used = max(self._rows.lengths) + new
        self.reserve(len(self._rows.lengths), used)
        starts = self._rows.starts
        assert starts is not None, "set the rows' starts before the forward"
        where = starts[:, None] + torch.arange(new, device=starts.device)  # [B, T]
        keys, values = self.rows()
        _scatter_columns(keys, where, key_states)
        _scatter_columns(values, where, value_states)
        self.keys, self.values = keys[:, :, :used], values[:, :, :used]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return max(self._rows.lengths, default=0)

    def reserve(self, rows: int, columns: int) -> None:
        """Room for ``rows`` rows of ``columns`` columns (grown with spare room if needed)."""
        assert self.key_buffer is not None and self.value_buffer is not None
        have_rows, _, have_columns, _ = self.key_buffer.shape
        if rows > have_rows or columns > have_columns:
            # Rows grow by doubling, so that joining calls rarely copy the others.
            rows = _doubled(rows) if rows > have_rows else have_rows
            columns = max(columns, have_columns)
            room = columns if columns == have_columns else with_room(columns)
            self.key_buffer = _enlarged(self.key_buffer, rows - have_rows, room)
            self.value_buffer = _enlarged(self.value_buffer, rows - have_rows, room)


class RowCache(DynamicCache):
    """A cache of `RowLayer`s over the rows of a batch."""

    def __init__(self, rows: _Rows, buffers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self.rows = rows
        self.layer_class_to_replicate = None
        self.layers = []
        for keys, values in buffers:
            layer = RowLayer(rows)
            layer.key_buffer, layer.value_buffer = keys, values
            layer.lazy_initialization(keys, values)
            self.layers.append(layer)

    def row_layers(self) -> list[RowLayer]:
        return [layer for layer in self.layers if isinstance(layer, RowLayer)]


class BatchCache:
    """The KV cache of the calls decoding together: one row each, in order; ``packed`` for
    packed steps (`prepare` with their inputs), else padded ones."""

    def __init__(self, packed: bool = False) -> None:
        self.packed = packed
        self.lengths: list[int] = []
        # The one row's own cache, a RowCache (padded), or a PackedRowCache (packed).
        self.cache: DynamicCache = GrowingCache()
        # The buffers of the last RowCache, kept while one row decodes alone: the next batch
        # writes into them rather than allocating (and faulting in) fresh memory.
        self._spare: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @torch.inference_mode()
    def add_row(self, row: DynamicCache, expected_rows: int = 0) -> int:
        """Append a call's own (prefilled, batch-of-one) cache as a new row; returns its index.
        ``expected_rows``: how many rows the batch will soon hold (others are joining), so that
        its buffers are allocated once rather than grown row by row."""
        length = row.get_seq_length()
        if not self.lengths:
            self.cache, self.lengths = row, [length]
            return 0
        if self.packed:
            return self._add_packed(row, length)
        count = self.rows + 1
        capacity = max(count, expected_rows)
        if not isinstance(self.cache, RowCache):
            self.cache = self._row_cache(capacity, max(self.lengths[0], length))
        assert isinstance(self.cache, RowCache)
        layers = self.cache.row_layers()
        states = [_states(layer) for layer in _full_layers(row)] if length else [None] * len(layers)
        for layer, new in zip(layers, states, strict=True):
            layer.reserve(capacity, length)
            assert layer.key_buffer is not None and layer.value_buffer is not None
            if new is not None:  # (a row that starts empty is prefilled in place)
                layer.key_buffer[count - 1, :, :length] = new[0][0]
                layer.value_buffer[count - 1, :, :length] = new[1][0]
        self.lengths.append(length)
        return count - 1

    def _add_packed(self, row: DynamicCache, length: int) -> int:
        """A packed batch takes the row's own buffers as they are (a row that starts empty
        gets its own at its first step)."""
        if not isinstance(self.cache, PackedRowCache):  # a second call joins
            first = layer_rooms(self.cache) if self.lengths[0] else []
            self.cache = PackedRowCache([first], self.lengths)
        self.cache.rooms.append(layer_rooms(row) if length else [])
        self.lengths.append(length)
        return self.rows - 1

    def row_view(self, index: int) -> DynamicCache:
        """Row ``index``'s cached tokens as a cache of its own: views, not copies."""
        if isinstance(self.cache, RowCache):
            rows = [layer.rows() for layer in self.cache.row_layers()]
            return viewed_row(
                [(keys[index : index + 1], values[index : index + 1]) for keys, values in rows],
                self.lengths[index],
            )
        if isinstance(self.cache, PackedRowCache):
            return viewed_row(self.cache.rooms[index], self.lengths[index])
        return self.cache

    @torch.inference_mode()
    def row_copy(self, index: int) -> DynamicCache:
        """Row ``index``'s cached tokens copied into a tree cache of its own, which outlives
        the row (the batch moves and overwrites its buffers as rows leave and join)."""
        cache = new_tree_cache()
        for layer, own in enumerate(_full_layers(self.row_view(index))):
            cache.update(*_states(own), layer)  # copied in
        return cache

    @torch.inference_mode()
    def keep_rows(self, keep: Sequence[int]) -> list[int]:
        """Keep only the rows ``keep`` (ascending): the others' calls have left. Returns the
        kept rows in their new order: a row past the kept count moves into a hole left before
        it, and the others stay where they are, so that each row is copied at most once."""
        assert list(keep) == sorted(set(keep)), "rows are listed in order"
        if isinstance(self.cache, PackedRowCache):
            return self._keep_packed(keep)
        if not isinstance(self.cache, RowCache):  # a call alone, leaving
            self.cache, self.lengths[:] = GrowingCache(), [self.lengths[i] for i in keep]
            return list(keep)
        layers = self.cache.row_layers()
        if len(keep) <= 1:  # back to a call alone, in a cache of its own
            lengths = [self.lengths[i] for i in keep]
            self._spare = [(layer.key_buffer, layer.value_buffer) for layer in layers]  # type: ignore[misc]
            single = GrowingCache()
            for index, layer in enumerate(layers):
                if keep:
                    keys, values = layer.rows()
                    row = slice(keep[0], keep[0] + 1)
                    single.update(keys[row, :, : lengths[0]], values[row, :, : lengths[0]], index)
            self.cache, self.lengths[:] = single, lengths
            return list(keep)
        order = filled_holes(keep)
        for target, source in enumerate(order):
            if source != target:  # a row from past the kept count: no other row is read there
                used = self.lengths[source]
                for layer in layers:
                    keys, values = layer.rows()
                    keys[target, :, :used] = keys[source, :, :used]
                    values[target, :, :used] = values[source, :, :used]
        self.lengths[:] = [self.lengths[i] for i in order]
        return order

    def _keep_packed(self, keep: Sequence[int]) -> list[int]:
        """A packed batch's rows ``keep`` stay, in order; nothing is copied (the last one
        decodes on in its own buffers)."""
        assert isinstance(self.cache, PackedRowCache)
        rooms = self.cache.rooms
        rooms[:] = [rooms[i] for i in keep]
        self.lengths[:] = [self.lengths[i] for i in keep]
        if len(keep) <= 1:
            self.cache = growing_cache(rooms[0], self.lengths[0]) if keep else GrowingCache()
        return list(keep)

    def prepare(self, packed: PackedInputs | None = None) -> None:
        """Before a batched forward (of ``packed`` inputs in a packed batch, of padded ones in
        a padded one): where each row's new columns go."""
        if (packed is not None) != self.packed:
            raise ValueError("a packed batch takes packed inputs, a padded one padded inputs")
        if isinstance(self.cache, PackedRowCache):
            assert packed is not None
            self.cache.place(packed.offsets, packed.sizes)
        elif isinstance(self.cache, RowCache):
            device = self.cache.row_layers()[0].key_buffer.device  # type: ignore[union-attr]
            self.cache.rows.starts = torch.tensor(self.lengths, device=device)

    @torch.inference_mode()
    def keep_accepted(self, width: int, nodes: Sequence[Sequence[int]]) -> None:
        """After a step of ``width`` new columns per row, keep each row's accepted ``nodes``
        (indices into its draft, root first) and grow its length by them."""
        if isinstance(self.cache, PackedRowCache):  # each row wrote its own step's columns
            for row, accepted in enumerate(nodes):
                if list(accepted) != list(range(len(accepted))):
                    self.cache.keep_nodes(row, accepted)
        elif not isinstance(self.cache, RowCache):  # a call alone: its own cache, rolled back
            keep_accepted(self.cache, self.lengths[0], width, nodes[0])
            self.lengths[0] += len(nodes[0])
            return
        elif any(list(n) != list(range(len(n))) for n in nodes):
            kept = max(len(n) for n in nodes)
            # Beyond a row's accepted count the gathered columns are stale, and stay hidden.
            rows = zip(self.lengths, nodes, strict=True)
            source = torch.tensor(
                [[length + k for k in n] + [length] * (kept - len(n)) for length, n in rows]
            )
            target = torch.tensor([[length + k for k in range(kept)] for length in self.lengths])
            for layer in self.cache.row_layers():
                for buffer in layer.rows():
                    _scatter_columns(buffer, target.to(buffer.device), _gather_columns(buffer, source))
        self.lengths[:] = [length + len(n) for length, n in zip(self.lengths, nodes, strict=True)]

    def _row_cache(self, capacity: int, columns: int) -> RowCache:
        """The one row's own cache as the first row of a `RowCache` with room for ``capacity``
        rows of ``columns`` columns (and more columns to grow into)."""
        rows = [_states(layer) for layer in _full_layers(self.cache)]
        spare, self._spare = self._spare, []
        pairs = zip(rows, spare, strict=False)
        if len(spare) == len(rows) and all(
            _fits(buffer, capacity, columns, keys) for (keys, _), (buffer, _) in pairs
        ):
            for (keys, values), (key_buffer, value_buffer) in zip(rows, spare, strict=True):
                key_buffer[:1, :, : keys.shape[2]] = keys
                value_buffer[:1, :, : values.shape[2]] = values
            return RowCache(_Rows(self.lengths), spare)
        extra, room = _doubled(capacity) - 1, with_room(columns)
        buffers = [(_enlarged(keys, extra, room), _enlarged(values, extra, room)) for keys, values in rows]
        return RowCache(_Rows(self.lengths), buffers)


def viewed_row(rows: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> DynamicCache:
    """A cache of one row's first ``length`` columns of ``rows`` (per layer, its keys' and
    values' buffers ``[1, KV, capacity, D]``): views, not copies."""
    view = DynamicCache()
    view.layers = []
    for keys, values in rows:
        own = DynamicLayer()
        own.lazy_initialization(keys, values)
        own.keys, own.values = keys[:, :, :length], values[:, :, :length]
        view.layers.append(own)
    return view


def filled_holes(keep: Sequence[int]) -> list[int]:
    """The new order of the rows ``keep``: those within the first ``len(keep)`` stay, and
    each one beyond fills a hole there, in order."""
    count, kept = len(keep), set(keep)
    movers = iter(row for row in keep if row >= count)
    return [row if row in kept else next(movers) for row in range(count)]


def _doubled(rows: int) -> int:
    """The row capacity that holds ``rows``: a power of two."""
    return 1 << (rows - 1).bit_length()


def _fits(buffer: torch.Tensor, rows: int, columns: int, states: torch.Tensor) -> bool:
    """Whether ``buffer`` has room for ``rows`` rows of ``columns`` columns of ``states``."""
    have_rows, heads, have_columns, dim = buffer.shape
    return (
        have_rows >= rows
        and have_columns >= columns
        and (heads, dim) == (states.shape[1], states.shape[3])
        and (buffer.dtype, buffer.device) == (states.dtype, states.device)
    )


def _full_layers(cache: DynamicCache) -> list[DynamicLayer]:
    return [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]


def _states(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


def _enlarged(states: torch.Tensor, extra_rows: int, columns: int) -> torch.Tensor:
    """``states`` in a zero buffer with ``extra_rows`` more rows and ``columns`` columns."""
    rows, heads, used, dim = states.shape
    out = states.new_zeros((rows + extra_rows, heads, columns, dim))
    out[:rows, :, :used] = states
    return out


def _gather_columns(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``states`` ``[B, H, L, D]`` at columns ``index`` ``[B, A]`` of each row: ``[B, H, A, D]``."""
    rows, heads, _, dim = states.shape
    where = index.to(states.device)[:, None, :, None].expand(rows, heads, index.shape[1], dim)
    return states.gather(2, where)


def _scatter_columns(buffer: torch.Tensor, index: torch.Tensor, states: torch.Tensor) -> None:
    """Write ``states`` ``[B, H, A, D]`` into ``buffer`` at columns ``index`` ``[B, A]``."""
    rows, heads, count, dim = states.shape
    buffer.scatter_(2, index.to(buffer.device)[:, None, :, None].expand(rows, heads, count, dim), states)
