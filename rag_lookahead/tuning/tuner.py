"""The backend of one model's forwards, chosen when the engine is built and again after the
model's structure changed; and the runner that runs on it.

At load: the linear kernels (`rag_lookahead.tuning.kernel_choice`: named, read back from the
disk, or timed), then on them the direct forward's exactness, the tree probe and the packed
rows' probe (`rag_lookahead.tuning.probes`) — every probe on runners of its own — then the
batch's step (`rag_lookahead.tuning.step_choice`: eager, or a static step, captured where
named), into one `Backend`, which the engine's `ModelRunner` runs on from then on. Each call
looks whether the model changed since (`refresh`, by its `ModelState`): any change makes what
was computed from it stale (the schedulers drop their kept prompts when `generation` moves); a
change of its structure (a hook, a layer replaced or wrapped, an adapter, train() or eval(), or
a write the caller declares) has the reordered weights made again, the probes run again and the
step chosen again, in the model's thread, into a new backend; a weight replaced has the static
step's graphs captured again.
"""

from __future__ import annotations

import functools
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rag_lookahead.config import CpuLinear
from rag_lookahead.progress import progress_bar
from rag_lookahead.runtime.attention import ATTENTION_NAME
from rag_lookahead.runtime.backend import Backend, Source
from rag_lookahead.runtime.direct import DirectForward
from rag_lookahead.runtime.fingerprint import ModelState
from rag_lookahead.runtime.kernels import LinearKernels, OneDnnLayers
from rag_lookahead.runtime.kv_cache import cache_kwarg
from rag_lookahead.runtime.layer_masks import LayerMasks
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.static import StaticStep
from rag_lookahead.runtime.threads import ModelThread
from rag_lookahead.tuning.kernel_choice import chosen_linear, kernel_timer, model_layers
from rag_lookahead.tuning.probes import (
    direct_matches,
    packed_rows_match,
    training_problem,
    tree_support_problem,
)
from rag_lookahead.tuning.step_choice import StepSettings, chosen_step
from rag_lookahead.tuning.trials import model_backend

__all__ = ["ModelTuning"]


@dataclass(frozen=True)
class _Choice:
    """A backend, and the objects its runner runs on."""

    backend: Backend
    layers: OneDnnLayers | None
    direct: DirectForward | None
    static: StaticStep | None = None


