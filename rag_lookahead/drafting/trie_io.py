"""A trie's file format: versioned JSON (never pickle), validated on the way in.

This module knows nodes, not tries: `TokenTrie.save` hands it the nodes in creation order, and
`TokenTrie.load` gets back the settings and attaches each validated node through its public
`restore_node`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from rag_lookahead.drafting.trie_nodes import NO_OWNER, Node, is_int

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
    tmp = f"{os.fspath(path)}.tmp"
    try:
        with _open_text(path, "w", tmp) as handle:
            json.dump(payload, handle, separators=(",", ":"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


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


def _open_text(path: str | os.PathLike[str], mode: str, actual: str | None = None) -> IO[str]:
    # ``path`` picks the compression; ``actual`` (a temporary file) is what gets opened.
    where = os.fspath(path) if actual is None else actual
    if os.fspath(path).endswith(".gz"):
        return gzip.open(where, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(where, mode, encoding="utf-8")
