"""The matrix kernel of the engine's forwards on CPU: oneDNN's for fp32 linear layers.

torch computes an fp32 ``linear`` on CPU with its BLAS (MKL in the PyPI wheels). For the few
rows a decoding step feeds it — one token, a draft tree, a batch of trees — that is far from
the best kernel on some CPUs: on an AMD EPYC, MKL multiplies 2 or 3 rows one at a time and
more rows at several times the cost of one, where the cost of oneDNN's (also inside torch, the
library its compiled CPU graphs call) grows far more slowly with the rows
(`benchmarks/README.md`, *oneDNN linear layers*). A wider forward is what drafting pays for,
so its kernel decides what drafting gains.

Within `onednn_linear` every fp32 ``torch.nn.functional.linear`` on CPU in this thread runs on
oneDNN instead (a `TorchFunctionMode`: the model's code and weights are untouched, and other
threads are not affected). The values are the same up to rounding, as between any two kernels
(or two shapes of one kernel: a draft tree's rows already differ from a one-token step's in
their last bits); greedy outputs are checked against ``generate`` by the test suite and every
benchmark. Anything else — autograd, other dtypes or devices, a torch without the operator —
runs as it would.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from rag_lookahead.config import CpuLinear

__all__ = [
    "LinearKernels",
    "OneDnnLinear",
    "faster_linear",
    "linear_used",
    "onednn_available",
    "onednn_linear",
]

_LINEAR = torch.nn.functional.linear


@cache
def onednn_available() -> bool:
    """Whether this torch has oneDNN's linear operator for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass(frozen=True)
class LinearKernels:
    """The kernel of a forward's fp32 linear layers by its tokens (all rows together): from
    each entry's least tokens on, its kernel, ascending."""

    classes: tuple[tuple[int, str], ...] = ((1, "torch"),)

    @classmethod
    def one(cls, kernel: str) -> LinearKernels:
        return cls(((1, kernel),))

    def onednn(self, tokens: int) -> bool:
        """Whether a forward of ``tokens`` tokens runs its linear layers on oneDNN."""
        kernel = "torch"
        for least, name in self.classes:
            if tokens >= least:
                kernel = name
        return kernel == "onednn"

    def __str__(self) -> str:
        """``torch``, ``onednn``, or by class, e.g. ``torch,4:onednn`` (the cost curves' key)."""
        kernels = [name for _, name in self.classes]
        if len(set(kernels)) == 1:
            return kernels[0]
        return ",".join(name if least == 1 else f"{least}:{name}" for least, name in self.classes)


# The classes of forwards by their tokens that ``"auto"`` chooses a kernel for, each timed at
# one size in it: (least tokens, tokens timed, whether the output head runs over all of them).
# A plain step; a draft (2 or 3 rows are already a matrix product, not a vector's); a wide
# draft or a batch; a prompt's chunk (its logits are read at its last token alone).
_CLASSES = ((1, 1, True), (2, 4, True), (8, 16, True), (64, 256, False))


def linear_used(model: Any, device: torch.device, choice: CpuLinear) -> LinearKernels:
    """The kernels the engine's forwards of ``model`` on ``device`` run fp32 linear layers with
    (``"auto"``: the faster of the two for its layers by a forward's tokens, `faster_linear`,
    timed now)."""
    applies = choice != "torch" and device.type == "cpu" and model.dtype == torch.float32
    if not (applies and onednn_available()):
        return LinearKernels.one("torch")
    return faster_linear(model) if choice == "auto" else LinearKernels.one("onednn")


def faster_linear(
    model: Any, classes: Sequence[tuple[int, int, bool]] = _CLASSES, repeats: int = 3
) -> LinearKernels:
    """Which kernel multiplies ``model``'s linear layers faster here, for each class of forwards
    by their tokens (``(least tokens, tokens timed, with the head)``: a plain step, a draft, a
    batch, a prompt's chunk): every distinct
    weight timed with both kernels in turn, weighted by how many layers share its shape, the
    median of ``repeats``. CPUs differ: on some AMD EPYCs oneDNN's kernel is much faster than
    MKL's for a few rows, on some Intel Xeons slower for one."""
    weights = _distinct_weights(model)
    if not weights:
        return LinearKernels.one("torch")
    head = (
        getattr(model.get_output_embeddings(), "weight", None)
        if hasattr(model, "get_output_embeddings")
        else None
    )
    chosen = []
    with torch.inference_mode():
        for least, count, with_head in classes:
            timed = [(w, n) for w, n in weights if with_head or w is not head]
            seconds: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats):
                for onednn in (False, True):  # in turn: a change in load meets both
                    seconds[onednn].append(_layers_seconds(timed, count, onednn))
            faster = statistics.median(seconds[True]) < statistics.median(seconds[False])
            chosen.append((least, "onednn" if faster else "torch"))
    merged = [entry for i, entry in enumerate(chosen) if i == 0 or entry[1] != chosen[i - 1][1]]
    return LinearKernels(((1, merged[0][1]), *merged[1:]))


def _distinct_weights(model: Any) -> list[tuple[torch.Tensor, int]]:
    """One fp32 linear weight per shape of ``model``'s, with how many layers have that shape."""
    shapes: dict[tuple[int, ...], tuple[torch.Tensor, int]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            first, count = shapes.get(tuple(weight.shape), (weight, 0))
            shapes[tuple(weight.shape)] = (first, count + 1)
    return list(shapes.values())


def _layers_seconds(weights: Sequence[tuple[torch.Tensor, int]], rows: int, onednn: bool) -> float:
    """Seconds of every linear layer of one forward of ``rows`` tokens, on one kernel."""
    total = 0.0
    with onednn_linear(onednn):
        for weight, count in weights:
            x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)  # [rows, in]
            started = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            total += (time.perf_counter() - started) * count
    return total


class OneDnnLinear(TorchFunctionMode):
    """fp32 CPU ``linear`` calls without autograd go to oneDNN; everything else runs as is."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is _LINEAR and _onednn_fits(*args, **kwargs):
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return func(*args, **kwargs)


def _onednn_fits(x: Any, weight: Any, bias: Any = None) -> bool:
    """Whether oneDNN computes this ``linear`` exactly as torch's would, up to rounding."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (
        not torch.is_grad_enabled()
        and all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)
        and all(
            t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided for t in tensors
        )
        and weight.dim() == 2
        and x.dim() >= 2
        and x.shape[-1] == weight.shape[1]
        and (bias is None or bias.shape == (weight.shape[0],))
        and x.numel() > 0
    )


@contextmanager
def onednn_linear(enabled: bool) -> Iterator[None]:
    """Within this block (in this thread), fp32 CPU linear layers run on oneDNN if ``enabled``."""
    if not enabled:
        yield
        return
    with OneDnnLinear():
        yield
