"""`demo` says what it is doing at each step, streams the lookahead answer as it decodes and
flushes as it goes (a pipe shows it as it comes); on a tiny model saved to disk, so that it is
quick. tests/test_cli_rag.py runs it on the real default model."""

import io
import sys
from pathlib import Path

import pytest

from rag_lookahead.cli import main
from rag_lookahead.testing import save_tiny_model


class Flushes(io.StringIO):
    """Standard output that keeps what had been written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def flush(self) -> None:
        self.seen.append(self.getvalue())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_the_demo_talks_streams_and_flushes(model_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # its cost curve measured afresh, there
    out, err = Flushes(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["demo", "--model", str(model_dir), "--questions", "2", "--max-new-tokens", "6"]) == 0
    text = out.getvalue()
    steps = [
        "Indexing the bundled corpus",
        "Loading the model",
        "Measuring the model's forward costs",
        "Warming up the lookahead path",
        "=== Question 1/2: ",
        "=== Question 2/2: ",
        "(plain decoding first this time",
        "All 2 answers: median ",
    ]
    assert [text.find(step) for step in steps] == sorted(text.find(step) for step in steps)
    assert -1 not in [text.find(step) for step in steps] and "2/2 identical" in text
    # The first answer is flushed before it is whole: its text is out, its sources are not yet.
    question = text.index("=== Question 1/2: ")
    start = text.index("\n", question) + 1
    assert any(len(seen) > start and "sources:" not in seen[start:] for seen in out.seen)
    assert out.seen[-1] == text  # nothing left in a buffer
    # Where standard error is no terminal, the waits are told as lines there.
    assert "embedding: 1/1" in err.getvalue() and "measuring forward costs (once): " in err.getvalue()
