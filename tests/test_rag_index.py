"""The document/index layer: loading, chunking, embedding, search, save/load and update."""

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import faiss
import numpy as np
import pytest

from rag_lookahead.rag import (
    DEFAULT_EMBEDDER,
    Chunk,
    ChunkingConfig,
    Document,
    DocumentIndex,
    IndexFormatError,
    SentenceTransformerEmbedder,
    Skipped,
    chunking,
    load_documents,
    split_document,
    store,
)
from rag_lookahead.rag.documents import printable

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
SMALL = ChunkingConfig(size=48, overlap=12, unit="tokens")


class CountingEmbedder:
    """The real model, remembering every text it embedded (and optionally lying about itself)."""

    def __init__(self, inner, name=None, dimension=None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.dimension = dimension or inner.dimension
        self.tokenizer = inner.tokenizer
        self.embedded: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.embedded.extend(texts)
        return self.inner.embed(texts)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="module")
def built(embedder) -> DocumentIndex:
    index, skipped = DocumentIndex.build([CORPUS], embedder, SMALL)
    assert skipped == []
    return index


def tokens(tokenizer, text: str) -> list[tuple[int, int]]:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


# ---------------------------------------------------------------------------- documents


def test_folders_are_read_recursively_in_sorted_order() -> None:
    documents, skipped = load_documents([CORPUS])
    names = [d.source.removeprefix(str(CORPUS) + "/") for d in documents]
    assert names == [
        "guides/bicycle-chain.md",
        "honeybees.txt",
        "lighthouses.md",
        "records.jsonl#1",
        "records.jsonl#2",
        "records.jsonl#3",
        "sourdough.txt",
    ]
    assert skipped == []
    assert documents[1].text == (CORPUS / "honeybees.txt").read_text()
    assert documents[4].text.startswith("Green tea and black tea")


def test_a_file_named_twice_is_read_once() -> None:
    documents, _ = load_documents([CORPUS / "honeybees.txt", CORPUS, str(CORPUS / "honeybees.txt")])
    assert len(documents) == 7 and documents[0].source == str(CORPUS / "honeybees.txt")


def test_bad_inputs_are_skipped_with_reasons(tmp_path: Path) -> None:
    (tmp_path / "a-empty.txt").write_text("")
    (tmp_path / "b-blank.md").write_text("  \n\t\n")
    (tmp_path / "c-binary.txt").write_bytes(b"PK\x03\x04\x00\x00 zipped")
    (tmp_path / "d-latin1.txt").write_bytes("Caf\u00e9 au lait".encode("latin-1"))
    (tmp_path / "e-bom.txt").write_bytes(b"\xef\xbb\xbfWith a byte-order mark.")
    (tmp_path / "f-ignored.csv").write_text("a,b\n1,2\n")
    lines = [
        '{"text": "A good record."}',
        '{"text": "broken',
        "",  # blank lines are not records
        '{"body": "no text field"}',
        '["not", "an", "object"]',
        '{"text": 42}',
        '{"text": "   "}',
        '{"text": "caf\xe9"}',
    ]
    data = "\n".join(lines[:-1]).encode() + b"\n" + lines[-1].encode("latin-1") + b"\n"
    (tmp_path / "g-records.jsonl").write_bytes(data)

    documents, skipped = load_documents([tmp_path])

    def src(name: str) -> str:
        return str(tmp_path / name)

    assert documents == [
        Document(src("e-bom.txt"), "With a byte-order mark."),
        Document(src("g-records.jsonl") + "#1", "A good record."),
    ]
    reasons = {s.source.removeprefix(str(tmp_path) + "/"): s.reason for s in skipped}
    assert reasons["a-empty.txt"] == "empty"
    assert reasons["b-blank.md"] == "empty"
    assert reasons["c-binary.txt"] == "binary content (a NUL byte at offset 4)"
    assert reasons["d-latin1.txt"] == "not UTF-8 (invalid byte at offset 3)"
    assert reasons["g-records.jsonl#2"].startswith("invalid JSON")
    assert reasons["g-records.jsonl#4"] == "no 'text' field"
    assert reasons["g-records.jsonl#5"] == "not a JSON object but list"
    assert reasons["g-records.jsonl#6"] == "field 'text' is int, not a string"
    assert reasons["g-records.jsonl#7"] == "empty"
    last_line_start = len("\n".join(lines[:-1]).encode()) + 1
    bad_byte = last_line_start + lines[-1].index("\xe9")
    assert reasons["g-records.jsonl#8"] == f"not UTF-8 (invalid byte at offset {bad_byte})"
    assert len(skipped) == 10


