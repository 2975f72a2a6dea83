"""A static KV cache with one preallocated row per slot, written in place at per-row columns.

transformers' `StaticCache` writes every row of a batch at the same columns (one running
length for the whole batch) and its sliding layers keep a rolling window, which a rejected
tree node would evict from. Here each layer holds ``[slots, KV, max_len, D]`` keys and values,
allocated once at the first forward, every position of every layer kept (sliding windows are
cut by the mask, as the engine's other caches do); a step's row ``r`` writes its ``W`` new
entries at the columns ``columns[r, :W]`` (a persistent ``[slots, widest]`` buffer the step
fills before its forward), so rows of different lengths share one forward of one shape. What
the model gets back is the first ``R`` rows, all ``max_len`` columns: the 4-D mask hides the
columns a row must not see. Nothing here moves entries between forwards: `move` and
`copy_slot` do, outside the forward, by index copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

__all__ = ["SlotCache", "SlotLayer", "prompt_entries"]


class SlotLayer(StaticLayer):
    """One layer's slot rows: written at the cache's ``columns``, never grown or cropped."""

    def __init__(self, slots: int, max_len: int, columns: torch.Tensor) -> None:
        super().__init__(max_cache_len=max_len)
        self.slots = slots
        self.columns = columns  # [S, widest], shared by every layer of the cache

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # Zeros, not empty: a hidden column's value is multiplied by a zero weight, and a NaN
        # left in memory would turn that product into NaN.
        heads, device = key_states.shape[1], key_states.device
        self.keys = key_states.new_zeros((self.slots, heads, self.max_cache_len, key_states.shape[-1]))
        self.values = value_states.new_zeros((self.slots, heads, self.max_cache_len, value_states.shape[-1]))
        self.device = device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states``/``value_states`` ``[R, KV, W, D]`` at ``columns[:R, :W]`` of the
        first ``R`` slots; return those slots' keys and values, every column."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        rows, heads, width, _ = key_states.shape
        where = self.columns[:rows, :width]  # [R, W]
        keys, values = self.keys[:rows], self.values[:rows]
        keys.scatter_(2, where[:, None, :, None].expand(rows, heads, width, keys.shape[-1]), key_states)
        values.scatter_(2, where[:, None, :, None].expand(rows, heads, width, values.shape[-1]), value_states)
        return keys, values

    def get_seq_length(self) -> int:
        return 0  # rows differ in length: the step passes positions and a 4-D mask itself


class SlotCache(Cache):
    """Slot rows for every layer of a model (`SlotLayer`), sharing one ``columns`` buffer."""

    def __init__(self, layers: int, slots: int, max_len: int, widest: int, device: torch.device) -> None:
        if min(layers, slots, max_len, widest) < 1 or widest > max_len:
            raise ValueError(
                f"a slot cache needs layers, slots, widest >= 1 and widest <= max_len ({max_len})"
            )
        self.slots, self.max_len = slots, max_len
        self.columns = torch.zeros((slots, widest), dtype=torch.long, device=device)  # [S, widest]
        self.slot_layers = [SlotLayer(slots, max_len, self.columns) for _ in range(layers)]
        super().__init__(layers=list(self.slot_layers))

    @property
    def allocated(self) -> bool:
        """Whether the first forward has allocated every layer's rows."""
        return all(layer.is_initialized for layer in self.slot_layers)

    def nbytes(self) -> int:
        """Bytes held by every layer's keys and values."""
        return sum(keys.nbytes + values.nbytes for keys, values in self.rows())

    def rows(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values, ``[S, KV, max_len, D]`` each (once allocated)."""
        if not self.allocated:
            raise RuntimeError("a slot cache is allocated by its first forward: none ran yet")
        return [(layer.keys, layer.values) for layer in self.slot_layers]  # type: ignore[misc]

    def load(self, slot: int, entries: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write a prompt's entries (each layer's keys and values ``[1, KV, L, D]``) into
        columns ``0..L-1`` of ``slot``."""
        self._check_slot(slot)
        if len(entries) != len(self.layers):
            raise ValueError(f"{len(entries)} layers of entries for a cache of {len(self.layers)}")
        for (keys, values), (new_keys, new_values) in zip(self.rows(), entries, strict=True):
            length = new_keys.shape[-2]
            if length > self.max_len:
                raise ValueError(f"a prompt of {length} tokens does not fit {self.max_len} columns")
            keys[slot, :, :length] = new_keys[0]
            values[slot, :, :length] = new_values[0]

    def move(self, slot: int, sources: torch.Tensor, start: int) -> None:
        """Gather ``slot``'s columns ``sources`` ``[K]`` to columns ``start..start+K-1`` (the
        accepted path of a tree to the next positions)."""
        self._check_slot(slot)
        count = sources.numel()
        if start + count > self.max_len:
            raise ValueError(f"columns {start}..{start + count - 1} do not fit {self.max_len} columns")
        for keys, values in self.rows():
            # Gathered first, then written: source and destination columns may overlap.
            keys[slot, :, start : start + count] = keys[slot, :, sources]
            values[slot, :, start : start + count] = values[slot, :, sources]

    def copy_slot(self, source: int, target: int, length: int) -> None:
        """Copy the first ``length`` columns of slot ``source`` to slot ``target``."""
        self._check_slot(source)
        self._check_slot(target)
        for keys, values in self.rows():
            keys[target, :, :length] = keys[source, :, :length]
            values[target, :, :length] = values[source, :, :length]

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not among the cache's {self.slots}")


def prompt_entries(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values ``[1, KV, L, D]`` of a prompt's cache of full layers
    (`rag_lookahead.runtime.kv_cache.new_tree_cache`'s), to `SlotCache.load` into a slot."""
    entries = []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise ValueError(
                f"a prompt's entries are read from full dynamic layers, not {type(layer).__name__}"
            )
        entries.append((layer.keys, layer.values))
    return entries
