"""How the engine's forwards run on one model, as one printable record: the `Backend`.

What the forwards run on is decided when the engine is built (and again after the model's
structure changed): the linear layers' kernel for each class of forwards by their tokens, the
model's direct forward or its own, batched steps' rows packed side by side or padded, whether
the model verifies draft trees. Some of it is measured, some read back from the disk cache an
earlier process of the machine wrote, some named by the user, some follows from the model and
its device. The tuning wing (`rag_lookahead.tuning`) chooses; the `ModelRunner` runs what the
record says; `LookaheadEngine.backend`, the benchmark's JSON and the server report it, each
choice with where it came from (`Source`), so that two processes decoding at different speeds
show why.

Defined here, below the tuning wing, because the runner is built from it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["KERNELS", "STEP_KINDS", "Backend", "BatchLayout", "Forward", "Source", "StepKind", "kernels_name"]

# The kernels of fp32 linear layers on a CPU (`rag_lookahead.runtime.kernels`): torch's own,
# oneDNN's over the weights as they are, oneDNN's over a copy reordered into its layout.
KERNELS = ("torch", "onednn", "reordered")

# The forward: `rag_lookahead.runtime.direct`'s (checked against the model's own at each forward,
# which runs wherever the model changed since) or the model's own.
Forward = Literal["direct", "model"]

# A batched step's rows: side by side, unpadded, each over its own cache (``packed``), or
# padded to the widest row.
BatchLayout = Literal["packed", "padded"]

# How a step's forward runs: over the growing caches (``eager``), or as a static-shape step
# (`rag_lookahead.runtime.static`) over fixed buffers, run as it is (``static``) or replayed
# from CUDA graphs captured per bucket (``captured``).
StepKind = Literal["eager", "static", "captured"]
STEP_KINDS = ("eager", "static", "captured")

# The choices a `Backend` records a source for, in the order it prints them.
_CHOICES = ("device", "dtype", "attention", "linear", "forward", "batch_layout", "trees", "captured", "step")


class Source(enum.Enum):
    """Where one of a `Backend`'s choices came from."""

    MEASURED = "measured"  # timed or probed in this process
    CACHED = "cached"  # read back from the disk cache (an earlier process timed it)
    NAMED = "named"  # named by the user (`LookaheadConfig`)
    MODEL = "model"  # follows from the model and its device: nothing to choose


