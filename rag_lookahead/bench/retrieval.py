"""Retrieval quality on a question set: does a question's search find its own (gold) context?

Every distinct context of the file becomes a document of one index (chunked and embedded as
`rag-lookahead index` would); each question is searched in every retrieval mode, and recall@k
is the share of questions whose gold context owns one of the first k chunks. Build time is split
by what each mode needs (chunking, embedding, the keyword index); query time is the total over
all questions. A question is embedded once, timed, and that time is counted in each mode that
needs the vector (dense, hybrid); then the modes search in turn, each going first in turn, so
that a machine busy with other work slows them alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag_lookahead.rag import ChunkingConfig, Document, DocumentIndex, Embedder
from rag_lookahead.rag.index import RETRIEVAL_MODES, RetrievalMode, check_mode

__all__ = ["RECALL_AT", "evaluate_retrieval", "format_retrieval", "load_qa_records"]

RECALL_AT = (1, 4)
Progress = Callable[[Iterable[Any]], Iterable[Any]]


def load_qa_records(path: Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(question, context)`` of each JSONL record, with a clear error for a bad line."""
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise ValueError(f"--limit must be a positive integer, got {limit!r}")
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise FileNotFoundError(f"cannot read {path}: {err.strerror or err}") from None
    records: list[tuple[str, str]] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        records.append(_record(path, number, line))
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


def _record(path: Path, number: int, line: bytes) -> tuple[str, str]:
    where = f"{path}:{number}"
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8") from None
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{where}: invalid JSON ({str(err)[:100]})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record is a JSON object, not {type(record).__name__}")
    for field in ("question", "context"):
        value = record.get(field)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where}: a record needs a non-empty string {field!r}")
    return record["question"], record["context"]


def evaluate_retrieval(
    records: Sequence[tuple[str, str]],
    embedder: Embedder,
    *,
    name: str = "data",
    config: ChunkingConfig | None = None,
    modes: Sequence[str] = RETRIEVAL_MODES,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Index every distinct context of `records`, search every question in every mode.

    Returns:
        ``{"data", "records", "contexts", "chunks", "modes": {mode: {"recall_at_1",
        "recall_at_4", "build_seconds", "query_seconds"}}}``; recalls are fractions.
    """
    checked: list[RetrievalMode] = [check_mode(mode) for mode in modes]
    if not checked:
        raise ValueError("no retrieval mode to evaluate")
    config = config or ChunkingConfig()
    contexts = list(dict.fromkeys(context for _, context in records))
    source = {context: f"{name}#{i}" for i, context in enumerate(contexts, 1)}
    index = DocumentIndex(embedder, config)
    index.add([Document(source[c], c) for c in contexts], progress)
    ranks, seconds = _search_all(index, records, source, checked)
    results = {
        mode: {
            **{f"recall_at_{k}": _recall(ranks[mode], k) for k in RECALL_AT},
            "build_seconds": round(index.timings.for_mode(mode), 3),
            "query_seconds": round(seconds[mode], 3),
        }
        for mode in checked
    }
    return {
        "data": name,
        "records": len(records),
        "contexts": len(contexts),
        "chunks": len(index),
        "chunking": {"size": config.size, "overlap": config.overlap, "unit": config.unit},
        "modes": results,
    }


class _OneQuery:
    """The index's embedder, embedding each question once however many modes search for it."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name, self.dimension, self.tokenizer = inner.name, inner.dimension, inner.tokenizer
        self._text: str | None = None
        self._vector = np.zeros((0, inner.dimension), np.float32)

    def prepare(self, text: str) -> float:
        """Embed `text` now; the seconds it took."""
        started = time.perf_counter()
        self._vector, self._text = self.inner.embed([text]), text
        return time.perf_counter() - started

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if list(texts) != [self._text]:
            raise RuntimeError("only the prepared question is embedded while searching")
        return self._vector


def _search_all(
    index: DocumentIndex,
    records: Sequence[tuple[str, str]],
    source: dict[str, str],
    modes: list[RetrievalMode],
) -> tuple[dict[str, list[int | None]], dict[str, float]]:
    """Per mode, the rank (from 1) of each question's gold context (None if not in the first
    max(k)) and the seconds spent searching, the question's embedding included where used."""
    ranks: dict[str, list[int | None]] = {mode: [] for mode in modes}
    seconds: dict[str, float] = dict.fromkeys(modes, 0.0)
    embedder = index.embedder
    queries = index.embedder = _OneQuery(embedder)
    try:
        for i, (question, context) in enumerate(records):
            embedding = queries.prepare(question)
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:  # each goes first in turn
                started = time.perf_counter()
                hits = index.search(question, max(RECALL_AT), mode)
                seconds[mode] += time.perf_counter() - started + (embedding if mode != "keyword" else 0.0)
                sources = [hit.chunk.source for hit in hits]
                gold = source[context]
                ranks[mode].append(sources.index(gold) + 1 if gold in sources else None)
    finally:
        index.embedder = embedder
    return ranks, seconds


def _recall(ranks: list[int | None], k: int) -> float:
    return round(sum(rank is not None and rank <= k for rank in ranks) / len(ranks), 4)


def format_retrieval(summary: dict[str, Any]) -> str:
    """The summary as a table."""
    head = (
        f"{summary['data']}: {summary['records']} questions, {summary['contexts']} contexts, "
        f"{summary['chunks']} chunks"
    )
    rows = [head, f"{'mode':<8} {'recall@1':>9} {'recall@4':>9} {'build s':>9} {'query s':>9}"]
    for mode, r in summary["modes"].items():
        rows.append(
            f"{mode:<8} {r['recall_at_1']:>9.1%} {r['recall_at_4']:>9.1%} "
            f"{r['build_seconds']:>9.2f} {r['query_seconds']:>9.2f}"
        )
    return "\n".join(rows)
