"""What a forward pass costs: measured once per (model, processor, dtype, threads), cached on disk,
and corrected by the forwards really run.

On a CPU a forward over 8 new tokens costs about twice one over a single token; on a GPU the
curve is nearly flat for dozens of tokens. The draft budget is chosen against this curve, as
the steps' own timings calibrate it (`StepCalibration`): by width, and by the context they
attend to, which the curve (timed after a short one) does not see.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import platform
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from rag_lookahead.files import exclusive, keep_cache, read_cache

__all__ = [
    "BatchCosts",
    "Calibration",
    "CostCurve",
    "CostModel",
    "CurveCheck",
    "StepCalibration",
    "cached_curve",
    "curve_key",
    "forget_curve",
    "measure_curve",
    "model_digest",
    "most_forwards",
    "processor",
    "settled",
    "sparse_sizes",
]

FORMAT = "rag-lookahead-costs"
# 1: sparse sizes, forced non-decreasing; 2: medians of three, kept however spread; 3: least
# times, kept as measured (a v3 file does not say whether a load shared its cores: measured again)
VERSION = 4
MAX_AGE_SECONDS = 30 * 24 * 3600
# A curve measured while other work shared the cores is kept this long only: a later process,
# on a machine that may be quiet by then, measures its own.
LOADED_MAX_AGE_SECONDS = 3600
# The most rounds `measure_curve` times a size in, by default (a size settled sooner stops).
_MAX_ROUNDS = 6


@dataclass(frozen=True)
class CostCurve:
    """Forward seconds for ``sizes[i]`` new tokens over a cache, interpolated in between.

    The seconds are fitted monotone on construction (measured, read back or given alike): each
    is the most of its own and every smaller size's, a running maximum from the left. A forward
    over more tokens does a smaller one's work and more; a size timed cheaper than a smaller
    one is a kernel shape or a load that hindered the smaller sizes, and the plan must not draft
    wider to save time on it. Pricing the larger size up, never the smaller ones down, errs
    toward drafting less: the direction that cannot make ``auto`` slower than plain decoding
    (the forwards really run correct the rest, `StepCalibration`). ``loaded`` marks a curve
    measured while other work shared the cores: cached briefly (`LOADED_MAX_AGE_SECONDS`) and
    checked against the forwards run (`CurveCheck`).
    """

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    loaded: bool = False

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds) or self.sizes[0] != 1:
            raise ValueError("a cost curve needs matching sizes and seconds, starting at size 1")
        if list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError("cost curve sizes must increase")
        if not all(math.isfinite(s) and s > 0 for s in self.seconds):
            raise ValueError("cost curve seconds must be finite and positive")
        object.__setattr__(self, "seconds", tuple(itertools.accumulate(map(float, self.seconds), max)))

    def __call__(self, tokens: float) -> float:
        """Seconds for a forward over ``tokens`` new tokens (linear between and beyond the
        measured points; a fraction: a packed batch's tokens per row)."""
        sizes, secs = self.sizes, self.seconds
        if tokens <= sizes[0]:
            return secs[0]
        for i in range(1, len(sizes)):
            if tokens <= sizes[i]:
                frac = (tokens - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
                return secs[i - 1] + frac * (secs[i] - secs[i - 1])
        slope = (secs[-1] - secs[0]) / max(sizes[-1] - 1, 1)
        return secs[-1] + slope * (tokens - sizes[-1])

    @classmethod
    def flat(cls) -> CostCurve:
        """Every size costs the same: drafting is free (an idle GPU, roughly)."""
        return cls((1,), (1.0,))


@dataclass(frozen=True)
class BatchCosts:
    """Forward seconds of a batch by its width (tokens per row), one curve per number of rows.

    Measured for a few row counts; in between, the two nearest are interpolated. A batched
    forward is not priced by its total tokens: several rows each attend to their own cache,
    and kernels take other paths than for one row (on a CPU a second token per row can cost
    as much as the first).
    """

    curves: tuple[tuple[int, CostCurve], ...]  # (rows, seconds by width), rows increasing

    def __post_init__(self) -> None:
        rows = [n for n, _ in self.curves]
        if not rows or rows != sorted(set(rows)) or rows[0] < 2:
            raise ValueError("batch costs need increasing row counts of at least 2")

    def __call__(self, rows: int, width: float) -> float:
        """Seconds of a forward over ``rows`` rows of ``width`` tokens each (on average, when
        packed)."""
        below = [(n, c) for n, c in self.curves if n <= rows] or [self.curves[0]]
        above = [(n, c) for n, c in self.curves if n >= rows] or [self.curves[-1]]
        (low, low_curve), (high, high_curve) = below[-1], above[0]
        if high == low:
            return low_curve(width) * max(rows, 1) / low if rows > high else low_curve(width)
        frac = (rows - low) / (high - low)
        return low_curve(width) + frac * (high_curve(width) - low_curve(width))


@dataclass
class CostModel:
    """The forward costs of one model on its device, kept in one place: the engine holds it
    (measuring writes it, `rag_lookahead.engine.pricing.prepare_costs`), every planner of the
    model and the scheduler read it, so an engine variant made before a measurement plans with
    it too."""

    curve: CostCurve | None = None  # one row, by new tokens
    batch: BatchCosts | None = None  # several rows, by width
    # Watches a curve read from the disk cache, or measured under a load, against the forwards
    # really timed (None: a curve measured quietly in this process, or given).
    check: CurveCheck | None = None
    # The curve as one row's steps find it, by width and context (None: the curve as it is,
    # where a forward's time is not known when it returns, or for a curve given).
    calibration: StepCalibration | None = None
    # Forgets the checked curve on disk (`forget_curve`; None: nothing stored to forget).
    forget: Callable[[], object] | None = field(default=None, repr=False, compare=False)
    _claim: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _contradicted: bool = field(default=False, repr=False, compare=False)
    _explored: tuple[CostCurve, frozenset[int], CostCurve] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def given(cls, curve: CostCurve | None) -> CostModel:
        """The costs of a curve given rather than measured here: planned with as it is, unless
        it is marked ``loaded`` (timed while other work shared the cores, wherever it came
        from); then the steps calibrate it and check it, as a measured loaded one
        (`in_doubt`)."""
        if curve is None or not curve.loaded:
            return cls(curve)
        return cls(curve, check=CurveCheck(), calibration=StepCalibration())

    @property
    def in_doubt(self) -> bool:
        """Whether the curve's shape (each width's cost against one token's) is in doubt:
        measured under a load, or contradicted by the forwards run since (`CurveCheck`). A load
        inflates some widths more than others, so such a curve can price a draft out that
        pays; the plan then drafts into the widths no step timed yet (`explored`)."""
        curve, check = self.curve, self.check
        if curve is None:
            return False
        return curve.loaded or self._contradicted or (check is not None and check.contradicted())

    def retire_contradicted(self) -> bool:
        """Whether the forwards run so far contradict the checked curve in a way only measuring
        it again mends (`CurveCheck`); then, for one caller only (the check ends with it), the
        curve is forgotten on disk, so that the next process measures its own. This one plans
        by the curve as its forwards calibrate it: no call waits for a measurement, and one
        taken now, while calls run, would be a loaded one."""
        with self._claim:
            if self.check is None or not self.check.stale():
                return False
            self.check, forget, self._contradicted = None, self.forget, True
        if forget is not None:
            forget()
        return True

    def observe(self, tokens: int, seconds: float, *, context: int) -> None:
        """One row's forward over ``tokens`` new tokens after ``context`` cached ones took
        ``seconds`` (for `CurveCheck` and `StepCalibration`)."""
        curve, check, calibration = self.curve, self.check, self.calibration
        if curve is None:
            return
        predicted = curve(tokens)
        if check is not None:
            check.record(predicted, seconds, tokens=tokens, context=context)
        if calibration is not None:
            calibration.record(tokens, context, predicted, seconds)

    def priced(self, context: int) -> CostCurve | None:
        """One row's forward seconds by new tokens after ``context`` cached ones: the curve as
        the steps timed so far calibrate it (still monotone), or as it is."""
        curve, calibration = self.curve, self.calibration
        if curve is None or calibration is None:
            return curve
        return calibration.apply(curve, context)

    def explored(self, context: int) -> CostCurve | None:
        """What one row's plan prices its draft with after ``context`` cached tokens: `priced`,
        except that a curve `in_doubt` prices each width class no step has timed yet (after any
        context) as the width below it. The plan decides by the curve's ratios (a width's cost
        against one token's), and a loaded curve's ratios are the load's: rather than have them
        keep every draft out (then no step would ever time a wider forward to correct them),
        the draft is verified into such a class, and its steps time it (`StepCalibration`,
        from its ``least``-th timing); from then on their ratio decides. A measurement is not
        waited for, and drafting never stops meanwhile."""
        priced, calibration = self.priced(context), self.calibration
        if priced is None or calibration is None or not self.in_doubt:
            return priced
        timed = calibration.timed_widths()
        if all(size.bit_length() in timed for size in priced.sizes):
            return priced
        kept = self._explored
        if kept is not None and kept[0] is priced and kept[1] == timed:
            return kept[2]
        seconds = list(priced.seconds)
        for i in range(1, len(seconds)):
            if priced.sizes[i].bit_length() not in timed:
                seconds[i] = seconds[i - 1]
        explored = CostCurve(priced.sizes, tuple(seconds), priced.loaded)
        self._explored = (priced, timed, explored)
        return explored

    def batched(self) -> Callable[[int, float], float] | None:
        """Seconds of a batched forward by rows and width: as measured, else one row's curve
        over all the batch's tokens (a `Calibration` corrects it), else nothing to plan with."""
        if self.batch is not None:
            return self.batch
        curve = self.curve
        if curve is None:
            return None
        return lambda rows, width: curve(rows * width)


class Calibration:
    """How much batched forwards really cost over what `BatchCosts` says, learned step by step.

    The batch costs were measured at a short context and a few tokens per row (or are missing,
    and a row's curve stands in); real rows hold RAG prompts, and the curve is extrapolated past
    its widths. The ratio observed / predicted is kept per row count and per width class (1,
    2-3, 4-7, 8-15, ... tokens per row: the error grows with the width, so one ratio for every
    width would price wide steps too low and narrow ones too high), smoothed, and multiplies
    the prediction. A cell not seen yet takes the ratio of the nearest seen class, from the
    nearest row count among those: a prompt's chunk widens a step into a class that drafts
    rarely reach, and once one such step was timed, steps as wide over other rows are priced
    from it rather than from narrow ones.
    """

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self._ratios: dict[tuple[int, int], float] = {}

    def factor(self, rows: int, width: int) -> float:
        return _nearest(self._ratios, rows, width.bit_length())

    @staticmethod
    def class_ends(size: int, least: int = 1) -> list[int]:
        """The largest size of every class from ``least``'s up to below ``size``'s, then
        ``size``: within a class one ratio applies, so a price that grows with the size grows
        within it, and its highest over these sizes is the least price for ``size`` that no
        smaller size (from ``least``) exceeds, whatever ratio each class learned."""
        ends = ((1 << k) - 1 for k in range(least.bit_length(), size.bit_length()))
        return [*(end for end in ends if end >= least), size]

    def record(self, rows: int, width: int, predicted: float, observed: float) -> None:
        key, ratio = (rows, width.bit_length()), observed / predicted
        old = self._ratios.get(key)
        self._ratios[key] = ratio if old is None else old + self.weight * (ratio - old)


class StepCalibration:
    """How much one row's forwards really cost over what its curve says, learned from the
    steps' own timings, by context class (0, 1, 2-3, ... 512-1023, 1024-2047 cached tokens) and
    width class (as `Calibration`'s).

    The curve was timed after a short context, perhaps while other work shared the cores: its
    level can be several times off in either direction, and its shape too (a load that hindered
    some sizes more than others), and after a long context each drafted token attends to all of
    it, so a wide step costs relatively more than the curve says. The ratio observed / predicted
    of each cell corrects all three, both ways. A cell counts from its ``least``-th timing, at
    the median of its last ``window``: one forward hindered by other work moves no price, so no
    price is stuck on one bad timing. Until then it takes the nearest counted cell's ratio (the
    nearest width class, then the nearest context class, as `Calibration` does), and with none
    counted the curve stands as it is. Thread-safe.

    `apply` runs before every step: its curve is kept per context class and made again only
    once a ratio it read has changed (its class's own, or any, where it took a nearest one).
    """

    def __init__(self, window: int = 15, least: int = 3) -> None:
        if window < 1 or not 1 <= least <= window:
            raise ValueError("a step calibration needs window >= 1 and least in [1, window]")
        self.window = window
        self.least = least
        self._timings: dict[tuple[int, int], deque[float]] = {}
        self._ratios: dict[tuple[int, int], float] = {}  # the counted cells' medians
        self._changes: dict[int, int] = {}  # by context class: how often a ratio of it changed
        self._changed = 0  # how often any ratio changed
        # By context class: (the curve, the count it was made at, whether that count is its
        # class's alone, the curve calibrated).
        self._applied: dict[int, tuple[CostCurve, int, bool, CostCurve]] = {}
        self._lock = threading.Lock()

    def record(self, tokens: int, context: int, predicted: float, observed: float) -> None:
        """A forward over ``tokens`` after ``context`` cached tokens took ``observed`` seconds,
        where the curve said ``predicted``."""
        if predicted <= 0 or not math.isfinite(observed) or observed <= 0:
            return
        key = (context.bit_length(), tokens.bit_length())
        with self._lock:
            timings = self._timings.setdefault(key, deque(maxlen=self.window))
            timings.append(observed / predicted)
            if len(timings) < self.least:
                return
            ratio = statistics.median(timings)
            if self._ratios.get(key) != ratio:
                self._ratios[key] = ratio
                self._changes[key[0]] = self._changes.get(key[0], 0) + 1
                self._changed += 1

    def timed_widths(self) -> frozenset[int]:
        """The width classes (`int.bit_length` of a width) whose steps were timed often enough
        to count, after any context."""
        with self._lock:
            return frozenset(width for _, width in self._ratios)

    def factor(self, tokens: int, context: int) -> float:
        """What the curve's price of ``tokens`` after ``context`` cached tokens is multiplied by."""
        with self._lock:
            return _nearest(self._ratios, context.bit_length(), tokens.bit_length())

    def apply(self, curve: CostCurve, context: int) -> CostCurve:
        """``curve`` as calibrated after ``context`` cached tokens (fitted monotone again: each
        width class has its own ratio, and a wide one learned lower than a narrow one must not
        make the plan draft wider to save time); the same object while no ratio it read changed."""
        group = context.bit_length()
        with self._lock:
            kept = self._applied.get(group)
            if kept is not None and kept[0] is curve:
                _, seen, own, applied = kept
                if seen == (self._changes.get(group, 0) if own else self._changed):
                    return applied
            classes = {size.bit_length() for size in curve.sizes}
            ratios = {width: _nearest(self._ratios, group, width) for width in classes}
            own = all((group, width) in self._ratios for width in classes)  # no nearest one taken
            seen = self._changes.get(group, 0) if own else self._changed
            seconds = [s * ratios[n.bit_length()] for n, s in zip(curve.sizes, curve.seconds, strict=True)]
            applied = CostCurve(curve.sizes, tuple(seconds), curve.loaded)
            self._applied[group] = (curve, seen, own, applied)
            return applied


class CurveCheck:
    """Whether the forwards really run contradict a cost curve in a way that only measuring it
    again mends (a curve read from the disk cache, or measured while other work ran).

    Forwards after at least the measured ``context`` (shorter ones are not compared) should
    cost at least what the curve says, and wide ones relatively more: every drafted token
    attends to the whole context. So the curve was measured under a load that has gone when,
    over ``samples`` forwards, even the slower half ran in under ``ratio`` of the curve's time
    (all of them, or those of one width class after one context class), or when a wider class
    ran, against the curve, in under ``ratio`` of a narrower one's time (the curve steeper than
    the forwards) over as long a context. Forwards slower than the curve, or relatively dearer
    wide, prove nothing the curve could mend (a load now, or a long context): they never call
    for a measurement, which would measure a load; `StepCalibration` prices them. Thread-safe.
    """

    def __init__(self, samples: int = 16, ratio: float = 0.6, context: int = 0) -> None:
        if samples < 1 or not 0 < ratio < 1 or context < 0:
            raise ValueError("a curve check needs samples >= 1, a ratio in (0, 1) and a context >= 0")
        self.samples = samples
        self.ratio = ratio
        self.context = context
        self._ratios: list[float] = []  # the first forwards, whatever their width
        self._cells: dict[tuple[int, int], list[float]] = {}  # by context and width class
        self._lock = threading.Lock()  # recorded by the decoding loop, asked by a new call

    def record(self, predicted: float, observed: float, *, tokens: int = 1, context: int = 0) -> None:
        if predicted <= 0 or context < self.context:
            return
        ratio = observed / predicted
        with self._lock:
            if len(self._ratios) < self.samples:
                self._ratios.append(ratio)
            cell = self._cells.setdefault((context.bit_length(), tokens.bit_length()), [])
            if len(cell) < self.samples:
                cell.append(ratio)

    def contradicted(self) -> bool:
        """Whether the forwards contradict the curve's shape, so that its ratios (a width's cost
        against one token's) may not decide alone: it is `stale`, or one-token forwards after
        about the context it was timed after (its class or the next) ran, even the faster half
        of ``samples`` of them, in over ``1 / ratio`` of its one-token time. That time was then
        taken in a quiet moment that its wider sizes, timed in others, did not share, and the
        curve prices every draft too dear against it. This calls for no measurement (it would
        measure the load): the steps time the widths (`CostModel.explored`)."""
        if self.stale():
            return True
        group = self.context.bit_length()
        with self._lock:
            ones = [r for (context, width), r in self._cells.items() if width == 1 and context <= group + 1]
        return any(len(r) >= self.samples and _faster_half(r) * self.ratio > 1 for r in ones)

    def stale(self) -> bool:
        with self._lock:
            first = list(self._ratios)
            cells = {key: _slower_half(r) for key, r in self._cells.items() if len(r) >= self.samples}
        if len(first) >= self.samples and _slower_half(first) < self.ratio:
            return True
        if any(level < self.ratio for level in cells.values()):
            return True
        return any(  # within one context class: a wider class cheaper, against the curve
            wide < self.ratio * narrow
            for (context, width), narrow in cells.items()
            for (other, wider), wide in cells.items()
            if other == context and wider > width
        )


def measure_curve(
    forward: Callable[[int], float],
    max_tokens: int,
    repeats: int = 3,
    *,
    tolerance: float = 0.1,
    max_rounds: int = _MAX_ROUNDS,
    bar: Any = None,
    sizes: Sequence[int] | None = None,
) -> CostCurve:
    """Time ``forward(k)`` (seconds of one forward over k new tokens) for each k of ``sizes``
    (every k up to ``max_tokens`` unless given; they start at 1 and end at ``max_tokens``).

    The curve fits them monotone, and interpolates in between (`CostCurve`). Rounds run over
    the sizes in turn, and each size keeps the least of its times: other work on the machine
    only ever adds time, so the least is the nearest to the forward's own cost. A size whose two
    least times still differ by more than ``tolerance`` was never timed unhindered twice: it is
    timed again, round after round, up to ``max_rounds`` rounds in all; if one still has not
    settled then, the curve is marked ``loaded``. ``bar``, a `tqdm` bar, counts the forwards:
    its total, set at the start, is the most they can be (a warm-up and ``max_rounds`` rounds
    of every size), brought down to the count once the sizes settle earlier.
    """
    if repeats < 2 or max_rounds < repeats:
        raise ValueError("measure_curve needs at least 2 repeats and max_rounds >= repeats")
    sizes = tuple(range(1, max_tokens + 1) if sizes is None else sizes)
    if not sizes or sizes[0] != 1 or sizes[-1] != max_tokens or list(sizes) != sorted(set(sizes)):
        raise ValueError(f"measure_curve's sizes must increase from 1 to max_tokens ({max_tokens})")
    if bar is not None:
        bar.total = most_forwards(len(sizes), max_rounds)
    for k in sizes:
        forward(k)  # warm-up: allocator and kernel selection for this shape
        _tick(bar)
    runs: dict[int, list[float]] = {k: [] for k in sizes}
    timed: Sequence[int] = sizes
    for round_ in range(max_rounds):
        if round_ >= repeats:
            timed = [k for k in sizes if not settled(runs[k], tolerance)]
            if not timed:
                break
        for k in timed:
            runs[k].append(forward(k))
            _tick(bar)
    if bar is not None:
        bar.total = bar.n  # the rounds left were not needed
        bar.refresh()
    loaded = not all(settled(r, tolerance) for r in runs.values())
    return CostCurve(sizes, tuple(min(runs[k]) for k in sizes), loaded)


def most_forwards(sizes: int, max_rounds: int = _MAX_ROUNDS) -> int:
    """The most forwards `measure_curve` runs over ``sizes`` sizes: a warm-up and ``max_rounds``
    rounds of each (a bar's total, known before the first)."""
    return (1 + max_rounds) * sizes


def sparse_sizes(max_tokens: int) -> tuple[int, ...]:
    """A few sizes from 1 to ``max_tokens`` that a curve is timed at (the sizes between are
    interpolated): 1, 2, 3, then each power of two and the size half-way to the next, then
    ``max_tokens``. Every width class of the steps' calibration (`StepCalibration`: 1, 2-3,
    4-7, ...) holds at least one, and the time to measure grows with the log of ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"a curve needs max_tokens >= 1, got {max_tokens}")
    picked = {1, 2, 3, max_tokens}
    power = 4
    while power < max_tokens:
        picked.update({power, power + power // 2})
        power *= 2
    return tuple(sorted(k for k in picked if k <= max_tokens))


def settled(times: Sequence[float], tolerance: float) -> bool:
    """Whether the two least of ``times`` agree within ``tolerance`` (relative): the least was
    seen twice, so it is the forward's own cost, not a lucky or a hindered one."""
    if len(times) < 2:
        return False
    first, second = sorted(times)[:2]
    return second <= first * (1 + tolerance)


def _tick(bar: Any) -> None:
    if bar is not None:
        bar.update(1)


def model_digest(model: Any) -> str:
    """A short digest of the model's configuration: what tells one model from another."""
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") else ""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def processor(device: torch.device) -> str:
    """What runs ``device``'s forwards: the GPU's name, or the CPU's (vendor, family, model and
    model name; a VM's model name alone can be as generic as "AMD EPYC") with the instruction
    set torch's kernels use. A cache directory shared by several machines (one home directory
    on many hosts) or a kernel set chosen otherwise must not plan one with another's curve."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    return f"{_cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"


@cache
def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux
        return platform.processor() or platform.machine() or "unknown CPU"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():  # the first processor's block is enough
            break
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    parts = (fields.get(name) for name in ("vendor_id", "cpu family", "model", "model name"))
    return ", ".join(part for part in parts if part) or platform.machine() or "unknown CPU"


def curve_key(
    model: Any, device: torch.device, max_tokens: int, linear: str, attention: str, forward: str = "model"
) -> dict[str, Any]:
    """What the curve depends on (``linear``: the kernels of its linear layers, a `Backend`'s;
    ``attention``: its attention's, `attention_used`; ``forward``: ``"direct"`` where the
    forwards run as `rag_lookahead.runtime.direct` has them, else ``"model"``; the `processor`);
    a cached curve with another key is stale."""
    import transformers

    return {
        "model": model_digest(model),
        "device": str(device),
        "processor": processor(device),
        "dtype": str(model.dtype),
        "attention": attention,
        "linear": linear,
        "forward": forward,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "max_tokens": max_tokens,
    }


def cached_curve(
    directory: Path,
    key: dict[str, Any],
    measure: Callable[[], CostCurve],
    *,
    remeasure: bool = False,
    waiting: str | None = None,
) -> CostCurve:
    """The curve stored for ``key`` under ``directory``, measured and stored if missing, stale
    or ``remeasure`` is set; while another process measures it, this one waits for its curve
    (saying ``waiting`` on standard error, if given)."""
    path = _curve_path(directory, key)
    asked = time.time()
    curve = None if remeasure else _read(path, key)
    if curve is not None:
        return curve
    # One process measures, another waiting meanwhile reads its curve: two measuring at once
    # would slow each other's forwards and both keep a curve that is too steep.
    with exclusive(path, waiting):
        # Measured by another process while this one waited (after it asked, if it remeasures).
        curve = _read(path, key, since=asked if remeasure else None)
        if curve is None:
            curve = measure()
            _write(path, key, curve)
    return curve


def forget_curve(directory: Path, key: dict[str, Any], curve: CostCurve) -> bool:
    """Remove the curve stored for ``key`` under ``directory`` if it is still ``curve`` (not
    one another process measured since), so that the next process measures its own; whether it
    was removed. Without waiting for the lock of a process measuring it: that one replaces it."""
    path = _curve_path(directory, key)
    if _read(path, key) != curve:
        return False
    try:
        path.unlink()
    except OSError:
        return False  # a read-only cache: the check of the next process reading it finds it again
    return True


def _curve_path(directory: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return directory / f"costs-v{VERSION}-{digest}.json"  # another version's file is left alone


def _read(path: Path, key: dict[str, Any], since: float | None = None) -> CostCurve | None:
    """The curve at ``path`` if it is for ``key``, fresh (a curve measured under a load only
    for `LOADED_MAX_AGE_SECONDS`), and measured at ``since`` or later; a malformed file is a
    miss, with a warning naming it (`read_cache`)."""
    return read_cache(path, lambda data: _curve(data, key, since), "measuring the costs again")


def _curve(data: dict[str, Any], key: dict[str, Any], since: float | None) -> CostCurve | None:
    """``data``'s curve; ``None`` where it is for another key, stale or older than ``since``."""
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} file of version {VERSION}")
    measured_at, loaded = float(data["measured_at"]), data.get("loaded", False)
    if not isinstance(loaded, bool):
        raise ValueError("'loaded' is not true or false")
    age = time.time() - measured_at
    fresh = 0 <= age < (LOADED_MAX_AGE_SECONDS if loaded else MAX_AGE_SECONDS)
    if data.get("key") != key or not fresh or (since is not None and measured_at < since):
        return None
    sizes, seconds = tuple(int(s) for s in data["sizes"]), tuple(float(s) for s in data["seconds"])
    return CostCurve(sizes, seconds, loaded)  # fitted monotone, whatever the file holds


def _write(path: Path, key: dict[str, Any], curve: CostCurve) -> None:
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "key": key,
        "measured_at": time.time(),
        "loaded": curve.loaded,
        "sizes": list(curve.sizes),
        "seconds": list(curve.seconds),
    }
    keep_cache(path, json.dumps(payload, indent=1), "the next process measures the costs again")


def _nearest(ratios: dict[tuple[int, int], float], group: int, wanted: int) -> float:
    """The ratio of cell (``group``, width class ``wanted``), else of the nearest width class
    seen, from the nearest group among those (ties: the wider class, then the larger group);
    1.0 with none seen."""
    ratio = ratios.get((group, wanted))
    if ratio is not None:
        return ratio
    seen = [(abs(c - wanted), -c, abs(n - group), -n, r) for (n, c), r in ratios.items()]
    return min(seen)[-1] if seen else 1.0


def _faster_half(ratios: Sequence[float]) -> float:
    """The most of the faster half of ``ratios`` (their median, the lower one of an even count)."""
    return sorted(ratios)[(len(ratios) - 1) // 2]


def _slower_half(ratios: Sequence[float]) -> float:
    """The least of the slower half of ``ratios`` (their median, the upper one of an even count)."""
    return sorted(ratios)[len(ratios) // 2]
