"""`index`, `ask`, `chat`, `demo`, `bench --retrieval hybrid` and `bench --fresh` end to end, with the
real default model."""

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from rag_lookahead.cli import main

pytestmark = pytest.mark.slow
CORPUS = Path(__file__).parent / "fixtures" / "corpus"
SAMPLE = resources.files("rag_lookahead") / "data" / "sample.jsonl"
FAST = ["--max-new-tokens", "12", "--threads", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("corpus") / "docs"
    shutil.copytree(CORPUS, copy)
    return copy


@pytest.fixture(scope="module")
def index_dir(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index") / "idx"
    assert main(["index", str(corpus), "--out", str(out)]) == 0
    return out


def test_index_builds_then_updates_without_stale_chunks(corpus, tmp_path, capsys) -> None:
    out = tmp_path / "idx"
    assert main(["index", str(corpus), "--out", str(out)]) == 0
    assert "built" in capsys.readouterr().out
    (corpus / "notes.txt").write_text("Kettles descale best with citric acid.\n")
    (corpus / "blob.txt").write_bytes(b"\x00\x01binary")
    try:
        assert main(["index", str(corpus), "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert "updated" in printed and "1 sources added" in printed
        assert "skipped" in printed and "binary" in printed
    finally:
        (corpus / "notes.txt").unlink()
        (corpus / "blob.txt").unlink()
    assert main(["index", str(corpus), "--out", str(out)]) == 0
    assert "1 removed" in capsys.readouterr().out


def test_ask_streams_the_answer_then_its_sources(index_dir, capsys) -> None:
    question = "How often should a sourdough starter be fed?"
    assert main(["ask", "--index", str(index_dir), question, *FAST]) == 0
    fast = capsys.readouterr().out
    assert main(["ask", "--index", str(index_dir), question, "--no-lookahead", *FAST]) == 0
    plain = capsys.readouterr().out
    assert "sources:" in fast and "sourdough.txt" in fast and "similarity" in fast
    assert fast.split("sources:")[0] == plain.split("sources:")[0]


def test_chat_answers_until_an_empty_line_and_debug_marks_drafts(index_dir, capsys, monkeypatch) -> None:
    lines = iter(["How often should a sourdough starter be fed?", "", "never read"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    # Drafts forced: `auto` verifies none where its curve says they do not pay (a busy machine).
    assert main(["chat", "--index", str(index_dir), "--debug", "--mode", "trie", *FAST]) == 0
    out = capsys.readouterr().out
    assert "sources:" in out and "|" in out and "[" in out  # a `[source|drafted]` mark
    assert next(lines) == "never read"


def test_demo_indexes_the_bundled_corpus_and_compares(capsys) -> None:
    assert main(["demo", "--max-new-tokens", "8", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("identical: True") == 12 and "normans.md" in out
    assert "per answer:" in out and "All 12 answers:" in out and "12/12 identical" in out


def test_demo_asks_the_first_questions_and_says_how_busy_the_machine_was(capsys) -> None:
    assert main(["demo", "--questions", "2", "--max-new-tokens", "8", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 2 and "All 2 answers:" in out and "2/2 identical" in out
    assert "While timing, the machine was" in out or "load is unknown" in out


def test_bench_with_retrieved_contexts_matches_greedy(tmp_path) -> None:
    out = tmp_path / "rag.json"
    with resources.as_file(SAMPLE) as path:
        args = ["bench", "--data", str(path), "--retrieval", "hybrid", "--limit", "2", "--json", str(out)]
        assert main([*args, "--max-new-tokens", "8", "--methods", "lookahead"]) == 0
    summary = json.loads(out.read_text())
    assert summary["retrieval"] == "hybrid" and summary["top_k"] == 4
    assert all(m["identical_to_greedy"] == 2 for m in summary["methods"].values())


def test_bench_fresh_times_each_answer_both_ways(tmp_path, capsys) -> None:
    out = tmp_path / "fresh.json"
    args = ["bench", "--fresh", "--data", "bundled", "--limit", "2", "--json", str(out), "--plot"]
    assert main([*args, str(tmp_path / "fresh.png"), "--cost-curve", "1:1,2:1.64,16:2.55", *FAST]) == 0
    summary = json.loads(out.read_text())
    assert summary["records"] == 2 and summary["identical"] == 2 and summary["cost_curve"] == "injected"
    assert summary["relative_costs"]["2"] == 1.64 and (tmp_path / "fresh.png").is_file()
    assert [set(a) >= {"ratio", "plain_s", "lookahead_s", "identical"} for a in summary["answers"]] == [
        True
    ] * 2
    assert "aggregate" in capsys.readouterr().out
    assert main(["bench", "--fresh", "--data", "bundled", "--cost-curve", "2:1,1", *FAST]) == 2
    assert "--cost-curve takes size:cost pairs" in capsys.readouterr().err


def test_bad_index_directories_are_clear_errors(tmp_path, capsys) -> None:
    assert main(["ask", "--index", str(tmp_path / "missing"), "question?"]) == 2
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.json").write_text('{"format": "rag-lookahead-index", "format_version": 99}')
    assert main(["ask", "--index", str(tmp_path / "old"), "question?"]) == 2
    err = capsys.readouterr().err
    assert err.count("rag-lookahead: error:") == 2 and "Traceback" not in err
