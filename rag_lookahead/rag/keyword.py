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

Words are runs of letters and digits, lowercased, English stop words out, Snowball stems. Scripts
written without spaces between words (Chinese, Japanese, Thai, Lao, Khmer, Myanmar; Korean,
whose spaces leave particles on their words) have no such runs: theirs are cut into overlapping
pairs of characters, as Lucene's CJK analyzer does, so that a phrase is found inside a longer run
by its pairs. A text's characters are terms too, for a query of one character; a query's pairs
alone are looked up (its characters would match nearly every text of its script).
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from collections.abc import Sequence
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FILES", "PREVIOUS_TOKENIZER", "TOKENIZER", "TOKENIZERS", "KeywordIndex", "tokenize"]

# Named in meta.json: queries are cut as the index's words were, so an index cut otherwise than
# by one of `TOKENIZERS` is refused.
TOKENIZER = "words-lower-stopwords_en_plus-snowball_english-spaceless_pairs-v2"
#: Words only: a run of a script without spaces was one word (saved before v2, still read).
PREVIOUS_TOKENIZER = "words-lower-stopwords_en_plus-snowball_english-v1"
TOKENIZERS = (TOKENIZER, PREVIOUS_TOKENIZER)
# Letters and digits; "_" and "." split, so `textwrap.dedent` and `shutil_copy` match their parts.
_WORD = re.compile(r"[^\W_]+")
# The Unicode blocks of the scripts written without spaces between words (see the docstring).
_SPACELESS = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK unified ideographs extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # halfwidth Katakana
    "\U00020000-\U0003134f"  # CJK unified ideographs extensions B to H
)
# A run of those scripts' characters, or a word of the others' letters and digits.
_TERM = re.compile(f"(?P<spaceless>[{_SPACELESS}]+)|(?P<word>[^\\W_{_SPACELESS}]+)")
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


def tokenize(text: str, *, query: bool = False, tokenizer: str = TOKENIZER) -> list[str]:
    """The terms BM25 counts in ``text`` (a chunk's, or a ``query``'s: see the module
    docstring), as ``tokenizer`` (one of `TOKENIZERS`) cuts them."""
    if _checked(tokenizer) == PREVIOUS_TOKENIZER:
        return _stemmed(_WORD.findall(text.lower()))
    words: list[str] = []
    terms: list[str] = []
    for match in _TERM.finditer(text.lower()):
        if match.lastgroup == "word":
            words.append(match.group())
        else:
            terms += _pairs(match.group(), query)
    return _stemmed(words) + terms


def _checked(tokenizer: str) -> str:
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown keyword tokenizer {tokenizer!r}; known: {', '.join(TOKENIZERS)}")
    return tokenizer


def _stemmed(words: list[str]) -> list[str]:
    """``words`` without English stop words, as Snowball stems."""
    stop = _stopwords()
    return list(_stemmer().stemWords([w for w in words if w not in stop]))


def _pairs(run: str, query: bool) -> list[str]:
    """The terms of a run of a script without spaces: each stretch of characters between
    punctuation as its overlapping pairs (a stretch of one character as itself) and, but in a
    query, its characters."""
    terms: list[str] = []
    for units in _stretches(run):
        pairs = [a + b for a, b in pairwise(units)]
        terms += pairs or units
        if not query and pairs:
            terms += units
    return terms


def _stretches(run: str) -> list[list[str]]:
    """``run`` cut at what is neither a letter, a digit nor a mark, each stretch as its
    characters, each with the marks that follow it (Thai and Lao vowel and tone marks, which
    are no letters: a character without them is another)."""
    stretches: list[list[str]] = [[]]
    for char in run:
        if char.isalnum():
            stretches[-1].append(char)
        elif unicodedata.category(char).startswith("M") and stretches[-1]:
            stretches[-1][-1] += char
        elif stretches[-1]:
            stretches.append([])
    return [units for units in stretches if units]


class KeywordIndex:
    """BM25 (bm25s, Lucene's variant) over texts; `search` returns ``(row, score)`` pairs."""

    def __init__(self, bm25: Any, rows: int, tokenizer: str = TOKENIZER) -> None:
        self._bm25 = bm25  # None when there are no rows
        self.rows = rows
        self.tokenizer = _checked(tokenizer)  # how its texts' words were cut, and its queries' are

    @classmethod
    def build(cls, texts: Sequence[str], tokenizer: str = TOKENIZER) -> KeywordIndex:
        """The index of `texts`, in order, their words cut by ``tokenizer``."""
        if not texts:
            return cls(None, 0, tokenizer)
        import bm25s

        bm25 = bm25s.BM25()
        bm25.index([tokenize(text, tokenizer=tokenizer) for text in texts], show_progress=False)
        return cls(bm25, len(texts), tokenizer)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The `k` best rows with a positive score (at least one query word), best first."""
        if self._bm25 is None:
            return []
        vocab = self._bm25.vocab_dict
        ids = sorted(
            {vocab[term] for term in tokenize(query, query=True, tokenizer=self.tokenizer) if term in vocab}
        )
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
    def load(cls, directory: Path, rows: int, tokenizer: str = TOKENIZER) -> KeywordIndex:
        """Read what `save` wrote for `rows` chunks whose words ``tokenizer`` cut.

        Raises:
            ValueError: The files are missing, unreadable or do not describe `rows` chunks.
        """
        if rows == 0:
            return cls(None, 0, tokenizer)
        import bm25s

        params = _read_json(directory / "params.index.json")
        if not isinstance(params, dict) or params.get("num_docs") != rows:
            raise ValueError(f"the keyword index does not hold {rows} chunks")
        try:
            bm25 = bm25s.BM25.load(directory, mmap=False, allow_pickle=False, show_progress=False)
        except Exception as err:  # whatever a damaged file makes a third-party reader raise
            raise ValueError(f"the keyword index is unreadable ({str(err)[:200]})") from None
        _check_arrays(bm25, rows)
        return cls(bm25, rows, tokenizer)


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
