"""The on-disk form of a `DocumentIndex`: a directory of three files and a folder, written atomically.

- ``index.faiss``: the FAISS flat inner-product index (row ``i`` = line ``i`` of chunks.jsonl);
- ``chunks.jsonl``: one chunk per line (id, source, start, end, headings, text), plus its
  binding to its vector: ``row`` (its FAISS row, equal to its line number from 0) and
  ``vector`` (the first 16 hex digits of the SHA-256 of that row's little-endian float32 bytes);
- ``keyword/``: the BM25 index of the same rows, as bm25s writes it (``.npy`` arrays read
  without pickle, JSON vocabulary and parameters);
- ``meta.json``: format name and version, embedder name and dimension, chunking settings (an
  index saved before they named the sentence splitter was cut by ``"punctuation"``, and an update
  keeps cutting it so: its chunks stay as they were and new ones are cut alike), the SHA-256 of
  every source's text, ``chunks_sha256``, the SHA-256 of chunks.jsonl's bytes,
  ``keyword``: the tokenizer's name and the SHA-256 of every file of ``keyword/``, and
  ``save_id``, a random name of the save that wrote it (each save's meta.json differs).

The files are chained, and `read_rows` checks the whole chain on every load: meta.json fixes
chunks.jsonl byte for byte, every line must name its own row, and every line's ``vector``
must be the digest of that row of index.faiss (all rows are hashed at once, in a fraction of
a second even for 100k chunks). So lines that were reordered, replaced, duplicated or edited
(even with a recomputed id), or an index.faiss from another save, are refused with the advice
to rebuild, instead of answering with a source that is not the one a vector was made from.
The keyword files are fixed by their digests in meta.json, so they too come from the save that
wrote chunks.jsonl, and their arrays are checked against the number of chunks before use.
The digests guard against accidents and mismatched files, not a forger: nothing is secret.

Saving is atomic, but an update is load, change, save: two processes updating the same index
at once would each save their own change over the other's. `lock` is a lock file beside the
directory (``.NAME.lock``) that such writers hold from load to save.

A save swaps a new directory in for the old one (two renames), while a reader opens the files
one by one: one that reads while another process saves could see meta.json of one save and the
chunks of the next, or find no directory between the renames. `read_index` stamps the
directory (its inode and meta.json's bytes, which hold the save's ``save_id``) before and after
reading it, and reads again while the stamps differ, or while no directory is there but a
save's previous one is beside it.

No pickle: every file is plain JSON or FAISS's own format, safe to read from anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from filelock import FileLock

from rag_lookahead.files import fsync_file, lock_beside, scratch_dir
from rag_lookahead.rag import keyword
from rag_lookahead.rag.chunking import Chunk, ChunkingConfig, chunk_id
from rag_lookahead.rag.embedding import DEFAULT_EMBEDDER, Embedder, SentenceTransformerEmbedder
from rag_lookahead.rag.keyword import KeywordIndex

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "META_FILE",
    "IndexFormatError",
    "SavedIndex",
    "lock",
    "read_index",
    "refuse_foreign",
]

FORMAT = "rag-lookahead-index"
# 2: chunks bound to their FAISS rows, chunks.jsonl to meta.json;
# 3: chunks cut at markdown headings and carrying them; the keyword (BM25) index beside FAISS.
FORMAT_VERSION = 3
_REBUILD = "rebuild it with `rag-lookahead index`"
_INDEX, _CHUNKS, _META, _KEYWORD = "index.faiss", "chunks.jsonl", "meta.json", "keyword"
META_FILE = _META  # its presence tells an index directory apart
_CHUNK_FIELDS = frozenset({"id", "source", "text", "start", "end", "headings", "row", "vector"})
_VECTOR_DIGEST = 16  # hex digits of a row's SHA-256 kept in chunks.jsonl
_FIRST_SPLITTER = "punctuation"  # of indexes whose chunking settings name no splitter
# Seconds to wait before each new read of an index that a save changed meanwhile: a save's
# swap takes two renames, so the first pauses are short; their sum bounds the wait on a save
# that a crash left between its renames (whose error then names the previous index).
_REREAD_PAUSES = (0.001, 0.005, 0.02, 0.05, 0.1, 0.2, 0.5)


class IndexFormatError(ValueError):
    """A directory does not hold an index this version can use with this embedder."""


def make_meta(embedder: Embedder, config: ChunkingConfig, sources: Mapping[str, str]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "embedder": embedder.name,
        "dimension": embedder.dimension,
        "chunking": dataclasses.asdict(config),
        "sources": dict(sorted(sources.items())),
    }


def source_file(source: str) -> str:
    """The file a source comes from: ``data.jsonl#3`` -> ``data.jsonl``."""
    match = re.fullmatch(r"(.*\.jsonl)#\d+", source, flags=re.IGNORECASE | re.DOTALL)
    return match.group(1) if match else source


