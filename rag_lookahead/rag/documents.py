"""Reading a corpus from disk: ``.txt``, ``.md`` and ``.jsonl`` files, or folders of them.

Unreadable inputs (empty, binary content, not UTF-8, a broken JSON line, a record whose text
escapes a lone surrogate, a file whose name is not UTF-8, a FIFO, socket or device) are reported
as `Skipped` rather than raised, so one bad file or record never stops indexing a folder;
mistakes in what the caller named (a missing path, an unsupported file) raise, because they are
not about the data. Only regular files are opened, so a FIFO (even one named explicitly) never
blocks a run, and a device is never read without end. A text file with a NUL byte anywhere is
binary content; one that starts with a UTF-16 or UTF-32 byte-order mark is decoded as such,
every other one as UTF-8 (after a UTF-8 byte-order mark, if any).

A folder is read only within itself: a file or folder in it that is a symbolic link to somewhere
outside (another project, ``/etc/passwd``) is skipped with the reason, unless ``follow_symlinks``
is set, so pointing the index at a folder never puts files from elsewhere into the answers. Broken
links (and link loops) are listed as skipped, and so is a folder holding a rag-lookahead index
(an ``--out`` inside the folder it indexes), whose chunk file would otherwise be read as records.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUPPORTED_SUFFIXES", "Document", "Skipped", "load_documents", "printable"]

SUPPORTED_SUFFIXES = (".jsonl", ".md", ".txt")
# The same heuristic as git and grep: text files practically never hold a NUL byte. A .jsonl
# file is probed at its start only: a NUL later costs just its record (no JSON allows one raw).
_BINARY_PROBE = 8192
# Byte-order marks of the encodings read besides UTF-8; UTF-32's first (UTF-16 LE's is its prefix).
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# What a path that is no regular file is, by its mode (a link is followed first).
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
# What a rag-lookahead index directory (or a save's scratch copy of one) holds.
_INDEX_FILES = ("index.faiss", "chunks.jsonl")
# Half of a UTF-16 pair, alone: no Unicode text, so no encoder, tokenizer or hash takes it.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


@dataclass(frozen=True)
class Document:
    """One text to index.

    Attributes:
        source: The file path, or ``path#line`` (1-based) for a record of a ``.jsonl`` file.
        text: The text exactly as read (chunk offsets point into it).

    Raises:
        ValueError: Either is not a string, the source is empty, or either holds a lone
            surrogate (a JSON ``\\ud800`` escape, a file name not in UTF-8), which is no Unicode
            text: the error names the document, before anything is indexed.
    """

    source: str
    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"Document.source must be a non-empty string, got {self.source!r}")
        if not isinstance(self.text, str):
            raise ValueError(f"Document.text must be a string, got {type(self.text).__name__}")
        if found := _lone_surrogate(self.source):
            raise ValueError(f"Document.source {self.source!r} holds {found}; fix or drop it")
        if found := _lone_surrogate(self.text):
            raise ValueError(f"{self.source} holds {found}, which is no Unicode text; fix or drop it")


@dataclass(frozen=True)
class Skipped:
    """An input that was not indexed, and why (``"empty"``, ``"binary"``, ...)."""

    source: str
    reason: str

    def __post_init__(self) -> None:
        if not self.source or not self.reason:
            raise ValueError("Skipped needs a source and a reason")

    def __str__(self) -> str:
        """``source: reason``, printable (a file name that is not UTF-8 shows its bytes escaped)."""
        return printable(f"{self.source}: {self.reason}")


def load_documents(
    paths: Sequence[str | Path], *, text_field: str = "text", follow_symlinks: bool = False
) -> tuple[list[Document], list[Skipped]]:
    """Read documents from files and folders (recursively), in a deterministic order.

    Args:
        paths: Files or folders. Folders are walked in sorted order and only their ``.txt``,
            ``.md`` and ``.jsonl`` files are read; a file reached twice is read once.
        text_field: The key holding the text in each ``.jsonl`` record.
        follow_symlinks: Also read what links in a folder point to outside it: files, and
            folders (each entered once, so a link loop ends); otherwise they are skipped. Files
            named explicitly are always read.

    Returns:
        The documents, and the inputs that were skipped with their reasons.

    Raises:
        FileNotFoundError: A path does not exist.
        ValueError: A file named explicitly has an unsupported extension.
    """
    if isinstance(paths, (str, Path)):  # a lone path would otherwise be iterated by character
        paths = [paths]
    documents: list[Document] = []
    skipped: list[Skipped] = []
    seen: set[Path] = set()
    for found in _files(paths, follow_symlinks):
        if isinstance(found, Skipped):
            skipped.append(found)
            continue
        file, folder = found
        resolved = file.resolve()
        if folder is not None and not follow_symlinks and not resolved.is_relative_to(folder):
            skipped.append(_link_out(file, folder, resolved))
            continue
        if resolved in seen:
            continue
        seen.add(resolved)
        if _lone_surrogate(str(file)):  # os.fsdecode maps each undecodable byte to one
            skipped.append(Skipped(str(file), "its name is not UTF-8 (rename it)"))
            continue
        loaded, bad = _read_file(file, text_field)
        documents.extend(loaded)
        skipped.extend(bad)
    return documents, skipped


def _lone_surrogate(text: str) -> str | None:
    """Where `text` holds a lone surrogate, in words (``"a lone surrogate (U+D800 at character
    5)"``); ``None`` when it holds none."""
    found = None if text.isascii() else _SURROGATE.search(text)
    if found is None:
        return None
    return f"a lone surrogate (U+{ord(found.group()):04X} at character {found.start()})"


