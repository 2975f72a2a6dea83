"""What a model is now, cheaply: whether it changed since the engine derived state from it.

The engine keeps things computed from its model: prompt prefixes' KV entries
(`rag_lookahead.runtime.prefix`), reordered weight copies (`rag_lookahead.runtime.kernels`),
the direct forward and the probes' verdicts (its `Backend`, `rag_lookahead.tuning`). A model
can be changed after that without the engine seeing it: weights loaded, scaled, stepped or
replaced; a hook registered; a layer wrapped or replaced (an adapter); an adapter switched;
train() or eval(). `ModelState` is what torch records of all of it, read once per call
(`rag_lookahead.tuning.tuner.ModelTuning.refresh`):

- its weights: each parameter and buffer, its identity, torch's version counter (which every
  in-place write under autograd's eye bumps: ``copy_`` in ``load_state_dict``, ``mul_`` under
  ``no_grad``, an optimizer's step) and its storage's address (which ``.data = ...`` changes);
- its structure: each module, in order (a replaced or wrapped one differs), its forward hooks
  and pre-hooks (and torch's global ones), and its own attributes (the training flag, a
  ``forward`` set on the instance, an adapter's name or switch: by value where plain, else by
  identity, lists and dicts by length too).

A write through ``.data`` (``weight.data.mul_(2)``, or PEFT's unsafe merge, which also lists the
merged adapter and so changes the structure) bumps no version and keeps the storage: nothing
here sees it, and `LookaheadEngine.model_changed` is how the caller says so.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.nn.modules import module as _torch_module

from rag_lookahead.runtime.kernels import shadows_forward

__all__ = ["Change", "ModelState"]

# What changed: the weights alone (the prefixes' KV entries are stale), or the structure too
# (whatever was probed on the modules is).
Change = Literal["weights", "structure"]

_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True, eq=False)
class ModelState:
    """A model's fingerprint (see the module's docstring): `of` reads it, `change_from` compares.

    Held objects are compared by identity: modules and tensors weakly (a replaced weight is
    not kept alive by the fingerprint), other attributes strongly (so that an address is never
    reused by another one while compared)."""

    structure: tuple[Any, ...]  # identities, where `_same` compares
    settings: tuple[Any, ...]  # plain values, lengths and hook keys, compared by value
    weights: tuple[Any, ...]  # weak references to each parameter and buffer
    versions: tuple[int, ...]  # each one's version counter and storage address

    @classmethod
    def of(cls, model: Any) -> ModelState:
        """``model``'s fingerprint now (any thread: the engine's own shadowed ``forward``s,
        which only exist during its forwards, are left out)."""
        structure: list[Any] = []
        settings: list[Any] = [*_keys(_torch_module._global_forward_hooks)]
        settings += _keys(_torch_module._global_forward_pre_hooks)
        weights: list[Any] = []
        versions: list[int] = []
        for module in _modules(model):
            structure.append(weakref.ref(module))
            _attributes(module, structure, settings)
            settings += _keys(module._forward_hooks)
            settings += _keys(module._forward_pre_hooks)
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is None:
                    weights.append(None)
                    continue
                weights.append(weakref.ref(tensor))
                versions += (_version(tensor), tensor.data_ptr())
        return cls(tuple(structure), tuple(settings), tuple(weights), tuple(versions))

    def change_from(self, earlier: ModelState) -> Change | None:
        """What changed since ``earlier`` was read (``None``: nothing torch records)."""
        if self.settings != earlier.settings or not _same(self.structure, earlier.structure):
            return "structure"
        if self.versions != earlier.versions or not _same(self.weights, earlier.weights):
            return "weights"
        return None


def _modules(model: Any) -> Iterator[torch.nn.Module]:
    """Every module of ``model`` once, in a fixed order (cheaper than ``modules()``, which
    builds every module's name)."""
    seen = {id(model)}
    stack = [model]
    while stack:
        module = stack.pop()
        yield module
        for child in reversed(module._modules.values()):
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)


def _attributes(module: torch.nn.Module, structure: list[Any], settings: list[Any]) -> None:
    """``module``'s own attributes into the fingerprint: plain values by value, dicts (its
    registries among them) by identity and length, lists and tuples by identity and length,
    anything else by identity."""
    attributes = module.__dict__.copy()  # (one step: the engine's thread may shadow a forward)
    if shadows_forward(attributes.get("forward")):
        del attributes["forward"]
    settings.append(len(attributes))
    for value in attributes.values():
        kind = type(value)
        if kind in _PLAIN:
            settings.append(value)
        elif kind is dict:
            settings += (id(value), len(value))  # the module's own: kept alive by it
        elif isinstance(value, (torch.nn.Module, torch.Tensor)):
            structure.append(weakref.ref(value))
        else:
            structure.append(value)
            if kind in (list, tuple, set):
                settings.append(len(value))


def _keys(hooks: dict[int, Any]) -> tuple[int, ...]:
    """A hook registry's handles, with their count (so that registries never run together)."""
    return (len(hooks), *hooks)


def _same(now: tuple[Any, ...], earlier: tuple[Any, ...]) -> bool:
    """Whether two sequences hold the same objects, weak references resolved."""
    return len(now) == len(earlier) and all(map(operator.is_, map(_resolved, now), map(_resolved, earlier)))


def _resolved(item: Any) -> Any:
    return item() if type(item) is weakref.ref else item


def _version(tensor: torch.Tensor) -> int:
    """``tensor``'s version counter (``-1`` for an inference tensor, which has none)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return -1
