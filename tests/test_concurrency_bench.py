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
        for key in ("tokens_per_s", "speedup_vs_serialised", "p95_latency_vs_serialised"):
            assert figures[key] == round(statistics.median(r[key] for r in rounds), 3)
    assert all(r["speedup_vs_serialised"] == 1.0 for r in methods["serialised"]["rounds"])
    best, base = methods["batched"]["best"], methods["serialised"]["best"]
    assert best["tokens_per_s"] == max(r["tokens_per_s"] for r in methods["batched"]["rounds"])
    assert best["p95_latency_s"] == min(r["p95_latency_s"] for r in methods["batched"]["rounds"])
    assert best["speedup_vs_serialised"] == round(best["tokens_per_s"] / base["tokens_per_s"], 3)
    assert best["p95_latency_vs_serialised"] == round(best["p95_latency_s"] / base["p95_latency_s"], 3)


def test_one_round_reports_that_round_alone() -> None:
    summary = run_concurrency(tiny_engine(), INPUTS, 4, [2], ["batched"])
    figures = summary["concurrency"]["2"]["methods"]["batched"]
    assert "rounds" not in figures and figures["identical_to_greedy"] == 2


def test_rounds_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run_concurrency(tiny_engine(), INPUTS, 4, [2], ["batched"], rounds=0)
