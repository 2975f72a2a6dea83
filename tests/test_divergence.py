"""Where an answer leaves greedy's, and generate's margin there (the benchmarks' check of
answers that are not greedy's, as in bf16 on a GPU)."""

from __future__ import annotations

import pytest
import torch

from rag_lookahead.bench import divergence as divergence_module
from rag_lookahead.bench.divergence import describe, divergence, divergences, first_difference
from rag_lookahead.bench.run import BenchInput, hf_generate, run_benchmark
from rag_lookahead.testing import tiny_engine

PROMPT = [40, 73, 0, 84, 72, 69]


@pytest.mark.parametrize(
    ("answer", "reference", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 4], [1, 2, 3], 2),
        ([5, 2, 3], [1, 2, 3], 0),
        ([1, 2], [1, 2, 3], 2),  # the answer ended first
        ([1, 2, 3, 4], [1, 2, 3], 3),  # greedy's ended first
        ([], [], None),
        ([], [7], 0),
    ],
)
def test_the_first_token_that_differs(answer: list[int], reference: list[int], expected: int | None) -> None:
    assert first_difference(answer, reference) == expected


def _logits_after(engine, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The model's logits for the token after ``ids``, one forward over them all."""
    with torch.inference_mode():
        return engine.model(torch.tensor([ids])).logits[0, -1]  # [V]


def test_the_margin_is_generates_own_at_the_first_differing_token() -> None:
    engine = tiny_engine()
    reference = hf_generate(engine, PROMPT, 8)
    index = 3
    logits = _logits_after(engine, [*PROMPT, *reference[:index]])
    runner_up = int(logits.topk(2).indices[1])
    answer = [*reference[:index], runner_up, *reference[index + 1 :]]
    found = divergence(engine, PROMPT, answer, reference)
    assert found is not None
    assert (found["position"], found["greedy_token"], found["token"], found["rank"]) == (
        index,
        reference[index],
        runner_up,
        2,
    )
    expected = float(logits[reference[index]] - logits[runner_up])
    assert found["margin"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert found["margin"] >= 0
    assert found["logit"] == pytest.approx(float(logits[reference[index]]), rel=1e-4, abs=1e-5)
    assert found["spacing"] == pytest.approx(abs(found["logit"]) * torch.finfo(torch.float32).eps, rel=1.0)


def test_an_answer_that_ends_first_has_no_margin() -> None:
    engine = tiny_engine()
    reference = hf_generate(engine, PROMPT, 6)
    found = divergence(engine, PROMPT, reference[:4], reference)
    assert found == {"position": 4, "greedy_token": reference[4], "token": None, "margin": None, "rank": None}


def test_a_reference_that_generate_does_not_repeat_is_said_so() -> None:
    engine = tiny_engine()
    greedy = hf_generate(engine, PROMPT, 6)
    other = (greedy[0] + 1) % engine.model.config.vocab_size
    reference = [other, *greedy[1:]]  # not what greedy decoding answers
    answer = [*reference[:3], (reference[3] + 1) % engine.model.config.vocab_size, *reference[4:]]
    found = divergence(engine, PROMPT, answer, reference)
    assert found is not None and found["repeated"] is False and found["margin"] is None
    assert "not repeated" in describe("m", [{"answer": 0, **found}])[0]


def test_only_the_answers_that_differ_are_listed_with_their_index() -> None:
    engine = tiny_engine()
    reference = hf_generate(engine, PROMPT, 6)
    changed = [*reference[:2], (reference[2] + 1) % engine.model.config.vocab_size, *reference[3:]]
    found = divergences(engine, [PROMPT, PROMPT], [reference, changed], [reference, reference])
    assert [(f["answer"], f["position"]) for f in found] == [(1, 2)]
    assert describe("lookahead", found) == [
        f"  lookahead: answer 1 leaves greedy's at token 2: generate's margin {found[0]['margin']:.4g} "
        f"(spacing {found[0]['spacing']:.4g}), its choice ranked {found[0]['rank']}"
    ]


def test_the_benchmark_lists_none_where_every_answer_is_greedys() -> None:
    summary = run_benchmark(tiny_engine(), [BenchInput(PROMPT)], 6, ["greedy", "lookahead"])
    for figures in summary["methods"].values():
        assert figures["identical_to_greedy"] == 1 and figures["divergences"] == []


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(20.5, torch.bfloat16), (-20.5, torch.bfloat16), (1.0, torch.float32), (3.0, torch.float16)],
)
def test_the_spacing_is_the_dtypes_step_at_the_value(value: float, dtype: torch.dtype) -> None:
    here = torch.tensor(value, dtype=dtype)
    away = torch.nextafter(here, torch.tensor(float("inf") if value > 0 else float("-inf"), dtype=dtype))
    assert divergence_module._spacing(value, dtype) == abs(float(away) - float(here))
