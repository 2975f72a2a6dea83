"""The cost-aware draft budget, with injected cost curves (no timing in tests)."""

import json

import pytest

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.tree import DraftTree, SideRows, StepDraft
from rag_lookahead.planning.costs import (
    BatchCosts,
    Calibration,
    CostCurve,
    CostModel,
    StepCalibration,
    cached_curve,
    measure_curve,
)
from rag_lookahead.planning.planner import (
    AcceptanceModel,
    StepPlanner,
    fused_prefill,
    lone_prefill,
    plan_batch,
    plan_draft,
    plan_packed,
    rank_draft,
    separate_prefill,
)

# root -> a -> b -> c ; root -> d ; a -> e
TREE = DraftTree((0, 1, 2, 3, 4, 5), (-1, 0, 1, 2, 0, 1), "trie", (1.0, 0.9, 0.8, 0.7, 0.3, 0.2))


def no_exploring() -> AcceptanceModel:
    return AcceptanceModel(explore_every=10**9)


def test_a_flat_curve_drafts_the_whole_budget() -> None:
    assert plan_draft(TREE, no_exploring(), CostCurve.flat()) == TREE


def test_a_steep_curve_drafts_nothing() -> None:
    planned = plan_draft(TREE, no_exploring(), CostCurve((1, 2), (1.0, 50.0)))
    assert len(planned) == 1 and planned.source == "none"


def test_a_cpu_like_curve_keeps_the_likely_path_only() -> None:
    curve = CostCurve((1, 2, 4, 8), (1.0, 1.3, 1.35, 3.0))
    planned = plan_draft(TREE, no_exploring(), curve)
    # Prior chances (0.5 x estimate, multiplied down the path): a .45, b .18, d .15, c .06, e .05.
    # Rates 1.45/1.3, 1.63/1.325, 1.78/1.35, then the curve's jump makes a fourth node not pay.
    assert planned.tokens == (0, 1, 2, 4)
    assert planned.parents == (-1, 0, 1, 0)


def test_a_dip_in_a_curve_never_makes_the_plan_draft_wider_to_save_time() -> None:
    # Measured CPU curves dip (a kernel shape, or a load that hindered the smaller sizes): 3
    # tokens timed dearer than 4 here. Fitted monotone, 4 tokens cost what 3 do.
    curve = CostCurve((1, 2, 3, 4, 5, 6), (1.0, 1.7, 2.2, 1.4, 3.0, 3.0))
    assert curve.seconds == (1.0, 1.7, 2.2, 2.2, 3.0, 3.0)
    planned = plan_draft(TREE, no_exploring(), curve)
    assert len(planned) == 1  # not the root and 3 drafts at the dip's 1.4


# The default Jacobi window: 4 columns x 3 levels, offsets 1..6 after the root.
SIDE = SideRows(tuple(range(12)), tuple(level + j + 1 for level in range(3) for j in range(4)), ((0,),) * 12)
FAR = 1 << 20  # context room: no row is near the end of the context window


def test_the_step_planner_needs_no_curve_outside_auto_mode() -> None:
    for mode in ("trie", "jacobi"):
        planner = StepPlanner(LookaheadConfig(mode=mode))  # no curve: never consulted
        assert planner.plan(StepDraft(TREE, SIDE), FAR) == StepDraft(TREE, SIDE)
    auto = StepPlanner(LookaheadConfig(), CostModel(CostCurve((1, 2), (1.0, 50.0))))
    assert auto.plan(StepDraft(TREE, SIDE), FAR) == StepDraft(TREE.subtree([]), None)
    with pytest.raises(RuntimeError, match="measure_costs"):
        StepPlanner(LookaheadConfig()).plan(StepDraft(TREE), FAR)


def test_the_window_rides_along_in_auto_only_where_it_is_nearly_free() -> None:
    chain = TREE.subtree([1, 2, 3, 4])  # 5 tokens plus the window's 12 rows: 17 against 5
    nearly_flat = CostCurve((1, 32), (1.0, 1.04))
    cpu_like = CostCurve((1, 2, 32), (1.0, 1.6, 2.5))
    flat_plan = StepPlanner(LookaheadConfig(), CostModel(nearly_flat)).plan(StepDraft(chain, SIDE), FAR)
    assert flat_plan.side == SIDE
    assert StepPlanner(LookaheadConfig(), CostModel(cpu_like)).plan(StepDraft(chain, SIDE), FAR).side is None


