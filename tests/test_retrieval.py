"""Structure-aware chunks, keyword and hybrid search, the keyword index on disk, eval-retrieval."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_lookahead.cli import build_parser, main
from rag_lookahead.cli.setup import retrieval_config
from rag_lookahead.rag import (
    Chunk,
    ChunkingConfig,
    Document,
    DocumentIndex,
    IndexFormatError,
    RagPipeline,
    RetrievalConfig,
    SentenceTransformerEmbedder,
    keyword,
    split_document,
)
from rag_lookahead.rag.keyword import KeywordIndex, tokenize
from rag_lookahead.rag.pipeline import format_sources
from rag_lookahead.testing import tiny_engine

STDLIB = Path(__file__).parent / "fixtures" / "stdlib"
REBUILD = "rebuild it with `rag-lookahead index`"
DEDENT = "What does textwrap.dedent do?"


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="module")
def stdlib(embedder) -> DocumentIndex:
    index, skipped = DocumentIndex.build([STDLIB], embedder)
    assert skipped == []
    return index


def count(embedder, text: str) -> int:
    return len(embedder.tokenizer(text, add_special_tokens=False)["input_ids"])


def chunks_of(embedder, source: str, text: str, **config: Any) -> list[Chunk]:
    chunks = split_document(Document(source, text), ChunkingConfig(**config), embedder.tokenizer)
    for chunk in chunks:
        assert text[chunk.start : chunk.end] == chunk.text
    return chunks


# ----------------------------------------------------------------------------- chunking

GUIDE = """Text before any heading.

# Kettles

Descale a kettle with citric acid.

## Descaling

```sh
# not a heading: a comment in a fence
descale --acid citric
```

> # Nor is this one, inside a quote

### Safety

Unplug it first.

## Filling
Fill to the line.

Setext heading
--------------

