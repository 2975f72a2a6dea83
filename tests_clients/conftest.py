"""Set-up for the tests of real OpenAI clients against the local server (``make test-clients``,
not ``make test``): the OpenAI Agents SDK, instructor, lm-eval and LlamaIndex's
OpenAILikeEmbedding, each unmodified, talking HTTP to `rag-lookahead serve --backend local`'s
app on 127.0.0.1.

They live in a virtual environment of their own (the Agents SDK needs openai >= 3, which the
integrations' LlamaIndex client refuses); a test module whose client is not installed is
skipped with the reason. The servers serve the tiny random models: only the equality of each
client's answer with the in-process engine's matters here, not its quality.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# The Agents SDK exports traces to OpenAI unless told not to; the tests disable tracing too.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from collections.abc import Iterator

import pytest
import torch

from rag_lookahead import LookaheadEngine
from rag_lookahead.testing import packaged_template, tiny_tool_engine
from rag_lookahead.testing.local_server import LiveServer, served_engine, settled_server

# Tiny models gain nothing from threads, and spinning threads slow a loaded 2-core machine.
torch.set_num_threads(1)

from client_support import MODEL  # noqa: E402


@pytest.fixture(scope="session")
def engine() -> LookaheadEngine:
    """The tiny model with its one-character-a-token ASCII tokenizer (no tools)."""
    return served_engine()


@pytest.fixture(scope="session")
def live(engine: LookaheadEngine) -> Iterator[LiveServer]:
    with settled_server(engine, MODEL) as server:
        yield server


@pytest.fixture(scope="session")
def tool_engine() -> LookaheadEngine:
    """The tiny model under the default model's tool-calling template (SmolLM2's format)."""
    return tiny_tool_engine(packaged_template())


@pytest.fixture(scope="session")
def tool_live(tool_engine: LookaheadEngine) -> Iterator[LiveServer]:
    with settled_server(tool_engine, MODEL) as server:
        yield server