def printable(text: str) -> str:
    """`text` with every lone surrogate written as an escape, so that it can be printed: a byte
    of a file name that is not UTF-8 as ``\\xe9`` (the byte `os.fsdecode` mapped), another as
    ``\\ud800``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def is_supported(path: Path) -> bool:
    """Whether `load_documents` reads files with this name."""
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def _files(
    paths: Sequence[str | Path], follow_symlinks: bool
) -> Iterator[tuple[Path, Path | None] | Skipped]:
    """Each file to read, with the resolved folder it was found in (``None``: named explicitly),
    and what was skipped on the way."""
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {str(raw)!r}")
        if path.is_dir():
            folder = path.resolve()
            # Sorting full paths keeps the order stable across file systems and runs.
            for found in sorted(_walk(path, follow_symlinks), key=_path_of):
                yield found if isinstance(found, Skipped) else (found, folder)
        elif is_supported(path):
            not_regular = _not_regular(path)
            yield (path, None) if not_regular is None else not_regular
        else:
            raise ValueError(
                f"{str(raw)!r} has an unsupported extension {path.suffix!r}; "
                f"supported: {', '.join(SUPPORTED_SUFFIXES)}"
            )


def _walk(root: Path, follow_symlinks: bool) -> Iterator[Path | Skipped]:
    """The supported files under `root` (links to files included: `load_documents` checks where
    they lead), and the entries skipped on the way. A link to a folder inside `root` adds nothing
    (the folder is walked as itself); one to a folder outside is entered only with
    `follow_symlinks`, once per real folder. A FIFO, device or socket with a supported name is
    listed as skipped, unread (never opened)."""
    base = root.resolve()
    entered = {base}
    pending = [root]
    while pending:
        folder = pending.pop()
        if folder != root and all((folder / name).is_file() for name in _INDEX_FILES):
            yield Skipped(str(folder), "a rag-lookahead index (its chunks are not documents)")
            continue
        try:
            entries = list(os.scandir(folder))
        except OSError as err:
            yield Skipped(str(folder), f"unreadable folder ({err.strerror or err})")
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink() and not path.exists():  # exists() is False on a loop too
                if is_supported(path):
                    yield Skipped(str(path), f"a broken link, to {os.readlink(path)}")
            elif not entry.is_dir():
                if is_supported(path):
                    yield path if entry.is_file() else (_not_regular(path) or path)
            elif not entry.is_symlink():
                pending.append(path)
            elif (target := path.resolve()) not in entered and not target.is_relative_to(base):
                if follow_symlinks:
                    entered.add(target)
                    pending.append(path)
                else:
                    yield _link_out(path, base, target)


def _path_of(found: Path | Skipped) -> Path:
    return Path(found.source) if isinstance(found, Skipped) else found


def _link_out(path: Path, folder: Path, target: Path) -> Skipped:
    reason = f"a link out of {folder}, to {target} (read with follow_symlinks / --follow-symlinks)"
    return Skipped(str(path), reason)


def _not_regular(path: Path) -> Skipped | None:
    """`path` as skipped where it is no regular file (a link followed), by `os.stat` alone."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # opening it says why
    return None if stat.S_ISREG(mode) else Skipped(str(path), _kind(mode))


