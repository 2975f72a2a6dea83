"""The repository's LangChain examples, examples/langchain_rag.py and examples/langgraph_agent.py,
run end to end (briefly)."""

import pytest

from rag_lookahead.testing import load_example

pytestmark = pytest.mark.model


def test_example_streams_identical_answers_and_reports_speed(capsys) -> None:
    example = load_example("langchain_rag.py")
    assert example.main(["--max-new-tokens", "16", "--questions", "1", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "hybrid retrieval" in out and "Identical answers." in out and "tok/s" in out


def test_the_agent_calls_the_retriever_tool_then_answers(capsys) -> None:
    example = load_example("langgraph_agent.py")
    assert example.main(["--max-new-tokens", "64", "--questions", "1", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "tool call: search_corpus({'query': " in out
    assert "tool result: " in out and "answer: " in out
