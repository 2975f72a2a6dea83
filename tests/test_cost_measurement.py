"""A cost curve that resists a busy machine: least times, re-timed when they disagree, fitted
monotone, kept briefly when measured under a load, calibrated and checked by the forwards
really run, and measuring again on request. Fake timers only: no test here reads a clock."""

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rag_lookahead.bench.run import fresh_engine
from rag_lookahead.config import LookaheadConfig
from rag_lookahead.decoding.tree import DraftTree
from rag_lookahead.engine import LookaheadEngine
from rag_lookahead.engine import executor as executor_module
from rag_lookahead.engine.executor import Executor
from rag_lookahead.planning import costs as costs_module
from rag_lookahead.planning.acceptance import save_acceptance
from rag_lookahead.planning.costs import (
    LOADED_MAX_AGE_SECONDS,
    VERSION,
    CostCurve,
    CostModel,
    CurveCheck,
    StepCalibration,
    cached_curve,
    forget_curve,
    measure_curve,
    settled,
)
from rag_lookahead.planning.load import MachineLoad, watch_load
from rag_lookahead.planning.planner import AcceptanceModel, StepPlanner, plan_draft
from rag_lookahead.serve.readiness import measure_ahead
from rag_lookahead.testing import CharTokenizer, greedy_reference, tiny_model
from rag_lookahead.tuning import cost_timing
from rag_lookahead.tuning.kernel_cache import cached_classes

# The two-thread curve first measured on an AVX2-only EPYC while other work ran (issue 40): one
# token 262 ms, 2 tokens 1.40x that, 8 tokens 0.96x, 13 tokens 0.76x; no forward has that shape.
LOADED = (1, 2, 8, 13), (0.262, 0.262 * 1.40, 0.262 * 0.96, 0.262 * 0.76)
# What the same forwards cost on the quiet machine, after a RAG prompt (one token 108 ms).
QUIET = {1: 0.108, 2: 0.108 * 1.36, 8: 0.108 * 1.8}
# root -> a chain of 12 draft tokens (prior chances 0.5, 0.25, ...)
CHAIN = DraftTree(tuple(range(13)), tuple(range(-1, 12)), "trie", (1.0,) * 13)


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
    assert curve.seconds == (1.0, 1.4, 1.6) and not curve.loaded  # what the forwards cost alone
    assert timer.calls[12:] == [2, 2]  # only the unsettled size was timed again, till it settled


def test_a_load_that_never_passes_stops_after_max_rounds() -> None:
    loads = [0.0, 0.0] + [0.5 * (i % 3) for i in range(100)]
    timer = LoadedTimer({1: 1.0, 2: 2.0}, loads)
    curve = measure_curve(timer, max_tokens=2, repeats=3, tolerance=0.01, max_rounds=5)
    assert len(timer.calls) <= 2 + 2 * 5
    assert curve.loaded  # never timed unhindered twice: the disk keeps it briefly


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


def test_one_caller_retires_a_contradicted_curve_and_the_check_ends() -> None:
    forgotten: list[bool] = []
    costs = CostModel(curve=CostCurve((1, 2), (2.0, 3.0)), check=CurveCheck(samples=2))
    costs.forget = lambda: forgotten.append(True)
    costs.observe(1, 0.5, context=0)
    assert not costs.retire_contradicted()
    costs.observe(2, 0.5, context=0)
    assert costs.retire_contradicted() and forgotten == [True]
    assert not costs.retire_contradicted() and costs.check is None and forgotten == [True]
    costs.observe(1, 0.1, context=0)  # no check any more: nothing happens
    assert CostModel().retire_contradicted() is False


def _engine(tmp_path) -> LookaheadEngine:
    # The kernel named: `auto` times both per engine, and on a busy machine two engines can
    # choose differently, which keys their curves apart (two files where one is read back).
    config = LookaheadConfig(
        max_batch_size=1, decoding_length=3, window_size=1, ngram_size=2, cpu_linear="torch"
    )
    return LookaheadEngine(tiny_model("llama"), CharTokenizer(), config, cache_dir=tmp_path)