@dataclass(frozen=True)
class Backend:
    """How the forwards of one model run (see the module's docstring).

    Attributes:
        device: Where the model's weights are (``"cpu"``, ``"cuda:0"``).
        dtype: Its weights' dtype (``"float32"``).
        attention: The attention function its forwards run with (the model's configured one, or
            ``rag_lookahead_sdpa`` on a CPU: `rag_lookahead.runtime.attention`).
        linear: For each class of forwards by their tokens, from its least tokens on, the kernel
            of the fp32 linear layers (`KERNELS`), ascending from one token.
        forward: ``"direct"`` or ``"model"`` (`Forward`).
        batch_layout: ``"packed"`` or ``"padded"`` (`BatchLayout`).
        tree_problem: Why the model cannot verify draft trees (it then decodes plainly), or
            ``None`` where it can.
        captured: The static step's buckets captured as CUDA graphs for replay, as
            ``"rows x width"`` (`rag_lookahead.runtime.static.Bucket`), largest first.
        sources: Where each choice came from, by its name (``"trees"`` for ``tree_problem``).
        step: How the batch's steps run (`StepKind`): the runner's static step runs them
            where ``"static"`` or ``"captured"``.
        step_problem: Why the step is not the one the config named (or, with ``"auto"`` on a
            CUDA device, why it is not captured); ``None`` where it is.
    """

    device: str
    dtype: str
    attention: str
    linear: tuple[tuple[int, str], ...]
    forward: Forward
    batch_layout: BatchLayout
    tree_problem: str | None
    captured: tuple[str, ...] = ()
    sources: Mapping[str, Source] = field(default_factory=dict)
    step: StepKind = "eager"
    step_problem: str | None = None

    def __post_init__(self) -> None:
        leasts = [least for least, _ in self.linear]
        if not leasts or leasts[0] != 1 or leasts != sorted(set(leasts)):
            raise ValueError(f"a backend's linear classes must ascend from one token, got {self.linear!r}")
        if any(kernel not in KERNELS for _, kernel in self.linear):
            raise ValueError(f"a backend's linear kernels must be among {KERNELS}, got {self.linear!r}")
        if self.forward not in ("direct", "model"):
            raise ValueError(f"a backend's forward must be 'direct' or 'model', got {self.forward!r}")
        if self.batch_layout not in ("packed", "padded"):
            raise ValueError(f"a backend's batches must be 'packed' or 'padded', got {self.batch_layout!r}")
        if self.batch_layout == "packed" and self.tree_problem is not None:
            raise ValueError("a backend that cannot verify trees has no batched steps to pack")
        if self.step not in STEP_KINDS:
            raise ValueError(f"a backend's step must be among {STEP_KINDS}, got {self.step!r}")
        if self.step == "captured" and not self.device.startswith("cuda"):
            raise ValueError(f"captured steps replay CUDA graphs: a backend on {self.device} cannot")
        unknown = set(self.sources) - set(_CHOICES)
        if unknown or not all(isinstance(source, Source) for source in self.sources.values()):
            raise ValueError(f"a backend's sources name its choices ({', '.join(_CHOICES)}) by a Source")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    @property
    def trees(self) -> bool:
        """Whether the model verifies draft trees (else it decodes plainly)."""
        return self.tree_problem is None

    @property
    def linear_name(self) -> str:
        """The linear kernels in one word (`kernels_name`), e.g. ``torch,2:reordered``."""
        return kernels_name(self.linear)

    def kernel(self, tokens: int) -> str:
        """The linear kernel of a forward of ``tokens`` tokens (all rows together)."""
        kernel = "torch"
        for least, name in self.linear:
            if tokens >= least:
                kernel = name
        return kernel

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON values (the benchmark's JSON, the server's ``/version``)."""
        return {
            "device": self.device,
            "dtype": self.dtype,
            "attention": self.attention,
            "linear": self.linear_name,
            "linear_classes": [[least, kernel] for least, kernel in self.linear],
            "forward": self.forward,
            "batch_layout": self.batch_layout,
            "trees": self.trees,
            "tree_problem": self.tree_problem,
            "captured": list(self.captured),
            "step": self.step,
            "step_problem": self.step_problem,
            "sources": {name: source.value for name, source in self.sources.items()},
        }

    def __str__(self) -> str:
        """One line: each choice, and in brackets where it came from, e.g. ``cpu float32,
        attention rag_lookahead_sdpa (model); linear torch,2:reordered (cached); forward direct
        (measured); batches packed (measured); trees verified (measured)``."""
        trees = "verified" if self.trees else f"not verified: {self.tree_problem}"
        parts = [
            f"{self.device} {self.dtype}, attention {self.attention}{self._from('attention')}",
            f"linear {self.linear_name}{self._from('linear')}",
            f"forward {self.forward}{self._from('forward')}",
            f"batches {self.batch_layout}{self._from('batch_layout')}",
            f"trees {trees}{self._from('trees')}",
        ]
        if self.captured:
            parts.append(f"captured {','.join(self.captured)}{self._from('captured')}")
        if self.step != "eager" or self.step_problem is not None:
            why = f" ({self.step_problem})" if self.step_problem is not None else ""
            parts.append(f"step {self.step}{self._from('step')}{why}")
        return "; ".join(parts)

    def _from(self, choice: str) -> str:
        source = self.sources.get(choice)
        return "" if source is None else f" ({source.value})"


def kernels_name(classes: tuple[tuple[int, str], ...]) -> str:
    """``torch``, ``onednn``, ``reordered``, or by class, e.g. ``torch,4:reordered`` (the cost
    curves' key)."""
    kernels = [name for _, name in classes]
    if len(set(kernels)) == 1:
        return kernels[0]
    return ",".join(name if least == 1 else f"{least}:{name}" for least, name in classes)
