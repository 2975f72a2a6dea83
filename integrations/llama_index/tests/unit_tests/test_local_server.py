"""`LookaheadLLM(engine=ServerEngine(..., kind="rag-lookahead"))`: a query engine moved to
`rag-lookahead serve` with one line keeps its drafts. Real HTTP on 127.0.0.1 with the tiny
model: the retrieved nodes reach the served call as a corpus, and the answer is the in-process
one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding

from llama_index.llms.rag_lookahead import LookaheadLLM, LookaheadQueryEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.remote import ServerEngine
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.testing import tiny_engine
from rag_lookahead.testing.local_server import LiveServer, ScopedCalls

# A server on 127.0.0.1 only: sockets stay off for every other host.
pytestmark = pytest.mark.allow_hosts(["127.0.0.1"])

MODEL = "tiny"
N = 16
TEXTS = ["The lighthouse stands on the north cliff.", "Its lamp was lit in 1850."]


def wide_engine() -> Any:
    """The tiny engine with room for LlamaIndex's prompt packing (the rotary model takes it)."""
    engine = tiny_engine()
    engine.model.config.max_position_embeddings = 4096
    return engine


@pytest.fixture
def served() -> Iterator[tuple[ScopedCalls, LiveServer]]:
    server = ScopedCalls(wide_engine())
    with LiveServer(create_app(server.engine, ServeSettings(model_name=MODEL))) as live:
        yield server, live


def ask(llm: LookaheadLLM) -> str:
    # One node: a mock embedding ties every node, and ties would order the prompt by chance.
    embed = MockEmbedding(embed_dim=8)
    index = VectorStoreIndex.from_documents([Document(text=" ".join(TEXTS))], embed_model=embed)
    engine = LookaheadQueryEngine.from_index(index, llm=llm, similarity_top_k=2)
    return str(engine.query("Where is the lighthouse?"))


def test_a_query_engine_on_the_server_keeps_its_drafts(served: tuple[ScopedCalls, LiveServer]) -> None:
    server, live = served
    expected = ask(LookaheadLLM(engine=wide_engine(), max_new_tokens=N))
    engine = ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0, context_window=4096)
    assert ask(LookaheadLLM(engine=engine, max_new_tokens=N)) == expected
    (scoped, _) = server.calls[-1]
    assert scoped == 1  # the retrieved node reached the served call, as a corpus
    # The query ended: its corpus left the server and the trie.
    assert server.engine.trie.owners() <= {OUTPUT_OWNER}
    assert live.server.config.app.state.lookahead.corpora.count == 0


def test_a_call_s_documents_travel_in_its_request(served: tuple[ScopedCalls, LiveServer]) -> None:
    server, live = served
    expected = LookaheadLLM(engine=tiny_engine(), max_new_tokens=N).complete("Lighthouse?", documents=TEXTS)
    llm = LookaheadLLM(
        engine=ServerEngine(live.base_url, MODEL, "rag-lookahead", max_retries=0), max_new_tokens=N
    )
    assert llm.complete("Lighthouse?", documents=TEXTS).text == expected.text
    assert server.calls[-1][0] == 0 and server.engine.trie.owners() <= {OUTPUT_OWNER}
