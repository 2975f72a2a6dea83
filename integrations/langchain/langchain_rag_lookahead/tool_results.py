"""Tool results in a chat prompt, as documents the call drafts from.

An agent's retriever tool (``create_retriever_tool``, or any tool that fetches text) hands its
result back as a `ToolMessage`; the answer that follows copies names, figures and sentences from
it. The result is in the prompt already, but as the chat template renders it: inside markup,
and a template may JSON-escape it, so that its quotes and line breaks are not the tokens the
answer writes. Given to the call as a document as well, the raw
text is tokenized on its own and becomes branches owned by the call (eliminated when the call
ends, as every document passed with ``documents=``). This works with or without a
`LookaheadCallbackHandler` on the agent, and for tools that fetch text without a LangChain
retriever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["tool_result_documents"]


def tool_result_documents(prompt: Any) -> list[str]:
    """The text of each tool message of a chat prompt.

    Messages are ``{"role": "tool", "content": ...}`` dicts, as `to_chat_messages` makes them;
    a plain-text or token-id prompt has none.
    """
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (list, tuple)):
        return []
    texts = []
    for message in prompt:
        if isinstance(message, Mapping) and message.get("role") == "tool":
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                texts.append(content)
    return texts
