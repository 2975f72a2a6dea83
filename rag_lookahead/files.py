"""Files written whole or not at all, and work on a file done once across processes.

`atomic_file` / `atomic_write`: the bytes go to a temporary file in the same folder, are synced
to the disk, then renamed over the target, so a reader sees the old file or the new one, never
half of one, and a crash leaves at most a stray temporary file. `exclusive` (and `held`): a lock
file (``.NAME.lock`` beside the target, `filelock`) that lets the second of two processes wait
for the first to finish a slow piece of work (converting a model, measuring costs) and then read
its result instead of doing it again.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock, Timeout

__all__ = ["atomic_file", "atomic_write", "exclusive", "fsync_file", "held", "lock_beside", "scratch_dir"]


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
