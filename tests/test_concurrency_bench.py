"""The concurrency benchmark's rounds: methods alternated, figures the medians of the rounds."""

from __future__ import annotations

import statistics

import pytest

from rag_lookahead.bench import concurrency
from rag_lookahead.bench.concurrency import run_concurrency
from rag_lookahead.bench.run import BenchInput
from rag_lookahead.testing import tiny_engine

INPUTS = [BenchInput([40, 73, 0, 84, 72, 69]), BenchInput([52, 72, 69, 0, 67, 65])]


def test_rounds_alternate_the_methods_and_report_the_medians(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    run_method = concurrency._run_method

    def spied(engine, name, *args):  # type: ignore[no-untyped-def]
        order.append(name)
        return run_method(engine, name, *args)

    monkeypatch.setattr(concurrency, "_run_method", spied)
    summary = run_concurrency(tiny_engine(), INPUTS, 6, [2], ["serialised", "batched"], rounds=3)
    assert order == ["serialised", "batched", "batched", "serialised", "serialised", "batched"]
    methods = summary["concurrency"]["2"]["methods"]
    assert list(methods) == ["serialised", "batched"]
    for figures in methods.values():
        rounds = figures["rounds"]
        assert len(rounds) == 3
        assert figures["identical_to_greedy"] == figures["answers"] == len(INPUTS)
        assert figures["divergences"] == []
        for key in ("tokens_per_s", "speedup_vs_serialised", "p95_latency_vs_serialised"):
            assert figures[key] == round(statistics.median(r[key] for r in rounds), 3)
    assert all(r["speedup_vs_serialised"] == 1.0 for r in methods["serialised"]["rounds"])
    best, base = methods["batched"]["best"], methods["serialised"]["best"]
    assert best["tokens_per_s"] == max(r["tokens_per_s"] for r in methods["batched"]["rounds"])
    assert best["p95_latency_s"] == min(r["p95_latency_s"] for r in methods["batched"]["rounds"])
    assert best["speedup_vs_serialised"] == round(best["tokens_per_s"] / base["tokens_per_s"], 3)
    assert best["p95_latency_vs_serialised"] == round(best["p95_latency_s"] / base["p95_latency_s"], 3)


def test_the_answers_that_differ_are_those_of_the_round_with_fewest_identical() -> None:
    def round_(identical: int, diverging: list[dict[str, int]]) -> dict[str, dict[str, object]]:
        return {
            "m": {
                "identical_to_greedy": identical,
                "divergences": diverging,
                "tokens_per_s": 1.0,
                "p95_latency_s": 1.0,
            }
        }

    runs = [round_(2, []), round_(1, [{"answer": 1, "position": 4}]), round_(2, [])]
    assert concurrency._medians(runs)["m"]["divergences"] == [{"answer": 1, "position": 4}]  # type: ignore[arg-type]


def test_one_round_reports_that_round_alone() -> None:
    summary = run_concurrency(tiny_engine(), INPUTS, 4, [2], ["batched"])
    figures = summary["concurrency"]["2"]["methods"]["batched"]
    assert "rounds" not in figures and figures["identical_to_greedy"] == 2


def test_rounds_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run_concurrency(tiny_engine(), INPUTS, 4, [2], ["batched"], rounds=0)


def test_this_engines_runs_leave_out_their_own_prompt_forwards() -> None:
    """The decode rate that leaves out the prompts' forwards as timed in the run itself (a
    machine's speed drifts between a timing before the runs and the runs)."""
    summary = run_concurrency(tiny_engine(), INPUTS, 6, [2], ["serialised", "batched", "hf_static_batch"])
    methods = summary["concurrency"]["2"]["methods"]
    for name in ("serialised", "batched"):
        figures = methods[name]
        own = figures["prompt_forward_seconds"]
        assert 0 < own < figures["seconds"]
        # Both times are reported to the millisecond, so on a tiny model the rate is checked
        # against the interval their rounding allows, not a relative tolerance.
        rest = figures["seconds"] - own
        lowest, highest = figures["new_tokens"] / (rest + 0.001), figures["new_tokens"] / (rest - 0.001)
        assert lowest - 0.001 <= figures["run_decode_tokens_per_s"] <= highest + 0.001
    assert "run_decode_speedup_vs_serialised" in methods["batched"]
    assert "run_decode_tokens_per_s" not in methods["hf_static_batch"]  # not this engine's


def test_the_scheduler_counts_the_prompts_it_forwards_alone() -> None:
    engine = tiny_engine()
    assert engine.scheduler.prompt_forwards.forwards == 0
    for item in INPUTS:
        list(engine.stream(item.prompt_ids, max_new_tokens=3).chunks())
    counted = engine.scheduler.prompt_forwards
    assert counted.tokens == sum(len(item.prompt_ids) for item in INPUTS)  # no shared beginning
    assert counted.forwards == len(INPUTS) and counted.seconds > 0


def test_an_answer_that_is_not_greedys_is_listed_with_where_it_leaves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's own answers, not the reference, are what is compared: one changed after the
    engine streamed it is counted, listed and described under the table."""
    stream = concurrency._stream

    def altered(engine, item, max_new_tokens, served):  # type: ignore[no-untyped-def]
        stream(engine, item, max_new_tokens, served)
        if item is INPUTS[1]:
            served.tokens[2] = (served.tokens[2] + 1) % engine.model.config.vocab_size

    monkeypatch.setattr(concurrency, "_stream", altered)
    summary = run_concurrency(tiny_engine(), INPUTS, 6, [2], ["batched"])
    figures = summary["concurrency"]["2"]["methods"]["batched"]
    assert figures["identical_to_greedy"] == len(INPUTS) - 1
    [found] = figures["divergences"]
    assert (found["answer"], found["position"]) == (1, 2) and found["rank"] > 1
    assert "batched: answer 1 leaves greedy's at token 2" in concurrency.format_concurrency(summary)
