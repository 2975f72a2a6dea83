"""A cost curve that resists a busy machine: least times, re-timed when they disagree, a check
of a cached curve against the forwards really run, and measuring again on request. Fake
timers only: no test here reads a clock."""

import json

import pytest

from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.costs import CostCurve, CostModel, CurveCheck, measure_curve, settled
from rag_lookahead.decoding.load import MachineLoad, watch_load
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.testing import CharTokenizer, tiny_model


class LoadedTimer:
    """Forward seconds of ``cost(k)``, plus whatever load each call's turn brings."""

    def __init__(self, cost: dict[int, float], loads: list[float]) -> None:
        self.cost, self.loads, self.calls = cost, loads, []

    def __call__(self, k: int) -> float:
        self.calls.append(k)
        extra = self.loads[len(self.calls) - 1] if len(self.calls) <= len(self.loads) else 0.0
        return self.cost[k] * (1 + extra)


def test_a_passing_load_is_measured_away_by_timing_again() -> None:
    cost = {1: 1.0, 2: 1.4, 3: 1.6}
    # Warm-up (3 calls), then rounds of 3: size 2 is loaded in all three rounds (it never sees
    # two unhindered times), size 1 once, size 3 never.
    warm_up, rounds = [0.0] * 3, [[0, 2.0, 0], [1.0, 1.5, 0], [0, 0.8, 0]]
    loads = warm_up + [load for round_ in rounds for load in round_]
    timer = LoadedTimer(cost, loads)
    curve = measure_curve(timer, max_tokens=3, repeats=3)
    assert curve.seconds == (1.0, 1.4, 1.6)  # what the forwards cost alone
    assert timer.calls[12:] == [2, 2]  # only the unsettled size was timed again, till it settled


def test_a_load_that_never_passes_stops_after_max_rounds() -> None:
    loads = [0.0, 0.0] + [0.5 * (i % 3) for i in range(100)]
    timer = LoadedTimer({1: 1.0, 2: 2.0}, loads)
    measure_curve(timer, max_tokens=2, repeats=3, tolerance=0.01, max_rounds=5)
    assert len(timer.calls) <= 2 + 2 * 5


def test_settled_needs_two_close_least_times() -> None:
    assert not settled([1.0], 0.1)
    assert settled([1.0, 3.0, 1.05], 0.1)
    assert not settled([1.0, 3.0, 1.2], 0.1)
    with pytest.raises(ValueError):
        measure_curve(LoadedTimer({1: 1.0}, []), max_tokens=1, repeats=1)


def test_the_check_flags_a_cached_curve_slower_than_the_forwards_run_now() -> None:
    check = CurveCheck(samples=4, ratio=0.6)
    for _ in range(3):
        check.record(predicted=2.0, observed=0.8)
    assert not check.stale()  # too few forwards to say
    check.record(predicted=2.0, observed=0.8)
    assert check.stale()
    slow = CurveCheck(samples=4)
    for _ in range(8):
        slow.record(predicted=1.0, observed=5.0)  # a load now, or long contexts: no reason
    assert not slow.stale()


def test_one_caller_claims_the_remeasurement_and_the_check_ends() -> None:
    costs = CostModel(curve=CostCurve((1, 2), (2.0, 3.0)), check=CurveCheck(samples=2))
    costs.observe(1, 0.5)
    assert not costs.claim_remeasure()
    costs.observe(2, 0.5)
    assert costs.claim_remeasure()
    assert not costs.claim_remeasure() and costs.check is None
    costs.observe(1, 0.1)  # no check any more: nothing happens
    assert CostModel().claim_remeasure() is False


def _engine(tmp_path) -> LookaheadEngine:
    config = LookaheadConfig(max_batch_size=1, decoding_length=3, window_size=1, ngram_size=2)
    return LookaheadEngine(tiny_model("llama"), CharTokenizer(), config, cache_dir=tmp_path)


def _stored(tmp_path) -> list[float]:
    (path,) = (tmp_path / "costs").glob("costs-*.json")
    return json.loads(path.read_text())["measured_at"]


def test_remeasure_replaces_the_cached_curve_and_a_cached_one_is_checked(tmp_path) -> None:
    engine = _engine(tmp_path)
    engine.measure_costs()
    first = _stored(tmp_path)
    assert engine.runner.costs.check is None  # measured now: trusted
    again = _engine(tmp_path)
    again.measure_costs()
    assert _stored(tmp_path) == first and again.runner.costs.check is not None  # read back
    again.measure_costs(remeasure=True)
    assert _stored(tmp_path) != first and again.runner.costs.check is None


class CountingCheck(CurveCheck):
    """Counts the forwards recorded, and says stale once told to (no clock decides)."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded = 0
        self.verdict = False

    def record(self, predicted: float, observed: float) -> None:
        self.recorded += 1

    def stale(self) -> bool:
        return self.verdict


def test_a_stale_cached_curve_is_measured_again_between_calls_with_the_same_tokens(tmp_path) -> None:
    engine = _engine(tmp_path)
    engine.measure_costs()
    prompt = [3, 14, 15, 9, 26] * 4
    before = engine.complete(prompt, max_new_tokens=16).token_ids
    cached = _engine(tmp_path)
    cached.measure_costs()
    measured_at = _stored(tmp_path)
    check = cached.runner.costs.check = CountingCheck()
    during = cached.complete(prompt, max_new_tokens=16).token_ids
    assert check.recorded > 0  # every forward of a call alone is compared with the curve
    check.verdict = True  # as a curve measured on a busy machine would be found
    after = cached.complete(prompt, max_new_tokens=16).token_ids  # measured again first
    assert _stored(tmp_path) != measured_at and cached.runner.costs.check is None
    assert before == during == after


def test_the_load_seen_says_busy_only_when_other_work_shared_the_cores() -> None:
    ticks = iter([0.0, 10.0])
    cpu = iter([0.0, 20.0])
    with watch_load(clock=lambda: next(ticks), cpu=lambda: next(cpu), load=lambda: 6.0) as seen:
        pass
    (load,) = seen
    assert load.own_cores == 2.0 and load.others == 4.0
    quiet = MachineLoad(seconds=10.0, own_cores=2.0, load=2.2, cores=load.cores)
    assert not quiet.busy and "quiet" in quiet.describe()
    busy = MachineLoad(seconds=10.0, own_cores=2.0, load=7.5, cores=2)
    assert busy.busy and "busy" in busy.describe() and "7.5" in busy.describe()
    unknown = MachineLoad(seconds=1.0, own_cores=1.0, load=None, cores=2)
    assert not unknown.busy and unknown.others is None and "unknown" in unknown.describe()
