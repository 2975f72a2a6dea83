"""Files written whole or not at all, and work on a file done once across processes.

`atomic_file` / `atomic_write`: the bytes go to a temporary file in the same folder, are synced
to the disk, then renamed over the target, so a reader sees the old file or the new one, never
half of one, and a crash leaves at most a stray temporary file. `exclusive` (and `held`): a lock
file (``.NAME.lock`` beside the target, `filelock`) that lets the second of two processes wait
for the first to finish a slow piece of work (converting a model, measuring costs) and then read
its result instead of doing it again.

`read_cache` / `keep_cache`: the JSON files a cache keeps (cost curves, kernel choices,
acceptance statistics). A file that cannot be used (not UTF-8, not JSON, nested past Python's
limit, not an object of the expected shape, a folder, under a file where its folder should be)
is a miss, with a warning naming it: the work is done again, never fatal. A folder that cannot
take a new file (no write permission, a file in its way) costs the next process that work, and
says so.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from filelock import FileLock, Timeout

__all__ = [
    "atomic_file",
    "atomic_write",
    "exclusive",
    "fsync_file",
    "held",
    "keep_cache",
    "lock_beside",
    "read_cache",
    "read_json_object",
    "scratch_dir",
]

T = TypeVar("T")
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_JSON_KINDS[type(None)] = "null"


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` when the block
    ends without an error (and is removed when it raises)."""
    target = Path(path)
    # Unique per writer, and created like any file the user writes (mkstemp's would be 0600).
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            # Without it a power cut after the rename can leave the new name on an empty file.
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, newlines as given) to ``path`` atomically."""
    with atomic_file(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


def scratch_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named folder in ``parent``, made like any folder the user makes (it follows
    the umask: ``tempfile.mkdtemp``'s is 0700, which would keep the group out of what is renamed
    from it)."""
    for _ in range(100):
        path = parent / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir(0o777)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free scratch folder name in {parent}")


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Push ``path``'s content to the disk (before a rename that makes it visible)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_beside(target: str | os.PathLike[str]) -> FileLock:
    """The inter-process lock of ``target``: the file ``.NAME.lock`` beside it (not inside it,
    since a directory may be replaced whole). Creates ``target``'s parent folder."""
    path = Path(os.path.abspath(target))
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path.with_name(f".{path.name}.lock"))


@contextmanager
def held(lock: FileLock, waiting: str | None = None) -> Iterator[None]:
    """Hold ``lock`` for the block; when another process holds it first, say ``waiting`` on
    standard error (if given) and wait for it."""
    _acquire(lock, waiting)
    try:
        yield
    finally:
        lock.release()


@contextmanager
def exclusive(target: str | os.PathLike[str], waiting: str | None = None) -> Iterator[None]:
    """Hold ``target``'s lock (`lock_beside`) for the block, as `held` does, where its folder
    allows one: in a read-only cache the block runs unlocked, as it would alone."""
    lock: FileLock | None
    try:
        lock = lock_beside(target)
        _acquire(lock, waiting)
    except OSError:
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _acquire(lock: FileLock, waiting: str | None) -> None:
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting is not None:
            print(waiting, file=sys.stderr, flush=True)
        lock.acquire()


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file at ``path``; ``None`` where there is no file.

    Raises:
        ValueError: Naming ``path``: it cannot be read (a folder, no permission, a file where a
            folder of its path should be), is not UTF-8 or JSON, is nested deeper than Python's
            parser recurses, or holds something other than an object.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is unreadable ({err})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:  # RecursionError: arrays nested thousands deep
        raise ValueError(f"{path} is not readable JSON ({str(err)[:200]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {_JSON_KINDS.get(type(data), 'a JSON value')}, not a JSON object")
    return data


def read_cache(path: Path, parse: Callable[[dict[str, Any]], T | None], again: str) -> T | None:
    """What ``parse`` makes of the cache file at ``path``: ``None`` where there is none, or
    where ``parse`` returns ``None`` (stale, for another key). A file that cannot be used
    (`read_json_object`'s errors, or a ``ValueError``, ``KeyError`` or ``TypeError`` of
    ``parse`` on a malformed object) is a miss too, with a warning naming it and saying
    ``again`` (``"measuring again"``): a cache is never fatal."""
    try:
        data = read_json_object(path)
    except ValueError as err:
        warnings.warn(f"rag-lookahead: {err}; {again}", UserWarning, stacklevel=2)
        return None
    if data is None:
        return None
    try:
        return parse(data)
    except (ValueError, KeyError, TypeError) as err:
        why = f"no field {err}" if isinstance(err, KeyError) else str(err)
        warnings.warn(f"rag-lookahead: {path} is malformed ({why}); {again}", UserWarning, stacklevel=2)
        return None


def keep_cache(path: Path, text: str, lost: str) -> None:
    """Write the cache file ``path`` (atomically, creating its folder). Where its folder cannot
    take it (no write permission, a file in the way), a warning names it and says what is
    ``lost`` (``"the next process measures again"``); nothing raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    except OSError as err:
        warnings.warn(f"rag-lookahead: cannot keep {path} ({err}); {lost}", UserWarning, stacklevel=2)
