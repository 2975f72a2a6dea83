"""Tool results (a retriever tool's passages) in the messages a `ChatLookahead` gets become
documents of that call, and leave the trie with it; on the tiny model."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_rag_lookahead import ChatLookahead
from langchain_rag_lookahead.chat_models import to_chat_messages
from langchain_rag_lookahead.tool_results import tool_result_documents
from rag_lookahead import LookaheadEngine
from rag_lookahead.drafting import OUTPUT_OWNER

PASSAGE = "The lighthouse stands on the north cape, 40 m tall."
CALL = {"name": "search_docs", "args": {"query": "lighthouse"}, "id": "call_1", "type": "tool_call"}


def agent_turn(*results: str) -> list[Any]:
    """A question, the model's retriever call, and the tool's answers to it."""
    return [
        SystemMessage("Answer from the tool results."),
        HumanMessage("Where is the lighthouse?"),
        AIMessage("", tool_calls=[CALL]),
        *(ToolMessage(r, tool_call_id="call_1") for r in results),
    ]


class Recorder:
    def __init__(self, engine: LookaheadEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.documents: list[list[str]] = []
        stream = engine.stream

        def spy(prompt: Any, params: Any = None, *, documents: Any = (), **kwargs: Any) -> Any:
            self.documents.append(list(documents))
            return stream(prompt, params, documents=documents, **kwargs)

        monkeypatch.setattr(engine, "stream", spy)


def test_tool_results_are_documents_of_the_call(
    engine: LookaheadEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = ChatLookahead(engine=engine, max_tokens=16, lookahead=False).invoke(agent_turn(PASSAGE))
    recorder = Recorder(engine, monkeypatch)
    llm = ChatLookahead(engine=engine, max_tokens=16)

    answer = llm.invoke(agent_turn(PASSAGE, "Second result."), documents=["mine"])

    assert recorder.documents == [["mine", PASSAGE, "Second result."]]
    assert isinstance(answer.content, str)
    assert llm.invoke(agent_turn(PASSAGE)).content == reference.content  # lossless
    assert engine.trie.owners() <= {OUTPUT_OWNER}  # the call's branches are gone with it


async def test_streamed_and_async_calls_too(engine: LookaheadEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(engine, monkeypatch)
    llm = ChatLookahead(engine=engine, max_tokens=8)
    "".join(str(c.content) for c in llm.stream(agent_turn(PASSAGE)))
    await llm.ainvoke(agent_turn(PASSAGE))
    assert recorder.documents == [[PASSAGE], [PASSAGE]]


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("plain text", []),
        ([1, 2, 3], []),
        (b"bytes", []),
        (None, []),
        ([{"role": "user", "content": "question"}], []),
        ([{"role": "tool", "content": ""}, {"role": "tool", "content": "  \n"}], []),  # nothing to draft
        ([{"role": "tool", "content": None}, {"role": "tool"}, "not a message"], []),
        ([{"role": "tool", "content": [{"type": "text", "text": "x"}]}], []),  # not rendered text
        (to_chat_messages(agent_turn(PASSAGE)), [PASSAGE]),
    ],
)
def test_what_counts_as_a_tool_result(prompt: Any, expected: list[str]) -> None:
    assert tool_result_documents(prompt) == expected
