"""``cpu_linear="auto"``'s choice kept on disk, so that the processes of one machine run on the
same kernels (`rag_lookahead.tuning.kernel_choice` makes it).

Timed anew in each process, the choice can differ between two kernels a few percent apart, and
a busy moment at the start can tip it to one far slower for the rest of the process's life: the
processes of one machine then decode at different speeds. A choice made on a quiet machine is
kept (versioned JSON beside the cost curves, `rag_lookahead.planning.costs`) for a month, one
made while other work shared the cores for an hour only, as a cost curve measured then is; its
key names everything the timing depended on. The file holds kernel names only: files written
before the reordered kernel had its name call it ``packed``, read as ``reordered``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_lookahead.files import exclusive, keep_cache, read_cache
from rag_lookahead.planning.costs import LOADED_MAX_AGE_SECONDS, MAX_AGE_SECONDS

__all__ = ["Classes", "cached_classes"]

FORMAT = "rag-lookahead-kernels"
VERSION = 1
# The kernels' names in a file, the reordered kernel's earlier name among them.
_NAMES = {"torch": "torch", "onednn": "onednn", "reordered": "reordered", "packed": "reordered"}

# Each class of forwards by its least tokens, and its kernel, ascending from 1.
Classes = tuple[tuple[int, str], ...]


def cached_classes(
    directory: Path, key: dict[str, Any], choose: Callable[[], tuple[Classes, bool]]
) -> tuple[Classes, bool]:
    """The classes stored for ``key`` under ``directory``, else ``choose()``'s (the classes,
    and whether other work shared the cores meanwhile), stored; and whether they were read
    back (rather than chosen now). One process chooses while another waits for its choice: two
    timing at once would slow each other's kernels. ``key["packed"]`` says whether the
    reordered kernel may be among them (the key's name since its first version)."""
    path = _path(directory, key)
    classes = _read(path, key)
    if classes is not None:
        return classes, True
    with contextlib.suppress(OSError):  # a read-only cache: chosen in each process
        directory.mkdir(parents=True, exist_ok=True)
    with exclusive(path):
        classes = _read(path, key)
        if classes is not None:  # chosen by another process meanwhile
            return classes, True
        classes, loaded = choose()
        _write(path, key, classes, loaded)
    return classes, False


def _path(directory: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return directory / f"kernels-v{VERSION}-{digest}.json"


def _read(path: Path, key: dict[str, Any]) -> Classes | None:
    """The classes at ``path`` if they are for ``key`` and fresh; a malformed file is a miss,
    with a warning naming it (`read_cache`)."""
    return read_cache(path, lambda data: _classes(data, key), "choosing the kernels again")


def _classes(data: dict[str, Any], key: dict[str, Any]) -> Classes | None:
    """``data``'s classes; ``None`` where they are for another key or stale."""
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} file of version {VERSION}")
    loaded = data.get("loaded")
    if not isinstance(loaded, bool):
        raise ValueError("'loaded' is not true or false")
    age = time.time() - float(data["chosen_at"])
    if data.get("key") != key or not 0 <= age < (LOADED_MAX_AGE_SECONDS if loaded else MAX_AGE_SECONDS):
        return None
    named = tuple((int(least), str(kernel)) for least, kernel in data["classes"])
    leasts = [least for least, _ in named]
    if not named or leasts[0] != 1 or leasts != sorted(set(leasts)):
        raise ValueError("the classes do not ascend from one token")
    if any(kernel not in _NAMES for _, kernel in named):
        raise ValueError("a class names a kernel that does not exist")
    classes = tuple((least, _NAMES[kernel]) for least, kernel in named)
    if any(kernel == "reordered" and not key.get("packed") for _, kernel in classes):
        raise ValueError("a class names a kernel this model cannot run")
    return classes


def _write(path: Path, key: dict[str, Any], classes: Classes, loaded: bool) -> None:
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "key": key,
        "chosen_at": time.time(),
        "loaded": loaded,
        "classes": [list(entry) for entry in classes],
    }
    keep_cache(path, json.dumps(payload, indent=1), "the next process chooses the kernels again")
