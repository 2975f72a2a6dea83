"""Tests on tiny random models and loopback stubs: sockets stay disabled (pytest-socket, see
the package's pytest options) except for a stub server's own loopback traffic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rag_lookahead.server.testing import StubServer, stub_server


@pytest.fixture
def stub(socket_enabled: None) -> Iterator[StubServer]:
    """A loopback stub of an OpenAI API (127.0.0.1 only)."""
    with stub_server() as server:
        yield server
