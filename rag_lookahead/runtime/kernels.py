"""The matrix kernel of the engine's forwards on CPU: oneDNN's for fp32 linear layers.

torch computes an fp32 ``linear`` on CPU with its BLAS (MKL in the PyPI wheels). For the few
rows a decoding step feeds it — one token, a draft tree, a batch of trees — that is far from
the best kernel on some CPUs: on an AMD EPYC, MKL multiplies 2 or 3 rows one at a time and
more rows at several times the cost of one, where the cost of oneDNN's (also inside torch, the
library its compiled CPU graphs call) grows far more slowly with the rows
(`benchmarks/README.md`, *oneDNN linear layers*). A wider forward is what drafting pays for,
so its kernel decides what drafting gains. oneDNN is faster still when a weight was reordered
beforehand into the blocked layout its kernels read (what torch's compiled CPU graphs do when
they freeze weights): the ``reordered`` kernel keeps such a copy of every fp32 linear weight —
a second copy of those weights in memory. Which kernel runs a forward of so many tokens is the
`Backend`'s choice (`rag_lookahead.tuning` makes it); this module runs it.

Within `OneDnnLayers.installed` (an engine forward: `LinearKernels.running`) each fp32 CPU
`torch.nn.Linear` of the model runs on oneDNN: the layer's ``forward`` is shadowed by an
attribute of the instance for the block's duration, then removed — the model's code and
weights are untouched, and a layer that already has an instance ``forward`` (an accelerate
hook) is left as it is. (A `TorchFunctionMode` would do the same without touching the layers,
but it intercepts every torch call of the forward, a cost measurable in the step:
`benchmarks/README.md`, *Reordered weights*.) The values are the same up to
rounding, as between any two kernels (or two shapes of one kernel: a draft tree's rows already
differ from a one-token step's in their last bits); greedy outputs are checked against
``generate`` by the test suite and every benchmark. Anything else — autograd, other dtypes or
devices, a torch without the operator — runs as it would. A weight changed in place, or
replaced by another tensor, is reordered again before its next use (a replaced weight's old
copy is kept until `OneDnnLayers.release`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from rag_lookahead.runtime.backend import kernels_name

__all__ = [
    "LinearKernels",
    "OneDnnLayers",
    "linear_weights",
    "onednn_available",
    "onednn_linear",
    "shadows_forward",
    "torch_linear",
]

_F32 = torch.float32


@cache
def onednn_available() -> bool:
    """Whether this torch has oneDNN's linear operator for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear(x, weight, bias)`` on oneDNN, for fp32 CPU tensors (``weight`` contiguous, or
    reordered by oneDNN: it reads a strided one far more slowly)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@dataclass
class _Reordered:
    """A weight's copy in oneDNN's layout, and what the weight was when it was made."""

    weight: torch.Tensor
    version: int
    pointer: int
    copy: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> _Reordered:
        # Laid out for a few rows (a step's or a draft's); oneDNN reads it for any number.
        with torch.inference_mode():
            copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 4)
        return cls(weight, _version(weight), weight.data_ptr(), copy)

    def current(self, weight: torch.Tensor) -> bool:
        return (
            self.weight is weight and self.pointer == weight.data_ptr() and self.version == _version(weight)
        )


def _version(weight: torch.Tensor) -> int:
    """How many times ``weight`` was changed in place (``-1`` for a tensor made in inference
    mode, which counts none)."""
    try:
        return int(weight._version)
    except RuntimeError:
        return -1


