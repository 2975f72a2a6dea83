"""Saving and loading a `TokenTrie`: versioned JSON, never pickle, validated on the way in."""

from __future__ import annotations

import gzip
import json
import os
from typing import IO, Any

from rag_lookahead.drafting.trie import TokenTrie
from rag_lookahead.drafting.trie_nodes import NO_OWNER, Node, collector_paused, is_int

__all__ = ["FORMAT", "VERSION", "load_trie", "save_trie"]

FORMAT = "rag-lookahead-trie"
VERSION = 1


def save_trie(trie: TokenTrie, path: str | os.PathLike[str]) -> None:
    """Write ``trie`` to ``path`` (gzip when it ends with .gz); a crash never leaves half a file."""
    nodes = sorted(trie._iter_nodes(), key=lambda node: node.order)
    index: dict[Node, int] = {node: i for i, node in enumerate(nodes)}
    index[trie.root] = -1
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "max_query_length": trie.max_query_length,
        "branch_length": trie.branch_length,
        "max_nodes": trie.max_nodes,
        # Creation order with parent indices: parents precede children and ties replay exactly.
        "nodes": [[n.token, index[n.parent], n.counts] for n in nodes],  # type: ignore[index]
    }
    tmp = f"{os.fspath(path)}.tmp"
    try:
        with _open_text(path, "w", tmp) as handle:
            json.dump(payload, handle, separators=(",", ":"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_trie(path: str | os.PathLike[str]) -> TokenTrie:
    """Read a trie written by `save_trie`; ValueError on a malformed or foreign file."""
    name = os.fspath(path)
    try:
        with _open_text(path, "r") as handle:
            payload = json.load(handle)
    except (ValueError, EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(f"{name}: not a readable trie file ({exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{name}: not a {FORMAT} file")
    if payload.get("version") != VERSION:
        raise ValueError(f"{name}: unsupported trie version {payload.get('version')!r}, expected {VERSION}")
    params = [payload.get(key) for key in ("max_query_length", "branch_length", "max_nodes")]
    trie = TokenTrie(*params)  # type: ignore[arg-type]  # the constructor validates them
    nodes = payload.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > trie.max_nodes:
        raise ValueError(f"{name}: 'nodes' must be a list of at most max_nodes entries")
    built: list[Node] = []
    with collector_paused():
        for i, entry in enumerate(nodes):
            built.append(_restore(trie, i, entry, built))
    return trie


def _restore(trie: TokenTrie, i: int, entry: Any, built: list[Node]) -> Node:
    if not (isinstance(entry, list) and len(entry) == 3):
        raise ValueError(f"trie node #{i}: expected [token, parent_index, counts]")
    token, parent_index, counts = entry
    if not (is_int(token) and is_int(parent_index) and -1 <= parent_index < i):
        raise ValueError(f"trie node #{i}: bad token or parent index")
    parent = trie.root if parent_index == -1 else built[parent_index]
    if token in parent.children or not isinstance(counts, dict) or not counts:
        raise ValueError(f"trie node #{i}: duplicate child or empty counts")
    for owner, count in counts.items():
        limit = count if parent is trie.root else parent.counts.get(owner, 0)
        if owner == NO_OWNER or not (is_int(count) and 1 <= count <= limit):
            raise ValueError(f"trie node #{i}: count for {owner!r} must be 1..parent's count")
    return trie._restore_node(parent, token, counts)


def _open_text(path: str | os.PathLike[str], mode: str, actual: str | None = None) -> IO[str]:
    # ``path`` picks the compression; ``actual`` (a temporary file) is what gets opened.
    where = os.fspath(path) if actual is None else actual
    if os.fspath(path).endswith(".gz"):
        return gzip.open(where, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(where, mode, encoding="utf-8")
