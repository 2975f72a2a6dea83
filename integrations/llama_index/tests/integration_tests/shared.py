"""What the real-model tests share: the answer length, and a spy on each LLM call's scope."""

from __future__ import annotations

from typing import Any

from llama_index.llms.rag_lookahead import LookaheadLLM, active_scope

MAX_NEW_TOKENS = 24


class CallSpy:
    """What the trie held when each LLM call of a query started."""

    def __init__(self, llm: LookaheadLLM) -> None:
        self.llm = llm
        self.calls: list[dict[str, Any]] = []

    def record(self) -> None:
        scope = active_scope(self.llm.engine.trie)
        trie = self.llm.engine.trie
        self.calls.append(
            {
                "owner": scope.owner if scope else None,
                "documents": len(scope.sequences) if scope else 0,
                "nodes_in_trie": trie.count_owned(scope.owner) if scope else 0,
            }
        )