class OneDnnLayers:
    """The fp32 CPU `torch.nn.Linear` layers of a model, run on oneDNN within `installed`
    (``reordered``: over copies of their weights reordered into oneDNN's layout, `reordered`,
    once `reorder` made them)."""

    def __init__(self, model: Any) -> None:
        self.layers = _linear_layers(model)
        self._reordered: dict[int, _Reordered] = {}
        self._forwards = self._shadows()
        self.keeps_copies = False

    def _shadows(self) -> dict[bool, list[_Shadow]]:
        return {
            reordered: [_Shadow(self._forward, layer, reordered) for layer in self.layers]
            for reordered in (False, True)
        }

    def refresh(self, model: Any) -> None:
        """``model``'s layers read again (a layer replaced or wrapped since), and the reordered
        copies made anew where there are some (a weight written through ``.data``, which leaves
        no trace `reordered` could see). In the model's thread, outside `installed`."""
        self.layers = _linear_layers(model)
        self._forwards = self._shadows()
        self._reordered.clear()
        if self.keeps_copies:
            self.reorder()

    def reorder(self) -> None:
        """Reorders every layer's weight now (``installed(reordered=True)`` reads the copies)."""
        for layer in self.layers:
            self.reordered(layer.weight)
        self.keeps_copies = True

    def release(self) -> None:
        """Frees the reordered copies."""
        self._reordered.clear()
        self.keeps_copies = False

    @property
    def nbytes(self) -> int:
        """The memory the reordered copies take."""
        return sum(r.weight.numel() * r.weight.element_size() for r in self._reordered.values())

    def reordered(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight``'s copy in oneDNN's layout (made again if ``weight`` changed since)."""
        entry = self._reordered.get(id(weight))
        if entry is None or not entry.current(weight):
            entry = self._reordered[id(weight)] = _Reordered.of(weight)
        return entry.copy

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, reordered: bool
    ) -> Any:
        """``linear(x, weight, bias)`` on oneDNN (over the weight's reordered copy if
        ``reordered``)."""
        read = self.reordered(weight) if reordered else weight
        return onednn_linear(x, read, bias)

    @contextmanager
    def installed(self, reordered: bool = False) -> Iterator[None]:
        """Within this block the layers run on oneDNN (``reordered``: over the reordered copies,
        once `reorder` made them), wherever they are called from."""
        forwards = self._forwards[reordered and self.keeps_copies]
        shadowed = [i for i, layer in enumerate(self.layers) if "forward" not in layer.__dict__]
        for i in shadowed:
            self.layers[i].forward = forwards[i]  # type: ignore[method-assign]
        try:
            yield
        finally:
            for i in shadowed:
                del self.layers[i].forward

    def function(self, reordered: bool) -> Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]:
        """What a layer's shadowed ``forward`` computes, as a function of the layer and its input
        (``reordered``: over the reordered copies, once `reorder` made them): for a forward that
        calls no layer (`rag_lookahead.runtime.direct`), so nothing needs shadowing."""
        return self._reordered_forward if reordered and self.keeps_copies else self._plain_forward

    def _reordered_forward(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self._forward(layer, True, x)

    def _plain_forward(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self._forward(layer, False, x)

    def _forward(self, layer: torch.nn.Linear, reordered: bool, x: Any) -> Any:
        weight, bias = layer.weight, layer.bias
        if _fits_input(x) and (bias is None or _fits_bias(bias, weight)):
            # A weight whose reordered copy is current fitted when the copy was made.
            entry = self._reordered.get(id(weight)) if reordered else None
            if entry is not None and entry.current(weight):
                return onednn_linear(x, entry.copy, bias)
            if _fits_weight(weight):
                return self.linear(x, weight, bias, reordered)
        return torch.nn.functional.linear(x, weight, bias)


def _linear_layers(model: Any) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear and _fits_weight(m.weight)]


class _Shadow(functools.partial[Any]):
    """A layer's ``forward`` while `OneDnnLayers.installed` runs it on oneDNN."""


def shadows_forward(value: Any) -> bool:
    """Whether ``value`` is a layer's ``forward`` shadowed by `OneDnnLayers.installed` (the
    engine's own, for one forward: not a change of the model)."""
    return type(value) is _Shadow


def torch_linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """What ``layer`` computes of ``x`` as torch's own class does."""
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


def _fits_weight(weight: Any) -> bool:
    return (
        type(weight) in (torch.Tensor, torch.nn.Parameter)
        and weight.dtype is _F32
        and weight.device.type == "cpu"
        and weight.layout == torch.strided
        and weight.dim() == 2
    )


def _fits_bias(bias: Any, weight: torch.Tensor) -> bool:
    return (
        type(bias) in (torch.Tensor, torch.nn.Parameter)
        and bias.dtype is _F32
        and bias.device.type == "cpu"
        and bias.shape == (weight.shape[0],)
    )


def _fits_input(x: Any) -> bool:
    """Whether oneDNN computes a layer's ``linear`` of ``x`` as torch's would, up to rounding."""
    return (
        type(x) is torch.Tensor
        and not torch.is_grad_enabled()
        and x.dtype is _F32
        and x.device.type == "cpu"
        and x.layout == torch.strided
        and x.dim() >= 2
        and x.numel() > 0
    )


@dataclass(frozen=True)
class LinearKernels:
    """The kernel of a forward's fp32 linear layers by its tokens (all rows together): from
    each entry's least tokens on, its kernel (``torch``, ``onednn`` or ``reordered``: a
    `Backend`'s ``linear``), ascending; ``layers`` runs the model's layers on the two oneDNN
    kernels."""

    classes: tuple[tuple[int, str], ...] = ((1, "torch"),)
    layers: OneDnnLayers | None = field(default=None, compare=False, repr=False)

    @classmethod
    def one(cls, kernel: str, layers: OneDnnLayers | None = None) -> LinearKernels:
        return cls(((1, kernel),), layers)

    def kernel(self, tokens: int) -> str:
        """The kernel of a forward of ``tokens`` tokens."""
        kernel = "torch"
        for least, name in self.classes:
            if tokens >= least:
                kernel = name
        return kernel

    def running(self, tokens: int) -> AbstractContextManager[Any]:
        """Within this block the model's fp32 CPU linear layers run on the kernel of a forward
        of ``tokens`` tokens."""
        kernel = self.kernel(tokens)
        if kernel == "torch" or self.layers is None:
            return nullcontext()
        return self.layers.installed(reordered=kernel == "reordered")

    def function(self, tokens: int) -> Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]:
        """A layer's output for its input, on the kernel of a forward of ``tokens`` tokens (as
        the layer computes it within `running`), as a function of the layer and its input."""
        kernel = self.kernel(tokens)
        if kernel == "torch" or self.layers is None:
            return torch_linear
        return self.layers.function(reordered=kernel == "reordered")

    def __str__(self) -> str:
        """The kernels in one word (`kernels_name`), e.g. ``torch,4:reordered``."""
        return kernels_name(self.classes)


def linear_weights(model: Any, every: bool = False) -> list[tuple[torch.Tensor, int]]:
    """One fp32 CPU linear weight per shape of ``model``'s, with how many layers have that
    shape (``every``: each distinct weight, with how many layers share it)."""
    shapes: dict[Any, tuple[torch.Tensor, int]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is torch.nn.Linear and _fits_weight(weight):
            assert isinstance(weight, torch.Tensor)
            key = id(weight) if every else tuple(weight.shape)
            first, count = shapes.get(key, (weight, 0))
            shapes[key] = (first, count + 1)
    return list(shapes.values())
