"""Runners for a trial: a timer or a probe runs its forwards on a runner of its own, on the
candidate `Backend` it tries, never on the engine's (whose backend stays as it is meanwhile).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from rag_lookahead.runtime.attention import attention_used
from rag_lookahead.runtime.backend import Backend, BatchLayout, Source
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.kernels import OneDnnLayers
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.threads import ModelThread

__all__ = ["TORCH", "dtype_tolerance", "model_backend", "trial_runner"]

# Every forward's linear layers on torch's own kernel.
TORCH: tuple[tuple[int, str], ...] = ((1, "torch"),)


def model_backend(model: Any) -> Backend:
    """What follows from ``model`` and its device alone, the rest as plainly as it runs: torch's
    kernel, the model's own forward, padded batches, trees not yet probed (taken as verified)."""
    device = next(model.parameters()).device
    return Backend(
        device=str(device),
        dtype=str(model.dtype).removeprefix("torch."),
        attention=str(attention_used(model, device)),
        linear=TORCH,
        forward="model",
        batch_layout="padded",
        tree_problem=None,
        sources=dict.fromkeys(("device", "dtype", "attention"), Source.MODEL),
    )


def trial_runner(
    model: Any,
    thread: ModelThread,
    *,
    linear: tuple[tuple[int, str], ...] = TORCH,
    layers: OneDnnLayers | None = None,
    direct: DirectForward | None = None,
    batch_layout: BatchLayout = "padded",
) -> ModelRunner:
    """A runner of ``model`` for one trial: on the ``linear`` kernels (over ``layers``), by
    ``direct`` where given (else the model's own forward), its batches laid out so."""
    backend = replace(
        model_backend(model),
        linear=linear if layers is not None else TORCH,
        forward="direct" if direct is not None else "model",
        batch_layout=batch_layout,
    )
    return ModelRunner(model, backend, layers=layers, direct=direct, thread=thread)


def dtype_tolerance(model: Any) -> float:
    """How far a probe's logits may be from the reference's, relative to their largest: fp32's
    rounding, or a half precision's."""
    return 1e-3 if model.dtype == torch.float32 else 5e-2