- first item
- second item
"""


def test_markdown_chunks_never_straddle_a_heading_and_keep_its_path(embedder) -> None:
    chunks = chunks_of(embedder, "guide.md", GUIDE, size=200, overlap=20)
    assert [(c.headings, c.text.splitlines()[0]) for c in chunks] == [
        ((), "Text before any heading."),
        (("Kettles",), "Descale a kettle with citric acid."),
        (("Kettles", "Descaling"), "```sh"),
        (("Kettles", "Descaling", "Safety"), "Unplug it first."),
        (("Kettles", "Filling"), "Fill to the line."),
        (("Kettles", "Setext heading"), "- first item"),
    ]
    fence = chunks[2]
    assert "# not a heading" in fence.text and "> # Nor is this one" in fence.text
    assert all(not re.search(r"^#+ (Kettles|Descaling|Safety|Filling)", c.text, re.M) for c in chunks)
    assert chunks[5].indexed_text == "Kettles > Setext heading\n- first item\n- second item"
    assert chunks[0].indexed_text == chunks[0].text  # no headings, nothing added


def test_the_same_text_as_plain_text_is_cut_at_paragraphs_only(embedder) -> None:
    chunks = chunks_of(embedder, "guide.txt", GUIDE, size=200, overlap=20)
    assert len(chunks) == 1 and chunks[0].headings == () and "# Kettles" in chunks[0].text


def test_windows_lines_and_offsets_survive_crlf(embedder) -> None:
    text = GUIDE.replace("\n", "\r\n")
    chunks = chunks_of(embedder, "guide.md", text, size=200, overlap=20)
    assert [c.headings for c in chunks] == [
        c.headings for c in chunks_of(embedder, "guide.md", GUIDE, size=200, overlap=20)
    ]
    tokens = chunks_of(embedder, "guide.md", text, size=8, overlap=2, unit="tokens")
    assert {c.headings for c in tokens} == {c.headings for c in chunks}


def test_whole_paragraphs_are_packed_before_sentences(embedder) -> None:
    paragraphs = [
        f"Paragraph {n} has a first sentence about topic {n}. It has a second one too. And a third."
        for n in range(8)
    ]
    text = "\n\n".join(paragraphs)
    size = 3 * count(embedder, paragraphs[0]) + 2  # room for three whole paragraphs
    chunks = chunks_of(embedder, "notes.txt", text, size=size, overlap=10)
    starts = {text.index(p) for p in paragraphs}
    ends = {text.index(p) + len(p) for p in paragraphs}
    assert all(c.start in starts and c.end in ends for c in chunks)
    assert len(chunks) == 3 and all(a.end < b.start for a, b in pairwise(chunks))


def test_a_long_paragraph_is_cut_at_sentences_with_overlap_inside_it(embedder) -> None:
    sentences = [f"Sentence number {n} says something about bees and flowers." for n in range(12)]
    outro = "A closing paragraph, about something else entirely, ends the text here."
    text = "Short intro.\n\n" + " ".join(sentences) + "\n\n" + outro
    chunks = chunks_of(embedder, "bees.txt", text, size=40, overlap=15)
    assert all(count(embedder, c.text) <= 40 for c in chunks)
    starts = {text.index(s) for s in sentences} | {0, text.index(outro)}
    assert all(c.start in starts for c in chunks)
    overlaps = [(a, b) for a, b in pairwise(chunks) if b.start < a.end]
    assert overlaps  # repeated trailing sentences inside the long paragraph...
    assert chunks[-1].text == outro  # ...but nothing repeated across a paragraph break


def test_a_code_fence_is_kept_whole_unless_it_alone_is_too_long(embedder) -> None:
    short = "\n".join(f"x{n} = compute({n})" for n in range(4))
    long = "\n".join(f"value_{n} = transform(value_{n - 1}, factor={n})" for n in range(1, 40))
    text = f"# Code\n\nIntro line.\n\n```python\n{short}\n```\n\nMiddle.\n\n```python\n{long}\n```\n"
    chunks = chunks_of(embedder, "code.md", text, size=60, overlap=10)
    assert any(f"```python\n{short}\n```" in c.text for c in chunks)
    cut = [c for c in chunks if "transform" in c.text]
    assert len(cut) > 2 and all(count(embedder, c.text) <= 60 for c in cut)
    lines = set(long.splitlines())
    for chunk in cut:  # cut between lines, never inside one
        assert all(line in lines or line.startswith(("```", "Middle")) for line in chunk.text.splitlines())


def test_chunk_headings_are_validated() -> None:
    with pytest.raises(ValueError, match="headings must be a tuple of strings"):
        Chunk("x", "a.md", "hi", 0, 2, ["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="headings must be a tuple of strings"):
        Chunk("x", "a.md", "hi", 0, 2, ("a", 1))  # type: ignore[arg-type]
    assert Chunk.make("a.md", "hi", 0, 2, ("a",)).id != Chunk.make("a.md", "hi", 0, 2, ("b",)).id


# ----------------------------------------------------------------------- keyword search


def test_words_are_lowercased_stemmed_and_split_at_dots_and_underscores() -> None:
    assert tokenize("What does textwrap.dedent do?") == ["textwrap", "dedent"]
    assert tokenize("Copying shutil_copytree Trees") == ["copi", "shutil", "copytre", "tree"]
    assert tokenize("the of and ... ?!") == []


def test_keyword_search_returns_only_chunks_sharing_a_word() -> None:
    index = KeywordIndex.build(["bees make honey", "lighthouses guide ships", "honey bees dance"])
    assert [row for row, _ in index.search("Where do bees dance?", 5)] == [2, 0]
    assert index.search("submarine", 5) == [] and index.search("the", 5) == []
    assert KeywordIndex.build([]).search("bees", 3) == []


# (case, texts, query, the rows found): scripts written without spaces between words are cut
# into pairs of characters, so a phrase is found inside a longer run; Latin words as before.
SPACELESS_CASES: list[tuple[str, list[str], str, list[int]]] = [
    ("chinese quoted phrase", ["我们明天去北京大学参观。", "上海的天气很好。"], '"北京大学"', [0]),
    ("chinese one character", ["这只猫很可爱", "那只狗很凶"], "猫", [0]),
    ("chinese phrase absent", ["上海的天气很好。", "我们去北京大学。"], "广州", []),
    ("japanese quoted phrase", ["私は東京タワーに行きました。", "大阪城は美しい。"], "「東京タワー」", [0]),
    ("japanese hiragana phrase", ["きょうはいいてんきですね", "あしたはあめ"], "いいてんき", [0]),
    ("thai quoted phrase", ["ฉันชอบเรียนภาษาไทยมาก", "วันนี้อากาศดี"], '"ภาษาไทย"', [0]),
    ("thai tone marks", ["เราไปเที่ยวเชียงใหม่", "กรุงเทพฯ ร้อนมาก"], "เชียงใหม่", [0]),
    ("korean particle", ["서울에서 만나요", "부산은 바다가 좋아요"], "서울", [0]),
    ("latin beside han", ["iPhone用户很多", "Android phones"], "iphone", [0]),
    ("latin unchanged", ["bees make honey", "honey bees dance"], "Where do bees dance?", [1, 0]),
]


@pytest.mark.parametrize(
    ("case", "texts", "query", "rows"), SPACELESS_CASES, ids=[c[0] for c in SPACELESS_CASES]
)
def test_phrases_of_scripts_without_spaces_are_found(case, texts, query, rows) -> None:
    assert [row for row, _ in KeywordIndex.build(texts).search(query, 5)] == rows


def test_scripts_without_spaces_are_cut_into_pairs_of_characters() -> None:
    assert tokenize("北京大学", query=True) == ["北京", "京大", "大学"]
    assert tokenize("猫", query=True) == ["猫"]  # a lone character is a term of its own
    assert sorted(tokenize("猫很")) == ["很", "猫", "猫很"]  # a text's characters too, for such queries
    assert tokenize("เชียงใหม่", query=True) == ["เชี", "ชีย", "ยง", "งใ", "ให", "หม่"]  # marks kept
    assert tokenize("東京、大阪", query=True) == ["東京", "大阪"]  # punctuation ends a run
    assert tokenize("Copying shutil_copytree Trees", query=True) == ["copi", "shutil", "copytre", "tree"]


def test_the_dedent_question_finds_its_section_first(stdlib) -> None:
    for mode in ("hybrid", "keyword"):
        hits = stdlib.search(DEDENT, k=4, mode=mode)
        assert hits[0].chunk.headings[-1] == "textwrap.dedent", mode
        assert hits[0].chunk.text.startswith("`textwrap.dedent(text)` removes")
    label = format_sources(stdlib.search(DEDENT, k=1, mode="hybrid")).splitlines()[0]
    assert label == "[1] textwrap.md § textwrap — wrapping and filling text > textwrap.dedent"


def test_every_function_of_the_corpus_is_a_chunk_of_its_own(stdlib) -> None:
    functions = [c.headings[-1] for c in stdlib.chunks if len(c.headings) == 2]
    assert len(functions) == len(set(functions)) == 22
    assert all(c.text.count("\n## ") == 0 for c in stdlib.chunks)


def test_modes_score_and_similarity(stdlib, embedder) -> None:
    dense = stdlib.search("copy a directory tree", k=3, mode="dense")
    assert all(h.score == h.similarity for h in dense)
    assert dense[0].chunk.headings[-1] == "shutil.copytree"
    keyword = stdlib.search("copy a directory tree", k=3, mode="keyword")
    assert all(h.similarity is None and h.score > 0 for h in keyword)
    hybrid = stdlib.search("copy a directory tree", k=3, mode="hybrid")
    assert [h.score for h in hybrid] == sorted((h.score for h in hybrid), reverse=True)
    vector = embedder.embed(["copy a directory tree"])[0]
    for hit in hybrid:  # the cosine is reported even for chunks only the keywords found
        row = stdlib.chunks.index(hit.chunk)
        assert hit.similarity == pytest.approx(float(stdlib._faiss.reconstruct(row) @ vector), abs=1e-5)
    assert stdlib.search("copy a directory tree", k=3) == hybrid  # the default


def test_concurrent_searches_match_their_solo_results(stdlib) -> None:
    questions = [DEDENT, "copy a directory tree", "parse JSON text", "split a shell command line"] * 3
    solo = [stdlib.search(q, 4, "hybrid") for q in questions]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda q: stdlib.search(q, 4, "hybrid"), questions)) == solo


@pytest.mark.parametrize("mode", ["bm25", "", None, "Hybrid"])
def test_unknown_retrieval_modes_are_refused(stdlib, mode) -> None:
    with pytest.raises(ValueError, match="retrieval mode must be one of dense, keyword, hybrid"):
        stdlib.search(DEDENT, k=2, mode=mode)
    with pytest.raises(ValueError, match="retrieval mode must be one of"):
        RetrievalConfig(mode=mode)


@pytest.mark.parametrize(
    ("argv", "mode"),
    [
        (["ask", "--index", "i", "q?"], "hybrid"),
        (["chat", "--index", "i", "--retrieval", "keyword"], "keyword"),
        (["bench", "--data", "d.jsonl", "--retrieval", "faiss"], "dense"),  # the old name
        (["bench", "--data", "bundled"], "hybrid"),  # gold has no index; the bundled corpus does
    ],
)
def test_the_retrieval_flag_sets_the_mode(argv, mode) -> None:
    assert retrieval_config(build_parser().parse_args(argv)).mode == mode


def test_the_pipeline_filters_by_similarity_except_keyword_hits(stdlib) -> None:
    def retrieve(**config: Any) -> list[str]:
        pipeline = RagPipeline(engine=tiny_engine(), index=stdlib, config=RetrievalConfig(**config))
        return [hit.chunk.headings[-1] for hit in pipeline.retrieve(DEDENT)]

    assert RetrievalConfig().mode == "hybrid"
    assert retrieve()[0] == "textwrap.dedent"
    assert retrieve(min_score=0.99) == []
    assert retrieve(min_score=0.99, mode="keyword")[0] == "textwrap.dedent"


# ------------------------------------------------------------------------- on disk


def test_the_keyword_index_is_saved_updated_and_loaded(embedder, tmp_path: Path) -> None:
    corpus = tmp_path / "docs"
    shutil.copytree(STDLIB, corpus)
    index, _ = DocumentIndex.build([corpus], embedder)
    index.save(tmp_path / "idx")
    loaded = DocumentIndex.load(tmp_path / "idx", embedder)
    for mode in ("keyword", "hybrid"):
        assert loaded.search(DEDENT, 4, mode) == index.search(DEDENT, 4, mode)
    assert loaded.search("zymurgy", 4, "keyword") == []

    (corpus / "brewing.md").write_text(
        "# brewing\n\n## brewing.zymurgy\n\nZymurgy is the chemistry of brewing.\n"
    )
    (corpus / "textwrap.md").unlink()
    loaded.update([corpus])
    loaded.save(tmp_path / "idx")
    again = DocumentIndex.load(tmp_path / "idx", embedder)
    assert again.search("zymurgy", 4, "keyword")[0].chunk.headings == ("brewing", "brewing.zymurgy")
    assert all("textwrap" not in h.chunk.source for h in again.search(DEDENT, 4, "keyword"))


def saved(index: DocumentIndex, directory: Path) -> Path:
    index.save(directory)
    return directory


def _refresh(directory: Path, name: str) -> None:
    """Recompute a keyword file's digest in meta.json, as a careful forger would."""
    meta = json.loads((directory / "meta.json").read_text())
    meta["keyword"]["files"][name] = hashlib.sha256((directory / "keyword" / name).read_bytes()).hexdigest()
    (directory / "meta.json").write_text(json.dumps(meta))


