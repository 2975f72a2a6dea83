"""KV-cache operations for tree verification, over transformers' own `DynamicCache`.

After a tree forward the cache holds the whole tree; only the accepted path may stay. When that
path is the tree's first nodes (the drafter puts its best branch first) a crop suffices;
otherwise the accepted entries are gathered into place first.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = [
    "GrowingCache",
    "GrowingLayer",
    "cache_kwarg",
    "growing_cache",
    "keep_accepted",
    "layer_rooms",
    "new_tree_cache",
    "supports_tree",
    "with_room",
]


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that appends into spare room in place instead of concatenating.

    `DynamicLayer` copies the whole layer at every step (``torch.cat``); with several rows of a
    long context that copy costs more than the attention itself. Here ``keys`` and ``values``
    are views of the first columns of a larger buffer; new columns are written after them,
    and only when the room runs out (or someone replaced the tensors) is the layer copied.
    """

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        self.keys, self._key_room = _append(self.keys, getattr(self, "_key_room", None), key_states)
        self.values, self._value_room = _append(self.values, getattr(self, "_value_room", None), value_states)
        return self.keys, self.values


class GrowingCache(DynamicCache):
    """A `DynamicCache` of `GrowingLayer`s: full attention, cropped and gathered like it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer


def _append(
    current: torch.Tensor, room: torch.Tensor | None, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``current`` then ``new`` along the columns, as a view of ``room`` (grown if needed)."""
    used = current.shape[-2] if current.dim() == 4 else 0
    needed = used + new.shape[-2]
    fits = (
        room is not None
        and used > 0
        and room.shape[:2] == new.shape[:2]
        and room.shape[-1] == new.shape[-1]
        and needed <= room.shape[-2]
        and current.data_ptr() == room.data_ptr()
        and current.stride() == room.stride()
    )
    if not fits:
        room = new.new_empty((*new.shape[:2], with_room(needed), new.shape[-1]))
        if used:
            room[:, :, :used] = current
    assert room is not None
    room[:, :, used:needed] = new
    return room[:, :, :needed], room


def layer_rooms(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values with the spare room after them (``[1, KV, capacity, D]``
    each, the entries in the first columns): a `GrowingLayer`'s own buffers where its entries
    are still their first columns, else the entries themselves. Views, not copies: whoever
    takes them writes past the entries in place, so ``cache`` is theirs from then on."""
    return [
        (
            _room(layer.keys, getattr(layer, "_key_room", None)),
            _room(layer.values, getattr(layer, "_value_room", None)),
        )
        for layer in cache.layers
        if isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
    ]


def growing_cache(rooms: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> GrowingCache:
    """A `GrowingCache` of the first ``length`` columns of ``rooms`` (`layer_rooms`), which
    appends into the room after them: no copy."""
    cache = GrowingCache()
    for keys, values in rooms:
        layer = GrowingLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer._key_room = keys[:, :, :length], keys
        layer.values, layer._value_room = values[:, :, :length], values
        cache.layers.append(layer)
    return cache


def _room(current: torch.Tensor, room: torch.Tensor | None) -> torch.Tensor:
    """``room`` where ``current`` is its first columns, else ``current``."""
    fits = (
        room is not None
        and current.dim() == 4
        and room.shape[:2] == current.shape[:2]
        and room.shape[-1] == current.shape[-1]
        and current.data_ptr() == room.data_ptr()
        and current.stride() == room.stride()
    )
    return room if fits and room is not None else current


# A long context grows by at most this many columns per copy: one copy per this many tokens.
_MOST_ROOM = 512


def with_room(columns: int) -> int:
    """Columns to allocate for ``columns`` used ones: spare room, so that growing rarely copies,
    bounded so that a long prompt does not reserve half its length again for a short answer."""
    return columns + min(max(64, columns // 2), _MOST_ROOM)


def new_tree_cache() -> DynamicCache:
    """A cache of plain full-attention layers, whose entries can be cropped and gathered."""
    return GrowingCache()


def supports_tree(cache: Any) -> bool:
    """Whether ``cache`` is one this module can roll back exactly."""
    layers = getattr(cache, "layers", None)
    return (
        isinstance(cache, DynamicCache)
        and bool(layers)
        and all(type(layer) in (DynamicLayer, GrowingLayer) for layer in layers)  # type: ignore[union-attr]
    )


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward argument that takes the cache: ``cache`` unless only the old name is declared."""
    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params and "cache" not in params else "cache"


@torch.inference_mode()  # the cache tensors were made under inference mode
def keep_accepted(cache: DynamicCache, past_length: int, tree_size: int, nodes: Sequence[int]) -> None:
    """Keep the cache entries of the accepted tree ``nodes``, drop the rest of the tree.

    ``past_length`` is the cache length before the tree forward, ``tree_size`` its node count.
    """
    kept = len(nodes)
    if list(nodes) != list(range(kept)):
        index = torch.tensor(nodes, dtype=torch.long) + past_length
        for layer in cache.layers:  # plain DynamicLayers: `supports_tree` checked them
            assert isinstance(layer, DynamicLayer) and layer.keys is not None
            assert layer.values is not None
            index = index.to(layer.keys.device)
            # Index first, then write: source and destination ranges may overlap.
            layer.keys[..., past_length : past_length + kept, :] = layer.keys[..., index, :]
            layer.values[..., past_length : past_length + kept, :] = layer.values[..., index, :]
    if tree_size > kept:
        cache.crop(-(tree_size - kept))