def test_a_long_context_makes_the_plan_draft_narrower() -> None:
    # The curve is timed after a short context; after a long one every drafted token attends
    # to all of it, so the steps' own timings there find wide steps dearer, relatively.
    chain = DraftTree(tuple(range(16)), tuple(range(-1, 15)), "trie", (1.0,) + (0.9,) * 15)
    curve = CostCurve((1, 2, 4, 8, 16), (1.0, 1.1, 1.2, 1.4, 1.8))
    costs = CostModel(curve, calibration=StepCalibration())
    planner = StepPlanner(LookaheadConfig(), costs)
    planner.acceptance = no_exploring()
    dearer = {1: 1.1, 2: 1.5, 5: 2.0, 12: 2.6}  # observed over the curve's price, by width
    for tokens, ratio in dearer.items():
        for _ in range(3):
            costs.observe(tokens, curve(tokens), context=300)  # as timed
            costs.observe(tokens, curve(tokens) * ratio, context=1500)
    short, long = (len(planner.plan(StepDraft(chain), FAR, context)) for context in (300, 1500))
    assert short == len(plan_draft(chain, no_exploring(), curve)) == 4
    assert long == 1
    # An unseen longer context class is priced from the nearest seen one.
    assert len(planner.plan(StepDraft(chain), FAR, 6000)) == 1
    assert costs.priced(1500).seconds == pytest.approx((1.1, 1.65, 2.4, 3.64, 4.68))


def test_side_rows_never_reach_past_the_context_window() -> None:
    planner = StepPlanner(LookaheadConfig(mode="jacobi"))
    furthest = max(SIDE.offsets)
    assert planner.plan(StepDraft(TREE, SIDE), furthest + 1).side == SIDE
    assert planner.plan(StepDraft(TREE, SIDE), furthest).side is None


def test_acceptance_is_learned_from_outcomes() -> None:
    model = no_exploring()
    before = model.probability("trie", True, 0.95)
    for _ in range(50):  # node 1 (first level) always accepted, node 4 never
        model.update(TREE, [0, 1])
    assert model.probability("trie", True, 0.95) > 0.9 > before > 0.4
    assert model.probability("trie", True, 0.3) < 0.05
    # Node 2 was tried (its parent 1 was accepted) and always missed; node 3 never was, but it
    # is of the same source and level, whose pooled scale fell: so did its chance.
    assert model.probability("trie", False, 0.8) < 0.1
    assert model.probability("trie", False, 0.7) < 0.1
    # Another source keeps the prior: what one source's drafts are worth says nothing of another.
    assert model.probability("jacobi", False, 0.7) == pytest.approx(0.5 * 0.7)


def test_evidence_on_one_decile_moves_its_whole_source() -> None:
    model = no_exploring()
    hits = DraftTree((0, 1), (-1, 0), "doc1", (1.0, 0.35))
    for _ in range(40):
        model.update(hits, [0, 1])  # estimated .35, always accepted
    assert model.scale("doc1", True) > 2.0
    assert model.probability("doc1", True, 0.25) > 0.5  # a decile never tried
    assert model.probability("doc1", True, 0.25) > model.probability("doc2", True, 0.25)


def test_periodic_exploration_verifies_the_most_likely_node() -> None:
    model = AcceptanceModel(explore_every=3)
    for _ in range(50):
        model.update(TREE, [0])  # everything missed: calibrated chances collapse
    curve = CostCurve((1, 2, 8), (1.0, 1.5, 1.6))
    plans = [plan_draft(TREE, model, curve) for _ in range(6)]
    assert [len(p) for p in plans] == [1, 1, 2, 1, 1, 2]
    assert plans[2].tokens == (0, 1)  # the node most likely by the calibrated chances


