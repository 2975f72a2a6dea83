"""LangChain integration of rag-lookahead.

Local Hugging Face models with lossless lookahead decoding, drafting from the documents
retrieved in the same chain run.
"""

from langchain_rag_lookahead._version import __version__
from langchain_rag_lookahead.callbacks import LookaheadCallbackHandler, with_retrieved_documents
from langchain_rag_lookahead.chat_models import ChatLookahead
from langchain_rag_lookahead.llms import LookaheadLLM

__all__ = [
    "ChatLookahead",
    "LookaheadCallbackHandler",
    "LookaheadLLM",
    "__version__",
    "with_retrieved_documents",
]
