"""The keyword side of the index: BM25 over the chunks' words, row ``i`` = chunk ``i``.

The library is bm25s, chosen by measurement against rank-bm25 and tantivy on the contexts and
questions of the benchmark sets (`benchmarks/bm25_choice.py`, figures in benchmarks/README.md):
it queried fastest of the three (its scores are a precomputed sparse matrix, a query sums a few
of its rows) and built faster than tantivy, in memory of the same order; it needs nothing beyond
numpy and scipy, both here already, and saves to ``.npy`` arrays and JSON, read back without
pickle. rank-bm25 has no persistence but pickle and scores every chunk in Python per query;
tantivy is a whole search engine with its own tokenizer and segment files, more than a list of
chunks needs.

BM25 statistics are corpus-wide, so every change of the chunks rebuilds the keyword index from
all their texts; tokenizing is cheap next to embedding them.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FILES", "TOKENIZER", "KeywordIndex", "tokenize"]

# Named in meta.json: an index whose words were cut otherwise is refused (queries must be cut alike).
TOKENIZER = "words-lower-stopwords_en_plus-snowball_english-v1"
# Letters and digits; "_" and "." split, so `textwrap.dedent` and `shutil_copy` match their parts.
_WORD = re.compile(r"[^\W_]+")
# The files bm25s writes (no corpus file: the chunks are in chunks.jsonl already).
FILES = (
    "data.csc.index.npy",
    "indices.csc.index.npy",
    "indptr.csc.index.npy",
    "vocab.index.json",
    "params.index.json",
)


@cache
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return frozenset(STOPWORDS_EN_PLUS)


_local = threading.local()


def _stemmer() -> Any:
    # One per thread: a PyStemmer object keeps state between words and is not meant to be shared.
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        import Stemmer

        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer


def tokenize(text: str) -> list[str]:
    """The words BM25 counts: lowercased, English stop words out, Snowball stems."""
    stop = _stopwords()
    words = [w for w in _WORD.findall(text.lower()) if w not in stop]
    return list(_stemmer().stemWords(words))


class KeywordIndex:
    """BM25 (bm25s, Lucene's variant) over texts; `search` returns ``(row, score)`` pairs."""

    def __init__(self, bm25: Any, rows: int) -> None:
        self._bm25 = bm25  # None when there are no rows
        self.rows = rows

    @classmethod
    def build(cls, texts: Sequence[str]) -> KeywordIndex:
        """The index of `texts`, in order."""
        if not texts:
            return cls(None, 0)
        import bm25s

        bm25 = bm25s.BM25()
        bm25.index([tokenize(text) for text in texts], show_progress=False)
        return cls(bm25, len(texts))

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The `k` best rows with a positive score (at least one query word), best first."""
        if self._bm25 is None:
            return []
        vocab = self._bm25.vocab_dict
        ids = sorted({vocab[word] for word in tokenize(query) if word in vocab})
        if not ids:
            return []
        scores = np.asarray(self._bm25.get_scores_from_ids(ids), dtype=np.float32)  # [rows]
        matched = np.flatnonzero(scores > 0)
        best = matched[np.argsort(-scores[matched], kind="stable")[:k]]
        return [(int(row), float(scores[row])) for row in best]

    def save(self, directory: Path) -> None:
        """Write the bm25s files into `directory` (nothing for an empty index)."""
        directory.mkdir(parents=True, exist_ok=True)
        if self._bm25 is not None:
            self._bm25.save(directory, show_progress=False)

    @classmethod
    def load(cls, directory: Path, rows: int) -> KeywordIndex:
        """Read what `save` wrote for `rows` chunks.

        Raises:
            ValueError: The files are missing, unreadable or do not describe `rows` chunks.
        """
        if rows == 0:
            return cls(None, 0)
        import bm25s

        params = _read_json(directory / "params.index.json")
        if not isinstance(params, dict) or params.get("num_docs") != rows:
            raise ValueError(f"the keyword index does not hold {rows} chunks")
        try:
            bm25 = bm25s.BM25.load(directory, mmap=False, allow_pickle=False, show_progress=False)
        except Exception as err:  # whatever a damaged file makes a third-party reader raise
            raise ValueError(f"the keyword index is unreadable ({str(err)[:200]})") from None
        _check_arrays(bm25, rows)
        return cls(bm25, rows)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(f"{path.name} is unreadable ({err})") from None


def _check_arrays(bm25: Any, rows: int) -> None:
    """Refuse arrays that would index out of bounds or score nonsense (a damaged or forged file)."""
    data, indices, indptr = (bm25.scores[name] for name in ("data", "indices", "indptr"))
    vocab = bm25.vocab_dict
    words = len(indptr) - 1
    valid = (
        all(a.ndim == 1 for a in (data, indices, indptr))
        and data.dtype.kind == "f"
        and indices.dtype.kind in "iu"
        and indptr.dtype.kind in "iu"
        and len(data) == len(indices)
        and words >= 1
        and indptr[0] == 0
        and indptr[-1] == len(data)
        and bool(np.all(np.diff(indptr) >= 0))
        and (len(indices) == 0 or (indices.min() >= 0 and indices.max() < rows))
        and bool(np.all(np.isfinite(data)))
        and isinstance(vocab, dict)
        and all(isinstance(w, str) and type(i) is int and 0 <= i < words for w, i in vocab.items() if w)
    )
    if not valid:
        raise ValueError("the keyword index's arrays are inconsistent")
