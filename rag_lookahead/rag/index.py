"""A searchable index of document chunks: dense, keyword, or both fused.

- dense: FAISS inner product over unit vectors (= cosine) of the chunks' texts;
- keyword: BM25 over their words (`rag_lookahead.rag.keyword`), which finds the rare names
  (``dedent``, an error code, a flag) that embeddings blur;
- hybrid: both rankings fused by reciprocal rank fusion (Cormack et al., 2009): a chunk scores
  ``sum(1 / (60 + rank))`` over the rankings it is in, so neither side's score scale matters.

Row ``i`` of the FAISS index and of the keyword index is ``chunks[i]``; every change rebuilds
both from kept and new rows, which keeps that invariant trivially true. On disk an index is a
directory (see `rag_lookahead.rag.store`); nothing is pickled.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import faiss
import numpy as np
from filelock import FileLock

from rag_lookahead.rag import store
from rag_lookahead.rag.chunking import Chunk, ChunkingConfig, split_document
from rag_lookahead.rag.documents import Document, Skipped, load_documents
from rag_lookahead.rag.embedding import Embedder
from rag_lookahead.rag.keyword import KeywordIndex
from rag_lookahead.rag.retrieval import RETRIEVAL_MODES, RetrievalMode, check_mode
from rag_lookahead.rag.store import IndexFormatError

__all__ = [
    "RETRIEVAL_MODES",
    "BuildTimings",
    "DocumentIndex",
    "Hit",
    "IndexFormatError",
    "Progress",
    "RetrievalMode",
    "UpdateReport",
    "check_mode",
]

# Reciprocal rank fusion: the constant of its paper (it damps the head of each ranking), and how
# deep each ranking is read: a chunk ranked below that on both sides never makes a top k.
_RRF_K = 60
_FUSION_DEPTH = 50

T = TypeVar("T")
# Wraps the iterable of embedding batches, like `tqdm`: the CLI passes one to show a bar.
Progress = Callable[[Iterable[Any]], Iterable[Any]]
# Texts per `embed` call (so per progress step): small enough for a lively progress bar, big
# enough to batch well.
_EMBED_BATCH = 64


@dataclass(frozen=True)
class Hit:
    """A retrieved chunk, the score it was ranked by, and its cosine similarity to the query.

    Attributes:
        chunk: The chunk.
        score: Higher ranks first: the cosine similarity (dense), the BM25 score (keyword) or the
            reciprocal-rank-fusion score (hybrid).
        similarity: The chunk's cosine similarity to the query; ``None`` in keyword mode, which
            does not embed the query.
    """

    chunk: Chunk
    score: float
    similarity: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.chunk, Chunk):
            raise ValueError(f"Hit.chunk must be a Chunk, got {type(self.chunk).__name__}")


@dataclass(frozen=True)
class BuildTimings:
    """Where the last build, update or add of an index spent its time, in seconds.

    Attributes:
        chunking: Cutting documents into chunks.
        embedding: Embedding the new chunks and rebuilding the FAISS index.
        keyword: Rebuilding the keyword (BM25) index.
    """

    chunking: float = 0.0
    embedding: float = 0.0
    keyword: float = 0.0

    def for_mode(self, mode: RetrievalMode) -> float:
        """The time a `mode`-only index would have taken: chunking plus its own part(s)."""
        dense = self.embedding if mode in ("dense", "hybrid") else 0.0
        keyword = self.keyword if mode in ("keyword", "hybrid") else 0.0
        return self.chunking + dense + keyword


@dataclass(frozen=True)
class UpdateReport:
    """What `DocumentIndex.update` did, counted in sources (files or ``.jsonl`` records).

    A source whose content changed counts as both removed and added.
    """

    added: int
    removed: int
    unchanged: int
    skipped: tuple[Skipped, ...] = ()
    chunks_added: int = 0
    chunks_removed: int = 0

    def __post_init__(self) -> None:
        counts = (self.added, self.removed, self.unchanged, self.chunks_added, self.chunks_removed)
        if min(counts) < 0:
            raise ValueError(f"update counts cannot be negative: {counts}")


@dataclass
class _Batch:
    """New chunks and their vectors, embedded before the index changes (so a failure keeps it whole)."""

    chunks: list[Chunk]
    vectors: np.ndarray  # [N, D]
    sources: dict[str, str]  # source -> sha256 of its text
    chunking_seconds: float
    embedding_seconds: float


class DocumentIndex:
    """Chunks of documents, their vectors, and the content hash of every indexed source.

    Build one with `build`, or `load` a saved one. Not safe for concurrent mutation (across
    processes, see `lock`).
    """

    def __init__(self, embedder: Embedder, config: ChunkingConfig = ChunkingConfig()) -> None:
        self.embedder = embedder
        self.config = config
        self._chunks: list[Chunk] = []
        self._sources: dict[str, str] = {}
        self._faiss = faiss.IndexFlatIP(embedder.dimension)
        self._keyword = KeywordIndex.build([])
        self.timings = BuildTimings()

    @classmethod
    def build(
        cls,
        paths: Sequence[str | Path],
        embedder: Embedder,
        config: ChunkingConfig = ChunkingConfig(),
        progress: Progress | None = None,
        *,
        text_field: str = "text",
        follow_symlinks: bool = False,
    ) -> tuple[DocumentIndex, list[Skipped]]:
        """Index the documents under `paths` (see `load_documents`); also return what was skipped."""
        index = cls(embedder, config)
        documents, skipped = load_documents(paths, text_field=text_field, follow_symlinks=follow_symlinks)
        index._apply(index._embed_documents(documents, progress), stale=set())
        return index, skipped

    def update(
        self,
        paths: Sequence[str | Path],
        progress: Progress | None = None,
        *,
        text_field: str = "text",
        follow_symlinks: bool = False,
    ) -> UpdateReport:
        """Re-read `paths` and bring the index in line with them.

        Sources under `paths` whose text changed, or that are gone or now unreadable, lose all
        their chunks; changed and new sources are embedded; unchanged ones are kept as they are
        (not re-embedded). Sources outside `paths` are left alone. A path that no longer
        exists raises `FileNotFoundError`: update its parent folder to drop it. A link out of a
        folder is skipped (and its chunks dropped) unless `follow_symlinks` is set.
        """
        if isinstance(paths, (str, Path)):
            paths = [paths]
        documents, skipped = load_documents(paths, text_field=text_field, follow_symlinks=follow_symlinks)
        scope = [_absolute(p) for p in paths]
        current = {doc.source: _sha256(doc.text) for doc in documents}
        in_scope = [s for s in self._sources if s in current or _is_under(s, scope)]
        unchanged = {s for s in in_scope if current.get(s) == self._sources[s]}
        stale = set(in_scope) - unchanged
        fresh = [doc for doc in documents if doc.source not in unchanged]
        removed_chunks = sum(chunk.source in stale for chunk in self._chunks)
        batch = self._embed_documents(fresh, progress)
        self._apply(batch, stale)
        return UpdateReport(
            added=len(fresh),
            removed=len(stale),
            unchanged=len(unchanged),
            skipped=tuple(skipped),
            chunks_added=len(batch.chunks),
            chunks_removed=removed_chunks,
        )

    def add(self, documents: Sequence[Document], progress: Progress | None = None) -> int:
        """Index documents already in memory (replacing sources of the same name); returns chunks added."""
        batch = self._embed_documents(documents, progress)
        self._apply(batch, stale={doc.source for doc in documents} & set(self._sources))
        return len(batch.chunks)

    def search(self, query: str, k: int = 4, mode: RetrievalMode = "hybrid") -> list[Hit]:
        """The `k` best chunks for `query`, best first (fewer if the index is smaller).

        Args:
            query: The question or search text.
            k: How many chunks.
            mode: ``"hybrid"`` (both rankings below, fused by reciprocal rank), ``"dense"``
                (cosine similarity of embeddings) or ``"keyword"`` (BM25: only chunks sharing a
                word with the query, so possibly fewer than `k`).
        """
        if not isinstance(query, str) or not query.strip():
            raise ValueError("the search query is empty")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        mode = check_mode(mode)
        if not self._chunks:
            return []
        if mode == "keyword":
            return [Hit(self._chunks[row], score) for row, score in self._keyword.search(query, k)]
        vector = self._checked(self.embedder.embed([query]), 1)  # [1, D]
        if mode == "dense":
            return [Hit(self._chunks[row], sim, sim) for row, sim in self._dense(vector, k)]
        return self._fused(query, vector, k)

    def _dense(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        scores, rows = self._faiss.search(vector, min(k, len(self._chunks)))  # [1, k] each
        return [(int(row), float(score)) for score, row in zip(scores[0], rows[0], strict=True) if row >= 0]

    def _fused(self, query: str, vector: np.ndarray, k: int) -> list[Hit]:
        depth = max(k, _FUSION_DEPTH)
        dense = self._dense(vector, depth)
        fused: dict[int, float] = {}
        for ranking in ([row for row, _ in dense], [row for row, _ in self._keyword.search(query, depth)]):
            for rank, row in enumerate(ranking, 1):
                fused[row] = fused.get(row, 0.0) + 1.0 / (_RRF_K + rank)
        # Ties (a chunk ranked r on one side only, another r on the other) go to the dense side.
        order = {row: i for i, (row, _) in enumerate(dense)}
        best = sorted(fused, key=lambda row: (-fused[row], order.get(row, depth)))[:k]
        similarity = dict(dense)
        for row in best:
            if row not in similarity:  # found by keywords alone
                similarity[row] = float(self._faiss.reconstruct(row) @ vector[0])
        return [Hit(self._chunks[row], fused[row], similarity[row]) for row in best]

    def save(self, directory: str | Path) -> None:
        """Write the index to `directory`, atomically replacing an index already there."""
        store.save(Path(directory), self._faiss, self._keyword, self._chunks, self._meta())

    @classmethod
    def load(cls, directory: str | Path, embedder: Embedder | None = None) -> DocumentIndex:
        """Read an index saved by `save`.

        Args:
            directory: The index directory.
            embedder: The model the index was built with; ``None`` loads the default model,
                which is only right if the index was built with it.

        Raises:
            IndexFormatError: The directory is missing, is not an index, is of another format
                version, does not match `embedder`, or its files are damaged, were edited, or do
                not belong together (every chunk is bound to its vector; see
                `rag_lookahead.rag.store`).
        """
        saved = store.read_index(Path(directory))  # one save's files, though another saves now
        embedder = store.check_embedder(saved.meta, embedder)
        index = cls(embedder, store.chunking_config(saved.meta))
        index._faiss, index._chunks, index._keyword = saved.faiss, saved.chunks, saved.keywords
        index._sources = dict(saved.meta["sources"])
        return index

    @staticmethod
    def lock(directory: str | Path) -> FileLock:
        """A lock, across processes, on the index saved at `directory`.

        Hold it (``with DocumentIndex.lock(d):``) from `load` to `save` wherever another process
        may update the same index: saving is atomic, but without the lock the later save would
        drop the other's changes. Its file, ``.NAME.lock``, lies beside the directory.
        """
        return store.lock(Path(directory))

    def __len__(self) -> int:
        """The number of chunks."""
        return len(self._chunks)

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        """All chunks, in index order."""
        return tuple(self._chunks)

    @property
    def sources(self) -> Mapping[str, str]:
        """Every indexed source and the SHA-256 of its text (iterate it for the names)."""
        return dict(self._sources)

    def __repr__(self) -> str:
        return f"DocumentIndex({len(self._sources)} sources, {len(self)} chunks, {self.embedder.name!r})"

    def _embed_documents(self, documents: Sequence[Document], progress: Progress | None) -> _Batch:
        started = time.perf_counter()
        chunks = [
            chunk for doc in documents for chunk in split_document(doc, self.config, self.embedder.tokenizer)
        ]
        chunked = time.perf_counter()
        texts = [chunk.indexed_text for chunk in chunks]
        batches = [texts[i : i + _EMBED_BATCH] for i in range(0, len(texts), _EMBED_BATCH)]
        vectors = [
            self._checked(self.embedder.embed(batch), len(batch)) for batch in _wrap(batches, progress)
        ]  # each [B, D]
        dimension = self.embedder.dimension
        stacked = np.concatenate(vectors) if vectors else np.zeros((0, dimension), np.float32)
        sources = {doc.source: _sha256(doc.text) for doc in documents}
        embedded = time.perf_counter()
        return _Batch(chunks, stacked, sources, chunked - started, embedded - chunked)

    def _apply(self, batch: _Batch, stale: set[str]) -> None:
        """Drop the chunks of `stale` sources and add `batch`, rebuilding both indexes."""
        started = time.perf_counter()
        keep = [i for i, chunk in enumerate(self._chunks) if chunk.source not in stale]
        old = self._faiss.reconstruct_n(0, self._faiss.ntotal) if self._chunks else None  # [M, D]
        rebuilt = faiss.IndexFlatIP(self.embedder.dimension)
        if old is not None and keep:
            rebuilt.add(np.ascontiguousarray(old[keep]))  # [K, D]
        if len(batch.chunks):
            rebuilt.add(batch.vectors)
        self._faiss = rebuilt
        self._chunks = [self._chunks[i] for i in keep] + batch.chunks
        for source in stale:
            del self._sources[source]
        self._sources.update(batch.sources)
        rebuilt_at = time.perf_counter()
        self._keyword = KeywordIndex.build([chunk.indexed_text for chunk in self._chunks])
        done = time.perf_counter()
        self.timings = BuildTimings(
            chunking=batch.chunking_seconds,
            embedding=batch.embedding_seconds + (rebuilt_at - started),
            keyword=done - rebuilt_at,
        )

    def _checked(self, vectors: np.ndarray, count: int) -> np.ndarray:
        """`vectors` as contiguous float32 ``[count, D]``, or a clear error from a bad embedder."""
        array = np.ascontiguousarray(vectors, dtype=np.float32)
        if array.shape != (count, self.embedder.dimension):
            raise ValueError(
                f"embedder {self.embedder.name!r} returned shape {array.shape}, "
                f"expected ({count}, {self.embedder.dimension})"
            )
        return array

    def _meta(self) -> dict[str, Any]:
        return store.make_meta(self.embedder, self.config, self._sources)


def _wrap(items: list[T], progress: Progress | None) -> Iterable[T]:
    return items if progress is None else progress(items)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _absolute(path: str | Path) -> Path:
    # abspath, not resolve: a symlink inside a folder is still inside it.
    return Path(os.path.abspath(path))


def _is_under(source: str, scope: Sequence[Path]) -> bool:
    """Whether the file of `source` is one of the `scope` paths or inside one of them."""
    path = _absolute(store.source_file(source))
    return any(path == root or root in path.parents for root in scope)
