"""LlamaIndex integration of rag-lookahead: lossless lookahead decoding for RAG.

`LookaheadLLM` is a `CustomLLM` over a local Hugging Face model.
"""

from llama_index.llms.rag_lookahead.base import LookaheadLLM
from llama_index.llms.rag_lookahead.responses import usage
from llama_index.llms.rag_lookahead.scoping import active_scope, use_scope

__all__ = ["LookaheadLLM", "active_scope", "usage", "use_scope"]
