"""`ChatLookahead(base_url=..., server_kind="rag-lookahead")`: a chain moved to `rag-lookahead
serve` with one line keeps its drafts. Real HTTP on 127.0.0.1 with the tiny model: the run's
retrieved documents reach the served call as a corpus, and the answer is the in-process one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnablePassthrough

from langchain_rag_lookahead import ChatLookahead, LookaheadCallbackHandler
from langchain_rag_lookahead.chat_models import to_chat_messages
from rag_lookahead import LookaheadConfig, LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER
from rag_lookahead.http import ServeSettings, create_app
from rag_lookahead.http.testing import LiveServer, ScopedCalls
from rag_lookahead.testing import tiny_engine

N = 40
MODEL = "tiny"
QUESTION = "Where is the lighthouse?"


class FixedRetriever(BaseRetriever):
    documents: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self.documents


def rag_chain(llm: Runnable, documents: list[Document]) -> Runnable:
    """Retrieval whose documents are not in the prompt: only the drafts can carry them."""
    retrieve = RunnableParallel(docs=FixedRetriever(documents=documents), question=RunnablePassthrough())
    return retrieve | RunnableLambda(lambda x: x["question"]) | llm | StrOutputParser()


@pytest.fixture
def served() -> Iterator[tuple[ScopedCalls, LiveServer]]:
    server = ScopedCalls(tiny_engine())
    with LiveServer(create_app(server.engine, ServeSettings(model_name=MODEL))) as live:
        yield server, live


@pytest.mark.enable_socket
def test_a_chain_on_the_server_keeps_its_drafts(served: tuple[ScopedCalls, LiveServer]) -> None:
    server, live = served
    off = LookaheadEngine(server.engine.model, server.engine.tokenizer, LookaheadConfig(mode="off"))
    reference = off.complete(to_chat_messages([HumanMessage(QUESTION)]), max_new_tokens=N).text
    documents = [Document(page_content="assistant: " + reference), Document(page_content="noise")]
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
