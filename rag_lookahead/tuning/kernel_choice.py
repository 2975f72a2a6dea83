"""Which kernel runs the fp32 linear layers of a forward of so many tokens on a CPU
(``cpu_linear``): named by the user, or for ``"auto"`` timed once per model and thread count —
by the engine's own forwards on each kernel in turn (`kernel_timer`: a runner of its own per
candidate kernel) — and kept on disk for the machine's next processes
(`rag_lookahead.tuning.kernel_cache`). The kernels themselves are
`rag_lookahead.runtime.kernels`'.

``"auto"`` considers the reordered kernel (oneDNN's over a copy of the weights reordered into
its layout) only where that second copy of the linear weights is small beside the machine's
memory (`reordering_fits`).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.config import CpuLinear
from rag_lookahead.planning.costs import model_digest, processor, settled
from rag_lookahead.planning.load import watch_load
from rag_lookahead.progress import progress_bar
from rag_lookahead.runtime.backend import Source
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.kernels import LinearKernels, OneDnnLayers, linear_weights, onednn_available
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.tuning.kernel_cache import Classes, cached_classes
from rag_lookahead.tuning.timers import chain_timer, chunk_timer, context_for
from rag_lookahead.tuning.trials import trial_runner

__all__ = [
    "ForwardSeconds",
    "chosen_linear",
    "faster_linear",
    "kernel_timer",
    "model_layers",
    "reordering_fits",
]

# Seconds of one forward of so many tokens (with ``True``: a prompt's chunk, its logits at its
# last token alone; else a step's) with its linear layers on the kernels given; ``None`` where
# it cannot be timed (past the model's window).
ForwardSeconds = Callable[[LinearKernels, int, bool], "float | None"]

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

# ``"auto"`` considers the reordered kernel only where the reordered copy of the weights takes
# at most this share of the machine's memory.
_REORDERED_SHARE = 0.25

# The prompt before the forwards that choose the linear kernels of a step (`kernel_timer`).
_KERNEL_CONTEXT = 128


def chosen_linear(
    model: Any,
    device: torch.device,
    choice: CpuLinear,
    forwards: Callable[[], ForwardSeconds] | None = None,
    cache_dir: Path | None = None,
    progress: bool = False,
) -> tuple[LinearKernels, Source]:
    """The kernels the engine's forwards of ``model`` on ``device`` run fp32 linear layers with,
    and where that choice came from (``"auto"``: the fastest here for its layers by a forward's
    tokens, `faster_linear`, timed once per model and thread count, by the forwards ``forwards``
    makes a timer of where given, and kept under ``cache_dir`` for the next process,
    `cached_classes`; ``reordered`` only where its copy of the weights fits, `reordering_fits`).
    Every engine over one model shares the choice and the reordered copy. ``progress``: a bar
    counting the timings while they run (`rag_lookahead.progress`)."""
    applies = choice != "torch" and device.type == "cpu" and model.dtype == torch.float32
    if not (applies and onednn_available()):
        return LinearKernels.one("torch"), Source.NAMED if choice == "torch" else Source.MODEL
    layers = model_layers(model)
    if choice in ("onednn", "reordered"):
        if choice == "reordered":
            layers.reorder()
        return LinearKernels.one(choice, layers), Source.NAMED
    chosen = _CHOSEN.setdefault(model, {})
    threads = torch.get_num_threads()
    if threads not in chosen:
        chosen[threads] = _chosen_here(model, layers, forwards, cache_dir, progress)
    return chosen[threads]


def model_layers(model: Any) -> OneDnnLayers:
    """``model``'s layers on oneDNN, one object per model (engines over it share its copies)."""
    layers = _LAYERS.get(model)
    if layers is None:
        layers = _LAYERS[model] = OneDnnLayers(model)
    return layers


