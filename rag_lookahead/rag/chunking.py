"""Splitting documents into overlapping chunks measured in the embedder's tokens.

Chunks are exact substrings of their document (``doc.text[start:end] == chunk.text``): token
boundaries come from the fast tokenizer's offset mapping, never from decoding ids, so what is
retrieved is what the document says, character for character.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from rag_lookahead.rag.documents import Document

__all__ = ["Chunk", "ChunkingConfig", "split_document"]

Unit = Literal["tokens", "sentences"]
Span = tuple[int, int]  # [start, end) character offsets

# Tokenizing a huge document in one call holds every offset at once; blocks keep memory flat.
_BLOCK_CHARS = 100_000
# A sentence ends at . ! or ? (and any closing quotes or brackets) before whitespace, or at a
# blank line; simple, and wrong only in ways that cost a slightly odd chunk boundary.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n\s*\n")
_SENTENCE_BATCH = 512


@dataclass(frozen=True)
class ChunkingConfig:
    """How documents are cut.

    Attributes:
        size: Most tokens in a chunk.
        overlap: Tokens repeated from the end of one chunk at the start of the next, so a
            passage cut in two is still found whole in one of them.
        unit: ``"tokens"`` cuts anywhere between tokens; ``"sentences"`` packs whole sentences
            (and repeats whole trailing sentences as the overlap).
    """

    size: int = 200
    overlap: int = 40
    unit: Unit = "sentences"

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"chunk size must be a positive integer, got {self.size!r}")
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, int):
            raise ValueError(f"chunk overlap must be an integer, got {self.overlap!r}")
        if not 0 <= self.overlap < self.size:
            raise ValueError(
                f"chunk overlap must be at least 0 and less than size ({self.size}), got {self.overlap}"
            )
        if self.unit not in ("tokens", "sentences"):
            raise ValueError(f"chunk unit must be 'tokens' or 'sentences', got {self.unit!r}")


@dataclass(frozen=True)
class Chunk:
    """A piece of a document, as indexed and retrieved.

    Attributes:
        id: A short hex hash of source, offsets and text: stable across runs and rebuilds.
        source: The document's source.
        text: ``document.text[start:end]``.
        start: Offset of the first character in the document text.
        end: Offset one past the last character.
    """

    id: str
    source: str
    text: str
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"chunk offsets must satisfy 0 <= start <= end, got {self.start}, {self.end}")
        if len(self.text) != self.end - self.start:
            raise ValueError(
                f"chunk text has {len(self.text)} characters but its offsets span {self.end - self.start}"
            )

    @staticmethod
    def make(source: str, text: str, start: int, end: int) -> Chunk:
        """A chunk with its id computed from the other fields."""
        return Chunk(chunk_id(source, text, start, end), source, text, start, end)


def chunk_id(source: str, text: str, start: int, end: int) -> str:
    """The stable id of a chunk (16 hex digits of a SHA-256)."""
    digest = hashlib.sha256(f"{source}\0{start}\0{end}\0{text}".encode())
    return digest.hexdigest()[:16]


def split_document(doc: Document, config: ChunkingConfig, tokenizer: Any) -> list[Chunk]:
    """Cut a document into chunks of at most ``config.size`` tokens of `tokenizer`.

    Args:
        doc: The document.
        config: Chunk size, overlap and unit.
        tokenizer: A Hugging Face *fast* tokenizer (it must return offset mappings), normally
            the embedder's own, so a chunk's length is what the embedder will see.
    """
    if config.unit == "tokens":
        spans = list(_token_windows(_token_spans(doc.text, 0, len(doc.text), tokenizer), config))
    else:
        spans = _sentence_chunks(doc.text, config, tokenizer)
    return [Chunk.make(doc.source, doc.text[start:end], start, end) for start, end in spans]


def _token_windows(tokens: Iterator[Span], config: ChunkingConfig) -> Iterator[Span]:
    """Windows of `config.size` tokens, each starting `size - overlap` tokens after the last."""
    step = config.size - config.overlap
    window: list[Span] = []
    covered = 0  # tokens at the start of `window` already inside an emitted chunk
    for token in tokens:
        window.append(token)
        if len(window) == config.size:
            yield window[0][0], window[-1][1]
            del window[:step]
            covered = len(window)
    if len(window) > covered:  # the tail not yet in a chunk (or a document shorter than size)
        yield window[0][0], window[-1][1]


def _token_spans(text: str, start: int, end: int, tokenizer: Any) -> Iterator[Span]:
    """Character spans of the tokens of ``text[start:end]``, block by block."""
    for block_start, block_end in _blocks(text, start, end):
        encoded = tokenizer(
            text[block_start:block_end],
            add_special_tokens=False,
            return_offsets_mapping=True,
            verbose=False,  # no "sequence longer than the model's maximum" warning: we cut it
        )
        for token_start, token_end in encoded["offset_mapping"]:
            if token_end > token_start:
                yield block_start + token_start, block_start + token_end


def _blocks(text: str, start: int, end: int) -> Iterator[Span]:
    # Blocks end just before whitespace, where tokenizers split anyway, so cutting the text
    # there changes no token.
    while end - start > _BLOCK_CHARS:
        limit = start + _BLOCK_CHARS
        cut = max(text.rfind(" ", start + 1, limit), text.rfind("\n", start + 1, limit))
        cut = cut if cut > start else start + _BLOCK_CHARS
        yield start, cut
        start = cut
    if end > start:
        yield start, end


def _sentences(text: str) -> Iterator[Span]:
    """Sentence spans, with surrounding whitespace left out."""
    start = 0
    for match in _SENTENCE_END.finditer(text):
        yield from _stripped(text, start, match.start())
        start = match.end()
    yield from _stripped(text, start, len(text))


def _stripped(text: str, start: int, end: int) -> Iterator[Span]:
    piece = text[start:end]
    left = len(piece) - len(piece.lstrip())
    right = len(piece.rstrip())
    if right > left:
        yield start + left, start + right


def _counted_sentences(text: str, tokenizer: Any) -> Iterator[tuple[Span, int]]:
    """Each sentence with its token count, tokenized in batches (one call per sentence is slow)."""
    spans = list(_sentences(text))
    for first in range(0, len(spans), _SENTENCE_BATCH):
        batch = spans[first : first + _SENTENCE_BATCH]
        encoded = tokenizer([text[s:e] for s, e in batch], add_special_tokens=False, verbose=False)
        for span, ids in zip(batch, encoded["input_ids"], strict=True):
            yield span, len(ids)


def _sentence_chunks(text: str, config: ChunkingConfig, tokenizer: Any) -> list[Span]:
    chunks: list[Span] = []
    group: list[tuple[Span, int]] = []  # whole sentences of the chunk being filled
    for sentence, count in _counted_sentences(text, tokenizer):
        if count > config.size:  # too long on its own: cut it by tokens
            if group:
                chunks.append(_group_span(group))
            tokens = _token_spans(text, sentence[0], sentence[1], tokenizer)
            chunks.extend(_token_windows(tokens, config))
            group = []
            continue
        if group and sum(n for _, n in group) + count > config.size:
            chunks.append(_group_span(group))
            group = _overlap_tail(group, config.overlap, config.size - count)
        group.append((sentence, count))
    if group:
        chunks.append(_group_span(group))
    return chunks


def _overlap_tail(group: list[tuple[Span, int]], overlap: int, room: int) -> list[tuple[Span, int]]:
    """The trailing sentences worth at most `overlap` tokens that leave `room` for the next one.

    Never the whole group: the next chunk must move forward.
    """
    tail: list[tuple[Span, int]] = []
    total = 0
    for sentence, count in reversed(group[1:]):
        if total + count > min(overlap, room):
            break
        tail.insert(0, (sentence, count))
        total += count
    return tail


def _group_span(group: list[tuple[Span, int]]) -> Span:
    return group[0][0][0], group[-1][0][1]