def _stored(tmp_path) -> list[float]:
    (path,) = (tmp_path / "costs").glob("costs-*.json")
    return json.loads(path.read_text())["measured_at"]


def test_remeasure_replaces_the_cached_curve_and_a_cached_one_is_checked(tmp_path) -> None:
    engine = _engine(tmp_path)
    curve = engine.measure_costs()
    first = _stored(tmp_path)
    assert (engine.costs.check is None) == (not curve.loaded)  # measured now, quietly: trusted
    again = _engine(tmp_path)
    again.measure_costs()
    assert _stored(tmp_path) == first and again.costs.check is not None  # read back
    learned = again.costs.check, again.costs.calibration
    again.with_config(again.config).measure_costs()  # a variant reads it back: what was learned stands
    assert (again.costs.check, again.costs.calibration) == learned
    curve = again.measure_costs(remeasure=True)
    assert _stored(tmp_path) != first and (again.costs.check is None) == (not curve.loaded)


def test_a_new_engine_given_the_curve_it_reads_back_is_calibrated_and_checked(tmp_path) -> None:
    """A second engine over the model, given the first one's curve (as the benchmarks' fresh
    engines are), then told to measure: the same curve read back from the disk, which its own
    steps calibrate and check as any reader's would — not left as a curve given."""
    first = _engine(tmp_path)
    curve = first.measure_costs()
    second = LookaheadEngine(first.model, first.tokenizer, first.config, cost_curve=curve, cache_dir=tmp_path)
    given = second.costs  # as it is, unless measured under a load (`CostModel.given`)
    assert (given.calibration is None and given.check is None) is not curve.loaded
    assert given.forget is None  # nothing stored to forget: not yet read back
    assert second.measure_costs() == curve
    assert second.costs.calibration is not None and second.costs.check is not None
    assert second.costs.forget is not None


def test_a_benchmarks_fresh_engine_reads_the_costs_back_as_a_new_process_would(tmp_path) -> None:
    """`fresh_engine` (each benchmarked method's own engine): planning by costs, from the
    first engine's cache, calibrated and checked; decoding without drafts, nothing read."""
    first = _engine(tmp_path)
    curve = first.measure_costs()
    fresh = fresh_engine(first, first.config)
    assert fresh.cache_dir == tmp_path and fresh.cost_curve == curve
    assert fresh.costs.calibration is not None and fresh.costs.check is not None
    plain = fresh_engine(first, replace(first.config, mode="off"))
    assert plain.costs.forget is None  # nothing read back
    assert (plain.costs.calibration is None) is not curve.loaded  # a loaded curve given is doubted


def test_a_curve_cached_on_another_processor_is_measured_anew(tmp_path, monkeypatch) -> None:
    """One cache directory, two machines (a home directory shared by hosts, or torch's kernels
    held to another instruction set): neither plans with the other's curve."""
    first = _engine(tmp_path)
    first.measure_costs()
    monkeypatch.setattr(costs_module, "_cpu_model", lambda: "AuthenticAMD, 25, 1, AMD EPYC 7B13")
    monkeypatch.setattr(costs_module.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    other = _engine(tmp_path)
    curve = other.measure_costs()
    assert len(list((tmp_path / "costs").glob("costs-*.json"))) == 2  # one curve each
    assert (other.costs.check is None) == (not curve.loaded)  # measured there, not read back


@pytest.mark.parametrize(
    ("mode", "measured_before", "remeasure", "measures"),
    [
        ("auto", False, False, [False]),  # what its first call would measure
        ("auto", True, False, []),  # once measured, nothing
        ("auto", True, True, [True]),  # unless told to measure again
        ("trie", False, False, []),  # only auto plans with costs
    ],
)
def test_what_is_measured_ahead(tmp_path, mode, measured_before, remeasure, measures) -> None:
    """One place decides it for the server's startup and the command line's engines."""
    config = LookaheadConfig(mode=mode, max_batch_size=1, decoding_length=3, window_size=1, ngram_size=2)
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), config, cache_dir=tmp_path)
    if measured_before:
        engine.planner.cost_curve = CostCurve.flat()
    asked: list[bool] = []
    engine.measure_costs = lambda *, remeasure=False, batches=True: asked.append(remeasure)  # type: ignore[method-assign,assignment,return-value]
    measure_ahead(engine, remeasure=remeasure)
    assert asked == measures


