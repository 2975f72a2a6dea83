"""The repository's agent example, examples/langgraph_agent.py, runs end to end (briefly)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "langgraph_agent.py"


def test_the_agent_calls_the_retriever_tool_then_answers(capsys) -> None:
    spec = importlib.util.spec_from_file_location("langgraph_agent_example", EXAMPLE)
    assert spec is not None and spec.loader is not None, f"{EXAMPLE} is missing"
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--max-new-tokens", "64", "--questions", "1", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "tool call: search_corpus({'query': " in out
    assert "tool result: " in out and "answer: " in out