class ModelTuning:
    """The backend of ``model``'s forwards and the runner on it (see the module's docstring):
    its fp32 linear layers on ``linear``'s kernels (``"auto"``'s choice kept under
    ``cache_dir`` where given, for the next process), run directly where ``direct`` and the
    model's direct forward is its own; all torch work in ``thread`` (or the process's shared
    `ModelThread`). ``progress``: bars while the first choice is timed and probed (the
    kernels' timings, then the probes, each named as it runs: `rag_lookahead.progress`)."""

    def __init__(
        self,
        model: Any,
        linear: CpuLinear = "auto",
        direct: bool = True,
        cache_dir: Path | None = None,
        thread: ModelThread | None = None,
        progress: bool = False,
        step: StepSettings | None = None,
    ) -> None:
        self.model = model
        self.thread = thread or ModelThread.shared()
        self._wants_direct = direct
        self._step = step or StepSettings()
        first = functools.partial(
            _first_choice, model, self.thread, linear, direct, cache_dir, progress, self._step
        )
        chosen = self.thread.call(first)
        self.runner = ModelRunner(
            model,
            chosen.backend,
            layers=chosen.layers,
            direct=chosen.direct,
            static=chosen.static,
            thread=self.thread,
        )
        self._static = chosen.static  # the one built, its slots kept while the engine lives
        self._state = ModelState.of(model)
        self._state_lock = threading.Lock()
        self.generation = 0  # changes of the model seen: what was computed before one is stale
        # Changes of the model's structure seen (`refresh`), and the one the backend is for.
        self._structure = 0
        self._derived = 0
        self._warned: Backend | None = None  # the last backend whose tree problem was told
        self._warning = threading.Lock()
        self._tell_step(None)

    @property
    def backend(self) -> Backend:
        """What the runner runs on now."""
        return self.runner.backend

    def refresh(self, untracked: bool = False) -> int:
        """The model's changes seen so far (`generation`), after looking whether it changed
        since the last look (its `ModelState`: weights, modules, hooks, mode), once per call,
        in the caller's thread. After a change of its structure the backend is derived again,
        in the model's thread, before this returns. ``untracked``: the caller says the model
        changed where torch records nothing (a write through ``.data``), taken as a change of
        its structure."""
        state = ModelState.of(self.model)
        with self._state_lock:
            change = "structure" if untracked else state.change_from(self._state)
            self._state = state
            if change is not None:
                self.generation += 1
            if change == "structure":
                self._structure += 1
            generation = self.generation
        if change == "structure":
            told = self.runner.backend
            self.thread.call(self._derive_again)  # now, not in the middle of a step
            self._tell_step(told)
        elif change == "weights" and self.runner.static is not None:
            self.thread.call(self._capture_again)
        return generation

    def tree_problem(self) -> str | None:
        """Why this model cannot verify draft trees (the backend's ``tree_problem``), or
        ``None``; warned once per backend that has one."""
        backend = self.runner.backend
        if backend.tree_problem is None:
            return None
        with self._warning:
            fresh, self._warned = self._warned is not backend, backend
        if fresh:
            warnings.warn(
                f"rag-lookahead: this model cannot verify draft trees ({backend.tree_problem}); "
                "decoding plainly, without lookahead. Outputs are unaffected.",
                stacklevel=5,
            )
        return backend.tree_problem

    def _tell_step(self, told: Backend | None) -> None:
        """Say why the step is not the one named, once per backend that has a reason
        (``told``: the backend before, whose reason was told already if it was the same)."""
        backend = self.runner.backend
        problem = backend.step_problem
        if problem is None or (told is not None and told.step_problem == problem):
            return
        warnings.warn(
            f"rag-lookahead: the batch's steps run {backend.step}, not {self._step.named} "
            f"({problem}). Outputs are unaffected.",
            stacklevel=4,
        )

    def _capture_again(self) -> None:
        """In the model's thread: the buckets captured again where a weight was replaced (a
        replay reads the weights where they were when captured)."""
        runner, static = self.runner, self.runner.static
        if static is not None and static.weights_moved():
            static.capture()
            backend = replace(runner.backend, captured=tuple(map(str, static.captured)))
            runner.use(backend, layers=runner.linear.layers, direct=runner.direct, static=static)

    def _derive_again(self) -> None:
        """After a change of the model's structure, in the model's thread (which runs one thing
        at a time, so it is derived once however many threads saw the change): its linear
        layers read again, with their reordered copies (a weight written through ``.data`` left
        no trace); its direct forward probed again where the one it has no longer applies (built
        in training mode, or with a hook since removed: an earlier one is kept, as it applies
        again once the model is as it was); the trees and packed rows probed again."""
        structure = self._structure  # (a change seen meanwhile has it derived again)
        if self._derived == structure:
            return
        runner, kept = self.runner, self.runner.backend
        layers = runner.linear.layers
        if layers is not None:
            layers.refresh(self.model)
        kernels = LinearKernels(kept.linear, layers)
        direct, forward = _forward_choice(self.model, self.thread, kernels, self._wants_direct, runner.direct)
        problem = _tree_problem(self.model, runner.cache_arg, runner.layer_masks)
        sources = (kept.sources.get("linear", Source.MEASURED), forward)
        choice = _probed(self.model, self.thread, kernels, direct, problem, sources)
        backend, static = chosen_step(self.model, choice.backend, self._step, self._static)
        self._static = static or self._static
        runner.use(backend, layers=choice.layers, direct=choice.direct, static=static)
        self._derived = structure