class CountingCheck(CurveCheck):
    """Counts the forwards recorded, and says stale once told to (no clock decides)."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded = 0
        self.verdict = False

    def record(self, predicted: float, observed: float, *, tokens: int = 1, context: int = 0) -> None:
        self.recorded += 1

    def stale(self) -> bool:
        return self.verdict


def test_a_contradicted_cached_curve_is_left_for_the_next_process_and_no_call_measures(tmp_path) -> None:
    engine = _engine(tmp_path)
    engine.measure_costs()
    prompt = [3, 14, 15, 9, 26] * 4
    before = engine.complete(prompt, max_new_tokens=16).token_ids
    cached = _engine(tmp_path)
    curve = cached.measure_costs()
    check = cached.costs.check = CountingCheck()
    during = cached.complete(prompt, max_new_tokens=16).token_ids
    assert check.recorded > 0  # every forward of a call alone is compared with the curve
    check.verdict = True  # as a curve measured on a busy machine would be found
    calibration = cached.costs.calibration
    after = cached.complete(prompt, max_new_tokens=16).token_ids
    assert not list((tmp_path / "costs").glob("costs-*.json"))  # forgotten on disk
    costs = cached.costs  # while this process plans on, by the curve as calibrated
    assert costs.curve == curve and costs.calibration is calibration and costs.check is None
    assert before == during == after
    _engine(tmp_path).measure_costs()  # the next process measures its own
    assert _stored(tmp_path)


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


def _loaded_costs() -> CostModel:
    """The issue's loaded curve as a cached one is read back: checked, and calibrated."""
    return CostModel(CostCurve(*LOADED), check=CurveCheck(context=256), calibration=StepCalibration())


def test_the_loaded_curve_is_fitted_monotone() -> None:
    curve = CostCurve(*LOADED)
    assert curve.seconds == (0.262, 0.262 * 1.40, 0.262 * 1.40, 0.262 * 1.40)
    assert all(curve(k) <= curve(k + 1) for k in range(1, 20))  # more tokens never cost less


def test_quiet_forwards_correct_the_loaded_curve_s_level_and_shape_and_retire_it() -> None:
    costs = _loaded_costs()
    wide = len(plan_draft(CHAIN, AcceptanceModel(explore_every=10**9), costs.priced(1200)))
    for _ in range(6):  # the quiet machine's forwards after a RAG prompt
        for tokens, seconds in QUIET.items():
            costs.observe(tokens, seconds, context=1200)
    priced = costs.priced(1200)
    assert priced is not None
    assert priced(1) == pytest.approx(0.108)  # the level: 262 ms were 108
    assert priced(2) / priced(1) == pytest.approx(1.36)  # the shape: the curve said 1.40x
    assert priced(8) / priced(1) == pytest.approx(1.8)  # and 1.40x (its 0.96x fitted), not 1.8x
    assert len(plan_draft(CHAIN, AcceptanceModel(explore_every=10**9), priced)) < wide
    assert costs.retire_contradicted()  # and the disk's curve is left for the next process


def test_one_hindered_forward_moves_no_price() -> None:
    calibration = StepCalibration(window=5, least=3)
    curve = CostCurve((1, 2), (1.0, 2.0))
    for seconds in (0.5, 0.5, 9.0):  # the third hindered by other work
        calibration.record(1, 300, curve(1), seconds)
    assert calibration.factor(1, 300) == 0.5
    assert calibration.factor(2, 5000) == 0.5  # nothing else counted: the nearest cell's
    calibration.record(2, 300, curve(2), 50.0)  # one timing: not counted yet
    assert calibration.apply(curve, 300).seconds == (0.5, 1.0)
    with pytest.raises(ValueError, match="least"):
        StepCalibration(window=2, least=3)


