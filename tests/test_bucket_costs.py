"""`auto` on a static step (`rag_lookahead.runtime.static`): each bucket priced by its own
forward's time (`rag_lookahead.tuning.bucket_costs`), the costs taken from the buckets rather
than from eager forwards (`prepare_costs`), and no plan wider than the widest bucket. Only the
prices' structure is asserted (one price per bucket, never cheaper for a larger one), never a
time."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from rag_lookahead import GenerationParams, LookaheadConfig
from rag_lookahead.config import Mode
from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft
from rag_lookahead.decoding.verify import TokenChooser
from rag_lookahead.engine import pricing as pricing_module
from rag_lookahead.engine.pricing import Pricing, prepare_costs
from rag_lookahead.engine.request import Call, Decoder
from rag_lookahead.planning.costs import BatchCosts, CostCurve, CostModel
from rag_lookahead.planning.planner import StepPlanner, rank_draft
from rag_lookahead.runtime.backend import Backend
from rag_lookahead.runtime.runner import ModelRunner
from rag_lookahead.runtime.static import Bucket, Buckets, StaticStep
from rag_lookahead.streaming.stats import StepRecorder
from rag_lookahead.streaming.stopping import Stopping
from rag_lookahead.testing import CharTokenizer, tiny_model
from rag_lookahead.tuning import bucket_costs as bucket_costs_module
from rag_lookahead.tuning.bucket_costs import BucketCosts, bucket_costs

BUCKETS = Buckets(rows=(1, 2, 4), widths=(1, 4, 8))


@pytest.fixture(scope="module")
def step() -> StaticStep:
    return StaticStep(tiny_model("llama"), 48, BUCKETS)


def _assert_priced_by_bucket(costs: BucketCosts, buckets: Buckets, most: Bucket) -> None:
    """Every (rows, width) up to ``most`` costs its bucket's price, and a larger bucket never
    costs less than a smaller one."""
    timed = [b for b in buckets.all() if b.rows <= most.rows and b.width <= most.width]
    assert set(costs.seconds) == set(timed)
    curves: dict[int, Callable[[float], float]] = {1: costs.one_row}
    if costs.batch is not None:
        assert [rows for rows, _ in costs.batch.curves] == list(range(2, most.rows + 1))
        curves.update(dict(costs.batch.curves))
    assert costs.one_row.sizes == tuple(range(1, most.width + 1))
    for rows in range(1, most.rows + 1):
        for width in range(1, most.width + 1):
            assert curves[rows](width) == costs.seconds[buckets.fit(rows, width)]
    for small in timed:
        for large in timed:
            if small.rows <= large.rows and small.width <= large.width:
                assert costs.seconds[small] <= costs.seconds[large]


def test_each_bucket_has_one_price_over_its_widths_and_rows(step: StaticStep) -> None:
    costs = bucket_costs(step, 3, 7, progress=False)  # up to bucket 4x8
    _assert_priced_by_bucket(costs, BUCKETS, Bucket(4, 8))
    assert costs.batch is not None and costs.batch(3, 5) == costs.seconds[Bucket(4, 8)]
    alone = bucket_costs(step, 1, 2, progress=False)  # one row, up to width 4: nothing wider timed
    _assert_priced_by_bucket(alone, BUCKETS, Bucket(1, 4))
    assert alone.batch is None
    widest = bucket_costs(step, 99, 99, progress=False)  # capped at the step's largest bucket
    assert max(widest.seconds) == Bucket(4, 8)
    with pytest.raises(ValueError, match="max_rows"):
        bucket_costs(step, 0, 4, progress=False)


def test_a_larger_bucket_timed_cheaper_is_priced_up(step: StaticStep, monkeypatch: Any) -> None:
    """Made-up times that fall with the bucket's size (as a kernel shape or a load can make
    them): every bucket is then priced as the smallest one."""

    def timer(_: StaticStep, rows: int) -> Callable[[int], float]:
        return lambda width: 1.0 / (rows * width)

    monkeypatch.setattr(bucket_costs_module, "_timer", timer)
    costs = bucket_costs(step, 4, 8, progress=False)
    _assert_priced_by_bucket(costs, BUCKETS, Bucket(4, 8))
    assert set(costs.seconds.values()) == {1.0}


def _static_runner(step: StaticStep) -> ModelRunner:
    backend = Backend("cpu", "float32", "sdpa", ((1, "torch"),), "model", "padded", None)
    runner = ModelRunner(step.model, backend)
    runner.use(dataclasses.replace(backend, step="static"), layers=None, direct=None, static=step)
    return runner


@pytest.mark.parametrize("batches", [True, False])
def test_prepare_costs_takes_the_buckets_not_eager_forwards(
    step: StaticStep, tmp_path: Path, monkeypatch: Any, batches: bool
) -> None:
    def eager(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a static step's costs are its buckets'")

    monkeypatch.setattr(pricing_module, "step_curve", eager)
    monkeypatch.setattr(pricing_module, "batch_curves", eager)
    config = LookaheadConfig(max_batch_size=3, decoding_length=5, window_size=1, ngram_size=2)
    costs = CostModel()
    curve = prepare_costs(
        _static_runner(step),
        costs,
        StepPlanner(config, costs),
        config,
        tmp_path,
        remeasure=False,
        progress=False,
        batches=batches,
    )
    assert curve is costs.curve and curve.sizes == tuple(range(1, 9))  # 7 tokens: bucket width 8
    assert len({curve(w) for w in range(2, 5)}) == 1 and len({curve(w) for w in range(5, 9)}) == 1
    assert curve(1) <= curve(4) <= curve(8)
    if batches:
        assert isinstance(costs.batch, BatchCosts)
        assert [rows for rows, _ in costs.batch.curves] == [2, 3, 4]
        assert costs.batch(3, 6) == costs.batch(4, 8) >= curve(8)
    else:
        assert costs.batch is None
    assert not (tmp_path / "costs").exists()  # nothing kept on disk


# ---------------------------------------------------------------------- plans


def _call(config: LookaheadConfig, tokens: int = 12) -> tuple[Call, Decoder, StepDraft]:
    prompt = [1, 2, 3]
    stopping = Stopping(
        CharTokenizer(),
        eos=(15,),
        stop_strings=(),
        max_new_tokens=64,
        prompt_length=len(prompt),
        context_window=4096,
    )
    call = Call(prompt_ids=prompt, recorder=StepRecorder(prompt_tokens=len(prompt)))
    decoder = Decoder(
        config, StepPlanner(config, CostModel(CostCurve.flat())), TokenChooser(GenerationParams()), stopping
    )
    # A chain with a branch at the root: nodes in topological order.
    parents = [-1, 0, 1, -1, *range(3, tokens - 1)][:tokens]
    draft = DraftTree.from_draft(prompt[-1], list(range(20, 20 + tokens)), parents, "trie", [0.9] * tokens)
    return call, decoder, StepDraft(draft)


def _plans(pricing: Pricing, rows: Sequence[tuple[Call, Decoder, StepDraft]]) -> list[StepDraft]:
    calls, decoders, drafts = zip(*rows, strict=True)
    return pricing.plan_drafts(calls, decoders, drafts)


def _connected(tree: DraftTree) -> bool:
    return all(-1 < parent < node for node, parent in enumerate(tree.parents) if node)


@pytest.mark.parametrize("mode", ["auto", "trie"])
def test_a_single_rows_plan_is_cut_to_the_widest_bucket(mode: Mode) -> None:
    config = LookaheadConfig(mode=mode, decoding_length=16)
    row = _call(config)
    free = CostModel(CostCurve.flat())  # every width costs the same: auto verifies it all
    (whole,) = _plans(Pricing(free, 256), [row])
    assert len(whole) == 13
    (cut,) = _plans(Pricing(free, 256, widest=lambda: 4), [row])
    assert len(cut) == 4 and _connected(cut.tree)
    if mode == "trie":  # verified whole otherwise: its first nodes
        assert cut.tree.tokens == whole.tree.tokens[:4]


def test_side_rows_ride_along_only_within_the_widest_bucket() -> None:
    config = LookaheadConfig(mode="auto", decoding_length=16)
    call, decoder, draft = _call(config, tokens=2)
    side = SideRows((7, 8), (1, 2), ((0,), (0, 1)))
    with_side = StepDraft(draft.tree, side)
    free = CostModel(CostCurve.flat())
    for widest, kept in ((5, True), (4, False)):
        (plan,) = _plans(
            Pricing(free, 256, widest=functools.partial(int, widest)), [(call, decoder, with_side)]
        )
        assert len(plan.tree) == 3 and (plan.side is not None) == kept


def test_batch_plans_are_cut_to_the_widest_bucket_and_never_packed(monkeypatch: Any) -> None:
    config = LookaheadConfig(mode="auto", decoding_length=16)
    rows = [_call(config, tokens) for tokens in (12, 9, 2)]
    widths = tuple(range(1, 17))
    flat = CostCurve(widths, (1.0,) * len(widths))
    costs = CostModel(CostCurve.flat(), BatchCosts(((2, flat), (4, flat))))
    packed = _plans(Pricing(costs, 256, lambda: True), rows)
    assert sum(len(plan) for plan in packed) == 13 + 10 + 3

    def unpadded(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a static step pads its rows to a bucket: never planned packed")

    monkeypatch.setattr(pricing_module, "plan_packed", unpadded)
    for packs in (True, False):
        plans = _plans(Pricing(costs, 256, functools.partial(bool, packs), widest=lambda: 4), rows)
        assert [len(plan) for plan in plans] == [4, 4, 3]
        assert all(_connected(plan.tree) for plan in plans)


def test_a_cut_ranked_draft_keeps_its_best_nodes_in_order() -> None:
    tree = DraftTree.from_draft(5, [6, 7, 8, 9, 10], [-1, 0, -1, 2, 1], "trie", [0.9, 0.5, 0.8, 0.7, 0.1])
    config = LookaheadConfig(mode="auto")
    ranked = rank_draft(tree, StepPlanner(config).acceptance)
    cut = ranked.cut(3)
    assert cut.tree == ranked.take(3) and len(cut.tree) == 3
    assert cut.chances == ranked.chances[:2]
    assert [cut.tree.tokens[n] for n in cut.order] == [tree.tokens[n] for n in ranked.order[:2]]
    assert all(cut.take(k) == ranked.take(k) for k in range(1, 4))
    assert ranked.cut(6) is ranked


def test_joining_prompts_ride_along_no_wider_than_the_widest_bucket() -> None:
    widths = tuple(range(1, 65))
    flat = CostCurve(widths, (1.0,) * len(widths))
    costs = CostModel(flat, BatchCosts(((2, flat), (4, flat))))
    assert Pricing(costs, 256).fused_chunk([100], 1, 1) > 8
    assert Pricing(costs, 256, widest=lambda: 8).fused_chunk([100], 1, 1) == 8
