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

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from rag_lookahead.config import CpuLinear

__all__ = ["OneDnnLinear", "linear_used", "onednn_available", "onednn_linear"]

_LINEAR = torch.nn.functional.linear


@cache
def onednn_available() -> bool:
    """Whether this torch has oneDNN's linear operator for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear_used(model: Any, device: torch.device, choice: CpuLinear) -> str:
    """The kernel the engine's forwards of ``model`` on ``device`` run fp32 linear layers with."""
    applies = choice == "onednn" and device.type == "cpu" and model.dtype == torch.float32
    return "onednn" if applies and onednn_available() else "torch"


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