def test_a_calibrated_curve_is_made_again_only_once_a_ratio_it_read_changed() -> None:
    """`apply` runs before every step: within a context class the same curve comes back until
    a timing moves a ratio it was priced with."""
    calibration = StepCalibration(window=5, least=1)
    curve = CostCurve((1, 2, 4), (1.0, 1.5, 2.0))
    first = calibration.apply(curve, 300)
    assert calibration.apply(curve, 400) is first  # the same class (256-511), nothing recorded
    calibration.record(1, 300, curve(1), 0.5)
    second = calibration.apply(curve, 300)
    assert second is not first and second.seconds == (0.5, 0.75, 1.0)  # priced from the nearest
    assert calibration.apply(curve, 300) is second
    for tokens in (2, 4):
        calibration.record(tokens, 300, curve(tokens), curve(tokens))
    own = calibration.apply(curve, 300)  # every width class its own ratio now
    calibration.record(1, 5000, curve(1), 9.0)  # another context class moves
    assert calibration.apply(curve, 300) is own
    calibration.record(1, 300, curve(1), 0.5)  # timed as before: the ratio stays 0.5
    calibration.record(1, 300, curve(1), 2.0)  # hindered once: the median of three stays 0.5
    assert calibration.apply(curve, 300) is own
    calibration.record(1, 300, curve(1), 2.0)  # twice: the median moves to 1.25
    moved = calibration.apply(curve, 300)
    assert moved is not own and moved.seconds[0] == 1.25
    other = CostCurve((1, 2, 4), (1.0, 1.5, 2.0))  # an equal curve set anew (measured again)
    assert calibration.apply(other, 300) is not calibration.apply(curve, 300)


def test_a_kept_calibrated_curve_prices_as_one_made_afresh() -> None:
    """Whatever the timings, in whatever classes, the curve `apply` keeps is the one the
    ratios give now (`factor`): the plans are those of a curve made at every step."""
    import random

    rng = random.Random(40)
    calibration = StepCalibration(window=4, least=2)
    curve = CostCurve((1, 2, 3, 4, 8, 13), (1.0, 1.2, 1.3, 1.5, 2.0, 2.6))
    contexts = (0, 1, 3, 300, 700, 1500, 6000)
    for _ in range(400):
        tokens, context = rng.choice(curve.sizes), rng.choice(contexts)
        calibration.record(tokens, context, curve(tokens), curve(tokens) * rng.choice((0.5, 1.0, 2.0)))
        for at in contexts:
            fresh = [s * calibration.factor(n, at) for n, s in zip(curve.sizes, curve.seconds, strict=True)]
            assert calibration.apply(curve, at) == CostCurve(curve.sizes, tuple(fresh), curve.loaded)


# (case, observations as (tokens, context, seconds) repeated 16 times, stale): against the
# issue's loaded curve (262 ms, then 1.40x fitted flat), after a check at a 256-token context.
CONTRADICTIONS = [
    ("one-token steps several times faster", [(1, 300, 0.06)], True),
    ("quiet steps of every width", [(k, 1200, s) for k, s in QUIET.items()], True),
    ("wide steps cheaper than narrow ones, against the curve", [(1, 300, 0.262), (13, 300, 0.2)], True),
    ("every step slower: a load now, or a long context", [(k, 1200, 3 * s) for k, s in QUIET.items()], False),
    ("wide steps relatively dearer after a long context", [(1, 3000, 0.262), (13, 3000, 0.8)], False),
    ("faster steps after a shorter context than measured", [(1, 100, 0.06)], False),
]


