"""The repository's example, examples/llamaindex_rag.py, runs end to end (briefly)."""

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "llamaindex_rag.py"


def test_example_streams_identical_answers_and_reports_speed(capsys) -> None:
    spec = importlib.util.spec_from_file_location("llamaindex_rag_example", EXAMPLE)
    assert spec is not None and spec.loader is not None, f"{EXAMPLE} is missing"
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--max-new-tokens", "12", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "same text: True" in out and "tok/s end to end" in out


AGENT = EXAMPLE.parent / "llamaindex_agent.py"


def test_agent_example_calls_the_tool_and_answers(capsys) -> None:
    spec = importlib.util.spec_from_file_location("llamaindex_agent_example", AGENT)
    assert spec is not None and spec.loader is not None, f"{AGENT} is missing"
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--questions", "1", "--max-new-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "tool call: search_corpus({'query': " in out and "tool result: " in out
    assert "answer: " in out and "tokens per forward" in out
