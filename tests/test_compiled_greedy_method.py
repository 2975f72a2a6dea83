"""The benchmark's ``greedy_compiled``: transformers' static cache and compiled decoding step,
the plain decoding a GPU user reaches for first, answering exactly as ``generate`` does."""

from __future__ import annotations

from rag_lookahead.bench import BenchInput, run_benchmark
from rag_lookahead.testing import tiny_engine


def test_greedy_compiled_answers_as_greedy_with_one_cache_for_every_prompt() -> None:
    """Prompts of two lengths through one static cache (reset between them) and one compiled
    step (on this CPU, inductor's): the greedy answers, token for token."""
    inputs = [BenchInput([3, 14, 15, 9, 2, 6] * 4), BenchInput([5, 3, 5, 8, 9, 7, 9])]
    summary = run_benchmark(tiny_engine(), inputs, 10, ["greedy", "greedy_compiled"])
    compiled = summary["methods"]["greedy_compiled"]
    assert compiled["identical_to_greedy"] == len(inputs)
    assert compiled["new_tokens"] == summary["methods"]["greedy"]["new_tokens"]
