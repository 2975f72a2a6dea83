"""The matrix kernel of the engine's forwards on CPU: oneDNN's for fp32 linear layers.

torch computes an fp32 ``linear`` on CPU with its BLAS (MKL in the PyPI wheels). For the few
rows a decoding step feeds it — one token, a draft tree, a batch of trees — that is far from
the best kernel on some CPUs: on an AMD EPYC, MKL multiplies 2 or 3 rows one at a time and
more rows at several times the cost of one, where the cost of oneDNN's (also inside torch, the
library its compiled CPU graphs call) grows far more slowly with the rows
(`benchmarks/README.md`, *oneDNN linear layers*). A wider forward is what drafting pays for,
so its kernel decides what drafting gains. oneDNN is faster still when a weight was reordered
beforehand into the blocked layout its kernels read (what torch's compiled CPU graphs do when
they freeze weights): the ``packed`` kernel keeps such a copy of every fp32 linear weight — a
second copy of those weights in memory, so ``"auto"`` considers it only where that copy is
small beside the machine's memory (`packing_fits`).

Within `OneDnnLayers.installed` (an engine forward: `LinearKernels.running`) each fp32 CPU
`torch.nn.Linear` of the model runs on oneDNN: the layer's ``forward`` is shadowed by an
attribute of the instance for the block's duration, then removed — the model's code and
weights are untouched, and a layer that already has an instance ``forward`` (an accelerate
hook) is left as it is. (A `TorchFunctionMode` would do the same without touching the layers,
but it intercepts every torch call of the forward, a cost measurable in the step:
`benchmarks/README.md`, *Packed weights*.) The values are the same up to
rounding, as between any two kernels (or two shapes of one kernel: a draft tree's rows already
differ from a one-token step's in their last bits); greedy outputs are checked against
``generate`` by the test suite and every benchmark. Anything else — autograd, other dtypes or
devices, a torch without the operator — runs as it would. A weight changed in place, or
replaced by another tensor, is reordered again before its next use (a replaced weight's old
copy is kept until `OneDnnLayers.unpack`).
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.config import CpuLinear
from rag_lookahead.planning.costs import model_digest, processor, settled
from rag_lookahead.planning.load import watch_load
from rag_lookahead.runtime.kernel_cache import Classes, cached_classes

__all__ = [
    "ForwardSeconds",
    "LinearKernels",
    "OneDnnLayers",
    "faster_linear",
    "linear_used",
    "onednn_available",
    "onednn_linear",
    "packing_fits",
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
    (``packed``: over their weights reordered into oneDNN's layout, `reordered`, once `pack`
    made the copies)."""

    def __init__(self, model: Any) -> None:
        self.layers = _linear_layers(model)
        self._reordered: dict[int, _Reordered] = {}
        self._forwards = self._shadows()
        self.packs = False

    def _shadows(self) -> dict[bool, list[_Shadow]]:
        return {
            packed: [_Shadow(self._forward, layer, packed) for layer in self.layers]
            for packed in (False, True)
        }

    def refresh(self, model: Any) -> None:
        """``model``'s layers read again (a layer replaced or wrapped since), and the reordered
        copies made anew where there are some (a weight written through ``.data``, which leaves
        no trace `reordered` could see). In the model's thread, outside `installed`."""
        self.layers = _linear_layers(model)
        self._forwards = self._shadows()
        self._reordered.clear()
        if self.packs:
            self.pack()

    def pack(self) -> None:
        """Reorders every layer's weight now (``installed(packed=True)`` reads the copies)."""
        for layer in self.layers:
            self.reordered(layer.weight)
        self.packs = True

    def unpack(self) -> None:
        """Frees the reordered copies."""
        self._reordered.clear()
        self.packs = False

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

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> Any:
        """``linear(x, weight, bias)`` on oneDNN (over the reordered weight if ``packed``)."""
        read = self.reordered(weight) if packed else weight
        return onednn_linear(x, read, bias)

    @contextmanager
    def installed(self, packed: bool = False) -> Iterator[None]:
        """Within this block the layers run on oneDNN (``packed``: over reordered weights),
        wherever they are called from."""
        forwards = self._forwards[packed and self.packs]
        shadowed = [i for i, layer in enumerate(self.layers) if "forward" not in layer.__dict__]
        for i in shadowed:
            self.layers[i].forward = forwards[i]  # type: ignore[method-assign]
        try:
            yield
        finally:
            for i in shadowed:
                del self.layers[i].forward

    def function(self, packed: bool) -> Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]:
        """What a layer's shadowed ``forward`` computes, as a function of the layer and its input
        (``packed``: over reordered weights, once `pack` made them): for a forward that calls no
        layer (`rag_lookahead.runtime.direct`), so nothing needs shadowing."""
        return self._packed_forward if packed and self.packs else self._plain_forward

    def _packed_forward(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self._forward(layer, True, x)

    def _plain_forward(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self._forward(layer, False, x)

    def _forward(self, layer: torch.nn.Linear, packed: bool, x: Any) -> Any:
        weight, bias = layer.weight, layer.bias
        if _fits_input(x) and (bias is None or _fits_bias(bias, weight)):
            # A weight whose reordered copy is current fitted when the copy was made.
            entry = self._reordered.get(id(weight)) if packed else None
            if entry is not None and entry.current(weight):
                return onednn_linear(x, entry.copy, bias)
            if _fits_weight(weight):
                return self.linear(x, weight, bias, packed)
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
    each entry's least tokens on, its kernel (``torch``, ``onednn`` or ``packed``), ascending;
    ``layers`` runs the model's layers on the two oneDNN kernels."""

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
        return self.layers.installed(packed=kernel == "packed")

    def function(self, tokens: int) -> Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]:
        """A layer's output for its input, on the kernel of a forward of ``tokens`` tokens (as
        the layer computes it within `running`), as a function of the layer and its input."""
        kernel = self.kernel(tokens)
        if kernel == "torch" or self.layers is None:
            return torch_linear
        return self.layers.function(packed=kernel == "packed")

    def __str__(self) -> str:
        """``torch``, ``onednn``, ``packed``, or by class, e.g. ``torch,4:packed`` (the cost
        curves' key)."""
        kernels = [name for _, name in self.classes]
        if len(set(kernels)) == 1:
            return kernels[0]
        return ",".join(name if least == 1 else f"{least}:{name}" for least, name in self.classes)


# Seconds of one forward of so many tokens (with ``True``: a prompt's chunk, its logits at its
# last token alone; else a step's) with its linear layers on the kernels given; ``None`` where
# it cannot be timed (past the model's window).
ForwardSeconds = Callable[["LinearKernels", int, bool], "float | None"]

# The classes of forwards by their tokens that ``"auto"`` chooses a kernel for, each timed at
# one size in it: (least tokens, tokens timed, whether the output head runs over all of them).
# A plain step; a draft (2 or 3 rows are already a matrix product, not a vector's); a wide
# draft or a batch; a prompt's chunk (its logits are read at its last token alone).
_CLASSES = ((1, 1, True), (2, 4, True), (8, 16, True), (64, 256, False))

# Classes of fewer tokens than this are timed over every layer's weight, not one per shape.
_EVERY_LAYER_BELOW = 64

# Timings of each kernel per class, taken in turn; the least decides.
_REPEATS = 3
# A choice whose kernel's two least times differ by more than this is kept an hour only.
_SETTLED = 0.10

# ``"auto"`` considers the packed kernel only where the reordered copy of the weights takes at
# most this share of the machine's memory.
_PACKED_SHARE = 0.25


def linear_used(
    model: Any,
    device: torch.device,
    choice: CpuLinear,
    forwards: Callable[[], ForwardSeconds] | None = None,
    cache_dir: Path | None = None,
) -> LinearKernels:
    """The kernels the engine's forwards of ``model`` on ``device`` run fp32 linear layers with
    (``"auto"``: the fastest here for its layers by a forward's tokens, `faster_linear`, timed
    once per model and thread count, by the forwards ``forwards`` makes a timer of where
    given, and kept under ``cache_dir`` for the next process, `cached_classes`; ``packed`` only
    where its copy of the weights fits, `packing_fits`). Every engine over one model shares the
    choice and the reordered copy."""
    applies = choice != "torch" and device.type == "cpu" and model.dtype == torch.float32
    if not (applies and onednn_available()):
        return LinearKernels.one("torch")
    layers = _LAYERS.get(model)
    if layers is None:
        layers = _LAYERS[model] = OneDnnLayers(model)
    if choice == "onednn":
        return LinearKernels.one("onednn", layers)
    if choice == "packed":
        layers.pack()
        return LinearKernels.one("packed", layers)
    chosen = _CHOSEN.setdefault(model, {})
    threads = torch.get_num_threads()
    if threads not in chosen:
        chosen[threads] = _chosen_here(model, layers, forwards, cache_dir)
    return chosen[threads]


def _chosen_here(
    model: Any,
    layers: OneDnnLayers,
    forwards: Callable[[], ForwardSeconds] | None,
    cache_dir: Path | None,
) -> LinearKernels:
    """`faster_linear`'s choice for ``model`` at this thread count: read back from
    ``cache_dir`` where a process of this machine made it before, else timed now (and stored
    there, marked as made under a load where other work shared the cores meanwhile or its
    timings did not settle)."""
    pack = packing_fits(model)

    def choose() -> tuple[Classes, bool]:
        with watch_load() as seen:
            timer = forwards() if forwards is not None else None
            kernels, steady = _timed_kernels(model, _CLASSES, _REPEATS, pack, layers, timer)
        return kernels.classes, seen[0].busy or not steady

    if cache_dir is None:
        return _kernels_of(choose()[0], layers)
    import transformers

    key = {
        "model": model_digest(model),
        "processor": processor(torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "packed": pack,
        "timed_by": "forwards" if forwards is not None else "layers",
        "classes": [list(entry) for entry in _CLASSES],
    }
    return _kernels_of(cached_classes(cache_dir / "kernels", key, choose), layers)


def _kernels_of(classes: Classes, layers: OneDnnLayers) -> LinearKernels:
    """The kernels of ``classes``, over ``layers`` (reordered where ``packed`` is among them)
    unless every class runs on torch's."""
    used = {kernel for _, kernel in classes}
    if "packed" in used:
        layers.pack()
    return LinearKernels(classes, None if used == {"torch"} else layers)


# Per model (held weakly: they go with it), its layers on oneDNN and what ``"auto"`` chose for
# each thread count, so that engines over one model time its kernels once and keep one copy of
# its reordered weights.
_LAYERS: weakref.WeakKeyDictionary[Any, OneDnnLayers] = weakref.WeakKeyDictionary()
_CHOSEN: weakref.WeakKeyDictionary[Any, dict[int, LinearKernels]] = weakref.WeakKeyDictionary()


def packing_fits(model: Any) -> bool:
    """Whether a reordered copy of ``model``'s fp32 CPU linear weights takes at most
    ``_PACKED_SHARE`` of this machine's memory (``False`` where that is not known)."""
    needed = sum(w.numel() * w.element_size() for w, _ in _linear_weights(model, every=True))
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return False
    return needed <= _PACKED_SHARE * memory


def faster_linear(
    model: Any,
    classes: Sequence[tuple[int, int, bool]] = _CLASSES,
    repeats: int = _REPEATS,
    pack: bool = False,
    layers: OneDnnLayers | None = None,
    forwards: ForwardSeconds | None = None,
) -> LinearKernels:
    """Which kernel multiplies ``model``'s linear layers fastest here (torch's, oneDNN's, and
    with ``pack`` oneDNN's over reordered weights), for each class of forwards by their tokens
    (``(least tokens, tokens timed, with the head)``: a plain step, a draft, a batch, a
    prompt's chunk): each kernel in turn, the least of ``repeats`` (other work only ever adds
    time, and a burst of it meets one kernel's timing, not all).

    With ``forwards`` (seconds of one of the engine's own forwards), every class is timed by
    whole forwards (a step's tokens, or a prompt's chunk) where it times one: timed alone, the
    layers can rank the kernels otherwise than the forward does (on a busy machine, BLAS's
    one-row product kept its speed alone and lost it within the forward). Otherwise by the
    layers alone: a class of a few tokens over every layer's own weight (one weight per shape
    would be read from the cache its own last timing filled), a prompt's chunk (which computes
    far more than it reads) over one weight per shape, weighted by how many layers share it. CPUs
    differ: on some AMD EPYCs oneDNN's kernel is much faster than MKL's for a few rows, on some
    Intel Xeons slower for one. ``layers`` (the model's, `OneDnnLayers`) keep the reordered
    weights only if chosen."""
    return _timed_kernels(model, classes, repeats, pack, layers, forwards)[0]


def _timed_kernels(
    model: Any,
    classes: Sequence[tuple[int, int, bool]],
    repeats: int,
    pack: bool,
    layers: OneDnnLayers | None,
    forwards: ForwardSeconds | None,
) -> tuple[LinearKernels, bool]:
    """`faster_linear`'s choice, and whether it settled: each class's chosen kernel timed at
    its least twice within `_SETTLED` (else a burst of other work may have decided it)."""
    weights, every = _linear_weights(model), _linear_weights(model, every=True)
    if not weights:
        return LinearKernels.one("torch"), True
    layers = layers or OneDnnLayers(model)
    head = (
        getattr(model.get_output_embeddings(), "weight", None)
        if hasattr(model, "get_output_embeddings")
        else None
    )
    packed_before = layers.packs
    if pack:
        layers.pack()
    kernels = ("torch", "onednn", "packed") if pack else ("torch", "onednn")
    chosen = []
    steady = True
    with torch.inference_mode():
        for least, count, with_head in classes:
            pool = every if count < _EVERY_LAYER_BELOW else weights
            timed = [(w, n) for w, n in pool if with_head or w is not head]
            seconds: dict[str, list[float]] = {kernel: [] for kernel in kernels}
            for _ in range(repeats):
                for kernel in kernels:  # in turn: a change in load meets each
                    seconds[kernel].append(
                        _class_seconds(timed, (count, with_head), kernel, layers, forwards)
                    )
            fastest = min(kernels, key=lambda kernel: min(seconds[kernel]))
            chosen.append((least, fastest))
            steady = steady and settled(seconds[fastest], _SETTLED)
    merged = [entry for i, entry in enumerate(chosen) if i == 0 or entry[1] != chosen[i - 1][1]]
    used = {kernel for _, kernel in merged}
    if "packed" not in used and not packed_before:
        layers.unpack()  # the reordered copies are not kept
    return LinearKernels(((1, merged[0][1]), *merged[1:]), None if used == {"torch"} else layers), steady


def _linear_weights(model: Any, every: bool = False) -> list[tuple[torch.Tensor, int]]:
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


def _class_seconds(
    weights: Sequence[tuple[torch.Tensor, int]],
    timed: tuple[int, bool],
    kernel: str,
    layers: OneDnnLayers,
    forwards: ForwardSeconds | None,
) -> float:
    """Seconds of a class's forward of ``timed`` (its tokens, and whether the output head runs
    over all of them) on one kernel: one forward by ``forwards`` where it times one, else its
    linear layers alone (`_layers_seconds`)."""
    rows, with_head = timed
    seconds = forwards(LinearKernels.one(kernel, layers), rows, not with_head) if forwards else None
    return _layers_seconds(weights, rows, kernel, layers) if seconds is None else seconds


def _layers_seconds(
    weights: Sequence[tuple[torch.Tensor, int]], rows: int, kernel: str, layers: OneDnnLayers
) -> float:
    """Seconds of every linear layer of one forward of ``rows`` tokens, on one kernel."""
    total = 0.0
    for weight, count in weights:
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)  # [rows, in]
        started = time.perf_counter()
        if kernel == "torch":
            torch.nn.functional.linear(x, weight)
        else:
            layers.linear(x, weight, None, packed=kernel == "packed")
        total += (time.perf_counter() - started) * count
    return total