def _kind(mode: int) -> str:
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return f"not a regular file ({kind})"


def _read_bytes(path: Path) -> bytes | str:
    """The bytes of the regular file `path`, or why it was not read. Opened without blocking and
    checked once open, so that a FIFO put in its place since the walk cannot hang the run."""
    not_regular = _not_regular(path)
    if not_regular is not None:
        return not_regular.reason
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            return file.read() if stat.S_ISREG(mode) else _kind(mode)
    except OSError as err:  # no permission, a file that vanished since the walk, an I/O error
        return f"unreadable ({err.strerror or err})"


def _read_file(path: Path, text_field: str) -> tuple[list[Document], list[Skipped]]:
    source = str(path)
    data = _read_bytes(path)
    if isinstance(data, str):
        return [], [Skipped(source, data)]
    jsonl = path.suffix.lower() == ".jsonl"
    try:
        text = _decode(data, whole=not jsonl)
    except _NotText as err:
        return [], [Skipped(source, err.reason(0))]
    if jsonl:  # a file in UTF-16 or 32 as its UTF-8 bytes, whose lines are split as any
        return _read_jsonl(source, data if text is None else text.encode("utf-8"), text_field)
    if not text or not text.strip():
        return [], [Skipped(source, "empty")]
    return [Document(source, text)], []


def _read_jsonl(source: str, data: bytes, text_field: str) -> tuple[list[Document], list[Skipped]]:
    if not data.strip():
        return [], [Skipped(source, "empty")]
    documents: list[Document] = []
    skipped: list[Skipped] = []
    offset = 0
    # Lines are decoded one by one so a single bad record does not cost the whole file.
    for number, line in enumerate(data.split(b"\n"), start=1):
        line_source = f"{source}#{number}"
        line_offset, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue  # blank lines (a trailing newline, spacing) are not records
        try:
            text = _record_text(_utf8(line), text_field)
        except _NotText as err:
            skipped.append(Skipped(line_source, err.reason(line_offset)))
        except ValueError as err:
            skipped.append(Skipped(line_source, str(err)))
        else:
            documents.append(Document(line_source, text))
    return documents, skipped


def _record_text(line: str, text_field: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"invalid JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object but {type(record).__name__}")
    if text_field not in record:
        raise ValueError(f"no {text_field!r} field")
    text = record[text_field]
    if not isinstance(text, str):
        raise ValueError(f"field {text_field!r} is {type(text).__name__}, not a string")
    if not text.strip():
        raise ValueError("empty")
    if found := _lone_surrogate(text):  # a JSON escape (\\ud800) that no UTF-8 file could hold
        raise ValueError(f"field {text_field!r} holds {found}, which is no Unicode text")
    return text


class _NotText(Exception):
    def __init__(self, offset: int, what: str = "not UTF-8 (invalid byte") -> None:
        super().__init__(offset)
        self.offset, self.what = offset, what

    def reason(self, base: int) -> str:
        """The skip reason, with the offset counted from `base` bytes before the data."""
        return f"{self.what} at offset {base + self.offset})"


def _decode(data: bytes, *, whole: bool) -> str | None:
    """A file's text: by its UTF-16 or UTF-32 byte-order mark, else as UTF-8 where `whole`
    (``None`` otherwise: a .jsonl file's UTF-8 is decoded by line). Binary content (a NUL
    byte, in a .jsonl file's first block) and text that does not decode raise `_NotText`."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)  # the mark read and dropped
            except UnicodeDecodeError as err:
                raise _NotText(err.start, f"not {encoding.upper()} (invalid data") from None
    nul = data.find(b"\0", 0, None if whole else _BINARY_PROBE)
    if nul >= 0:
        raise _NotText(nul, "binary content (a NUL byte")
    return _utf8(data) if whole else None


def _utf8(data: bytes) -> str:
    # A byte-order mark (Windows editors like to add one) is not part of the text; decoding
    # after it by hand keeps error offsets counted in the file's bytes.
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise _NotText(skip + err.start) from None
