"""A LangGraph agent with a retriever tool over the bundled corpus, on rag-lookahead.

The agent is a two-node LangGraph graph: the model (`ChatLookahead`), and LangGraph's prebuilt
`ToolNode` running a retriever tool (LangChain's `create_retriever_tool` over a
`LookaheadRetriever` searching the bundled corpus: Wikipedia articles on the Normans and on
computational complexity theory). The model's first turn is a forced call to the tool
(``tool_choice="any"``: the 135M default model does not call tools on its own), decoded under
the tool's grammar in the model's own ``<tool_call>`` format; the tool's result comes back as a
`ToolMessage`, and the model answers from it.

Run (nothing is downloaded):
    pip install -e . -e 'integrations/langchain[test]'
    HF_HUB_OFFLINE=1 python examples/langgraph_agent.py [--max-new-tokens 64] [--questions 2]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, create_retriever_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_rag_lookahead import ChatLookahead, LookaheadRetriever
from rag_lookahead.cli.flags import add_max_new_tokens, add_top_k
from rag_lookahead.rag import DocumentIndex, SentenceTransformerEmbedder


def corpus_tool(k: int) -> BaseTool:
    """A retriever tool over the bundled corpus (hybrid search, ``k`` chunks)."""
    with resources.as_file(resources.files("rag_lookahead") / "data" / "corpus") as corpus:
        index, _ = DocumentIndex.build([Path(corpus)], SentenceTransformerEmbedder())
    return create_retriever_tool(
        LookaheadRetriever(index=index, k=k),
        "search_corpus",
        "Search Wikipedia articles on the Normans and on computational complexity theory.",
    )


def agent(llm: ChatLookahead, tool: BaseTool) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model -> tools -> model: the first turn calls the tool (forced), the next one answers."""
    call = llm.bind_tools([tool], tool_choice="any")
    answer = llm.bind_tools([tool], tool_choice="none")

    def model(state: MessagesState) -> dict[str, list[Any]]:
        searched = any(isinstance(m, ToolMessage) for m in state["messages"])
        return {"messages": [(answer if searched else call).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile()


def main(argv: Sequence[str] | None = None) -> int:
    """Ask the first questions of the bundled corpus; print each step of the agent."""
    parser = argparse.ArgumentParser(description="A LangGraph agent with a retriever tool")
    add_max_new_tokens(parser, default=64, help="new tokens per model turn")
    parser.add_argument("--questions", type=int, default=2, help="how many bundled questions")
    add_top_k(parser, default=2, help="chunks the tool retrieves")
    args = parser.parse_args(argv)
    questions = (resources.files("rag_lookahead") / "data" / "demo_questions.txt").read_text("utf-8")
    graph = agent(ChatLookahead(max_tokens=args.max_new_tokens), corpus_tool(args.top_k))
    for question in [q for q in questions.splitlines() if q.strip()][: args.questions]:
        print(f"\n=== {question}")
        result = graph.invoke({"messages": [HumanMessage(question)]})
        for message in result["messages"][1:]:
            if isinstance(message, AIMessage) and message.tool_calls:
                calls = ", ".join(f"{c['name']}({c['args']})" for c in message.tool_calls)
                print(f"  tool call: {calls}")
            elif isinstance(message, AIMessage) and message.invalid_tool_calls:
                errors = message.response_metadata.get("tool_call_errors")
                print(f"  the tool call did not parse (raise --max-new-tokens?): {errors}")
            elif isinstance(message, ToolMessage):
                print(f"  tool result: {len(message.text)} characters")
            else:
                stats = message.response_metadata.get("lookahead", {})
                print(f"  answer: {message.text.strip()}")
                print(f"  ({stats.get('tokens_per_step', 0):.2f} tokens per forward)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
