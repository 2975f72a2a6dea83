"""LlamaIndex's `FunctionCallingLLM` surface of `LookaheadLLM`: what an agent asks of it.

`chat_with_tools` prepares a `chat` call whose tools the core plans (the chat template renders
them, a forced call decodes under a grammar); the calls come back as `ToolSelection` s. Whether
the model takes tools at all is asked of the core once, with a probe tool.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools.types import BaseTool

from llama_index.llms.rag_lookahead.tools import tool_selections
from rag_lookahead.interface import Engine
from rag_lookahead.protocol import RequestError, plan_call

__all__ = ["ToolCallingLLM"]

# A tool to ask the chat template whether it takes tools at all.
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}},
}


class ToolCallingLLM(FunctionCallingLLM):
    """A `FunctionCallingLLM` whose `chat` takes ``tools=`` and ``tool_choice=`` as a chat
    request does (see `rag_lookahead.protocol.plan_call`)."""

    _tools_supported: bool | None = PrivateAttr(default=None)

    @property
    @abstractmethod
    def engine(self) -> Engine:
        """The engine every call of this LLM decodes with."""

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The arguments of the `chat` call `chat_with_tools` makes: the messages, and the
        tools with ``tool_choice`` (a ``tool_choice=`` keyword: ``"auto"``, ``"required"``,
        ``"none"`` or a tool's name), ``tool_required`` and ``allow_parallel_tool_calls``,
        which `chat` turns into the chat template's tools and, for a forced call, a grammar."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role=MessageRole.USER, content=user_msg)
                if isinstance(user_msg, str)
                else user_msg
            )
        return {
            "messages": messages,
            "tools": list(tools),
            "tool_choice": kwargs.pop("tool_choice", None),
            "tool_required": tool_required,
            "allow_parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls of a `chat_with_tools` response (see `tool_selections`)."""
        return tool_selections(response, error_on_no_tool_call)

    def _supports_tools(self) -> bool:
        """Whether the model's chat template takes tools in a format this package reads."""
        if self._tools_supported is None:
            probe = [{"role": "user", "content": "probe"}]
            try:
                plan_call("chat", probe, {"tools": [_PROBE_TOOL]}, self.engine)
                self._tools_supported = True
            except RequestError:
                self._tools_supported = False
        return self._tools_supported
