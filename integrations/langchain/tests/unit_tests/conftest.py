"""Fixtures over the tiny model: no weights are loaded from disk."""

from collections.abc import Iterator

import pytest
import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.testing import tiny_engine


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # A tiny model's forwards are too small to split; a second thread only adds contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def engine() -> LookaheadEngine:
    return tiny_engine()
