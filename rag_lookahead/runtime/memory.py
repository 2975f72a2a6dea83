"""Memory a long-lived CPU engine keeps once it has touched it.

A forward allocates its activations, and the batch its caches, afresh and frees them again,
thousands of times a minute. With glibc's defaults much of that goes back to the kernel each
time: a block past the mapping threshold (128 KiB at first) is mapped and unmapped apart, the
top of a heap is trimmed, and every thread allocates from arenas of its own, whose heaps (64 MiB
at most) are unmapped when they empty. Each block that comes back faults its pages in anew; in
a virtual machine that reports free pages to its host, the host must map them again too, and
while it does the core waits (the guest counts it as stolen time). The same forward then costs
more one time than the next, by what it had to fault in.

`retain_freed_memory` has glibc keep what the process frees, as tcmalloc and jemalloc do (vLLM
preloads tcmalloc on CPUs for this): one arena for every thread, blocks up to 32 MiB from the
heap, a free top of the heap kept up to 2 GiB. `reserve_heap` then grows the heap once to the
working set a server will need (`working_set_bytes`), so that its first requests do not pay
for the faults either. Both are process-wide and leave every result unchanged; a process that
should hand memory back between bursts does not call them. The command line's ``serve``
calls them on CPU; an application embedding the engine in a long-lived process may too.
Every engine's runner on a CPU makes the one change that needs no such choice
(`large_blocks_expected`): the first long prompt does not map its activations apart.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "kv_bytes_per_token",
    "large_blocks_expected",
    "reserve_heap",
    "retain_freed_memory",
    "working_set_bytes",
]

# mallopt's options (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_MAPPED_APART = 32 << 20  # glibc's own ceiling for its moving threshold on 64-bit (older ones refuse more)
_KEPT_TOP = (1 << 31) - 1  # mallopt takes an int
_PIECE = 16 << 20  # the reserve is touched in blocks under the mapping threshold (heap blocks)
# A row of the batch: a RAG prompt of a few retrieved passages and its answer.
ROW_TOKENS = 2048


# Under the defaults, glibc raises its mapping threshold to a freed mapped block's size, up to
# `_MAPPED_APART`: one block just under that, freed, raises it all the way.
_LARGE_BLOCK = _MAPPED_APART - 2**16


@functools.cache
def large_blocks_expected() -> None:
    """Tells the C allocator, once per process, that blocks of megabytes are common here
    (every engine's runner on a CPU does, retained or not).

    glibc's malloc serves every block above a threshold (128 KiB at first) by a fresh mmap,
    each page faulted on first touch and returned at free, until a freed block that large
    raises the threshold: the first long prompt's forward pays that for each of its
    activations (on a VM, seconds of a first long prefill; `benchmarks/README.md`, *The
    first long prompt*). One block freed now does what that prompt would have; under another
    allocator, or after `retain_freed_memory` fixed the threshold, it is one allocation,
    nothing more."""
    block = torch.empty(_LARGE_BLOCK, dtype=torch.uint8)  # never touched: no page is faulted
    del block


def _glibc() -> Any | None:
    """The process's C library where it is glibc (Linux), else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    except (AttributeError, OSError):  # musl and other C libraries: no such functions
        return None
    return libc


def retain_freed_memory() -> bool:
    """Have glibc keep freed memory in the process (see the module's docstring); whether it
    took every setting (``False`` off glibc; a setting refused leaves the others made). Call it
    before the engine's threads start (before loading a model): a thread keeps the arena it
    first allocated from."""
    libc = _glibc()
    if libc is None:
        return False
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, _MAPPED_APART), (_M_TRIM_THRESHOLD, _KEPT_TOP))
    taken = [libc.mallopt(option, value) == 1 for option, value in settings]  # each tried
    return all(taken)


def reserve_heap(nbytes: int) -> int:
    """Grow the heap by ``nbytes`` (at most 2 GiB, and at most half the memory the machine has
    available), its pages touched, and free it for the process to reuse; the bytes reserved (0 off
    glibc). Only after `retain_freed_memory`, which keeps the freed reserve: without it the
    reserve goes back to the kernel at once."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
    libc = _glibc()
    nbytes = min(nbytes, _KEPT_TOP, _available_bytes() // 2)
    if libc is None or nbytes == 0:
        return 0
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    blocks = []
    try:
        for _ in range(nbytes // _PIECE):
            block = libc.malloc(_PIECE)
            if not block:  # out of memory: keep what was reserved
                break
            ctypes.memset(block, 0, _PIECE)
            blocks.append(block)
    finally:
        for block in reversed(blocks):  # the last first: they merge into the heap's top
            libc.free(block)
    return len(blocks) * _PIECE


def _available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The memory the machine can hand out without swapping: Linux's ``MemAvailable`` (free
    pages and the page cache it can drop, such as the model files just read), else the free
    pages alone."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            fields = value.split()
            if name == "MemAvailable" and fields[1:] == ["kB"]:
                return int(fields[0]) << 10
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def kv_bytes_per_token(model: Any) -> int:
    """The bytes of keys and values one token adds to ``model``'s cache (0 where its config
    does not say)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(layers, int) or not isinstance(heads, int) or heads <= 0:
        return 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
    itemsize = getattr(getattr(model, "dtype", None), "itemsize", 4)
    return 2 * layers * int(kv_heads) * int(head_dim) * int(itemsize)


def working_set_bytes(model: Any, rows: int, prefix_cache_bytes: int) -> int:
    """What a server of ``rows`` running calls over ``model`` keeps in memory besides its
    weights, as `reserve_heap` reserves it: every row's keys and values over `ROW_TOKENS`
    tokens, and the prefix cache's budget."""
    return rows * ROW_TOKENS * kv_bytes_per_token(model) + prefix_cache_bytes
