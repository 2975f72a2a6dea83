"""Splitting documents into chunks measured in the embedder's tokens, along their structure.

A markdown document is first cut into sections at its headings: no chunk straddles a heading,
and each chunk keeps the path of headings above it (``("textwrap", "textwrap.dedent")``), which
is indexed with its text and shown with its source; a heading with no text under it (a title, a
FAQ written as headings) is the text of its own chunk. Within a section (or a whole plain-text
document) whole blocks are packed first (paragraphs, lists, tables; fenced code blocks are never
cut unless one alone is longer than a chunk, then at its lines), then whole sentences, and a
sentence longer than a chunk is cut between tokens. Sentences are found by sentencex
(Wikimedia's rule-based splitter, in Rust: it knows "e.g." and "U.S." end no sentence, and that
a closing quote belongs to the sentence it closes); a blank line, a list item or a table row
also starts one. Not pysbd: its pure-Python rules alone take many times what all of chunking
takes with sentencex (benchmarks/sentence_splitter.py times chunking), and its wheel installs
top-level ``benchmarks`` and ``examples`` packages; not nupunkt (Punkt with its model in the
wheel): it needs Python 3.11; not NLTK's punkt: its model is a download.

Chunks are exact substrings of their document (``doc.text[start:end] == chunk.text``): token
boundaries come from the fast tokenizer's offset mapping, never from decoding ids, so what is
retrieved is what the document says, character for character. That is why this is not LangChain's
``MarkdownHeaderTextSplitter`` / ``RecursiveCharacterTextSplitter`` or LlamaIndex's
``MarkdownNodeParser``: they strip headings and rejoin lines, so their chunks are no longer slices
with offsets (and they would bring langchain-core or llama-index-core into the core package).
The markdown itself is parsed by markdown-it-py (CommonMark), which knows what is a heading and
what only looks like one (a ``#`` line inside a code fence, an indented block, a quote).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Literal

import sentencex

from rag_lookahead.rag.documents import Document

__all__ = ["LONG_LINE", "Chunk", "ChunkingConfig", "Splitter", "long_lines", "split_document"]

Unit = Literal["tokens", "sentences"]
Splitter = Literal["sentencex", "punctuation"]
Span = tuple[int, int]  # [start, end) character offsets

# Tokenizing a huge document in one call holds every offset at once; blocks keep memory flat.
_BLOCK_CHARS = 100_000
# The "punctuation" splitter (indexes saved before sentencex keep it): a sentence ends at . ! or ?
# (and any closing quotes or brackets, which fall between two sentences) before whitespace, or at
# a blank line.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n\s*\n")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# English abbreviations; the full stops of other scripts (CJK, Devanagari, ...) end sentences too.
_LANGUAGE = "en"
# sentencex looks back to the last space before every full stop, so a run without spaces (CJK text,
# a line of "a?b") costs the square of its length: a long block is split a window at a time.
_SPLIT_WINDOW = 4_096
# A sentence ending this close to a window's end may have been decided on a look-ahead the window
# cut short (sentencex reads 30 bytes ahead): it is found again from the next window.
_WINDOW_MARGIN = 128
# Inside a block, a list item or a table row also starts a new sentence.
_LINE_ITEM = re.compile(r"\n(?=[ \t]*(?:[-*+]|\d{1,9}[.)])[ \t]|[ \t]*\|)")
_BLANK_LINE = re.compile(r"\n[ \t]*(?:\r?\n|\r)|\r\n?[ \t]*\r\n?")
_NEWLINE = re.compile(r"\r\n?|\n")  # what markdown-it counts as a line break
MARKDOWN_SUFFIXES = (".md", ".markdown")
# Where a chunk may end, strongest first: between blocks, between sentences, between tokens.
_BLOCK, _SENTENCE, _TOKEN = 0, 1, 2
_SENTENCE_BATCH = 512
# Characters of a line past which it is no paragraph of prose (minified code, base64, a whole
# log on one line): with no sentence breaks it is cut by tokens into many chunks, slow to embed.
LONG_LINE = 100_000


@dataclass(frozen=True)
class ChunkingConfig:
    """How documents are cut.

    Attributes:
        size: Most tokens in a chunk.
        overlap: Tokens repeated from the end of one chunk at the start of the next, so a
            passage cut in two is still found whole in one of them.
        unit: ``"sentences"`` packs whole blocks, then whole sentences (repeating whole
            trailing sentences as the overlap when a chunk ends inside a block); ``"tokens"`` cuts
            anywhere between tokens. Either way no chunk straddles a markdown heading.
        splitter: How sentences are found: ``"sentencex"``, or ``"punctuation"`` (a sentence
            ends at every ``.``, ``!`` or ``?`` before whitespace, "e.g." included), the rule of
            indexes saved before sentencex, kept so that such an index grows by the same rule.
    """

    size: int = 200
    overlap: int = 40
    unit: Unit = "sentences"
    splitter: Splitter = "sentencex"

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
        if self.splitter not in ("sentencex", "punctuation"):
            raise ValueError(f"sentence splitter must be 'sentencex' or 'punctuation', got {self.splitter!r}")


@dataclass(frozen=True)
class Chunk:
    """A piece of a document, as indexed and retrieved.

    Attributes:
        id: A short hex hash of source, offsets and text: stable across runs and rebuilds.
        source: The document's source.
        text: ``document.text[start:end]``.
        start: Offset of the first character in the document text.
        end: Offset one past the last character.
        headings: The markdown headings the chunk is under, outermost first (empty for plain
            text and for text before a document's first heading).
    """

    id: str
    source: str
    text: str
    start: int
    end: int
    headings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"chunk offsets must satisfy 0 <= start <= end, got {self.start}, {self.end}")
        if len(self.text) != self.end - self.start:
            raise ValueError(
                f"chunk text has {len(self.text)} characters but its offsets span {self.end - self.start}"
            )
        if not isinstance(self.headings, tuple) or not all(isinstance(h, str) for h in self.headings):
            raise ValueError(f"chunk headings must be a tuple of strings, got {self.headings!r}")

    @staticmethod
    def make(source: str, text: str, start: int, end: int, headings: tuple[str, ...] = ()) -> Chunk:
        """A chunk with its id computed from the other fields."""
        return Chunk(chunk_id(source, text, start, end, headings), source, text, start, end, headings)

    @property
    def indexed_text(self) -> str:
        """What is embedded and counted for keywords: the heading path, then the text.

        A section's later chunks do not contain its heading, yet are about it.
        """
        return f"{' > '.join(self.headings)}\n{self.text}" if self.headings else self.text


def chunk_id(source: str, text: str, start: int, end: int, headings: tuple[str, ...] = ()) -> str:
    """The stable id of a chunk (16 hex digits of a SHA-256)."""
    path = "\0".join(headings)
    digest = hashlib.sha256(f"{source}\0{start}\0{end}\0{text}\0\0{path}".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class _Block:
    """A span of a section: prose (cut into sentences) or code (kept whole, else cut at lines)."""

    start: int
    end: int
    code: bool = False


@dataclass(frozen=True)
class _Section:
    headings: tuple[str, ...]
    blocks: tuple[_Block, ...]
    level: int = 0  # of the heading that opens it (0: the text before the first heading)
    heading: _Block | None = None  # the heading's own line(s)


@dataclass(frozen=True)
class _Atom:
    """A piece packed whole into chunks, and how strongly the text may be cut before it."""

    span: Span
    count: int
    cut: int  # _BLOCK, _SENTENCE or _TOKEN


def split_document(doc: Document, config: ChunkingConfig, tokenizer: Any) -> list[Chunk]:
    """Cut a document into chunks of at most ``config.size`` tokens of `tokenizer`.

    Args:
        doc: The document; one whose source ends in ``.md`` or ``.markdown`` is read as markdown.
            (It holds no lone surrogate, which neither sentencex nor a tokenizer takes:
            `Document` refuses one.)
        config: Chunk size, overlap and unit.
        tokenizer: A Hugging Face *fast* tokenizer (it must return offset mappings), normally
            the embedder's own, so a chunk's length is what the embedder will see.
    """
    text = doc.text
    sections = _markdown_sections(text) if is_markdown(doc.source) else [_plain_section(text)]
    chunks: list[Chunk] = []
    for section in sections:
        if not section.blocks:
            continue
        if config.unit == "tokens":
            body = _token_spans(text, section.blocks[0].start, section.blocks[-1].end, tokenizer)
            spans = list(_token_windows(body, config))
        else:
            spans = _pack(_atoms(text, section.blocks, config, tokenizer), text, config, tokenizer)
        chunks.extend(Chunk.make(doc.source, text[s:e], s, e, section.headings) for s, e in spans)
    return chunks


def long_lines(documents: Iterable[Document], limit: int = LONG_LINE) -> list[tuple[str, int]]:
    """The source of every document with a line longer than `limit` characters, and its length."""
    found = []
    for doc in documents:
        if len(doc.text) > limit:
            longest = max(map(len, _NEWLINE.split(doc.text)))
            if longest > limit:
                found.append((doc.source, longest))
    return found


def is_markdown(source: str) -> bool:
    """Whether a document of this source is split at its markdown headings."""
    return source.lower().endswith(MARKDOWN_SUFFIXES)


# ------------------------------------------------------------------------------- structure


@cache
def _parser() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table")


def _markdown_sections(text: str) -> list[_Section]:
    """The document cut at its top-level headings, each part with its heading path."""
    lines = _line_starts(text)
    sections: list[_Section] = []
    path: list[tuple[int, str]] = []  # (level, heading) of the open headings
    blocks: list[_Block] = []
    opened: tuple[int, _Block | None] = (0, None)  # level and lines of the current section's heading
    tokens = _parser().parse(text)
    for i, token in enumerate(tokens):
        if token.map is None or not _is_block(token):
            continue
        if token.type == "heading_open":
            sections.append(_Section(tuple(h for _, h in path if h), tuple(blocks), *opened))
            depth = int(token.tag[1:])
            path = [(level, h) for level, h in path if level < depth]
            path.append((depth, tokens[i + 1].content.strip()))
            blocks = []
            opened = (depth, _line_block(text, lines, token.map, code=False) if path[-1][1] else None)
            continue
        block = _line_block(text, lines, token.map, code=token.type in ("fence", "code_block"))
        if block is not None:
            blocks.append(block)
    sections.append(_Section(tuple(h for _, h in path if h), tuple(blocks), *opened))
    return _with_bare_headings(sections)


def _with_bare_headings(sections: list[_Section]) -> list[_Section]:
    """A heading with no text under it is its own section's text (a FAQ of headings, a title),
    else its words would be in no chunk; unless the next section is deeper and has text, whose
    chunks carry the heading in their path already."""
    kept: list[_Section] = []
    for section in reversed(sections):
        after = kept[-1] if kept else None
        covered = after is not None and after.level > section.level and bool(after.blocks)
        if not section.blocks and section.heading is not None and not covered:
            section = replace(section, blocks=(section.heading,))
        kept.append(section)
    return kept[::-1]


def _is_block(token: Any) -> bool:
    """Top-level blocks, except that a top-level list is cut into its items (level 1 holds
    nothing else: a list in a quote is one level deeper)."""
    if token.level == 0:
        return token.type not in ("bullet_list_open", "ordered_list_open")
    return token.level == 1 and token.type == "list_item_open"


def _line_starts(text: str) -> list[int]:
    """Offsets where each line starts, and one past the end (markdown-it's line numbers)."""
    return [0, *(m.end() for m in _NEWLINE.finditer(text)), len(text) + 1]


def _line_block(text: str, lines: list[int], line_map: list[int], code: bool) -> _Block | None:
    first, last = line_map
    start, end = lines[first], min(lines[min(last, len(lines) - 1)], len(text))
    spans = list(_stripped(text, start, end))
    return _Block(spans[0][0], spans[0][1], code) if spans else None


def _plain_section(text: str) -> _Section:
    """Plain text: its paragraphs (blank-line separated) are the blocks."""
    blocks: list[_Block] = []
    start = 0
    for match in _BLANK_LINE.finditer(text):
        blocks.extend(_Block(s, e) for s, e in _stripped(text, start, match.start()))
        start = match.end()
    blocks.extend(_Block(s, e) for s, e in _stripped(text, start, len(text)))
    return _Section((), tuple(blocks))


# --------------------------------------------------------------------------------- packing


def _atoms(text: str, blocks: tuple[_Block, ...], config: ChunkingConfig, tokenizer: Any) -> list[_Atom]:
    """The section as pieces to pack: sentences, whole code blocks (or their lines)."""
    pieces = [(block, list(_pieces(text, block, config.splitter))) for block in blocks]
    counts = iter(_count(text, [span for _, spans in pieces for span in spans], tokenizer, config.size))
    atoms: list[_Atom] = []
    for block, spans in pieces:
        counted = [(span, next(counts)) for span in spans]
        whole = sum(n for _, n in counted)
        if block.code and whole <= config.size:
            atoms.append(_Atom((block.start, block.end), whole, _BLOCK))
            continue
        for i, (span, count) in enumerate(counted):
            atoms.append(_Atom(span, count, _BLOCK if i == 0 else _SENTENCE))
    return atoms


def _pieces(text: str, block: _Block, splitter: Splitter) -> Iterator[Span]:
    return _lines(text, block) if block.code else _sentences(text, block.start, block.end, splitter)


def _pack(atoms: list[_Atom], text: str, config: ChunkingConfig, tokenizer: Any) -> list[Span]:
    """Greedy packing. When a piece does not fit, the chunk ends before it if it starts a block,
    else at the last block boundary that leaves the chunk at least half full, else before it
    after all; then the next chunk repeats trailing sentences of the block that was cut."""
    chunks: list[Span] = []
    group: list[_Atom] = []
    for atom in atoms:
        if atom.count > config.size:  # too long on its own: cut it by tokens
            if group:
                chunks.append(_group_span(group))
            tokens = _token_spans(text, atom.span[0], atom.span[1], tokenizer)
            chunks.extend(_token_windows(tokens, config))
            group = []
            continue
        while group and sum(a.count for a in group) + atom.count > config.size:
            keep = len(group) if atom.cut == _BLOCK else _cut(group, config.size)
            chunks.append(_group_span(group[:keep]))
            if keep < len(group):
                group = group[keep:]
            elif atom.cut == _BLOCK:
                group = []
            else:
                group = _overlap_tail(group, config.overlap, config.size - atom.count)
        group.append(atom)
    if group:
        chunks.append(_group_span(group))
    return chunks


def _cut(group: list[_Atom], size: int) -> int:
    """How many of `group`'s pieces the chunk takes: up to its last block boundary past half."""
    total = 0
    best = len(group)
    for i, atom in enumerate(group):
        if i and atom.cut == _BLOCK and total >= size // 2:
            best = i
        total += atom.count
    return best


def _overlap_tail(group: list[_Atom], overlap: int, room: int) -> list[_Atom]:
    """The trailing pieces worth at most `overlap` tokens that leave `room` for the next one,
    never reaching back past the block's start (nor the whole group: the next chunk must move on)."""
    tail: list[_Atom] = []
    total = 0
    for atom in reversed(group[1:]):
        if total + atom.count > min(overlap, room):
            break
        tail.insert(0, atom)
        total += atom.count
        if atom.cut == _BLOCK:
            break
    return tail


def _group_span(group: list[_Atom]) -> Span:
    return group[0].span[0], group[-1].span[1]


# ----------------------------------------------------------------------- sentences, tokens


def _sentences(text: str, start: int, end: int, splitter: Splitter) -> Iterator[Span]:
    """Sentence spans of ``text[start:end]``, with surrounding whitespace left out."""
    piece = text[start:end]
    if splitter == "punctuation":
        cuts = [(m.start(), m.end()) for m in _SENTENCE_END.finditer(piece)]
    else:
        cuts = [(end, end) for end in _sentence_ends(piece)]
        cuts += [(m.start(), m.end()) for m in _PARAGRAPH_BREAK.finditer(piece)]
    at = 0
    for stop, resume in sorted(cuts + [(m.start(), m.end()) for m in _LINE_ITEM.finditer(piece)]):
        if stop < at:
            continue
        yield from _stripped(text, start + at, start + stop)
        at = resume
    yield from _stripped(text, start + at, end)


def _sentence_ends(piece: str) -> Iterator[int]:
    """Where sentencex ends the sentences of `piece` (offsets, the last one's end left out), a
    window at a time: each window starts where the last sentence the previous one ended whole did."""
    at = 0
    while len(piece) - at > _SPLIT_WINDOW:
        window = piece[at : at + _SPLIT_WINDOW]
        ends = [end for end in _sentencex_ends(window) if end <= _SPLIT_WINDOW - _WINDOW_MARGIN]
        if not ends:  # one sentence of thousands of characters: cut it before a space if it has one
            last = _SPLIT_WINDOW - _WINDOW_MARGIN
            space = max(window.rfind(" ", 1, last), window.rfind("\n", 1, last))
            ends = [space if space > 0 else last]
        yield from (at + end for end in ends)
        at += ends[-1]
    yield from (at + end for end in _sentencex_ends(piece[at:]))


def _sentencex_ends(piece: str) -> list[int]:
    sentences = sentencex.get_sentence_boundaries(_LANGUAGE, piece)
    return [sentence["end_index"] for sentence in sentences[:-1]]


def _lines(text: str, block: _Block) -> Iterator[Span]:
    at = block.start
    for match in _NEWLINE.finditer(text, block.start, block.end):
        yield from _stripped(text, at, match.start())
        at = match.end()
    yield from _stripped(text, at, block.end)


def _count(text: str, spans: list[Span], tokenizer: Any, size: int) -> Iterator[int]:
    """Token counts of `spans`, or for a span longer than a block, of its first block when that
    alone is over `size`: all such a count decides is that the span is cut by tokens, so a line of
    megabytes is not tokenized once more just to learn that."""
    heads = [next(_blocks(text, start, end)) for start, end in spans]
    for span, head, count in zip(spans, heads, _batch_count(text, heads, tokenizer), strict=True):
        if head != span and count <= size:
            count = sum(_batch_count(text, list(_blocks(text, *span)), tokenizer))
        yield count


def _batch_count(text: str, spans: list[Span], tokenizer: Any) -> Iterator[int]:
    """Token counts of `spans`, tokenized in batches (one call per sentence is slow)."""
    for first in range(0, len(spans), _SENTENCE_BATCH):
        batch = spans[first : first + _SENTENCE_BATCH]
        encoded = tokenizer([text[s:e] for s, e in batch], add_special_tokens=False, verbose=False)
        yield from (len(ids) for ids in encoded["input_ids"])


def _stripped(text: str, start: int, end: int) -> Iterator[Span]:
    piece = text[start:end]
    left = len(piece) - len(piece.lstrip())
    right = len(piece.rstrip())
    if right > left:
        yield start + left, start + right


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
