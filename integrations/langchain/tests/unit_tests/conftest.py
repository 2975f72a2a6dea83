"""Fixtures over the tiny model: no weights are loaded from disk."""

import pytest
from rag_lookahead import LookaheadEngine

from tests.unit_tests.tiny import tiny_engine


@pytest.fixture
def engine() -> LookaheadEngine:
    return tiny_engine()
