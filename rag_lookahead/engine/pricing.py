"""What forwards cost, in one object the scheduler asks: how much of each draft a step pays
for, when a joining prompt rides in the running rows' steps, how big a chunk goes apart; and
the costs a ``mode="auto"`` engine plans with, taken in once (`prepare_costs`).

The costs are the engine's `CostModel` (timed once by the tuning wing, or read from the disk
cache, `rag_lookahead.tuning.cost_timing`) as the steps' own timings calibrate them
(`observe`): batched steps per row count and width class, prompts' chunks forwarded alone per
size class, one row's steps by draft size and context.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.tree import StepDraft
from rag_lookahead.engine.request import Call, Decoder
from rag_lookahead.engine.step import StepPlan
from rag_lookahead.models import default_cache_dir
from rag_lookahead.planning.costs import (
    Calibration,
    CostCurve,
    CostModel,
    CurveCheck,
    StepCalibration,
    model_digest,
)
from rag_lookahead.planning.planner import (
    StepPlanner,
    fused_prefill,
    lone_prefill,
    plan_batch,
    plan_packed,
    separate_prefill,
)
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.streaming.stats import UndraftedReason
from rag_lookahead.tuning.bucket_costs import BucketCosts, bucket_costs
from rag_lookahead.tuning.cost_timing import TimedCurve, batch_curves, step_curve

__all__ = ["Pricing", "PromptForwards", "prepare_costs"]

# The widest draft per row that batch costs are measured for (wider is extrapolated): in a
# batch the spare compute is shared, and on a CPU a few tokens per row already use it up.
_BATCH_WIDTH = 6
# What of its prefill rate a prompt forwarded while no other call runs gives up, in smaller
# chunks, so that calls arriving meanwhile need not wait for all of it.
_LONE_LOSS = 0.05


@dataclass(frozen=True)
class PromptForwards:
    """The prompts' forwards run alone so far (a chunk apart, or a prompt that had the batch
    to itself): how many, their tokens and their seconds. A chunk riding in the batch's steps
    is not among them (its forward is the running rows' too)."""

    forwards: int = 0
    tokens: int = 0
    seconds: float = 0.0


class Pricing:
    """The batch's forward costs on one model, as calibrated by the forwards so far.

    Until the costs are measured (`measured`) nothing is priced: drafts are verified whole,
    joining prompts are prefilled apart, in chunks of ``max_tokens_per_forward``.

    Where the batch's steps run on a static step (``widest`` says its widest bucket), every
    step's rows are padded to a bucket: no row is planned wider than the widest one, and no
    step is packed.
    """

    def __init__(
        self,
        costs: CostModel,
        max_tokens_per_forward: int,
        packed: Callable[[], bool] = lambda: False,
        widest: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.costs = costs  # the engine's, shared with its variants and every planner
        self.max_tokens_per_forward = max_tokens_per_forward
        self.packed = packed  # whether batched steps run packed (the runner's answer, once probed)
        # The static step's widest bucket, where the batch's steps run on one (the runner's
        # answer: `ModelRunner.static`), else None.
        self.widest = widest
        self.calibration = Calibration()  # batched steps, by rows and width class
        # The one-row curve is measured for drafts, a few tokens wide, and only extrapolated
        # to a prompt's chunks: how much steeper or flatter the prompts forwarded alone find
        # it past its last measured size.
        self.prompts = Calibration()
        self.width = 1  # the running rows' drafts in the last step: what a join plans against
        self.prompt_forwards = PromptForwards()  # replaced, never changed: readable from any thread
        # Each size class's calibrated end, for the curve it was priced on.
        self._prefill_curve: CostCurve | None = None
        self._prefill_classes: dict[int, float] = {}

    @property
    def measured(self) -> bool:
        """Whether the costs are measured (`CostModel.batched` then stands in for a missing
        batch curve with the one-row curve)."""
        return self.costs.curve is not None

    # ------------------------------------------------------------------ prices

    def step_seconds(self, rows: int, width: int) -> float:
        """Seconds of a forward of ``rows`` rows ``width`` wide (once `measured`).

        The batch curves are measured a few tokens wide and extrapolated past that, where a
        joining prompt's chunk widens every row; a batch is never priced below its tokens in
        one row forwarded alone (`prefill_seconds`), which is what its linear layers cost at
        least. A static step's buckets are timed at every width a step may have: nothing is
        extrapolated, and a bucket's rows cost what it was timed at, not one row's extrapolated
        curve."""
        curve, batched = self._curve(), self.costs.batched()
        assert batched is not None, "priced before the costs were measured"
        if rows == 1:
            return curve(width)
        calibrated = batched(rows, width) * self.calibration.factor(rows, width)
        if self.widest() is not None:
            return calibrated
        return max(calibrated, self.prefill_seconds(rows * width))

    def prefill_seconds(self, tokens: int) -> float:
        """Seconds of a prompt's chunk of ``tokens`` forwarded alone, as calibrated so far:
        never less for more tokens (each class of sizes learns its own ratio)."""
        curve = self._curve()
        last = curve.sizes[-1]
        if tokens <= last:
            return curve(tokens)
        return max(self._class_end(curve, size) for size in Calibration.class_ends(tokens, last + 1))

    def row_share(self, decode_rows: int) -> float:
        """What a step loses by a call not decoding in it yet: a row's share of its cost (a
        plain step's, for calls decoding outside the batch)."""
        if not self.measured:
            return 0.0
        if decode_rows == 0:
            return self.step_seconds(1, 1)
        return self.step_seconds(decode_rows, self.width) / decode_rows

    # ------------------------------------------------------------------ decisions

    def should_fuse(self, decode_rows: int, remaining: int) -> bool:
        """Whether a prompt of ``remaining`` tokens to prefill costs the ``decode_rows``
        running rows less in their steps' forwards than forwarded apart between them."""
        if not self.measured or decode_rows == 0:
            return False
        limit, share = self._forward_limit(decode_rows + 1), self.row_share(decode_rows)
        fused = fused_prefill(
            [remaining], decode_rows, self.width, self.step_seconds, limit, share, self._curve()
        )
        return fused.rate >= separate_prefill(remaining, self.prefill_seconds, limit, share).rate

    def prefill_chunk(self, remaining: int, decode_rows: int) -> int:
        """The chunk of a prompt of ``remaining`` tokens to forward apart, between two steps
        of the ``decode_rows`` running rows.

        Sized on the one-row curve as measured: on the calibrated one, a larger class timed in
        a slow moment would make smaller chunks look cheaper per token, and smaller chunks cost
        more per token and keep the call out of the batch for more steps."""
        curve = self.costs.curve
        if curve is None:
            return min(remaining, self.max_tokens_per_forward)
        share = self.row_share(decode_rows)
        return separate_prefill(remaining, curve, self.max_tokens_per_forward, share).tokens

    def fused_chunk(self, remaining: Sequence[int], decode_rows: int, width: int) -> int:
        """The tokens of each prompt (``remaining`` each) that ride in a step with
        ``decode_rows`` rows of drafts ``width`` wide (see `fused_prefill`)."""
        limit = self._forward_limit(decode_rows + len(remaining))
        if not self.measured:
            rows = decode_rows + len(remaining)
            return max(min(max(remaining), limit // rows), width, 1)
        share = self.row_share(decode_rows)
        return fused_prefill(
            remaining, decode_rows, width, self.step_seconds, limit, share, self._curve()
        ).tokens

    def plan_drafts(
        self, calls: Sequence[Call], decoders: Sequence[Decoder], proposals: Sequence[StepDraft]
    ) -> list[StepDraft]:
        """What of each call's proposed draft the step verifies; a call whose step verifies
        none is told why (`StepRecorder.plan`, for its stats' ``undrafted_steps``)."""
        planned = self._plan_drafts(calls, decoders, proposals)
        for call, proposal, plan in zip(calls, proposals, planned, strict=True):
            call.recorder.plan(_undrafted(proposal, plan))
        return planned

    def _plan_drafts(
        self, calls: Sequence[Call], decoders: Sequence[Decoder], proposals: Sequence[StepDraft]
    ) -> list[StepDraft]:
        bucket = self.widest()  # a static step's widest bucket: no row planned wider
        if len(calls) == 1:
            decoder = decoders[0]
            cached = len(calls[0].ids) - 1  # all but the root
            room = decoder.stopping.context_room()
            return [decoder.planner.plan(proposals[0], room, cached, widest=bucket)]
        # Several rows: side rows stay out (each would widen every row), the plan is joint, by
        # width, against the batch costs as calibrated so far.
        ranked = [decoder.planner.rank(draft) for decoder, draft in zip(decoders, proposals, strict=True)]
        if bucket is not None:
            ranked = [r.cut(bucket) for r in ranked]
        widest = max(len(r.tree) for r in ranked)
        measured = self.costs.batched() is not None
        if measured and self._packs():  # each row as wide as its own nodes are worth
            most = sum(len(r.tree) for r in ranked)
            by_tokens = self._by_tokens(len(calls), most)
            return [StepDraft(tree) for tree in plan_packed(ranked, by_tokens, self.max_tokens_per_forward)]
        by_width = self._by_width(len(calls), widest) if measured else None
        return [StepDraft(tree) for tree in plan_batch(ranked, by_width, self.max_tokens_per_forward)]

    # ------------------------------------------------------------------ learning

    def observe(self, plan: StepPlan, seconds: float, cached: int) -> None:
        """The batch ran ``plan`` in ``seconds`` (its one row held ``cached`` tokens before,
        when it had one): every later decision is priced from it."""
        rows = len(plan.rows)
        packed = rows > 1 and self._packs()
        width = plan.tokens / rows if packed else plan.width  # tokens per row the forward ran
        if not plan.prompts:
            self.width = math.ceil(width)
        if rows > 1:
            batched = self.costs.batched()
            if batched is not None:
                self.calibration.record(rows, math.ceil(width), batched(rows, width), seconds)
        elif plan.prompts:
            self.observe_prompt(plan.width, seconds)
        else:  # calibrates the one-row curve (planning only; tokens never change)
            self.costs.observe(plan.width, seconds, context=cached)

    def observe_prompt(self, tokens: int, seconds: float) -> None:
        """A prompt's chunk of ``tokens`` forwarded alone took ``seconds``."""
        done = self.prompt_forwards
        self.prompt_forwards = PromptForwards(done.forwards + 1, done.tokens + tokens, done.seconds + seconds)
        curve = self.costs.curve
        if curve is None or tokens <= curve.sizes[-1] or curve(tokens) <= curve(curve.sizes[-1]):
            return
        beyond = curve(curve.sizes[-1])
        self.prompts.record(1, tokens, curve(tokens) - beyond, max(seconds - beyond, 1e-6))
        self._prefill_classes.clear()

    def lone_chunk(self, remaining: int, most: int) -> int:
        """The chunk of a prompt of ``remaining`` tokens to forward while no other call runs,
        up to ``most`` (`lone_prefill`, on the prompts' calibrated costs); all of it until the
        costs are measured."""
        if not self.measured:
            return remaining
        least = self.max_tokens_per_forward
        return lone_prefill(remaining, self.prefill_seconds, least, most, _LONE_LOSS)

    # ------------------------------------------------------------------ helpers

    def _packs(self) -> bool:
        """Whether batched steps run packed: a static step pads its rows to a bucket, whatever
        the backend's layout."""
        return self.widest() is None and self.packed()

    def _forward_limit(self, rows: int) -> int:
        """The most tokens a step of ``rows`` rows forwards: ``max_tokens_per_forward``, and
        on a static step no row wider than its widest bucket (a joining prompt's chunk too)."""
        bucket = self.widest()
        limit = self.max_tokens_per_forward
        return limit if bucket is None else min(limit, bucket * rows)

    def _curve(self) -> CostCurve:
        curve = self.costs.curve
        assert curve is not None, "priced before the costs were measured"
        return curve

    def _class_end(self, curve: CostCurve, size: int) -> float:
        """A prompt's chunk of ``size`` tokens (a class's end) priced past the curve's last
        measured size by its class's ratio; kept until a prompt recalibrates the classes or the
        curve is replaced (a joint plan prices every width, each over the classes below it)."""
        if self._prefill_curve is not curve:
            self._prefill_curve, self._prefill_classes = curve, {}
        price = self._prefill_classes.get(size)
        if price is None:
            last = curve(curve.sizes[-1])
            price = self._prefill_classes[size] = last + (curve(size) - last) * self.prompts.factor(1, size)
        return price

    def _by_tokens(self, rows: int, most: int) -> Callable[[int], float]:
        """Seconds of a packed step of ``rows`` rows by its tokens (up to ``most``): priced as
        so many tokens spread evenly over the rows, between the calibrated widths around."""
        by_width = self._by_width(rows, math.ceil(most / rows) + 1)

        def seconds(tokens: int) -> float:
            width = max(tokens / rows, 1.0)
            low = math.floor(width)
            return by_width(low) + (width - low) * (by_width(low + 1) - by_width(low))

        return seconds

    def _by_width(self, rows: int, widest: int) -> Callable[[int], float]:
        """Seconds of a step of ``rows`` rows by width, as calibrated, never cheaper for a
        wider step: each width class has its own calibration, and a wider class calibrated
        lower than a narrower one must not make the plan draft wider to save time."""
        batched = self.costs.batched()
        assert batched is not None
        calibrated = (batched(rows, w) * self.calibration.factor(rows, w) for w in range(1, widest + 1))
        seconds = list(itertools.accumulate(calibrated, max))
        return lambda width: seconds[min(width, widest) - 1]


def _undrafted(proposal: StepDraft, plan: StepDraft) -> UndraftedReason | None:
    """Why ``plan``, made of ``proposal``, verifies no draft (``None``: it verifies one)."""
    if len(plan.tree) > 1:
        return None
    return "not_worth_it" if len(proposal.tree) > 1 else "no_draft"


def prepare_costs(
    runner: ModelRunner,
    costs: CostModel,
    planner: StepPlanner,
    config: LookaheadConfig,
    cache_dir: Path | None,
    *,
    remeasure: bool,
    progress: bool,
    batches: bool = True,
) -> CostCurve:
    """The costs ``config`` may plan with, timed on ``runner`` (or read from ``cache_dir``) into
    ``costs`` (the batches' only with ``batches``: without, a batch is priced by one row's curve
    over its tokens, as its steps calibrate it), and the stored acceptance statistics loaded
    into ``planner``; the one-row curve.
    The forwards run (timed once the device has done them) calibrate the curve
    (`StepCalibration`), and a curve read from the disk or measured under a load is checked
    against them (`CurveCheck`), and forgotten on disk if they contradict it
    (`CostModel.retire_contradicted`).
    Where the batch's steps run on a static step (`ModelRunner.static`), the costs are its
    buckets' forwards, timed now whatever ``remeasure`` says (`bucket_costs`: never on disk)."""
    directory = (cache_dir or default_cache_dir()) / "costs"
    how = {"remeasure": remeasure, "progress": progress}
    size = config.decoding_length + 1 + config.window_size * (config.ngram_size - 1)
    if runner.static is not None:
        rows = config.max_batch_size if batches else 1
        timed = _take_buckets(costs, bucket_costs(runner.static, rows, size, progress=progress), batches)
    else:
        timed = step_curve(runner, size, directory, **how)  # every variant plans with it
        _take_curve(costs, timed)
        if batches:
            width = min(_BATCH_WIDTH, config.decoding_length + 1)
            costs.batch = batch_curves(runner, config.max_batch_size, width, directory, **how)
    # What drafts of each source the model accepted in earlier processes: a fresh engine
    # plans its first questions with it rather than with a guess.
    acceptance = (cache_dir or default_cache_dir()) / "acceptance"
    digest = model_digest(runner.model)
    planner.load_acceptance(acceptance / f"acceptance-{digest}.json", {"model": digest})
    return timed.curve


def _take_buckets(costs: CostModel, buckets: BucketCosts, batches: bool) -> TimedCurve:
    """A static step's bucket costs planned with from now on (the batches' with ``batches``):
    its one-row curve taken as one measured now (nothing on disk to forget)."""
    timed = TimedCurve(buckets.one_row, fresh=True, context=0, forget=lambda: False)
    _take_curve(costs, timed)
    if batches:
        costs.batch = buckets.batch
    return timed


def _take_curve(costs: CostModel, timed: TimedCurve) -> None:
    """``timed``'s curve planned with from now on: learned afresh (unless it is the one already
    held, read back again by another variant: what was learned of it stands), and checked
    against the forwards unless measured now on a quiet machine."""
    held = costs.calibration is not None and costs.forget is not None  # read back, not given
    if timed.curve == costs.curve and not timed.fresh and held:
        return
    costs.curve = timed.curve
    costs.calibration = StepCalibration()
    trusted = timed.fresh and not timed.curve.loaded
    costs.check = None if trusted else CurveCheck(context=timed.context)
    costs.forget = timed.forget
