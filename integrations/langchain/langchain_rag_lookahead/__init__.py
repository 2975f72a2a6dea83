"""LangChain integration of rag-lookahead.

Local Hugging Face models with lossless lookahead decoding, drafting from the documents
retrieved in the same chain run; and a retriever over rag-lookahead's own hybrid index.
"""

from langchain_rag_lookahead._version import __version__
from langchain_rag_lookahead.callbacks import LookaheadCallbackHandler, with_retrieved_documents
from langchain_rag_lookahead.chat_models import ChatLookahead
from langchain_rag_lookahead.llms import LookaheadLLM
from langchain_rag_lookahead.retrievers import LookaheadRetriever

__all__ = [
    "ChatLookahead",
    "LookaheadCallbackHandler",
    "LookaheadLLM",
    "LookaheadRetriever",
    "__version__",
    "with_retrieved_documents",
]