def _edit_meta(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        meta = json.loads((directory / "meta.json").read_text())
        edit(meta)
        (directory / "meta.json").write_text(json.dumps(meta))

    return apply


def _append(name: str, data: bytes) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        with open(directory / "keyword" / name, "ab") as file:
            file.write(data)

    return apply


def _forge_array(name: str, array: np.ndarray) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        np.save(directory / "keyword" / name, array, allow_pickle=True)
        _refresh(directory, name)

    return apply


def _forge_json(name: str, edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        path = directory / "keyword" / name
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
        _refresh(directory, name)

    return apply


def _remove(name: str) -> Callable[[Path], None]:
    return lambda directory: (directory / "keyword" / name).unlink()


def _extra(directory: Path) -> None:
    (directory / "keyword" / "corpus.jsonl").write_text('{"id": 0}\n')


def _set_headings(value: Any) -> Callable[[Path], None]:
    def apply(directory: Path) -> None:
        lines = (directory / "chunks.jsonl").read_text().splitlines()
        record = json.loads(lines[0])
        record["headings"] = value
        lines[0] = json.dumps(record)
        (directory / "chunks.jsonl").write_text("\n".join(lines) + "\n")

    return apply


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("pickle ran",))


# (case, what is done to a saved index, words of the refusal)
DISK_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("keyword-file-edited", _append("vocab.index.json", b" "), "vocab.index.json does not match its SHA-256"),
    ("keyword-file-missing", _remove("indptr.csc.index.npy"), "an index of 27 chunks needs"),
    ("keyword-file-extra", _extra, "holds ['corpus.jsonl', "),
    ("keyword-folder-gone", lambda d: shutil.rmtree(d / "keyword"), "keyword is unreadable"),
    (
        "other-tokenizer",
        _edit_meta(lambda m: m["keyword"].update(tokenizer="words-v0")),
        "cut words as 'words-v0', but this rag-lookahead cuts them as",
    ),
    ("keyword-meta-missing", _edit_meta(lambda m: m.pop("keyword")), "meta.json is damaged"),
    (
        "keyword-digest-mistyped",
        _edit_meta(lambda m: m["keyword"]["files"].update({"vocab.index.json": 7})),
        "meta.json is damaged",
    ),
    (
        "rows-out-of-range",
        _forge_array("indices.csc.index.npy", np.full(4, 10**6, dtype=np.int32)),
        "keyword is damaged (the keyword index's arrays are inconsistent)",
    ),
    (
        "nan-scores",
        _forge_array("data.csc.index.npy", np.full(4, np.nan, dtype=np.float32)),
        "arrays are inconsistent",
    ),
    (
        "pickled-array",
        _forge_array("data.csc.index.npy", np.array([_Boom()], dtype=object)),
        "keyword is damaged (the keyword index is unreadable",
    ),
    (
        "params-extra-argument",
        _forge_json("params.index.json", lambda p: {**p, "evil": 1}),
        "keyword index is unreadable",
    ),
    (
        "params-other-row-count",
        _forge_json("params.index.json", lambda p: {**p, "num_docs": 3}),
        "does not hold 27 chunks",
    ),
    (
        "vocab-out-of-range",
        _forge_json("vocab.index.json", lambda v: {**v, "dedent": 10**6}),
        "arrays are inconsistent",
    ),
    ("vocab-not-a-dict", _forge_json("vocab.index.json", lambda v: list(v)), "keyword index is unreadable"),
    ("headings-not-a-list", _set_headings("textwrap"), "'headings' must be a list of strings"),
    ("headings-of-numbers", _set_headings([1, 2]), "'headings' must be a list of strings"),
]


