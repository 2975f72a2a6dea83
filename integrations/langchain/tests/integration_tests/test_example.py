"""The repository's example, examples/langchain_rag.py, runs end to end (briefly)."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "langchain_rag.py"


def test_example_streams_identical_answers_and_reports_speed(capsys) -> None:
    spec = importlib.util.spec_from_file_location("langchain_rag_example", EXAMPLE)
    assert spec is not None and spec.loader is not None, f"{EXAMPLE} is missing"
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--max-new-tokens", "16", "--questions", "1", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "hybrid retrieval" in out and "Identical answers." in out and "tok/s" in out