def test_a_file_that_cannot_be_read_is_skipped_not_fatal(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "locked.txt").write_text("Only its owner may read this.")
    (tmp_path / "open.txt").write_text("Anyone may read this.")
    real_open = os.open

    def refuse(path, flags, *args):  # root reads every file, so a refusal is simulated
        if os.fspath(path).endswith("locked.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse)
    documents, skipped = load_documents([tmp_path])
    assert [doc.source for doc in documents] == [str(tmp_path / "open.txt")]
    assert skipped == [Skipped(str(tmp_path / "locked.txt"), "unreadable (Permission denied)")]


def test_what_is_skipped_prints_whatever_its_name_holds() -> None:
    """A file name's undecodable byte shows as that byte, any other lone surrogate (a JSON
    escape) as its escape: `Skipped` prints where its text would not encode."""
    assert printable("caf\udce9.txt") == "caf\\xe9.txt"  # the byte os.fsdecode mapped
    assert printable("lone \ud800") == "lone \\ud800"
    assert printable("plain é") == "plain é"
    assert str(Skipped("caf\udce9.txt", "its name is not UTF-8")) == "caf\\xe9.txt: its name is not UTF-8"


def test_named_files_must_exist_and_be_supported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file or folder: .*nowhere"):
        load_documents([tmp_path / "nowhere"])
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"unsupported extension '\.csv'.*\.txt"):
        load_documents([tmp_path / "table.csv"])


def test_jsonl_text_field_is_configurable(tmp_path: Path) -> None:
    (tmp_path / "qa.jsonl").write_text('{"body": "Text here."}\n')
    documents, skipped = load_documents([tmp_path], text_field="body")
    assert documents == [Document(str(tmp_path / "qa.jsonl#1"), "Text here.")] and skipped == []