@pytest.mark.parametrize(("case", "steps", "stale"), CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_a_curve_the_forwards_contradict_is_retired(case, steps, stale) -> None:
    costs = _loaded_costs()
    for _ in range(16):
        for tokens, context, seconds in steps:
            costs.observe(tokens, seconds, context=context)
    assert costs.retire_contradicted() is stale
    curve, calibration = CostCurve(*LOADED), costs.calibration
    for tokens, context, seconds in steps:  # and either way, the plan prices what it saw
        assert calibration is not None
        assert calibration.factor(tokens, context) == pytest.approx(seconds / curve(tokens))


def _write(directory, key, **fields) -> None:
    """A cache file as `cached_curve` writes one, with ``fields`` changed."""
    cached_curve(directory, key, lambda: CostCurve((1, 2), (1.0, 1.5)))
    (path,) = directory.glob(f"costs-v{VERSION}-*.json")
    data = {**json.loads(path.read_text()), **fields}
    path.write_text(json.dumps(data))


HOUR = 3600
AS_WRITTEN = CostCurve((1, 2), (1.0, 1.5))
# (case, fields of the cache file, whether it is measured again, the curve read otherwise)
CACHE_FILES = [
    ("quiet, two hours old", {"measured_at": -2 * HOUR}, False, AS_WRITTEN),
    (
        "loaded, a minute old",
        {"loaded": True, "measured_at": -60},
        False,
        CostCurve((1, 2), (1.0, 1.5), True),
    ),
    ("loaded, two hours old", {"loaded": True, "measured_at": -2 * HOUR}, True, None),
    ("loaded, a 'yes' for a flag", {"loaded": "yes"}, True, None),
    ("the issue's loaded curve", {"sizes": LOADED[0], "seconds": LOADED[1]}, False, CostCurve(*LOADED)),
    ("seconds not a number", {"seconds": [1.0, math.nan]}, True, None),
    ("seconds infinite", {"seconds": [1.0, math.inf]}, True, None),
    ("seconds negative", {"seconds": [1.0, -1.5]}, True, None),
    ("measured in the future", {"measured_at": 2 * HOUR}, True, None),
    ("version 3, whose load is unknown", {"version": 3}, True, None),
]


@pytest.mark.parametrize(("case", "fields", "measured", "read"), CACHE_FILES, ids=[c[0] for c in CACHE_FILES])
def test_a_cached_curve_is_read_only_when_it_can_be_trusted(tmp_path, case, fields, measured, read) -> None:
    key = {"model": "m"}
    if "measured_at" in fields:
        fields = {**fields, "measured_at": time.time() + fields["measured_at"]}
    _write(tmp_path, key, **fields)
    again = CostCurve((1, 2), (7.0, 8.0))
    got = cached_curve(tmp_path, key, lambda: again)
    assert got == (again if measured else read)
    assert list(got.seconds) == sorted(got.seconds)  # fitted monotone, whatever the file held


def test_a_curve_measured_under_a_load_is_kept_an_hour_and_marked(tmp_path) -> None:
    key = {"model": "m"}
    cached_curve(tmp_path, key, lambda: CostCurve((1, 2), (1.0, 1.5), loaded=True))
    (path,) = tmp_path.glob("costs-*.json")
    data = json.loads(path.read_text())
    assert data["loaded"] is True and LOADED_MAX_AGE_SECONDS == HOUR


BUSY = MachineLoad(seconds=10.0, own_cores=2.0, load=7.5, cores=2)


@contextmanager
def _busy_machine():
    seen: list[MachineLoad] = []
    yield seen
    seen.append(BUSY)


def test_an_engine_measuring_on_a_busy_machine_keeps_its_curve_briefly_and_checks_it(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(cost_timing, "watch_load", _busy_machine)
    engine = _engine(tmp_path)
    curve = engine.measure_costs()
    (path,) = (tmp_path / "costs").glob("costs-*.json")
    assert curve.loaded and json.loads(path.read_text())["loaded"] is True
    assert engine.costs.check is not None  # measured here, but not trusted
    monkeypatch.undo()
    later = _engine(tmp_path)
    assert later.measure_costs() == curve and later.costs.check is not None  # read back
    data = json.loads(path.read_text())
    data["measured_at"] -= 2 * HOUR
    path.write_text(json.dumps(data))
    _engine(tmp_path).measure_costs()  # past the hour: measured again
    assert json.loads(path.read_text())["measured_at"] > data["measured_at"] + HOUR


class CountingCalibration(StepCalibration):
    """The contexts the forwards were recorded and priced at."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[int] = []
        self.priced: list[int] = []

    def record(self, tokens: int, context: int, predicted: float, observed: float) -> None:
        self.recorded.append(context)
        super().record(tokens, context, predicted, observed)

    def apply(self, curve: CostCurve, context: int) -> CostCurve:
        self.priced.append(context)
        return super().apply(curve, context)


def test_each_step_is_timed_and_priced_at_its_own_context(tmp_path) -> None:
    engine = _engine(tmp_path)
    engine.measure_costs()
    calibration = engine.costs.calibration = CountingCalibration()
    prompt = [3, 14, 15, 9, 26] * 4
    out = engine.complete(prompt, max_new_tokens=16).token_ids
    assert out == greedy_reference(engine.model, prompt, 16)  # only the plan changes
    assert calibration.recorded[0] == len(prompt)  # the first step's cache: the prompt
    assert calibration.recorded == sorted(calibration.recorded)
    assert set(calibration.priced) <= set(calibration.recorded)  # a plan priced where it is timed


def test_a_curve_is_forgotten_only_while_the_disk_still_holds_it(tmp_path) -> None:
    key = {"model": "m"}
    first = cached_curve(tmp_path, key, lambda: CostCurve((1, 2), (1.0, 1.5)))
    newer = cached_curve(tmp_path, key, lambda: CostCurve((1, 2), (1.0, 1.2)), remeasure=True)
    assert not forget_curve(tmp_path, key, first)  # another process measured since: kept
    assert cached_curve(tmp_path, key, lambda: first) == newer
    assert forget_curve(tmp_path, key, newer) and not list(tmp_path.glob("costs-*.json"))
    assert not forget_curve(tmp_path, key, newer)  # nothing left to forget


def test_a_curve_in_a_read_only_cache_is_not_forgotten(tmp_path, monkeypatch) -> None:
    """The next process's check finds it again: no error, nothing lost."""
    key = {"model": "m"}
    curve = cached_curve(tmp_path, key, lambda: CostCurve((1, 2), (1.0, 1.5)))

    def refuse(self, missing_ok: bool = False) -> None:  # type: ignore[no-untyped-def]
        raise PermissionError(f"read-only: {self}")

    monkeypatch.setattr(Path, "unlink", refuse)
    assert not forget_curve(tmp_path, key, curve)
    monkeypatch.undo()
    assert cached_curve(tmp_path, key, lambda: CostCurve.flat()) == curve


def test_each_timed_forward_waits_for_the_device_before_the_clock_is_read(monkeypatch) -> None:
    """On a GPU a forward returns once its kernels are queued: the seconds that calibrate the
    plan must be the device's, so every timed forward synchronises before the clock stops."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(executor_module, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    config = LookaheadConfig(max_batch_size=1, decoding_length=3, window_size=1, ngram_size=2, mode="trie")
    engine = LookaheadEngine(tiny_model("llama"), CharTokenizer(), config)

    def device_done() -> None:
        clock.now += 1.0  # the device's work, seen only by waiting for it

    monkeypatch.setattr(engine.runner, "synchronize", device_done)
    timed: list[float] = []
    run, apart = Executor.run, Executor.prompt_apart
    monkeypatch.setattr(Executor, "run", lambda self, *a: _kept(timed, run(self, *a), lambda o: o.seconds))
    monkeypatch.setattr(
        Executor, "prompt_apart", lambda self, *a: _kept(timed, apart(self, *a), lambda o: o[2])
    )
    engine.complete([3, 4, 5, 3, 4, 5, 3, 4, 5], max_new_tokens=6)
    assert timed and all(seconds == 1.0 for seconds in timed)


def _kept(seen: list[float], output: Any, seconds: Callable[[Any], float]) -> Any:
    seen.append(seconds(output))
    return output


# ------------------------------------------------------- a cache file that cannot be used (issue 60)


def _holding(data: str | bytes) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def damage(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return damage


def _a_folder_at_the_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path.unlink()
    path.mkdir()


def _a_file_at_the_folder(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.rmtree(path.parent)
    path.parent.write_text("not a folder")


def _no_write_permission(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder refuses every new file and folder, as chmod a-w would (it binds no root)."""
    path.unlink()
    folder, real_open, real_mkdir = str(path.parent), os.open, os.mkdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def refused(target: Any) -> bool:
        return os.fspath(target).startswith(folder)

    def open_(target: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if refused(target) and flags & writes:
            raise PermissionError(13, "Permission denied", os.fspath(target))
        return real_open(target, flags, *args, **kwargs)

    def mkdir(target: Any, *args: Any, **kwargs: Any) -> None:
        if refused(target) and not os.path.isdir(target):
            raise PermissionError(13, "Permission denied", os.fspath(target))
        real_mkdir(target, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)


# (case, what is done to a cache file the call wrote before): the next call is a miss, done anew
# (chosen, measured, learned afresh) with a warning naming the file, and never fails
UNUSABLE_CACHE_CASES: list[tuple[str, Callable[[Path, pytest.MonkeyPatch], None]]] = [
    ("a JSON list", _holding("[]")),
    ("null", _holding("null")),
    ("a string", _holding('"onednn"')),
    ("a number", _holding("3")),
    ("an array nested 100,000 deep", _holding("[" * 100_000 + "]" * 100_000)),
    ("an object nested 100,000 deep", _holding('{"a":' * 100_000 + "1" + "}" * 100_000)),
    ("not UTF-8", _holding(b"\xff\xfe{\x00")),
    ("a folder where the file should be", _a_folder_at_the_file),
    ("a file where the folder should be", _a_file_at_the_folder),
    ("a folder without write permission", _no_write_permission),
]
_KEY = {"model": "m", "packed": False}


def _kernels(folder: Path, kernel: str) -> object:
    return cached_classes(folder, _KEY, lambda: (((1, kernel),), False))


def _costs(folder: Path, kernel: str) -> object:
    return cached_curve(folder, _KEY, lambda: CostCurve((1, 2), (1.0, 1.5 if kernel == "onednn" else 9.0)))


def _acceptance(folder: Path, kernel: str) -> object:
    planner, path = StepPlanner(LookaheadConfig()), folder / "acceptance-m.json"
    planner.load_acceptance(path, _KEY)
    if kernel == "torch":  # the first call: a table worth reading back
        planner.acceptance.load_state({"buckets": [["doc1", True, 3, 2.0, 5.0]], "scales": []})
    save_acceptance(path, _KEY, planner.acceptance)
    return planner.acceptance.state()


# (cache, its call: what it reads back, or makes anew as the second argument says)
CACHES: list[tuple[str, Callable[[Path, str], object]]] = [
    ("kernel choice", _kernels),
    ("cost curve", _costs),
    ("acceptance table", _acceptance),
]


@pytest.mark.parametrize(("cache", "call"), CACHES, ids=[c[0] for c in CACHES])
@pytest.mark.parametrize(("case", "damage"), UNUSABLE_CACHE_CASES, ids=[c[0] for c in UNUSABLE_CACHE_CASES])
def test_a_cache_file_that_cannot_be_used_is_a_miss_with_a_warning_naming_it(
    tmp_path, monkeypatch, cache, call, case, damage
) -> None:
    folder = tmp_path / "cache"
    call(folder, "torch")
    (path,) = (p for p in folder.iterdir() if not p.name.startswith("."))  # not its lock
    fresh = call(tmp_path / "fresh", "onednn")  # what a process without the file makes
    damage(path, monkeypatch)
    with pytest.warns(UserWarning) as warned:
        assert call(folder, "onednn") == fresh
    assert any(str(path) in str(w.message) for w in warned), [str(w.message) for w in warned]
