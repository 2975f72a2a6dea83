"""A trie's file format: versioned JSON (never pickle), validated on the way in.

This module knows nodes, not tries: `TokenTrie.save` hands it the nodes in creation order, and
`TokenTrie.load` gets back the settings and attaches each validated node through its public
`restore_node`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any, BinaryIO

from rag_lookahead.drafting.trie_nodes import NO_OWNER, Node, is_int
from rag_lookahead.files import atomic_file

__all__ = ["FORMAT", "SETTINGS", "VERSION", "read_trie_file", "restore_nodes", "write_trie_file"]

FORMAT = "rag-lookahead-trie"
VERSION = 1
SETTINGS = ("max_query_length", "branch_length", "max_nodes")

Attach = Callable[[Node, int, dict[str, int]], Node]


def write_trie_file(
    path: str | os.PathLike[str], settings: Mapping[str, int], root: Node, nodes: Iterable[Node]
) -> None:
    """Write ``nodes`` (in creation order) below ``root``; a crash never leaves half a file."""
    ordered = list(nodes)
    index: dict[Node, int] = {node: i for i, node in enumerate(ordered)}
    index[root] = -1
    payload = {
        "format": FORMAT,
        "version": VERSION,
        **{key: settings[key] for key in SETTINGS},
        # Creation order with parent indices: parents precede children and ties replay exactly.
        "nodes": [[n.token, index[n.parent], n.counts] for n in ordered],  # type: ignore[index]
    }
    with atomic_file(path) as raw, _text_writer(path, raw) as handle:
        json.dump(payload, handle, separators=(",", ":"))


def read_trie_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Any]]:
    """The settings and node entries of a trie file; ValueError on a malformed or foreign one."""
    name = os.fspath(path)
    try:
        with _open_text(path, "r") as handle:
            payload = json.load(handle)
    except (ValueError, EOFError, gzip.BadGzipFile, RecursionError) as exc:
        raise ValueError(f"{name}: not a readable trie file ({type(exc).__name__})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{name}: not a {FORMAT} file")
    if payload.get("version") != VERSION:
        raise ValueError(f"{name}: unsupported trie version {payload.get('version')!r}, expected {VERSION}")
    nodes = payload.get("nodes")
    if not isinstance(nodes, list):
        raise ValueError(f"{name}: 'nodes' must be a list")
    return {key: payload.get(key) for key in SETTINGS}, nodes


def restore_nodes(entries: list[Any], root: Node, attach: Attach) -> None:
    """Validate each ``[token, parent_index, counts]`` entry and ``attach`` it, in order."""
    built: list[Node] = []
    for i, entry in enumerate(entries):
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError(f"trie node #{i}: expected [token, parent_index, counts]")
        token, parent_index, counts = entry
        if not (is_int(token) and token >= 0 and is_int(parent_index) and -1 <= parent_index < i):
            raise ValueError(f"trie node #{i}: bad token or parent index")
        parent = root if parent_index == -1 else built[parent_index]
        if token in parent.children or not isinstance(counts, dict) or not counts:
            raise ValueError(f"trie node #{i}: duplicate child or empty counts")
        for owner, count in counts.items():
            limit = count if parent is root else parent.counts.get(owner, 0)
            if owner == NO_OWNER or not (is_int(count) and 1 <= count <= limit):
                raise ValueError(f"trie node #{i}: count for {owner!r} must be 1..parent's count")
        built.append(attach(parent, token, counts))


def _open_text(path: str | os.PathLike[str], mode: str) -> IO[str]:
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


@contextmanager
def _text_writer(path: str | os.PathLike[str], raw: BinaryIO) -> Iterator[IO[str]]:
    """Text into ``raw`` (a temporary file, left open), compressed if ``path`` names a ``.gz`` file."""
    # The gzip header names ``path``, not the temporary file.
    gz = os.fspath(path).endswith(".gz")
    binary = gzip.GzipFile(filename=os.path.basename(path), mode="wb", fileobj=raw) if gz else raw
    text = io.TextIOWrapper(binary, encoding="utf-8")
    try:
        yield text
    finally:
        text.flush()
        text.detach()
        if gz:
            binary.close()
