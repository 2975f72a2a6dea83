"""Which step the batch runs (`Backend.step`): eager, static, or captured, and the
`StaticStep` it runs on (`rag_lookahead.runtime.static`).

``"auto"`` runs eager for now. On a CUDA device a replayed graph saves the launches that bound
a small model's eager step, so ``"auto"`` is meant to capture there; it will once the GPU
check (``benchmarks/cuda/captured.sh``) has confirmed the captured answers and their speed on
a real device, which no session has run yet. On a CPU there are no launches to save, and the
static step's padding and its attention over every slot column cost more than they save
(measured in `benchmarks/`). A step named in the config runs where the model can run it;
where it cannot (an attention without tree masks, a hook a replay would skip, not a CUDA
device, no capture that succeeded) the backend runs eager and says why (``step_problem``):
the answers are the same either way. A static step, once built, is kept for the engine's
life (its slot memory reused), captured again where a change of the model asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from rag_lookahead.config import StepChoice
from rag_lookahead.progress import progress_bar
from rag_lookahead.runtime.backend import Backend, Source, StepKind
from rag_lookahead.runtime.static import Buckets, StaticStep, capture_problem, static_problem

__all__ = ["StepSettings", "chosen_step"]


@dataclass(frozen=True)
class StepSettings:
    """What the engine's config says of its step (`LookaheadConfig.step`,
    ``max_model_len``, ``max_batch_size``)."""

    named: StepChoice = "eager"
    max_len: int = 4096  # each slot's columns, cut to the model's positions
    rows: int = 8  # the most rows a step takes

    def __post_init__(self) -> None:
        if self.named not in ("auto", "eager", "static", "captured"):
            raise ValueError(f"a step is 'auto', 'eager', 'static' or 'captured', not {self.named!r}")
        if min(self.max_len, self.rows) < 1:
            raise ValueError("a static step needs at least one row and one column")

    def buckets(self) -> Buckets:
        """Row counts: the powers of two below ``rows``, then ``rows``; the default widths."""
        ladder = [1 << i for i in range(self.rows.bit_length()) if 1 << i < self.rows]
        return Buckets(rows=(*ladder, self.rows))

    def columns(self, model: Any) -> int:
        """``max_len`` cut to the positions ``model`` has."""
        text = model.config.get_text_config(decoder=True)
        positions = getattr(text, "max_position_embeddings", None)
        return min(self.max_len, positions) if isinstance(positions, int) else self.max_len


def chosen_step(
    model: Any,
    backend: Backend,
    settings: StepSettings,
    earlier: StaticStep | None = None,
    progress: bool = False,
) -> tuple[Backend, StaticStep | None]:
    """``backend`` with its step chosen for ``model`` as it is now, and the static step that
    runs it (``earlier``'s, captured again, where it still fits); ``None`` where eager. With
    ``progress``, a bar while the buckets are captured."""
    kind, problem = _wanted(model, backend, settings)
    step = None
    if kind != "eager":
        try:
            step = earlier if _fits(earlier, model, settings) else _built(model, settings)
        except torch.OutOfMemoryError as err:  # (the slots of every layer, allocated at once)
            kind, problem = "eager", f"no memory for the slots: {err}"
    if step is not None and kind == "captured":
        _capture(step, progress)
        if not step.captured:
            kind, problem, step = "eager", "; ".join(step.record.problems[-1:]), None
    source = Source.MODEL if settings.named == "auto" else Source.NAMED
    captured = tuple(map(str, step.captured)) if step is not None else ()
    sources = {**backend.sources, "step": source, **({"captured": Source.MEASURED} if captured else {})}
    chosen = replace(backend, step=kind, step_problem=problem, captured=captured, sources=sources)
    return chosen, step


def _wanted(model: Any, backend: Backend, settings: StepSettings) -> tuple[StepKind, str | None]:
    """The step to try, and why it is not the one named (``None``: it is)."""
    named = settings.named
    if named in ("eager", "auto"):  # (see the module's docstring)
        return "eager", None
    if backend.tree_problem is not None:
        return "eager", f"the model verifies no draft trees ({backend.tree_problem})"
    if named == "static":
        problem = static_problem(model)
        return ("eager", problem) if problem is not None else ("static", None)
    problem = capture_problem(model)
    return ("eager", problem) if problem is not None else ("captured", None)


def _fits(step: StaticStep | None, model: Any, settings: StepSettings) -> bool:
    return (
        step is not None
        and step.model is model
        and step.max_len == settings.columns(model)
        and step.buckets == settings.buckets()
    )


def _built(model: Any, settings: StepSettings) -> StaticStep:
    return StaticStep(model, settings.columns(model), settings.buckets())


def _capture(step: StaticStep, progress: bool) -> None:
    buckets = step.buckets.all()
    what = "capturing the step's CUDA graphs"
    with progress_bar(progress, what, total=len(buckets), unit="bucket") as bar:
        step.capture(done=lambda _: bar.update(1))