# ---------------------------------------------------------------------------------- saving


def save(
    target: Path, index: Any, keywords: KeywordIndex, chunks: Sequence[Chunk], meta: dict[str, Any]
) -> None:
    """Write into a scratch sibling, then swap it in: a crash never leaves a half-written index.

    Row ``i`` of `index` and of `keywords` must be ``chunks[i]``; each line of chunks.jsonl is
    bound to its FAISS row, and meta.json (`meta` plus ``chunks_sha256`` and ``keyword``) to
    chunks.jsonl and the keyword files.
    """
    if not index.ntotal == keywords.rows == len(chunks):
        raise ValueError(
            f"cannot save {index.ntotal} vectors and {keywords.rows} keyword rows with {len(chunks)} chunks"
        )
    refuse_foreign(target)
    lines = "".join(
        _chunk_line(chunk, row, digest)
        for row, (chunk, digest) in enumerate(zip(chunks, _row_digests(index), strict=True))
    )
    meta = {**meta, "chunks_sha256": hashlib.sha256(lines.encode("utf-8")).hexdigest()}
    meta["save_id"] = uuid.uuid4().hex  # two saves of one index differ, to a reader's stamp
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = scratch_dir(target.parent, f".{target.name}.tmp-")
    try:
        faiss.write_index(index, str(scratch / _INDEX))
        _write_text(scratch / _CHUNKS, lines)
        keywords.save(scratch / _KEYWORD)
        files = sorted(p.name for p in (scratch / _KEYWORD).iterdir())
        meta["keyword"] = {
            "tokenizer": keywords.tokenizer,
            "files": {name: _file_sha256(scratch / _KEYWORD / name) for name in files},
        }
        _write_text(scratch / _META, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        for path in (scratch / _INDEX, scratch / _CHUNKS, *(scratch / _KEYWORD / n for n in files)):
            fsync_file(path)
        fsync_file(scratch / _META)
        _swap(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # gone already after a successful swap


def refuse_foreign(target: Path) -> None:
    """Refuse a `target` that `save` would not replace: a file, or a folder with other things in it.

    Replacing the target deletes it, so it had better be an index (or nothing at all); callers
    check first to refuse before any embedding.
    """
    if not target.exists():
        return
    if not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory; choose another index path")
    if any(target.iterdir()) and _format_of(target) != FORMAT:
        raise FileExistsError(f"{target} exists and is not a rag-lookahead index; refusing to replace it")


def lock(target: Path) -> FileLock:
    """The inter-process lock of the index at `target` (its file is beside it: the directory
    itself is replaced on every save). Creates `target`'s parent folder."""
    return lock_beside(target)


def _swap(scratch: Path, target: Path) -> None:
    if not target.exists():
        scratch.rename(target)
        return
    # Two renames: if we die between them the old index is still whole, under `old`.
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    target.rename(old)
    try:
        scratch.rename(target)
    except BaseException:
        old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _chunk_line(chunk: Chunk, row: int, vector: str) -> str:
    record = {**dataclasses.asdict(chunk), "row": row, "vector": vector}  # id, source, text, start, end
    record["headings"] = list(chunk.headings)
    return json.dumps(record, ensure_ascii=False) + "\n"


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _row_digests(index: Any) -> list[str]:
    """The digest of every row of `index`, from its little-endian float32 bytes."""
    if index.ntotal == 0:
        return []
    vectors = np.ascontiguousarray(index.reconstruct_n(0, index.ntotal), dtype="<f4")  # [N, D]
    return [hashlib.sha256(row).hexdigest()[:_VECTOR_DIGEST] for row in vectors]


def _write_text(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as file:
        file.write(text)


# --------------------------------------------------------------------------------- loading


@dataclasses.dataclass(frozen=True)
class SavedIndex:
    """The files of one save of an index, read and checked against each other."""

    meta: dict[str, Any]
    faiss: Any
    chunks: list[Chunk]
    keywords: KeywordIndex


def read_index(directory: Path) -> SavedIndex:
    """The index at `directory`, all of it from one save, though another process may save
    meanwhile (see the module docstring).

    Raises:
        IndexFormatError: There is no index, or it is damaged (read the same twice), or saves
            kept changing it while it was read.
    """
    error: Exception | None = None
    for attempt in range(len(_REREAD_PAUSES) + 1):
        if attempt:
            time.sleep(_REREAD_PAUSES[attempt - 1])
        before = _stamp(directory)
        try:
            saved = _read_once(directory)
        except (IndexFormatError, OSError) as err:
            if not _changed(directory, before):
                raise
            error = err
        else:
            if not _changed(directory, before):
                return saved
    if error is not None:
        raise error
    raise IndexFormatError(f"{directory} changed with every read (other processes saving it); try again")


def _read_once(directory: Path) -> SavedIndex:
    meta = read_meta(directory)
    faiss_index, chunks = read_rows(directory, meta)
    return SavedIndex(meta, faiss_index, chunks, read_keyword(directory, meta, len(chunks)))


def _stamp(directory: Path) -> tuple[int, int, bytes] | None:
    """Which save `directory` holds: its inode (each save swaps a new directory in, though a
    removed one's number may come back) and meta.json's bytes (its save's ``save_id``, and the
    digests that fix every other file); ``None`` where it has none to read."""
    try:
        status = os.stat(directory)
        return status.st_dev, status.st_ino, (directory / _META).read_bytes()
    except OSError:
        return None


def _changed(directory: Path, before: tuple[int, int, bytes] | None) -> bool:
    """Whether a save changed `directory` since it was stamped `before`, or is swapping it in
    now (no directory, a previous one beside it)."""
    now = _stamp(directory)
    if now is None and not directory.exists():
        return bool(_leftovers(directory))
    return now != before


def read_meta(directory: Path) -> dict[str, Any]:
    """The validated meta.json of `directory`."""
    if not directory.is_dir():
        raise IndexFormatError(
            f"no index at {directory}{_leftover_hint(directory)}; build one with `rag-lookahead index`"
        )
    try:
        meta = json.loads((directory / _META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(f"{directory} is not a rag-lookahead index (no {_META}); {_REBUILD}") from None
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: JSON nested too deeply
        raise IndexFormatError(f"{directory / _META} is unreadable ({err}); {_REBUILD}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IndexFormatError(f"{directory} is not a rag-lookahead index; {_REBUILD}")
    if not _is_int(meta.get("format_version")) or meta["format_version"] != FORMAT_VERSION:
        raise IndexFormatError(
            f"{directory} holds index format version {meta.get('format_version')!r}, but this "
            f"rag-lookahead reads version {FORMAT_VERSION}; {_REBUILD}"
        )
    _check_fields(directory, meta)
    return meta


def _check_fields(directory: Path, meta: dict[str, Any]) -> None:
    sources, digest, keywords = meta.get("sources"), meta.get("chunks_sha256"), meta.get("keyword")
    valid = (
        isinstance(meta.get("embedder"), str)
        and bool(meta["embedder"])
        and _is_int(meta.get("dimension"))
        and meta["dimension"] >= 1
        and isinstance(meta.get("chunking"), dict)
        and isinstance(sources, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items())
        and _is_digest(digest)
        and isinstance(keywords, dict)
        and isinstance(keywords.get("tokenizer"), str)
        and isinstance(keywords.get("files"), dict)
        and all(isinstance(k, str) and _is_digest(v) for k, v in keywords["files"].items())
    )
    if not valid:
        raise IndexFormatError(f"{directory / _META} is damaged (missing or mistyped fields); {_REBUILD}")


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def check_embedder(meta: Mapping[str, Any], embedder: Embedder | None) -> Embedder:
    """The embedder to search with: `embedder`, or the default model if the index used it."""
    built_with = meta["embedder"]
    if embedder is None:
        if built_with != DEFAULT_EMBEDDER:
            raise IndexFormatError(
                f"the index was built with embedder {built_with!r}; load it with that model: "
                f"DocumentIndex.load(directory, embedder=SentenceTransformerEmbedder({built_with!r}))"
            )
        embedder = SentenceTransformerEmbedder()
    if embedder.name != built_with:
        raise IndexFormatError(
            f"the index was built with embedder {built_with!r}, not {embedder.name!r}; "
            f"load it with the same embedder, or {_REBUILD}"
        )
    if embedder.dimension != meta["dimension"]:
        raise IndexFormatError(
            f"the index holds {meta['dimension']}-dimensional vectors but embedder "
            f"{embedder.name!r} makes {embedder.dimension}-dimensional ones; {_REBUILD}"
        )
    return embedder


def chunking_config(meta: Mapping[str, Any]) -> ChunkingConfig:
    try:
        return ChunkingConfig(**{"splitter": _FIRST_SPLITTER, **meta["chunking"]})
    except (TypeError, ValueError) as err:
        raise IndexFormatError(f"the index's chunking settings are invalid ({err}); {_REBUILD}") from None


def read_rows(directory: Path, meta: Mapping[str, Any]) -> tuple[Any, list[Chunk]]:
    """The FAISS index and its chunks, checked against each other and against `meta`.

    Each line of chunks.jsonl must hold its own row number and the digest of that FAISS row,
    and the file must hash to meta.json's ``chunks_sha256``; see the module docstring.
    """
    path = directory / _CHUNKS
    try:
        data = path.read_bytes()
    except OSError as err:
        raise IndexFormatError(f"{path} is unreadable ({err}); {_REBUILD}") from None
    chunks, bound_to = _read_chunks(path, data, meta["sources"])
    try:
        index = faiss.read_index(str(directory / _INDEX))
    except RuntimeError as err:
        raise IndexFormatError(f"{directory / _INDEX} is unreadable ({str(err)[:200]}); {_REBUILD}") from None
    if not isinstance(index, faiss.IndexFlatIP) or index.d != meta["dimension"]:
        raise IndexFormatError(
            f"{directory / _INDEX} is not a {meta['dimension']}-dimensional flat inner-product "
            f"index; {_REBUILD}"
        )
    if index.ntotal != len(chunks):
        raise IndexFormatError(f"{directory} has {index.ntotal} vectors but {len(chunks)} chunks; {_REBUILD}")
    for row, (expected, found) in enumerate(zip(_row_digests(index), bound_to, strict=True)):
        if found != expected:
            raise IndexFormatError(
                f"{path} line {row + 1} is not bound to row {row} of {_INDEX} (its vector digest is "
                f"{found!r}, the row's is {expected!r}): the files come from different saves or were "
                f"edited; {_REBUILD}"
            )
    if hashlib.sha256(data).hexdigest() != meta["chunks_sha256"]:
        raise IndexFormatError(
            f"{path} does not match the chunks_sha256 in {_META}: it was edited after saving; {_REBUILD}"
        )
    return index, chunks


def read_keyword(directory: Path, meta: Mapping[str, Any], rows: int) -> KeywordIndex:
    """The keyword index of `directory`'s `rows` chunks, its files checked against meta.json."""
    recorded = meta["keyword"]
    if recorded["tokenizer"] not in keyword.TOKENIZERS:
        raise IndexFormatError(
            f"{directory}'s keyword index cut words as {recorded['tokenizer']!r}, but this "
            f"rag-lookahead cuts them as {keyword.TOKENIZER!r}; {_REBUILD}"
        )
    folder = directory / _KEYWORD
    expected = set(keyword.FILES) if rows else set()
    try:
        present = {p.name for p in folder.iterdir()}
    except OSError as err:
        raise IndexFormatError(f"{folder} is unreadable ({err}); {_REBUILD}") from None
    if set(recorded["files"]) != expected or present != expected:
        raise IndexFormatError(
            f"{folder} holds {sorted(present)}, but meta.json lists {sorted(recorded['files'])} and an "
            f"index of {rows} chunks needs {sorted(expected)}; {_REBUILD}"
        )
    for name, digest in recorded["files"].items():
        if _file_sha256(folder / name) != digest:
            raise IndexFormatError(
                f"{folder / name} does not match its SHA-256 in {_META}: it comes from another save or "
                f"was edited; {_REBUILD}"
            )
    try:
        return KeywordIndex.load(folder, rows, recorded["tokenizer"])
    except ValueError as err:
        raise IndexFormatError(f"{folder} is damaged ({err}); {_REBUILD}") from None


def _read_chunks(path: Path, data: bytes, sources: Mapping[str, str]) -> tuple[list[Chunk], list[str]]:
    """The chunks in `data` (read from `path`) and, for each, the digest of its vector."""
    try:
        # split("\n"), not splitlines(): JSON leaves U+2028 and friends unescaped in texts.
        lines = [line for line in data.decode("utf-8").split("\n") if line]
    except ValueError as err:
        raise IndexFormatError(f"{path} is unreadable ({err}); {_REBUILD}") from None
    chunks, bound_to = [], []
    for row, line in enumerate(lines):
        try:
            chunk, vector = _parse_chunk(line, row, sources)
        except (ValueError, TypeError, KeyError, RecursionError) as err:
            raise IndexFormatError(f"{path} line {row + 1} is damaged ({err}); {_REBUILD}") from None
        chunks.append(chunk)
        bound_to.append(vector)
    return chunks, bound_to


def _parse_chunk(line: str, row: int, sources: Mapping[str, str]) -> tuple[Chunk, str]:
    record = json.loads(line)
    if not isinstance(record, dict) or record.keys() != _CHUNK_FIELDS:
        raise ValueError(f"a chunk has exactly the fields {', '.join(sorted(_CHUNK_FIELDS))}")
    for name in ("id", "source", "text", "vector"):
        if not isinstance(record[name], str):
            raise ValueError(f"{name!r} must be a string, got {type(record[name]).__name__}")
    headings = record["headings"]
    if not isinstance(headings, list) or not all(isinstance(h, str) for h in headings):
        raise ValueError("'headings' must be a list of strings")
    for name in ("start", "end", "row"):
        if not _is_int(record[name]):
            raise ValueError(f"{name!r} must be an integer, got {type(record[name]).__name__}")
    if not re.fullmatch(f"[0-9a-f]{{{_VECTOR_DIGEST}}}", record["vector"]):
        raise ValueError(f"'vector' must be {_VECTOR_DIGEST} lowercase hex digits")
    if record["row"] != row:
        raise ValueError(
            f"it is bound to row {record['row']}, not to row {row}: lines were reordered, "
            "duplicated or edited"
        )
    chunk = Chunk(
        record["id"], record["source"], record["text"], record["start"], record["end"], tuple(headings)
    )
    if chunk.source not in sources:
        raise ValueError(f"source {chunk.source!r} is not in meta.json")
    if chunk.id != chunk_id(chunk.source, chunk.text, chunk.start, chunk.end, chunk.headings):
        raise ValueError(f"chunk id {chunk.id!r} does not match its content")
    return chunk, record["vector"]


def _is_int(value: object) -> bool:
    # bool is an int subclass, and JSON's true must not pass for 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _format_of(directory: Path) -> object:
    try:
        return json.loads((directory / _META).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def _leftover_hint(directory: Path) -> str:
    # An interrupted save between its two renames leaves the previous index here, whole.
    leftovers = _leftovers(directory)
    return f" (an interrupted save left the previous index at {leftovers[0]})" if leftovers else ""


def _leftovers(directory: Path) -> list[Path]:
    """The previous indexes a save set aside beside `directory` (until its swap is done)."""
    return sorted(directory.parent.glob(f".{directory.name}.old-*")) if directory.name else []
