"""`LookaheadRetriever`: a LlamaIndex retriever over a rag-lookahead `DocumentIndex`.

The index's dense, keyword or hybrid search (the default) behind LlamaIndex's retriever
interface: give it to `LookaheadQueryEngine.from_args` (or any query engine) to answer from
structure-aware chunks, with the keyword side finding the exact names embeddings miss. Each node
carries its source and heading path as metadata (shown to the LLM) and its offsets and cosine
similarity (not shown).
"""

from __future__ import annotations

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from rag_lookahead.rag import DocumentIndex, Hit
from rag_lookahead.rag.index import RetrievalMode, check_mode

__all__ = ["LookaheadRetriever", "hit_to_node"]

_HIDDEN = ["start", "end", "similarity"]  # metadata the LLM and the embedder do not see


class LookaheadRetriever(BaseRetriever):
    """Chunks of a `DocumentIndex` as scored LlamaIndex nodes, best first.

    Args:
        index: The index to search (built with `DocumentIndex.build`, or loaded).
        similarity_top_k: How many chunks per query (keyword mode may find fewer).
        mode: ``"hybrid"`` (keyword and dense rankings fused), ``"dense"`` or ``"keyword"``.
        callback_manager: As for any LlamaIndex retriever.
    """

    def __init__(
        self,
        index: DocumentIndex,
        similarity_top_k: int = 4,
        mode: RetrievalMode = "hybrid",
        callback_manager: CallbackManager | None = None,
    ) -> None:
        top_k = similarity_top_k
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"similarity_top_k must be a positive integer, got {similarity_top_k!r}")
        if not isinstance(index, DocumentIndex):
            raise TypeError(f"index must be a rag-lookahead DocumentIndex, got {type(index).__name__}")
        self.index = index
        self.similarity_top_k = similarity_top_k
        self.mode = check_mode(mode)
        super().__init__(callback_manager=callback_manager)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = self.index.search(query_bundle.query_str, self.similarity_top_k, self.mode)
        return [NodeWithScore(node=hit_to_node(hit), score=hit.score) for hit in hits]


def hit_to_node(hit: Hit) -> TextNode:
    """A retrieved chunk as a LlamaIndex node (its id is the chunk's id)."""
    chunk = hit.chunk
    metadata = {
        "source": chunk.source,
        "section": " > ".join(chunk.headings),
        "start": chunk.start,
        "end": chunk.end,
        "similarity": hit.similarity,
    }
    return TextNode(
        id_=chunk.id,
        text=chunk.text,
        metadata=metadata,
        excluded_llm_metadata_keys=list(_HIDDEN),
        excluded_embed_metadata_keys=list(_HIDDEN),
    )