# ----------------------------------------------------------------------------- chunking


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": 0}, "size must be a positive"),
        ({"size": 10, "overlap": 10}, "less than size"),
        ({"overlap": -1}, "at least 0"),
        ({"unit": "words"}, "'tokens' or 'sentences'"),
        ({"splitter": "pysbd"}, "'sentencex' or 'punctuation'"),
    ],
)
def test_chunking_config_is_validated(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ChunkingConfig(**kwargs)


def test_token_chunks_are_exact_windows_with_the_overlap(embedder) -> None:
    # As plain text: a markdown document's headings are left out of its chunks.
    doc = Document("lighthouses.txt", (CORPUS / "lighthouses.md").read_text())
    config = ChunkingConfig(size=30, overlap=8, unit="tokens")
    chunks = split_document(doc, config, embedder.tokenizer)
    spans = tokens(embedder.tokenizer, doc.text)
    step = config.size - config.overlap
    assert len(chunks) == -(-(len(spans) - config.overlap) // step) > 3
    for i, chunk in enumerate(chunks):
        assert doc.text[chunk.start : chunk.end] == chunk.text
        window = spans[i * step : i * step + config.size]
        assert (chunk.start, chunk.end) == (window[0][0], window[-1][1])
    assert chunks[-1].end == spans[-1][1]  # nothing lost at the end


def test_huge_documents_are_tokenized_in_blocks_without_changing_chunks(embedder, monkeypatch) -> None:
    text = (CORPUS / "honeybees.txt").read_text() + (CORPUS / "sourdough.txt").read_text()
    doc = Document("long.txt", text * 3)
    whole = split_document(doc, SMALL, embedder.tokenizer)
    monkeypatch.setattr(chunking, "_BLOCK_CHARS", 97)
    assert split_document(doc, SMALL, embedder.tokenizer) == whole


@pytest.mark.parametrize("block", [97, 400])
def test_sentences_longer_than_a_block_are_counted_without_changing_chunks(
    embedder, monkeypatch, block
) -> None:
    # Counted by their first block when that alone is over the size (400), else in full (97).
    words = " ".join(f"w{i % 97}" for i in range(600))  # one sentence, no breaks
    doc = Document("long.txt", f"Bees dance. {words}\n\nStarters need flour. {words[:300]} and water.")
    config = ChunkingConfig(size=48, overlap=12, unit="sentences")
    whole = split_document(doc, config, embedder.tokenizer)
    monkeypatch.setattr(chunking, "_BLOCK_CHARS", block)
    assert split_document(doc, config, embedder.tokenizer) == whole


def test_sentence_chunks_pack_whole_sentences(embedder) -> None:
    doc = load_documents([CORPUS / "honeybees.txt"])[0][0]
    config = ChunkingConfig(size=40, overlap=15, unit="sentences")
    chunks = split_document(doc, config, embedder.tokenizer)
    sentences = list(chunking._sentences(doc.text, 0, len(doc.text), config.splitter))
    starts, ends = {s for s, _ in sentences}, {e for _, e in sentences}
    assert len(chunks) > 3
    for chunk, following in pairwise(chunks):
        assert doc.text[chunk.start : chunk.end] == chunk.text
        assert chunk.start in starts and chunk.end in ends
        assert len(tokens(embedder.tokenizer, chunk.text)) <= config.size
        assert chunk.start < following.start
    # Some next chunk repeats the previous one's last sentence(s), no more than the overlap.
    repeats = [b.start for a, b in pairwise(chunks) if b.start < a.end]
    assert repeats
    for a, b in pairwise(chunks):
        assert len(tokens(embedder.tokenizer, doc.text[b.start : a.end])) <= config.overlap


def test_a_sentence_longer_than_the_size_is_cut_by_tokens(embedder) -> None:
    long = "word " * 50
    doc = Document("s.txt", f"Short one. {long.strip()}. Another short one.")
    chunks = split_document(doc, ChunkingConfig(size=20, overlap=5, unit="sentences"), embedder.tokenizer)
    assert chunks[0].text == "Short one."
    assert chunks[-1].text == "Another short one."
    middle = chunks[1:-1]
    assert len(middle) >= 3 and all(len(tokens(embedder.tokenizer, c.text)) <= 20 for c in middle)
    assert all(doc.text[c.start : c.end] == c.text for c in chunks)


ABBREVIATED = (
    'Use a splitter, e.g. sentencex. It works in the U.S. and the U.K. too. He said "Stop." '
    "Dr. Smith paid $3.50 at 5 p.m. yesterday."
)


def sentences_of(text: str, splitter: chunking.Splitter) -> list[str]:
    return [text[s:e] for s, e in chunking._sentences(text, 0, len(text), splitter)]


def test_sentences_end_at_full_stops_not_at_abbreviations() -> None:
    assert sentences_of(ABBREVIATED, "sentencex") == [
        "Use a splitter, e.g. sentencex.",
        "It works in the U.S. and the U.K. too.",
        'He said "Stop."',  # the closing quote belongs to its sentence
        "Dr. Smith paid $3.50 at 5 p.m. yesterday.",
    ]
    # The rule of indexes saved before sentencex, kept for them: every full stop, and a closing
    # quote between two sentences belongs to neither.
    assert sentences_of(ABBREVIATED, "punctuation")[:3] == [
        "Use a splitter, e.g.",
        "sentencex.",
        "It works in the U.S.",
    ]
    assert 'He said "Stop.' in sentences_of(ABBREVIATED, "punctuation")
    # Offsets count characters (not UTF-8 bytes, nor UTF-16 units): astral, combining, CJK.
    text = "Emoji 🚀 fine. Cafe\u0301 closes! 日本語の文です。次の文。 Last one"
    assert sentences_of(text, "sentencex") == [
        "Emoji 🚀 fine.",
        "Cafe\u0301 closes!",
        "日本語の文です。",
        "次の文。",
        "Last one",
    ]


def test_a_long_block_is_split_a_window_at_a_time_as_if_whole(monkeypatch) -> None:
    words = ["bees", "e.g. honeybees", "the U.S. Forest Service", "Dr. Lee", "3.5 km", "(see Fig. 2.)"]
    text = " ".join(
        f"Sentence {n} is about {words[n % 6]} and {'more ' * (n % 7)}flowers." for n in range(400)
    )
    assert len(text) > 4 * chunking._SPLIT_WINDOW
    whole = chunking._sentencex_ends(text)
    assert list(chunking._sentence_ends(text)) == whole and len(whole) == 399
    monkeypatch.setattr(chunking, "_SPLIT_WINDOW", 300)  # many windows, many restarts
    assert list(chunking._sentence_ends(text)) == whole


def test_an_index_saved_before_the_splitter_was_recorded_keeps_cutting_by_punctuation(
    embedder, tmp_path: Path
) -> None:
    config = ChunkingConfig(size=48, overlap=12)
    index, _ = DocumentIndex.build([CORPUS / "honeybees.txt"], embedder, config)
    directory = saved(index, tmp_path / "idx")
    assert json.loads((directory / "meta.json").read_text())["chunking"]["splitter"] == "sentencex"

    def before(meta) -> None:
        del meta["chunking"]["splitter"]

    tamper(directory, edit_meta=before)
    old = DocumentIndex.load(directory, embedder)
    assert old.chunks == index.chunks  # read as it is
    assert old.config == ChunkingConfig(size=48, overlap=12, splitter="punctuation")
    notes = Document("notes.txt", " ".join([ABBREVIATED] * 4))  # one paragraph, cut at sentences
    old.add([notes])
    by_rule = {
        rule: split_document(notes, ChunkingConfig(size=48, overlap=12, splitter=rule), embedder.tokenizer)
        for rule in ("punctuation", "sentencex")
    }
    assert by_rule["punctuation"] != by_rule["sentencex"]
    assert [c for c in old.chunks if c.source == "notes.txt"] == by_rule["punctuation"]
    old.save(directory)
    assert DocumentIndex.load(directory, embedder).config.splitter == "punctuation"


def test_chunk_ids_are_stable_and_chunks_validated() -> None:
    assert Chunk.make("a.txt", "hello", 3, 8) == Chunk.make("a.txt", "hello", 3, 8)
    assert Chunk.make("a.txt", "hello", 3, 8).id != Chunk.make("b.txt", "hello", 3, 8).id
    assert len(Chunk.make("a.txt", "hello", 3, 8).id) == 16
    with pytest.raises(ValueError, match="offsets span"):
        Chunk("x", "a.txt", "hello", 0, 3)
    with pytest.raises(ValueError, match="start <= end"):
        Chunk("x", "a.txt", "", 5, 4)


# ------------------------------------------------------------------------------- search


@pytest.mark.parametrize(
    "question, source",
    [
        ("How often should I feed my sourdough starter?", "sourdough.txt"),
        ("Who designed the lens used in lighthouses?", "lighthouses.md"),
        ("How do bees tell each other where the flowers are?", "honeybees.txt"),
        ("When does a bicycle chain need replacing?", "guides/bicycle-chain.md"),
        ("What is the difference between green and black tea?", "records.jsonl#2"),
    ],
)
def test_retrieval_finds_the_right_document(built, question: str, source: str) -> None:
    hits = built.search(question, k=3)
    assert hits[0].chunk.source == str(CORPUS / source)
    assert hits[0].score >= hits[1].score >= hits[2].score


def test_search_edge_cases(built, embedder) -> None:
    assert len(built.search("bees", k=1000)) == len(built) > 10
    with pytest.raises(ValueError, match="empty"):
        built.search("   ")
    with pytest.raises(ValueError, match="positive"):
        built.search("bees", k=0)
    assert DocumentIndex(embedder).search("anything") == []


def test_progress_wraps_the_embedding_batches(embedder) -> None:
    seen: list[list[str]] = []

    def progress(batches):
        for batch in batches:
            seen.append(batch)
            yield batch

    index, _ = DocumentIndex.build([CORPUS / "honeybees.txt"], embedder, SMALL, progress=progress)
    assert [text for batch in seen for text in batch] == [c.text for c in index.chunks]


# --------------------------------------------------------------------------- save / load


def test_save_load_round_trip(built, embedder, tmp_path: Path, monkeypatch) -> None:
    built.save(tmp_path / "idx")
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == [
        "chunks.jsonl",
        "index.faiss",
        "keyword",
        "meta.json",
    ]
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["format"] == "rag-lookahead-index" and meta["format_version"] == 3
    assert meta["embedder"] == DEFAULT_EMBEDDER and meta["dimension"] == 384
    assert meta["chunking"] == {"size": 48, "overlap": 12, "unit": "tokens", "splitter": "sentencex"}
    assert set(meta["sources"]) == set(built.sources)
    # embedder=None builds the default model; hand it the one already loaded.
    monkeypatch.setattr(store, "SentenceTransformerEmbedder", lambda: embedder)
    loaded = DocumentIndex.load(tmp_path / "idx")
    assert loaded.chunks == built.chunks and loaded.sources == built.sources
    assert loaded.config == built.config and len(loaded) == len(built)
    for question in ("bee dances", "Etna lava", "chain oil"):
        before, after = built.search(question, k=5), loaded.search(question, k=5)
        assert [h.chunk for h in before] == [h.chunk for h in after]
        assert [h.score for h in before] == pytest.approx([h.score for h in after])
    assert not list(tmp_path.glob(".idx*"))  # no scratch left behind


def test_a_saved_index_follows_the_umask_like_any_file(built, tmp_path: Path) -> None:
    old = os.umask(0o027)  # group may read, others may not
    try:
        built.save(tmp_path / "idx")
    finally:
        os.umask(old)
    root = tmp_path / "idx"
    assert stat.S_IMODE(root.stat().st_mode) == 0o750  # not mkdtemp's 0700
    for path in root.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o750 if path.is_dir() else 0o640), path


def test_load_errors_say_what_to_do(built, embedder, tmp_path: Path) -> None:
    with pytest.raises(IndexFormatError, match="no index at .*build one with `rag-lookahead index`"):
        DocumentIndex.load(tmp_path / "missing", embedder)
    (tmp_path / "plain").mkdir()
    with pytest.raises(IndexFormatError, match="not a rag-lookahead index"):
        DocumentIndex.load(tmp_path / "plain", embedder)

    built.save(tmp_path / "idx")
    meta_path = tmp_path / "idx" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "format_version": 4}))
    with pytest.raises(IndexFormatError, match="format version 4.*reads version 3; rebuild it"):
        DocumentIndex.load(tmp_path / "idx", embedder)

    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IndexFormatError, match="384-dimensional vectors .* 512-dimensional"):
        DocumentIndex.load(tmp_path / "idx", CountingEmbedder(embedder, dimension=512))
    with pytest.raises(IndexFormatError, match="built with embedder 'all-MiniLM-L6-v2', not 'other'"):
        DocumentIndex.load(tmp_path / "idx", CountingEmbedder(embedder, name="other"))

    meta_path.write_text(json.dumps({**meta, "embedder": "/models/e5"}))
    with pytest.raises(IndexFormatError, match=r"embedder=SentenceTransformerEmbedder\('/models/e5'\)"):
        DocumentIndex.load(tmp_path / "idx")

    meta_path.write_text(json.dumps(meta))
    (tmp_path / "idx" / "chunks.jsonl").write_text("")
    with pytest.raises(IndexFormatError, match="vectors but 0 chunks"):
        DocumentIndex.load(tmp_path / "idx", embedder)