def test_cost_curve_interpolates_and_validates() -> None:
    curve = CostCurve((1, 2, 8), (1.0, 2.0, 5.0))
    assert curve(1) == 1.0 and curve(2) == 2.0 and curve(5) == 3.5 and curve(0) == 1.0
    assert curve(15) == pytest.approx(5.0 + (4.0 / 7) * 7)
    with pytest.raises(ValueError):
        CostCurve((2, 4), (1.0, 2.0))
    with pytest.raises(ValueError):
        CostCurve((1, 4), (1.0, 0.0))


def test_measured_curves_keep_each_size_s_least_time_fitted_monotone() -> None:
    # A larger forward timed cheaper than a smaller one is priced as the smaller one.
    times = {
        1: [1.0, 1.1, 0.9],
        2: [3.0, 9.0, 3.1],
        3: [2.0, 2.2, 2.1],
        4: [2.5, 2.4, 2.6],
        5: [4.0, 4.0, 4.0],
    }
    calls: list[int] = []

    def forward(k: int) -> float:
        calls.append(k)
        return times[k][(calls.count(k) - 2) % 3]  # the first call per size is the warm-up

    curve = measure_curve(forward, max_tokens=5, repeats=3)
    assert curve.sizes == (1, 2, 3, 4, 5)
    # Injected numbers, no clock involved: each size's least time, the 9.0 outlier ignored,
    # and sizes 3 and 4 (least 2.0 and 2.4) priced as size 2.
    assert curve.seconds == (0.9, 3.0, 3.0, 3.0, 4.0) and not curve.loaded
    assert calls[5:10] == [1, 2, 3, 4, 5]  # rounds interleave the sizes


def test_curves_are_cached_per_key_and_remeasured_when_stale(tmp_path) -> None:
    calls = []

    def measure() -> CostCurve:
        calls.append(1)
        return CostCurve((1, 4), (1.0, float(len(calls) + 1)))

    key = {"model": "m", "threads": 2}
    first = cached_curve(tmp_path, key, measure)
    assert cached_curve(tmp_path, key, measure) == first and len(calls) == 1
    cached_curve(tmp_path, {"model": "m", "threads": 4}, measure)
    assert len(calls) == 2
    (path,) = [p for p in tmp_path.glob("costs-*.json") if json.loads(p.read_text())["key"] == key]
    data = json.loads(path.read_text())
    data["measured_at"] = 0  # far too old
    path.write_text(json.dumps(data))
    cached_curve(tmp_path, key, measure)
    path.write_text("not json")
    cached_curve(tmp_path, key, measure)
    assert len(calls) == 4


def test_batch_costs_interpolate_between_measured_row_counts() -> None:
    two = CostCurve((1, 2, 4), (1.0, 2.0, 3.0))
    eight = CostCurve((1, 2, 4), (2.0, 5.0, 6.0))
    costs = BatchCosts(((2, two), (8, eight)))
    assert costs(2, 2) == 2.0 and costs(8, 4) == 6.0
    assert costs(5, 1) == pytest.approx(1.5)  # halfway between 2 and 8 rows
    assert costs(16, 1) == pytest.approx(4.0)  # past the largest: scaled by the rows
    with pytest.raises(ValueError):
        BatchCosts(((1, two),))


def test_calibration_follows_observed_over_predicted_per_width_class() -> None:
    calibration = Calibration(weight=0.5)
    assert calibration.factor(4, 1) == 1.0
    calibration.record(4, 2, predicted=1.0, observed=3.0)
    calibration.record(4, 3, predicted=1.0, observed=1.0)
    assert calibration.factor(4, 2) == 2.0  # 2 and 3 tokens a row share a class
    assert calibration.factor(4, 5) == 2.0  # a class not seen: the nearest seen one's
    assert calibration.factor(8, 2) == 2.0  # nothing seen at 8 rows: the nearest row count's
    calibration.record(2, 32, predicted=1.0, observed=5.0)
    assert calibration.factor(8, 40) == 5.0  # a wide class seen only at 2 rows: that one
    calibration.record(4, 12, predicted=1.0, observed=4.0)
    assert calibration.factor(4, 9) == 4.0 and calibration.factor(4, 3) == 2.0
    assert calibration.factor(4, 1) == 2.0  # nearest: the 2-3 class
    assert calibration.factor(4, 5) == 4.0  # equally near 2-3 and 8-15: the wider one


