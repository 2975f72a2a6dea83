"""A RAG chain whose retrieved documents are not in its prompt, and documents that hold its
answer: for the tests of a run's documents, in process and on a server."""

from __future__ import annotations

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnablePassthrough

from langchain_rag_lookahead.chat_models import to_chat_messages
from rag_lookahead import LookaheadConfig, LookaheadEngine

N = 40
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


def answer_and_documents(engine: LookaheadEngine) -> tuple[str, list[Document]]:
    """``engine``'s plain answer to `QUESTION`, and retrieved documents: one holding it, one not."""
    off = LookaheadEngine(engine.model, engine.tokenizer, LookaheadConfig(mode="off"))
    reference = off.complete(to_chat_messages([HumanMessage(QUESTION)]), max_new_tokens=N).text
    return reference, [Document(page_content="assistant: " + reference), Document(page_content="noise")]