def test_a_failed_save_keeps_the_previous_index(built, embedder, tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "idx"
    small, _ = DocumentIndex.build([CORPUS / "honeybees.txt"], embedder, SMALL)
    small.save(target)

    real_write = store._write_text

    def crash_midway(path: Path, text: str) -> None:
        real_write(path, text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(store, "_write_text", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        built.save(target)
    monkeypatch.undo()

    def refuse_rename(self, other):
        raise OSError("rename failed")

    real_rename = Path.rename

    def rename(self, other):  # only the swap-in of the new index fails
        return (refuse_rename if ".tmp-" in self.name else real_rename)(self, other)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="rename failed"):
        built.save(target)
    monkeypatch.undo()

    assert DocumentIndex.load(target, embedder).chunks == small.chunks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no scratch or backup left


def test_save_never_replaces_something_that_is_not_an_index(built, tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a rag-lookahead index"):
        built.save(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


# ------------------------------------------------------------------------ index integrity

REBUILD = "rebuild it with `rag-lookahead index`"


def saved(index: DocumentIndex, directory: Path) -> Path:
    index.save(directory)
    return directory


def tamper(directory: Path, edit_lines=None, edit_meta=None, *, refresh: bool = False) -> None:
    """Edit chunks.jsonl (a list of records) and/or meta.json in place.

    `refresh` recomputes meta.json's chunks_sha256, as a careful hand edit would, so that only
    the binding of lines to rows can catch the edit.
    """
    chunks_path, meta_path = directory / "chunks.jsonl", directory / "meta.json"
    if edit_lines is not None:
        records = [json.loads(line) for line in chunks_path.read_text().splitlines()]
        edit_lines(records)
        chunks_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    meta = json.loads(meta_path.read_text())
    if refresh:
        meta["chunks_sha256"] = hashlib.sha256(chunks_path.read_bytes()).hexdigest()
    if edit_meta is not None:
        edit_meta(meta)
    meta_path.write_text(json.dumps(meta))


def test_saved_lines_are_bound_to_their_vectors(built, tmp_path: Path) -> None:
    directory = saved(built, tmp_path / "idx")
    data = (directory / "chunks.jsonl").read_bytes()
    records = [json.loads(line) for line in data.decode().splitlines()]
    vectors = built._faiss.reconstruct_n(0, len(built))  # [N, D]
    assert [r["row"] for r in records] == list(range(len(built)))
    assert [r["vector"] for r in records] == [hashlib.sha256(v).hexdigest()[:16] for v in vectors]
    meta = json.loads((directory / "meta.json").read_text())
    assert meta["chunks_sha256"] == hashlib.sha256(data).hexdigest()


def test_an_updated_index_round_trips(embedder, tmp_path: Path) -> None:
    shutil.copytree(CORPUS, tmp_path / "corpus")
    index, _ = DocumentIndex.build([tmp_path / "corpus"], embedder, SMALL)
    (tmp_path / "corpus" / "honeybees.txt").write_text("Bumblebees nest in the ground.\n")
    index.update([tmp_path / "corpus"])  # moves the changed source's rows to the end
    loaded = DocumentIndex.load(saved(index, tmp_path / "idx"), embedder)
    assert loaded.chunks == index.chunks
    for question in ("where do bumblebees nest", "Fresnel lens", "chain wear"):
        before, after = index.search(question, k=5), loaded.search(question, k=5)
        assert [h.chunk for h in before] == [h.chunk for h in after]
        assert [h.score for h in before] == pytest.approx([h.score for h in after])


def _swap(records) -> None:
    records[0], records[1] = records[1], records[0]


def _copy_over(records) -> None:
    records[2] = records[0]


def _duplicate(records) -> None:
    records[3:] = [records[3], *records[3:-1]]  # the totals still match


def _edit_row(records) -> None:
    records[3]["row"] = 7


def _swap_and_renumber(records) -> None:
    _swap(records)
    records[0]["row"], records[1]["row"] = 0, 1


@pytest.mark.parametrize("refresh", [False, True], ids=["as-is", "digest-refreshed"])
@pytest.mark.parametrize(
    "edit, message",
    [
        (_swap, "line 1 is damaged .*bound to row 1, not to row 0"),
        (_copy_over, "line 3 is damaged .*bound to row 0, not to row 2"),
        (_duplicate, "line 5 is damaged .*bound to row 3, not to row 4"),
        (_edit_row, "line 4 is damaged .*bound to row 7, not to row 3"),
        (_swap_and_renumber, "line 1 is not bound to row 0 of index.faiss"),
    ],
    ids=["swapped", "copied-over", "duplicated", "row-edited", "swapped-and-renumbered"],
)
def test_moved_or_copied_lines_are_refused(built, embedder, tmp_path: Path, edit, message, refresh) -> None:
    directory = saved(built, tmp_path / "idx")
    tamper(directory, edit, refresh=refresh)
    with pytest.raises(IndexFormatError, match=f"{message}.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)


def test_an_edited_line_with_a_recomputed_id_is_refused(built, embedder, tmp_path: Path) -> None:
    def reword(records) -> None:
        record = records[2]
        record["text"] = record["text"][::-1]  # same length, so the offsets still fit
        record["id"] = chunking.chunk_id(
            record["source"], record["text"], record["start"], record["end"], tuple(record["headings"])
        )

    directory = saved(built, tmp_path / "idx")
    tamper(directory, reword)
    with pytest.raises(IndexFormatError, match=f"chunks.jsonl does not match the chunks_sha256.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)


def test_vectors_from_another_save_are_refused(built, embedder, tmp_path: Path) -> None:
    directory = saved(built, tmp_path / "idx")
    vectors = built._faiss.reconstruct_n(0, len(built))  # [N, D]
    other = faiss.IndexFlatIP(vectors.shape[1])
    other.add(np.ascontiguousarray(vectors[::-1]))
    faiss.write_index(other, str(directory / "index.faiss"))
    with pytest.raises(IndexFormatError, match=f"line 1 is not bound to row 0 of index.faiss.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)


def test_deeply_nested_json_is_refused(built, embedder, tmp_path: Path) -> None:
    directory = saved(built, tmp_path / "idx")
    meta = (directory / "meta.json").read_text()
    (directory / "meta.json").write_text("[" * 100_000)
    with pytest.raises(IndexFormatError, match=f"meta.json is unreadable.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)
    (directory / "meta.json").write_text(meta)
    lines = (directory / "chunks.jsonl").read_text().splitlines()
    (directory / "chunks.jsonl").write_text("\n".join(["[" * 100_000, *lines[1:]]) + "\n")
    tamper(directory, refresh=True)
    with pytest.raises(IndexFormatError, match=f"line 1 is damaged.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)


def _set(key, value):
    def edit(meta) -> None:
        meta[key] = value

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        _set("dimension", True),
        _set("dimension", 0),
        _set("dimension", 384.0),
        _set("embedder", ""),
        _set("chunks_sha256", None),
        _set("sources", ["a.txt"]),
    ],
    ids=["dimension-true", "dimension-0", "dimension-float", "no-embedder", "no-digest", "sources-list"],
)
def test_mistyped_meta_fields_are_refused(built, embedder, tmp_path: Path, edit) -> None:
    directory = saved(built, tmp_path / "idx")
    tamper(directory, edit_meta=edit)
    with pytest.raises(IndexFormatError, match=f"meta.json is damaged.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)


def _set_line(number, key, convert):
    def edit(records) -> None:
        records[number][key] = convert(records[number][key])

    return edit


@pytest.mark.parametrize(
    "edit, line, message",
    [
        (_set_line(1, "row", bool), 2, "'row' must be an integer, got bool"),  # true == 1
        (_set_line(4, "start", bool), 5, "'start' must be an integer, got bool"),  # false == 0
        (_set_line(0, "end", float), 1, "'end' must be an integer, got float"),
        (_set_line(0, "vector", str.upper), 1, "'vector' must be 16 lowercase hex digits"),
        (_set_line(0, "text", lambda text: [text]), 1, "'text' must be a string, got list"),
        (lambda records: records[0].update(extra=1), 1, "a chunk has exactly the fields"),
    ],
    ids=["row-true", "start-false", "end-float", "vector-upper", "text-list", "extra-field"],
)
def test_mistyped_chunk_fields_are_refused(built, embedder, tmp_path: Path, edit, line, message) -> None:
    assert built.chunks[4].start == 0
    directory = saved(built, tmp_path / "idx")
    tamper(directory, edit, refresh=True)
    with pytest.raises(IndexFormatError, match=rf"line {line} is damaged \({message}.*{REBUILD}"):
        DocumentIndex.load(directory, embedder)


@pytest.mark.parametrize("version", [1, 2])
def test_an_index_of_a_previous_format_is_refused(built, embedder, tmp_path: Path, version) -> None:
    def unbind(records) -> None:
        for record in records:
            del record["headings"]
            if version == 1:
                del record["row"], record["vector"]

    def old(meta) -> None:
        del meta["keyword"]
        if version == 1:
            del meta["chunks_sha256"]
        meta["format_version"] = version

    directory = saved(built, tmp_path / "idx")
    shutil.rmtree(directory / "keyword")
    tamper(directory, unbind, old)
    refused = f"format version {version}, but .* reads version 3; {REBUILD}"
    with pytest.raises(IndexFormatError, match=refused):
        DocumentIndex.load(directory, embedder)
    built.save(directory)  # rebuilding over it is allowed
    assert DocumentIndex.load(directory, embedder).chunks == built.chunks


# ------------------------------------------------------------------------------- update


def test_update_replaces_only_what_changed(embedder, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    counting = CountingEmbedder(embedder)
    index, _ = DocumentIndex.build([corpus], counting, SMALL)
    bees_chunks = [c for c in index.chunks if c.source.endswith("honeybees.txt")]

    (corpus / "sourdough.txt").write_text("A sourdough starter needs flour, water and patience.\n")
    (corpus / "lighthouses.md").unlink()
    kites = "A kite flies best in a steady wind of fifteen to twenty-five kilometres per hour."
    (corpus / "guides" / "kites.txt").write_text(kites + "\n")
    (corpus / "broken.txt").write_bytes(b"\x00\x01")
    counting.embedded.clear()

    report = index.update([corpus])

    assert (report.added, report.removed, report.unchanged) == (2, 2, 5)
    assert report.skipped == (Skipped(str(corpus / "broken.txt"), "binary content (a NUL byte at offset 0)"),)
    assert counting.embedded == [  # in sorted source order
        kites,
        "A sourdough starter needs flour, water and patience.",
    ]
    assert report.chunks_added == 2
    # No stale chunk: every chunk is a slice of its file as it is now.
    for chunk in index.chunks:
        text = load_documents([store.source_file(chunk.source)])[0]
        assert chunk.text in {d.text[chunk.start : chunk.end] for d in text if d.source == chunk.source}
    assert not any("lighthouses" in s for s in index.sources)
    assert [c for c in index.chunks if c.source.endswith("honeybees.txt")] == bees_chunks
    # The result is what a fresh build would give, and the vectors still line up with chunks.
    fresh, _ = DocumentIndex.build([corpus], embedder, SMALL)
    assert sorted(c.id for c in index.chunks) == sorted(c.id for c in fresh.chunks)
    assert index.sources == fresh.sources
    assert index.search("kite wind", k=1)[0].chunk.source == str(corpus / "guides" / "kites.txt")
    assert index.search("Fresnel lens keeper", k=1)[0].chunk.source != str(corpus / "lighthouses.md")

    counting.embedded.clear()
    again = index.update([corpus])
    assert counting.embedded == [] and (again.added, again.removed, again.unchanged) == (0, 0, 7)


def test_update_leaves_sources_outside_its_paths_alone(embedder, tmp_path: Path) -> None:
    shutil.copytree(CORPUS, tmp_path / "corpus")
    index, _ = DocumentIndex.build([tmp_path / "corpus"], embedder, SMALL)
    (tmp_path / "corpus" / "honeybees.txt").unlink()
    report = index.update([tmp_path / "corpus" / "guides"])
    assert (report.added, report.removed, report.unchanged) == (0, 0, 1)
    assert str(tmp_path / "corpus" / "honeybees.txt") in index.sources
