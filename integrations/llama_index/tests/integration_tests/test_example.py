"""The repository's LlamaIndex examples, examples/llamaindex_rag.py and
examples/llamaindex_agent.py, run end to end (briefly)."""

from rag_lookahead.testing import load_example


def test_example_streams_identical_answers_and_reports_speed(capsys) -> None:
    example = load_example("llamaindex_rag.py")
    assert example.main(["--max-new-tokens", "12", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "same text: True" in out and "tok/s end to end" in out


def test_agent_example_calls_the_tool_and_answers(capsys) -> None:
    example = load_example("llamaindex_agent.py")
    assert example.main(["--questions", "1", "--max-new-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "tool call: search_corpus({'query': " in out and "tool result: " in out
    assert "answer: " in out and "tokens per forward" in out