@pytest.mark.parametrize(("case", "damage", "words"), DISK_CASES, ids=[c[0] for c in DISK_CASES])
def test_a_damaged_or_forged_keyword_index_is_refused(
    stdlib, embedder, tmp_path: Path, capsys, case, damage, words
) -> None:
    directory = saved(stdlib, tmp_path / "idx")
    damage(directory)
    with pytest.raises(IndexFormatError) as refused:
        DocumentIndex.load(directory, embedder)
    assert words in str(refused.value) and str(refused.value).endswith(REBUILD)
    assert "pickle ran" not in capsys.readouterr().out


def test_index_over_an_index_of_an_older_format_says_how_to_rebuild(
    stdlib, embedder, tmp_path: Path, capsys
) -> None:
    directory = saved(stdlib, tmp_path / "idx")
    _edit_meta(lambda m: m.update(format_version=2))(directory)
    assert main(["index", str(STDLIB), "--out", str(directory)]) == 2
    err = capsys.readouterr().err
    assert "format version 2" in err and f"remove {directory} first" in err


def test_an_index_saved_with_the_previous_word_cutting_is_searched_as_it_was_cut(
    embedder, tmp_path: Path
) -> None:
    """An index saved before scripts without spaces were cut into pairs still loads (its queries
    cut its way: Latin words alike); updated, its keyword index is cut the current way."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "notes.txt").write_text("Bees make honey.\n\n我们明天去北京大学参观。\n")
    index, _ = DocumentIndex.build([corpus], embedder)
    index._keyword = KeywordIndex.build(
        [chunk.indexed_text for chunk in index.chunks], keyword.PREVIOUS_TOKENIZER
    )
    directory = saved(index, tmp_path / "idx")
    assert (
        json.loads((directory / "meta.json").read_text())["keyword"]["tokenizer"]
        == keyword.PREVIOUS_TOKENIZER
    )
    old = DocumentIndex.load(directory, embedder)
    assert old.search("honey", 2, "keyword") and old.search("北京大学", 2, "keyword") == []
    old.update([corpus])  # nothing changed, but a saved update cuts the words anew
    old.save(directory)
    assert json.loads((directory / "meta.json").read_text())["keyword"]["tokenizer"] == keyword.TOKENIZER
    assert DocumentIndex.load(directory, embedder).search("北京大学", 2, "keyword")


def test_an_empty_index_saves_an_empty_keyword_folder(embedder, tmp_path: Path) -> None:
    directory = saved(DocumentIndex(embedder), tmp_path / "idx")
    assert list((directory / "keyword").iterdir()) == []
    assert DocumentIndex.load(directory, embedder).search(DEDENT, 3, "hybrid") == []


# --------------------------------------------------------------------- eval-retrieval

RECORDS = [
    {
        "question": "What does textwrap.dedent remove?",
        "context": "textwrap.dedent removes common indentation.",
    },
    {"question": "Which function splits shell words?", "context": "shlex.split splits a command line."},
    {"question": "How is JSON written to a file?", "context": "json.dump writes JSON to a file object."},
    {"question": "What does shlex.split do with quotes?", "context": "shlex.split splits a command line."},
]


def test_eval_retrieval_reports_recall_and_times_per_mode(tmp_path: Path, capsys) -> None:
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "result.json"
    assert main(["eval-retrieval", "--data", str(data), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["data"] == "tiny.jsonl" and summary["records"] == 4 and summary["contexts"] == 3
    assert set(summary["modes"]) == {"dense", "keyword", "hybrid"}
    for result in summary["modes"].values():
        assert set(result) == {"recall_at_1", "recall_at_4", "build_seconds", "query_seconds"}
        assert result["recall_at_4"] == 1.0  # three contexts: every one is in the first four
        assert 0 <= result["recall_at_1"] <= 1 and result["build_seconds"] >= 0
    assert summary["modes"]["keyword"]["build_seconds"] < summary["modes"]["hybrid"]["build_seconds"]
    printed = capsys.readouterr().out
    assert "recall@4" in printed and "hybrid" in printed and f"wrote {out}" in printed

    assert (
        main(
            ["eval-retrieval", "--data", str(data), "--modes", "keyword", "--limit", "2", "--json", str(out)]
        )
        == 0
    )
    summary = json.loads(out.read_text())
    assert list(summary["modes"]) == ["keyword"] and summary["records"] == 2


@pytest.mark.parametrize(
    ("content", "args", "words"),
    [
        ('["a list"]\n', [], "tiny.jsonl:1: a record is a JSON object, not list"),
        ('{"question": "q?"}\n', [], "tiny.jsonl:1: a record needs a non-empty string 'context'"),
        ('{"question": 3, "context": "c"}\n', [], "needs a non-empty string 'question'"),
        ('\n{"question": "q?", "context": "c"\n', [], "tiny.jsonl:2: invalid JSON"),
        ("\n\n", [], "holds no records"),
        (json.dumps(RECORDS[0]) + "\n", ["--modes", "dense,bm25"], "retrieval mode must be one of"),
        (json.dumps(RECORDS[0]) + "\n", ["--modes", ","], "no retrieval mode to evaluate"),
    ],
    ids=["not-object", "no-context", "question-int", "bad-json", "empty", "bad-mode", "no-mode"],
)
def test_eval_retrieval_refuses_bad_input_clearly(tmp_path: Path, capsys, content, args, words) -> None:
    data = tmp_path / "tiny.jsonl"
    data.write_text(content)
    assert main(["eval-retrieval", "--data", str(data), *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_eval_retrieval_of_a_missing_file_and_a_bad_cli_mode(tmp_path: Path, capsys) -> None:
    assert main(["eval-retrieval", "--data", str(tmp_path / "nowhere.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["ask", "--index", str(tmp_path), "q?", "--retrieval", "bm25"])
    assert exited.value.code == 2
    assert "invalid choice: 'bm25'" in capsys.readouterr().err