def test_a_batch_plan_widens_only_while_the_rate_grows() -> None:
    ranked = [rank_draft(TREE, no_exploring()), rank_draft(TREE, no_exploring())]
    cheap = plan_batch(ranked, lambda width: 1.0)
    assert [len(t) for t in cheap] == [len(TREE), len(TREE)]
    steep = plan_batch(ranked, lambda width: float(width))  # each width costs as much as it adds
    assert [len(t) for t in steep] == [1, 1]
    capped = plan_batch(ranked, lambda width: 1.0, max_tokens=4)
    assert [len(t) for t in capped] == [2, 2]


def test_a_packed_plan_takes_the_best_nodes_of_any_row_while_the_rate_grows() -> None:
    """Packed, a row's nodes cost their own tokens only: a sure node of one row is taken before
    a doubtful one of another, and a row with nothing worth verifying stays at its root."""
    sure = DraftTree((1, 2, 3), (-1, 0, 1), "trie", (1.0, 0.9, 0.9))
    doubtful = DraftTree((4, 5, 6), (-1, 0, 1), "trie", (1.0, 0.1, 0.1))
    ranked = [rank_draft(sure, no_exploring()), rank_draft(doubtful, no_exploring())]
    # A forward of n tokens: 10 for the weights, 1 a token; a node pays if its chance beats
    # the rate's share of a token (gain / cost).
    plan = plan_packed(ranked, lambda tokens: 10.0 + tokens)
    assert [t.tokens for t in plan] == [(1, 2, 3), (4,)]
    free = plan_packed(ranked, lambda tokens: 1.0)
    assert [len(t) for t in free] == [3, 3]
    capped = plan_packed(ranked, lambda tokens: 1.0, max_tokens=4)
    assert [len(t) for t in capped] == [3, 1]  # the cap's two nodes go to the sure row
    steep = plan_packed(ranked, lambda tokens: float(tokens))
    assert [len(t) for t in steep] == [1, 1]
    fixed = [rank_draft(doubtful, no_exploring(), fixed=True), rank_draft(doubtful, no_exploring())]
    assert [len(t) for t in plan_packed(fixed, lambda tokens: float(tokens))] == [3, 1]  # whole


def cpu_like(rows: int, width: int) -> float:
    """A weights read per forward, a cache read per row, and every token of every row (pads
    included) computed: milliseconds."""
    return 30.0 + 5.0 * rows + 0.5 * rows * width


def test_a_prompt_rides_as_wide_as_the_forward_allows_where_width_is_free() -> None:
    plan = fused_prefill([100], 8, 2, lambda rows, width: 1.0, 256)
    assert plan.tokens == 256 // 9 and plan.rate == float("inf")
    assert fused_prefill([5, 100], 7, 2, lambda rows, width: 1.0, 256).tokens == 256 // 9
    assert fused_prefill([10], 7, 2, lambda rows, width: 1.0, 256).tokens == 10  # all that is left
    # Nobody decodes: nobody waits, the widest.
    assert fused_prefill([300, 40], 0, 0, cpu_like, 256).tokens == 128


def test_a_prompt_widening_every_row_rides_as_wide_as_pays() -> None:
    base = cpu_like(8, 2)
    plan = fused_prefill([100], 8, 2, cpu_like, 256)
    # Padding every row to a wider chunk costs more per prompt token: the drafts' own width.
    assert plan.tokens == 2 and plan.rate == pytest.approx(2 / (cpu_like(9, 2) - base))
    # Counting the step the joining call misses, the fewer steps it takes the better.
    missed = fused_prefill([100], 8, 2, cpu_like, 256, missed=base / 8)
    assert missed.tokens == 256 // 9
    assert missed.rate == pytest.approx(28 / (cpu_like(9, 28) - base + base / 8))


