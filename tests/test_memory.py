"""The memory a long-lived CPU engine keeps (`rag_lookahead.runtime.memory`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rag_lookahead.runtime import memory
from rag_lookahead.testing import save_tiny_model
from rag_lookahead.testing.models import tiny_model

GLIBC = memory._glibc() is not None

# In a fresh interpreter: with or without retention (and a reserve), how many pages an 8 MiB
# block allocated after a free faults in. Without, glibc maps it apart (past 128 KiB) and
# every page faults; with, it comes from the reserve, whose pages were touched already.
_FAULTS = textwrap.dedent(
    """
    import ctypes, resource, sys
    from rag_lookahead.runtime.memory import reserve_heap, retain_freed_memory
    if sys.argv[1] == "retain":
        assert retain_freed_memory()
        assert reserve_heap(64 << 20) == 64 << 20
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    size = 8 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(way: str) -> int:
    done = subprocess.run([sys.executable, "-c", _FAULTS, way], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_a_retained_reserve_serves_later_blocks_without_faults() -> None:
    pages = (8 << 20) // 4096
    assert _faults("default") >= pages // 2
    assert _faults("retain") < pages // 20


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_the_reserve_leaves_half_the_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_available_bytes", lambda: 3 * memory._PIECE)
    assert memory.reserve_heap(1 << 30) == memory._PIECE  # half of three pieces: one whole piece


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable: 60 kB\nCached: 50 kB\n", 60 << 10),
        ("MemTotal: 100 kB\nMemFree: 10 kB\n", None),  # an old kernel: the free pages
        ("MemAvailable: lots\n", None),
        ("MemAvailable: 60 MB\n", None),
    ],
)
def test_available_memory_counts_the_page_cache_it_can_drop(
    text: str, expected: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine that just read a model's files holds them in its page cache: available,
    though not free. Where /proc/meminfo does not say (or is not there), the free pages."""
    pages = {"SC_AVPHYS_PAGES": 7, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(memory.os, "sysconf", pages.__getitem__)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(text)
    assert memory._available_bytes(meminfo) == (7 * 4096 if expected is None else expected)
    assert memory._available_bytes(tmp_path / "missing") == 7 * 4096


def test_a_refused_setting_leaves_the_others_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older glibc refusing one option (the mapping threshold past its ceiling) still
    takes the rest; retention says it is not complete."""
    made: list[int] = []

    class Libc:
        def mallopt(self, option: int, value: int) -> int:
            made.append(option)
            return 0 if option == memory._M_MMAP_THRESHOLD else 1

    monkeypatch.setattr(memory, "_glibc", lambda: Libc())
    assert memory.retain_freed_memory() is False
    assert made == [memory._M_ARENA_MAX, memory._M_MMAP_THRESHOLD, memory._M_TRIM_THRESHOLD]


def test_off_glibc_nothing_is_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory.retain_freed_memory() is False
    assert memory.reserve_heap(1 << 20) == 0


@pytest.mark.parametrize("nbytes", [-1, True, 1.5, "1"])
def test_reserve_refuses_what_is_no_size(nbytes: Any) -> None:
    with pytest.raises(ValueError, match="nbytes must be an integer >= 0"):
        memory.reserve_heap(nbytes)


def test_working_set_counts_every_row_and_the_prefix_cache() -> None:
    model = tiny_model("llama")
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4  # fp32
    assert memory.kv_bytes_per_token(model) == per_token
    assert memory.working_set_bytes(model, 3, 1000) == 3 * memory.ROW_TOKENS * per_token + 1000
    assert memory.kv_bytes_per_token(object()) == 0  # no config: nothing to count


def test_the_local_server_retains_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_lookahead import LookaheadEngine, cli
    from rag_lookahead.serve import run

    steps: list[str] = []
    load = LookaheadEngine.from_pretrained

    def loading(*args: Any, **kwargs: Any) -> LookaheadEngine:
        steps.append("load")
        return load(*args, **kwargs)

    monkeypatch.setattr(memory, "retain_freed_memory", lambda: steps.append("retain") or True)
    monkeypatch.setattr(memory, "reserve_heap", lambda nbytes: steps.append(f"reserve {nbytes}") or nbytes)
    monkeypatch.setattr(LookaheadEngine, "from_pretrained", staticmethod(loading))
    monkeypatch.setattr(run, "run_app", lambda app, host, port: app.build_now())  # no server
    model = str(save_tiny_model(tmp_path / "model"))
    assert cli.main(["serve", "--backend", "local", "--model", model, "--max-running", "2"]) == 0
    expected = memory.working_set_bytes(tiny_model("llama"), 2, 256 << 20)
    assert steps == ["retain", "load", f"reserve {expected}"]
