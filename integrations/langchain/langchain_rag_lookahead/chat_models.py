"""`ChatLookahead`: a LangChain chat model over the lookahead engine.

Messages are prompted through the model's own chat template, tools too (`bind_tools`); tool
calls are read in the model's own format and forced, like structured output, by a grammar.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.chat_models import agenerate_from_stream, generate_from_stream
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict

from langchain_rag_lookahead._base import LookaheadSettings
from langchain_rag_lookahead._tools import bound_tools, message_chunks, openai_tools, structured_output

__all__ = ["ChatLookahead", "to_chat_messages"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool", "function": "function"}


# `_stream` and `_astream` are the settings' (one pair for both models), whose first argument is
# named for the completion model's; LangChain passes it by position.
class ChatLookahead(LookaheadSettings, BaseChatModel):  # type: ignore[misc]
    """Chat model running a local Hugging Face model with lossless lookahead decoding.

    Drafts come from a token trie of the prompt, the documents retrieved in the same chain run
    (see `LookaheadCallbackHandler`) or passed as ``documents=``, and past answers; the model
    verifies each draft in one forward pass, so greedy answers equal plain greedy decoding.

    Example:
        ```python
        from langchain_rag_lookahead import ChatLookahead

        llm = ChatLookahead(max_tokens=128)  # the embedded SmolLM2-135M-Instruct
        llm.invoke("What is a lighthouse?", documents=[passage])
        ```

    Construction never loads the model; the first call does (``get_engine()``). Messages go
    through the model's chat template (``rag_lookahead.prompts.encode_prompt``), and only the
    new text comes back. Call-time options: ``stop``, ``documents``, ``prediction`` (text the
    answer is expected to copy, as ``ChatOpenAI`` takes it), ``max_tokens``, ``temperature``,
    ``top_p``, ``top_k``, ``repetition_penalty``, ``seed``, and those `bind_tools` and
    `with_structured_output` set: ``tools``, ``tool_choice`` and
    ``response_format`` (``{"type": "json_object"}`` or ``{"type": "json_schema",
    "json_schema": {"schema": ...}}``, decoded under that grammar).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())

    @property
    def _llm_type(self) -> str:
        return "rag-lookahead-chat"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """This model with ``tools`` rendered into every prompt by the model's chat template.

        Args:
            tools: LangChain tools, functions, pydantic models, TypedDicts or OpenAI-style
                tool dicts (converted by ``convert_to_openai_tool``).
            tool_choice: ``"auto"`` (or ``None``): the model decides, and its reply is parsed
                for calls; ``"any"`` / ``"required"`` / ``True``: one call to one of the tools,
                forced by a grammar; a tool's name (or ``{"type": "function", "function":
                {"name": ...}}``): one call to that tool, forced; ``"none"``: no tools in the
                prompt and no calls.
            **kwargs: More call options to bind.
        """
        return self.bind(**bound_tools(tools, tool_choice), **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, dict[str, Any] | BaseModel]:
        """This model answering in ``schema``'s shape, decoded under a grammar.

        Args:
            schema: A pydantic model (the result is an instance), a TypedDict or a JSON schema
                dict (the result is a dict); ``None`` only with ``method="json_mode"``.
            method: ``"json_schema"``: the reply is JSON that validates against the schema;
                ``"function_calling"``: a forced call to a tool whose parameters are the
                schema; ``"json_mode"``: a JSON object (held to ``schema`` too when one
                is given; the prompt should still ask for the keys).
            include_raw: Return ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``
                rather than raising on a reply that does not parse (e.g. cut by
                ``max_tokens``).
            strict: Accepted for compatibility; the grammar always holds the reply to the schema.
            **kwargs: Not accepted (an error names them).
        """
        if kwargs:
            raise ValueError(f"unexpected arguments to with_structured_output: {sorted(kwargs)}")
        return structured_output(self, schema, method, include_raw)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """The prompt's tokens as the model sees them, offline.

        The messages (and ``tools``, as `bind_tools` takes them) go through the chat template:
        the ``input_tokens`` a call reports.
        """
        extra = {"tools": openai_tools(tools)} if tools else {}
        return len(self.get_engine().encode(to_chat_messages(messages), **extra))

    def _chunks(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> Iterator[ChatGenerationChunk]:
        options = dict(kwargs)
        if options.get("tools") is not None:  # given to the call rather than to `bind_tools`
            options["tools"] = openai_tools(options["tools"])
        plan, pieces = self._open("chat", to_chat_messages(messages), stop, run_manager, options)
        return message_chunks(pieces, plan.tools.format, self._response_metadata)


# Content blocks that repeat an AI message's `tool_calls` (Anthropic's and LangChain's own).
_CALL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call"})


def to_chat_messages(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as ``{"role", "content"}`` dicts for the model's chat template.

    An AI message's tool calls become OpenAI-shaped ``tool_calls``; a tool message carries
    its ``tool_call_id`` (and the tool's ``name`` when known).
    """
    converted = []
    for message in messages:
        role = message.role if isinstance(message, ChatMessage) else _ROLES.get(message.type)
        if role is None:
            raise ValueError(f"unsupported message type {message.type!r}")
        calls = message.tool_calls if isinstance(message, AIMessage) else []
        content = message.content
        if isinstance(content, list):
            kinds = {str(b.get("type")) for b in content if isinstance(b, dict)} - {"text"}
            kinds -= _CALL_BLOCKS if calls else set()
            if isinstance(message, ToolMessage):
                kinds -= {"tool_result"}
            if kinds:
                raise ValueError(f"ChatLookahead takes text only; got content blocks {sorted(kinds)}")
        item: dict[str, Any] = {"role": role, "content": message.text}
        if calls:
            item["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                for c in calls
            ]
        if isinstance(message, ToolMessage):
            item["tool_call_id"] = message.tool_call_id
            if message.name:
                item["name"] = message.name
        converted.append(item)
    return converted