# What the probes' bar counts, each named as it starts.
_PROBES = ("the direct forward", "draft trees", "packed batch rows")


def _first_choice(
    model: Any,
    thread: ModelThread,
    linear: CpuLinear,
    direct: bool,
    cache_dir: Path | None,
    progress: bool,
    step: StepSettings,
) -> _Choice:
    """The backend ``model`` runs on as it is now: its kernels chosen (timed by runners of their
    own, on the direct forward where ``direct``), then everything else probed on them, then
    its step (captured, where ``step`` asks for it: with bars if ``progress``)."""
    device = next(model.parameters()).device

    def timer() -> Any:
        return kernel_timer(model, model_layers(model), thread, direct)

    kernels, source = chosen_linear(model, device, linear, timer, cache_dir, progress)
    what = "probing the model's forwards (exactness, draft trees, batches)"
    with progress_bar(progress, what, total=len(_PROBES), unit="probe") as bar:
        bar.set_postfix_str(_PROBES[0])
        forward, forward_source = _forward_choice(model, thread, kernels, direct, None)
        _probe_done(bar, 1)
        problem = _tree_problem(model, cache_kwarg(model), LayerMasks.of(model.config))
        _probe_done(bar, 2)
        choice = _probed(model, thread, kernels, forward, problem, (source, forward_source))
        _probe_done(bar, 3)
    backend, static = chosen_step(model, choice.backend, step, progress=progress)
    return replace(choice, backend=backend, static=static)


def _probe_done(bar: Any, done: int) -> None:
    """``done`` probes counted, and the next one named in the same line."""
    bar.set_postfix_str(_PROBES[done] if done < len(_PROBES) else "", refresh=False)
    bar.update(1)


def _forward_choice(
    model: Any, thread: ModelThread, kernels: LinearKernels, wanted: bool, earlier: DirectForward | None
) -> tuple[DirectForward | None, Source]:
    """The direct forward to run (``None``: the model's own), and where that came from: none
    unless ``wanted``; the ``earlier`` one while it still applies; a new one where it is the
    model's own bit for bit on ``kernels``; else the earlier one, which applies again once the
    model is as it read it."""
    if not wanted:
        return None, Source.NAMED
    if earlier is not None and earlier.applies():
        return earlier, Source.MEASURED
    candidate = DirectForward.of(model)
    if candidate is not None and direct_matches(model, thread, candidate, kernels.classes, kernels.layers):
        return candidate, Source.MEASURED
    if earlier is not None:
        return earlier, Source.MEASURED
    return None, Source.MODEL if candidate is None else Source.MEASURED


def _tree_problem(model: Any, cache_arg: str, masks: LayerMasks) -> str | None:
    """Why ``model`` cannot verify trees now (in training mode, or by the tree probe), or ``None``."""
    return training_problem(model) or tree_support_problem(model, cache_arg, masks)


def _probed(
    model: Any,
    thread: ModelThread,
    kernels: LinearKernels,
    direct: DirectForward | None,
    problem: str | None,
    sources: tuple[Source, Source],
) -> _Choice:
    """The backend of ``model`` on ``kernels`` and ``direct`` (where those came from:
    ``sources``), given its tree ``problem``: whether its batched steps may be packed (on the
    engine's own attention only, where the probe's packed rows give the padded ones' logits)."""
    base = model_backend(model)
    own = base.attention == ATTENTION_NAME
    packs = (
        own and problem is None and packed_rows_match(model, thread, kernels.classes, kernels.layers, direct)
    )
    backend = replace(
        base,
        linear=kernels.classes,
        forward="direct" if direct is not None else "model",
        batch_layout="packed" if packs else "padded",
        tree_problem=problem,
        sources={
            **base.sources,
            "linear": sources[0],
            "forward": sources[1],
            "batch_layout": Source.MEASURED if own else Source.MODEL,
            "trees": Source.MEASURED,
        },
    )
    return _Choice(backend, kernels.layers, direct)