def _chosen_here(
    model: Any,
    layers: OneDnnLayers,
    forwards: Callable[[], ForwardSeconds] | None,
    cache_dir: Path | None,
    progress: bool = False,
) -> tuple[LinearKernels, Source]:
    """`faster_linear`'s choice for ``model`` at this thread count: read back from
    ``cache_dir`` where a process of this machine made it before, else timed now (and stored
    there, marked as made under a load where other work shared the cores meanwhile or its
    timings did not settle), with a bar if ``progress``."""
    reorder = reordering_fits(model)

    def choose() -> tuple[Classes, bool]:
        total = len(_CLASSES) * _REPEATS * len(_kernel_names(reorder))
        what = "timing the CPU kernels (once per model and thread count)"
        with watch_load() as seen, progress_bar(progress, what, total=total, unit="forward") as bar:
            timer = forwards() if forwards is not None else None
            kernels, steady = _timed_kernels(model, _CLASSES, _REPEATS, reorder, layers, timer, bar)
        return kernels.classes, seen[0].busy or not steady

    if cache_dir is None:
        return _kernels_of(choose()[0], layers), Source.MEASURED
    import transformers

    key = {
        "model": model_digest(model),
        "processor": processor(torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "packed": reorder,  # (the key's name for it since its first version)
        "timed_by": "forwards" if forwards is not None else "layers",
        "classes": [list(entry) for entry in _CLASSES],
    }
    classes, read = cached_classes(cache_dir / "kernels", key, choose)
    return _kernels_of(classes, layers), Source.CACHED if read else Source.MEASURED


def _kernels_of(classes: Classes, layers: OneDnnLayers) -> LinearKernels:
    """The kernels of ``classes``, over ``layers`` (reordered where the reordered kernel is
    among them) unless every class runs on torch's."""
    used = {kernel for _, kernel in classes}
    if "reordered" in used:
        layers.reorder()
    return LinearKernels(classes, None if used == {"torch"} else layers)


# Per model (held weakly: they go with it), its layers on oneDNN and what ``"auto"`` chose for
# each thread count, so that engines over one model time its kernels once and keep one copy of
# its reordered weights.
_LAYERS: weakref.WeakKeyDictionary[Any, OneDnnLayers] = weakref.WeakKeyDictionary()
_CHOSEN: weakref.WeakKeyDictionary[Any, dict[int, tuple[LinearKernels, Source]]] = weakref.WeakKeyDictionary()


def reordering_fits(model: Any) -> bool:
    """Whether a reordered copy of ``model``'s fp32 CPU linear weights takes at most
    ``_REORDERED_SHARE`` of this machine's memory (``False`` where that is not known)."""
    needed = sum(w.numel() * w.element_size() for w, _ in linear_weights(model, every=True))
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return False
    return needed <= _REORDERED_SHARE * memory


def kernel_timer(model: Any, layers: OneDnnLayers, thread: ModelThread, direct: bool) -> ForwardSeconds:
    """Seconds of the engine's forward of so many tokens after a short prompt (a step's chained
    draft tokens, or a prompt's chunk) on the linear kernels given, each on a runner of its own,
    ``None`` past the model's window: the forwards `chosen_linear` chooses the kernels by.
    Timed as the forwards will run: directly, with ``direct``, where the model has a direct
    forward (only its speed counts here; it is probed for exactness once the kernels are
    chosen), else by the model's own."""
    forward = DirectForward.of(model) if direct else None
    prefill = trial_runner(model, thread, direct=forward)
    context = context_for(prefill, _KERNEL_CONTEXT)
    try:
        step, chunk = chain_timer(prefill, context), chunk_timer(prefill, context)
    except Exception:  # a direct forward the probe would refuse: the model's own
        forward = None
        prefill = trial_runner(model, thread)
        step, chunk = chain_timer(prefill, context), chunk_timer(prefill, context)
    window = getattr(model.config, "max_position_embeddings", None) or 512
    runners: dict[Classes, ModelRunner] = {}

    def seconds(kernels: LinearKernels, tokens: int, prompt: bool) -> float | None:
        if context + tokens > window:
            return None
        runner = runners.get(kernels.classes)
        if runner is None:
            runner = runners[kernels.classes] = trial_runner(
                model, thread, linear=kernels.classes, layers=layers, direct=forward
            )
        try:
            return chunk(runner, tokens) if prompt else step(runner, tokens)
        except Exception:  # a forward this model does not run so: timed on its layers
            return None

    return seconds


def faster_linear(
    model: Any,
    classes: Sequence[tuple[int, int, bool]] = _CLASSES,
    repeats: int = _REPEATS,
    reorder: bool = False,
    layers: OneDnnLayers | None = None,
    forwards: ForwardSeconds | None = None,
) -> LinearKernels:
    """Which kernel multiplies ``model``'s linear layers fastest here (torch's, oneDNN's, and
    with ``reorder`` oneDNN's over reordered weights), for each class of forwards by their
    tokens (``(least tokens, tokens timed, with the head)``: a plain step, a draft, a batch, a
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
    return _timed_kernels(model, classes, repeats, reorder, layers, forwards)[0]


def _timed_kernels(
    model: Any,
    classes: Sequence[tuple[int, int, bool]],
    repeats: int,
    reorder: bool,
    layers: OneDnnLayers | None,
    forwards: ForwardSeconds | None,
    bar: Any = None,
) -> tuple[LinearKernels, bool]:
    """`faster_linear`'s choice, and whether it settled: each class's chosen kernel timed at
    its least twice within `_SETTLED` (else a burst of other work may have decided it).
    ``bar``, a `tqdm` bar, counts the timings: ``len(classes) * repeats`` per kernel."""
    weights, every = linear_weights(model), linear_weights(model, every=True)
    if not weights:
        return LinearKernels.one("torch"), True
    layers = layers or OneDnnLayers(model)
    head = (
        getattr(model.get_output_embeddings(), "weight", None)
        if hasattr(model, "get_output_embeddings")
        else None
    )
    copies_before = layers.keeps_copies
    if reorder:
        layers.reorder()
    kernels = _kernel_names(reorder)
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
                    if bar is not None:
                        bar.update(1)
            fastest = min(kernels, key=lambda kernel: min(seconds[kernel]))
            chosen.append((least, fastest))
            steady = steady and settled(seconds[fastest], _SETTLED)
    merged = [entry for i, entry in enumerate(chosen) if i == 0 or entry[1] != chosen[i - 1][1]]
    used = {kernel for _, kernel in merged}
    if "reordered" not in used and not copies_before:
        layers.release()  # the reordered copies are not kept
    return LinearKernels(((1, merged[0][1]), *merged[1:]), None if used == {"torch"} else layers), steady


def _kernel_names(reorder: bool) -> tuple[str, ...]:
    """The kernels `_timed_kernels` times (the reordered one where its copy fits)."""
    return ("torch", "onednn", "reordered") if reorder else ("torch", "onednn")


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
            layers.linear(x, weight, None, reordered=kernel == "reordered")
        total += (time.perf_counter() - started) * count
    return total
