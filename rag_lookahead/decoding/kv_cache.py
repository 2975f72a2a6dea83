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

__all__ = ["cache_kwarg", "keep_accepted", "new_tree_cache", "supports_tree"]


def new_tree_cache() -> DynamicCache:
    """A cache of plain full-attention layers, whose entries can be cropped and gathered."""
    return DynamicCache()


def supports_tree(cache: Any) -> bool:
    """Whether ``cache`` is one this module can roll back exactly."""
    layers = getattr(cache, "layers", None)
    return (
        isinstance(cache, DynamicCache)
        and bool(layers)
        and all(type(layer) is DynamicLayer for layer in layers)  # type: ignore[union-attr]
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
