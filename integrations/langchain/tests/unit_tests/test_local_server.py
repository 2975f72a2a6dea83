"""`ChatLookahead(base_url=..., server_kind="rag-lookahead")`: a chain moved to `rag-lookahead
serve` with one line keeps its drafts. Real HTTP on 127.0.0.1 with the tiny model: the run's
retrieved documents reach the served call as a corpus, and the answer is the in-process one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from langchain_rag_lookahead import ChatLookahead, LookaheadCallbackHandler
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.serve import ServeSettings, create_app
from rag_lookahead.testing import tiny_engine
from rag_lookahead.testing.local_server import LiveServer, ScopedCalls
from tests.chains import QUESTION, N, answer_and_documents, rag_chain

MODEL = "tiny"


@pytest.fixture
def served() -> Iterator[tuple[ScopedCalls, LiveServer]]:
    server = ScopedCalls(tiny_engine())
    with LiveServer(create_app(server.engine, ServeSettings(model_name=MODEL))) as live:
        yield server, live


@pytest.mark.enable_socket
def test_a_chain_on_the_server_keeps_its_drafts(served: tuple[ScopedCalls, LiveServer]) -> None:
    server, live = served
    reference, documents = answer_and_documents(server.engine)
    in_process = rag_chain(ChatLookahead(engine=tiny_engine(), max_tokens=N), documents)
    assert in_process.invoke(QUESTION, config={"callbacks": [LookaheadCallbackHandler()]}) == reference

    llm = ChatLookahead(base_url=live.base_url, model=MODEL, server_kind="rag-lookahead", max_tokens=N)
    assert llm.get_engine().drafts_from_documents
    handler = LookaheadCallbackHandler()
    assert rag_chain(llm, documents).invoke(QUESTION, config={"callbacks": [handler]}) == reference
    (scoped, stream) = server.calls[-1]
    assert scoped == 2  # the run's documents reached the served call, as a corpus
    assert stream.stats.steps < stream.stats.new_tokens  # and its drafts were accepted
    # The run ended: its corpus left the server and the trie.
    assert handler.active_runs == 0
    assert server.engine.trie.owners() <= {OUTPUT_OWNER}
    assert live.server.config.app.state.lookahead.corpora.count == 0


def test_the_default_kind_is_unchanged() -> None:
    llm = ChatLookahead(base_url="http://127.0.0.1:9/v1", model=MODEL)
    assert llm.server_kind == "openai"
    with pytest.raises(ValueError):
        ChatLookahead(base_url="http://127.0.0.1:9/v1", model=MODEL, server_kind="llamacpp")  # type: ignore[arg-type]
