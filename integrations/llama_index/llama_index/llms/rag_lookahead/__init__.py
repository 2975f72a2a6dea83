"""LlamaIndex integration of rag-lookahead: lossless lookahead decoding for RAG.

`LookaheadLLM` is a `CustomLLM` and a `FunctionCallingLLM` (tools, structured output) over a
local Hugging Face model; `LookaheadQueryEngine` feeds
every retrieved node of a query into its trie for the duration of that query's synthesis;
`LookaheadRetriever` searches a rag-lookahead `DocumentIndex` (dense, keyword or hybrid);
`RetrievalScopes` hands the nodes any retriever returns inside a run (a chat engine's turn, a
router, an agent's tool call) to that run's later `LookaheadLLM` calls.
"""

from llama_index.llms.rag_lookahead.base import LookaheadLLM
from llama_index.llms.rag_lookahead.query_engine import LookaheadQueryEngine
from llama_index.llms.rag_lookahead.responses import usage
from llama_index.llms.rag_lookahead.retrievals import RetrievalScopes
from llama_index.llms.rag_lookahead.retriever import LookaheadRetriever
from llama_index.llms.rag_lookahead.scoping import active_scope, use_scope
from llama_index.llms.rag_lookahead.structured import StructuredOutputError

__all__ = [
    "LookaheadLLM",
    "LookaheadQueryEngine",
    "LookaheadRetriever",
    "RetrievalScopes",
    "StructuredOutputError",
    "active_scope",
    "usage",
    "use_scope",
]
