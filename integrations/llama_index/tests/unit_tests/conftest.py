"""Tests on tiny random models and loopback stubs: sockets stay disabled (pytest-socket, see
the package's pytest options) except for a stub server's own loopback traffic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.testing import tiny_engine
from rag_lookahead.testing.stub_server import StubServer, stub_server


@pytest.fixture
def stub(socket_enabled: None) -> Iterator[StubServer]:
    """A loopback stub of an OpenAI API (127.0.0.1 only)."""
    with stub_server() as server:
        yield server


@pytest.fixture
def engine() -> LookaheadEngine:
    """A tiny random engine (one per test: its trie learns from the test's calls)."""
    return tiny_engine()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread while the test runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