def test_a_join_is_never_priced_below_its_added_tokens_alone() -> None:
    """Costs calibrated cell by cell can price the running rows' step above a wider one with
    one row more; the join's tokens still cost what they add to a forward."""

    def inconsistent(rows: int, width: int) -> float:
        return 300.0 if (rows, width) == (7, 8) else cpu_like(rows, width)

    assert inconsistent(8, 32) < inconsistent(7, 8)
    missed = cpu_like(7, 8) / 7
    assert fused_prefill([300], 7, 8, inconsistent, 256, missed).rate == float("inf")  # a free join
    alone = CostCurve((1, 256), (35.0, 35.0 + 0.5 * 255))
    plan = fused_prefill([300], 7, 8, inconsistent, 256, missed, alone)
    # As wide as the drafts: its 8 tokens add what 8 tokens add to a forward alone.
    assert plan.tokens == 8 and plan.rate == pytest.approx(8 / (alone(64) - alone(56) + missed))
    assert plan.rate < separate_prefill(300, alone, 256, missed).rate  # so it goes apart
    # Where width is free (a GPU), the floor is free too: the join still rides.
    flat = CostCurve((1, 256), (35.0, 35.0))
    assert fused_prefill([300], 7, 8, lambda rows, width: 1.0, 256, alone=flat).rate == float("inf")


def test_a_prompt_alone_goes_in_the_smallest_chunk_that_keeps_its_rate_within_the_loss() -> None:
    # A CPU's forward: a fixed part (every weight read) and a part per token.
    affine = CostCurve((1, 256), (35.0, 35.0 + 1.5 * 255))
    chunk = lone_prefill(1855, affine, 256, 2048, loss=0.05)
    assert chunk % 256 == 0 and 256 < chunk < 1855

    def chunked(size: int) -> float:  # the prompt's seconds in chunks of ``size``
        return (1855 // size) * affine(size) + affine(1855 % size)

    assert chunked(chunk) <= affine(1855) / 0.95 < chunked(chunk - 256)
    assert lone_prefill(1855, affine, 256, 2048, loss=0.0) == 1855  # no loss: whole
    assert lone_prefill(4000, affine, 256, 2048, loss=0.0) == 2048  # at most `most`
    assert lone_prefill(200, affine, 256, 2048, loss=0.05) == 200  # short: whole
    # Tokens cost in proportion: any chunk is as good, the least; a flat forward (a GPU's): whole.
    assert lone_prefill(1855, CostCurve((1, 256), (1.0, 256.0)), 256, 2048, loss=0.05) == 256
    assert lone_prefill(1855, CostCurve((1, 256), (35.0, 35.0)), 256, 2048, loss=0.05) == 1855


def test_a_chunk_apart_is_the_most_prompt_per_second_its_forward_and_the_missed_step_take() -> None:
    alone = CostCurve((1, 256), (35.0, 35.0 + 0.5 * 255))
    plan = separate_prefill(1000, alone, 256)
    assert plan.tokens == 256 and plan.rate == pytest.approx(256 / alone(256))
    assert separate_prefill(20, alone, 256).tokens == 20  # the rest of the prompt
    knee = CostCurve((1, 64, 256), (35.0, 60.0, 400.0))  # dearer per token past 64
    assert separate_prefill(1000, knee, 256).tokens == 64
    assert separate_prefill(1000, knee, 256, missed=10.0).rate == pytest.approx(64 / 70.0)
    # On such a machine a join goes apart: a wide chunk there beats a narrow one in every row.
    missed = cpu_like(8, 2) / 8
    assert (
        separate_prefill(1000, alone, 256, missed).rate
        > fused_prefill([1000], 8, 2, cpu_like, 256, missed).rate
    )


def test_a_variant_made_before_a_measurement_plans_with_it() -> None:
    from rag_lookahead import LookaheadEngine
    from rag_lookahead.testing import CharTokenizer, tiny_model

    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), LookaheadConfig())
    variant = engine.with_config(LookaheadConfig(decoding_length=4))
    curve = CostCurve((1, 4), (1.0, 1.5))
    engine.costs.curve = curve  # as measure_costs() leaves it
    assert variant.cost_curve is curve and variant.planner.cost_curve is curve
    assert engine.costs.batched() is not None  # the batch plans with it too
