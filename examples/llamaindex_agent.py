"""A LlamaIndex `FunctionAgent` with a retriever tool over the bundled corpus, on rag-lookahead.

The agent's LLM is `LookaheadLLM`, a LlamaIndex `FunctionCallingLLM`; its one tool is a
function tool over `LookaheadRetriever`, which searches the bundled corpus (Wikipedia articles
on the Normans and on computational complexity theory) in a rag-lookahead `DocumentIndex`. The
agent's first turn is a forced call to the tool (``initial_tool_choice``: the 135M default model
does not call tools on its own), decoded under the tool's grammar in the model's own
``<tool_call>`` format. The tool's nodes come back as the tool result, and, seen through
LlamaIndex's instrumentation (`RetrievalScopes`), feed the trie of the agent's next turn, which
answers from them.

Run (nothing is downloaded):
    pip install -e . -e 'integrations/llama_index[test]'
    HF_HUB_OFFLINE=1 python examples/llamaindex_agent.py [--max-new-tokens 64] [--questions 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads; fail fast if it tried

import llama_index.core.instrumentation as instrument
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCall, ToolCallResult
from llama_index.core.bridge.pydantic import BaseModel, Field
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.schema import MetadataMode
from llama_index.core.tools import FunctionTool

from llama_index.llms.rag_lookahead import LookaheadLLM, LookaheadRetriever
from rag_lookahead.cli.flags import add_max_new_tokens, add_top_k
from rag_lookahead.rag import DocumentIndex, SentenceTransformerEmbedder

TOOL = "search_corpus"
MAX_QUERY = 60  # characters of a search


def corpus_tool(top_k: int) -> FunctionTool:
    """A retriever tool over the bundled corpus (hybrid search, ``top_k`` chunks)."""
    with resources.as_file(resources.files("rag_lookahead") / "data" / "corpus") as corpus:
        index, _ = DocumentIndex.build([Path(corpus)], SentenceTransformerEmbedder())
    retriever = LookaheadRetriever(index, similarity_top_k=top_k)

    async def search_corpus(query: str) -> str:
        nodes = await retriever.aretrieve(query)
        return "\n\n".join(n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes)

    # A function tool rather than `RetrieverTool` (one parameter, `input`): a named, described
    # and bounded parameter gets the small model to write a short search into it, and the
    # grammar of the forced call holds it to the bound.
    return FunctionTool.from_defaults(
        async_fn=search_corpus,
        name=TOOL,
        description="Search Wikipedia articles on the Normans and on computational complexity theory.",
        fn_schema=SearchArgs,
    )


class SearchArgs(BaseModel):
    """The search tool's arguments."""

    query: str = Field(description="A few words to look up in the articles", max_length=MAX_QUERY)


def agent(llm: LookaheadLLM, tool: FunctionTool) -> FunctionAgent:
    """An agent whose first turn calls the tool (forced) and whose next one answers."""
    return FunctionAgent(
        tools=[tool],
        llm=llm,
        initial_tool_choice=TOOL,
        system_prompt="Answer the question in one sentence from the search results.",
    )


class TurnStats(BaseEventHandler):
    """The decoding stats of the latest LLM turn (its last response carries them)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, Any] = {}

    @property
    def last(self) -> dict[str, Any]:
        return self._last

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            self._last = event.response.additional_kwargs.get("lookahead", self._last)


async def ask(workflow: FunctionAgent, question: str, max_iterations: int, stats: TurnStats) -> list[str]:
    """Run the agent on ``question``; a line per step (tool calls, results, the answer)."""
    handler = workflow.run(user_msg=question, max_iterations=max_iterations)
    lines, searched = [], False
    async for event in handler.stream_events():
        if isinstance(event, ToolCall) and not isinstance(event, ToolCallResult):
            lines.append(f"  tool call: {event.tool_name}({event.tool_kwargs})")
        elif isinstance(event, ToolCallResult):
            searched = True
            lines.append(f"  tool result: {len(event.tool_output.content)} characters")
        elif isinstance(event, AgentOutput) and not event.tool_calls:
            errors = event.response.additional_kwargs.get("tool_call_errors")
            if errors:
                lines.append(f"  the tool call did not parse (raise --max-new-tokens?): {errors}")
            lines.append(f"  answer: {(event.response.content or '').strip()}")
            per_step = stats.last.get("tokens_per_step", 0.0)
            source = ", drafting from the tool's nodes" if searched else ""
            lines.append(f"  ({per_step:.2f} tokens per forward{source})")
    await handler
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Ask the first questions of the bundled corpus; print each step of the agent."""
    parser = argparse.ArgumentParser(description="A LlamaIndex FunctionAgent with a retriever tool")
    add_max_new_tokens(parser, default=64, help="new tokens per model turn")
    parser.add_argument("--questions", type=int, default=2, help="how many bundled questions")
    add_top_k(parser, default=2, help="chunks the tool retrieves")
    parser.add_argument("--max-iterations", type=int, default=3, help="agent turns per question")
    args = parser.parse_args(argv)
    questions = (resources.files("rag_lookahead") / "data" / "demo_questions.txt").read_text("utf-8")
    workflow = agent(LookaheadLLM(max_new_tokens=args.max_new_tokens), corpus_tool(args.top_k))
    stats = TurnStats()
    instrument.get_dispatcher().add_event_handler(stats)
    try:
        for question in [q for q in questions.splitlines() if q.strip()][: args.questions]:
            print(f"\n=== {question}")
            for line in asyncio.run(ask(workflow, question, args.max_iterations, stats)):
                print(line)
    finally:
        instrument.get_dispatcher().event_handlers.remove(stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
