"""`ServerEngine` against real vLLM CPU servers serving the default SmolLM2-135M-Instruct."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import MAX_NEW_TOKENS

from rag_lookahead.remote import ServerEngine

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_ngram_speculation_changes_no_greedy_answer(
    ngram_engine: ServerEngine, prompts: list[list[dict[str, str]]], plain_answers: list[str]
) -> None:
    answers = [ngram_engine.complete(p, max_new_tokens=MAX_NEW_TOKENS).text for p in prompts]
    assert all(plain_answers), "the reference server gave an empty answer"
    assert answers == plain_answers


def test_a_quoting_answer_accepts_drafted_tokens(
    ngram_engine: ServerEngine, prompts: list[list[dict[str, str]]]
) -> None:
    before = ngram_engine.speculation_counters()
    completion = ngram_engine.complete(prompts[-1], max_new_tokens=MAX_NEW_TOKENS)
    run = ngram_engine.speculation_counters() - before
    assert completion.stats.new_tokens > 0
    assert run.drafts > 0
    assert 0 < run.accepted_tokens <= run.draft_tokens


def test_eight_concurrent_requests_complete(
    ngram_engine: ServerEngine, prompts: list[list[dict[str, str]]]
) -> None:
    batch = [prompts[i % len(prompts)] for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        completions = list(pool.map(lambda p: ngram_engine.complete(p, max_new_tokens=MAX_NEW_TOKENS), batch))
    for completion in completions:
        assert completion.text
        assert completion.stats.finish_reason in ("eos", "length", "stop_string")
        assert 0 < completion.stats.new_tokens <= MAX_NEW_TOKENS
        assert completion.stats.prompt_tokens > 0


def test_documents_not_in_the_prompt_are_refused(ngram_engine: ServerEngine) -> None:
    with pytest.raises(ValueError, match="not in the prompt"):
        ngram_engine.complete("Say hello.", documents=["A passage the prompt does not show."])


@pytest.mark.parametrize(
    ("script", "options"),
    [
        ("langchain_rag.py", ["--questions", "2", "--max-new-tokens", "32"]),
        ("llamaindex_rag.py", ["--max-new-tokens", "32"]),
    ],
)
def test_example_runs_against_the_server(ngram_engine: ServerEngine, script: str, options: list[str]) -> None:
    config = ngram_engine.config
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / script),
            "--base-url",
            config.base_url,
            "--model",
            config.model,
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "draft tokens accepted" in result.stdout
